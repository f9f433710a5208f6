"""The dry run's forecast of what ``analyze_gauss`` keeps (issue 24 item 6, issue 32 item 4),
from public facts only: it runs before the release and reads no row."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class ReleasedFigures:
    """What an earlier ``analyze_gauss`` release on the same dataset published and the
    forecast reads (all released, so reading them is post-processing): its per-component
    ``ratios`` and their total's ``interval``, its noisy ``eigenvalues`` (descending), the
    trace of ``H + E``, the Gram noise's ``sigma`` (all in the Gram's units, scaled as
    released) and ``d``."""

    ratios: tuple[float, ...]
    interval: tuple[float, float]
    eigenvalues: tuple[float, ...]
    trace: float
    sigma: float
    n_cols: int

    @classmethod
    def from_extras(cls, extras: Mapping[str, Any], n_cols: int) -> ReleasedFigures | None:
        """The figures of a release's extras, or ``None`` when one is missing (another
        mechanism, or a release from before the figures existed)."""
        try:
            ratios = tuple(float(x) for x in extras["explained_variance_ratio"])
            low, high = (float(x) for x in extras["explained_variance_ratio_interval"])
            values = tuple(float(x) for x in extras["eigenvalues"])
            trace = float(extras["trace"])
            sigma = float(extras["gram_noise_std"])
        except (KeyError, TypeError, ValueError):
            return None
        if not ratios or len(ratios) != len(values) or not sigma > 0:
            return None
        return cls(ratios, (low, high), values, trace, sigma, n_cols)


def overlap(eigenvalue: float, sigma: float, d: int) -> float:
    """Squared overlap of the top eigenvector of ``lambda v v^T + E(sigma)`` with ``v``
    (spiked Wigner, Baik, Ben Arous & Peche): ``1 - sigma^2 d / lambda^2`` above the edge
    ``lambda > sigma sqrt(d)``, 0 below it."""
    if not eigenvalue > sigma * math.sqrt(d):
        return 0.0
    return 1.0 - (sigma * math.sqrt(d) / eigenvalue) ** 2


def forecast_from_release(figures: ReleasedFigures, k: int, noise_ratio: float) -> float:
    """The share of the centred variance a release of ``k`` components keeps, forecast from an
    earlier release's released figures when the new Gram noise is ``noise_ratio`` times the
    earlier one's (a public ratio of the two requests' Gram ``mu``, the clip rule being the
    same).

    Component ``i`` of the earlier release kept ``r_i`` (its stated ratio) of the variance;
    that is ``v_i w_i(sigma_0)``, ``v_i`` the share of the variance along the true direction
    and ``w_i`` the squared overlap of :func:`overlap` at the debiased eigenvalue ``lambda_i``
    (:func:`~service.mechanisms.explained_variance.spiked_debias`). The new release keeps
    ``sum_i v_i w_i(sigma_1)`` over its ``k`` components; components beyond the earlier
    release's are unknown and counted as keeping nothing (the forecast is then low)."""
    from service.mechanisms.explained_variance import spiked_debias  # no import cycle

    d = figures.n_cols
    noisy = np.asarray(figures.eigenvalues, dtype=np.float64)
    debiased = spiked_debias(noisy, figures.sigma, d)
    kept = 0.0
    for i, (ratio, value) in enumerate(zip(figures.ratios, debiased, strict=True)):
        if i >= k:
            break
        before = overlap(float(value), figures.sigma, d)
        if before <= 0:
            continue
        share = min(ratio / before, 1.0)
        kept += share * overlap(float(value), figures.sigma * noise_ratio, d)
    return float(min(max(kept, 0.0), 1.0))
