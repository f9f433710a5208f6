"""The dry run's forecast of what ``analyze_gauss`` keeps (issue 24 item 6, issue 32 item 4),
from public facts only: it runs before the release and reads no row."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Forecast:
    """What the noise leaves recoverable, from public facts (issue 24, item 6)."""

    threshold_share: float
    power_law_share: float
    rows_needed: int
    meaning: str


def recoverable_forecast(sigma: float, n: int, d: int, k: int, clip_norm: float) -> Forecast:
    """The smallest eigenvalue of ``X^T X`` that stands out of ``E(sigma)``, as a share of the
    largest possible trace ``n C^2``: ``sigma sqrt(d)`` (below it the top eigenvector of a
    spiked Wigner matrix carries no information about the spike, Baik, Ben Arous & Peche; above
    it the squared overlap is ``1 - sigma^2 d/lambda^2``); and the expected share of the
    variance that k released components capture when the spectrum follows a power law
    ``lambda_i ~ 1/i`` over ``d`` with the rows at the bound (trace ``n C^2``)."""
    threshold = sigma * math.sqrt(d)
    total = n * clip_norm**2
    share = threshold / total if total > 0 else math.inf
    weights = 1.0 / np.arange(1, d + 1, dtype=np.float64)
    spectrum = total * weights / weights.sum()
    top = spectrum[:k]
    overlap = np.clip(1.0 - (threshold / top) ** 2, 0.0, 1.0)
    captured = float(np.sum(top * overlap) / total) if total > 0 else 0.0
    # Rows at which the k-th power-law eigenvalue n C^2 w_k / sum(w) reaches the threshold
    # (sigma does not depend on n); for the budget, sigma scales about as 1/epsilon.
    needed = math.ceil(threshold * float(weights.sum()) / (float(weights[k - 1]) * clip_norm**2))
    meaning = (
        f"Forecast: an eigenvalue of the clipped X^T X below {threshold:.4g} "
        f"({share:.3g} of n C^2) is lost in the noise; with a 1/i spectrum over d and rows at "
        f"the bound, k = {k} released components would capture about {captured:.3g} of the "
        f"variance (non-private PCA: {float(top.sum() / total):.3g}). All k components stand "
        f"out of the noise from about n = {needed} rows at this budget; the threshold share "
        "falls as 1/n and about as 1/epsilon, and grows as sqrt(d)."
    )
    return Forecast(share, captured, needed, meaning)
