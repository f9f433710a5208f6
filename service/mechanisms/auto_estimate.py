"""``auto``'s private estimate and the predictions it feeds (:mod:`~service.mechanisms.auto`).

The tail ``T = sum_{i>k} lambda_i`` and the trace of the clipped ``X^T X`` each move by at most
``C^2`` when a row is replaced (``T`` is a minimum over projectors of sums of terms in
``[0, C^2]``), so each with ``Lap(2 C^2/eps_s)`` (added by :func:`.auto.noisy_tail_and_trace`)
is ``(eps_s/2, 0)``-DP and the pair ``(eps_s, 0)``-DP; everything here is post-processing of the
pair and public facts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.mechanisms.analyze_gauss import noise_sigma
from service.mechanisms.auto_gram import predicted_gram_error
from service.mechanisms.auto_guard import ALPHA, Choice, predicted_friendly_error
from service.mechanisms.linalg import FloatArray, clipped_gram, eigenvalues_desc


def tail_and_trace(data: FloatArray, k: int, clip_norm: float) -> tuple[float, float]:
    """``(sum_{i>k} lambda_i, sum_i lambda_i)`` of the clipped ``X^T X`` (non-private; the tail
    summed from the smallest eigenvalues, clamped at 0, to keep its relative accuracy)."""
    values = np.maximum(eigenvalues_desc(clipped_gram(data, clip_norm)), 0.0)
    return float(values[k:].sum()), float(values.sum())


def predicted_gauss_error(gap: float, d: int, k: int, gauss: Choice) -> float:
    """``sigma (sqrt(d - k) + sqrt(k))/g`` for analyze_gauss at its clip ``C`` and its whole
    budget (the first-order bound itself; :func:`predicted_error` for auto's candidates)."""
    params: Any = gauss.params
    sigma = noise_sigma(params.clip_norm, gauss.epsilon, gauss.delta)
    return sigma * (math.sqrt(max(d - k, 0)) + math.sqrt(k)) / max(gap, 1e-300)


def predicted_error(gram: Choice, estimate: Estimate, d: int, k: int) -> float:
    """The Gram candidate's predicted error at its budget (:mod:`auto_gram`: spatial_sign's gap
    is the estimate's over the fill)."""
    args = (gram.epsilon, gram.delta, estimate.gap, estimate.fill, d, k)
    return predicted_gram_error(gram.name, gram.params, *args)


@dataclass(frozen=True)
class Estimate:
    """The released estimate as the predictions use it: the tail at either end of its one-sided
    ``1 - ALPHA`` intervals (``T_hat -+ b ln(1/(2 ALPHA))``, clamped at 0), the head ``S`` and
    the gap ``S/k`` (each floored at one noise scale ``b``), and the fill ``trace/(n C^2)``
    (``capacity = n C^2``; in ``[b/capacity, 1]``, 1 without a capacity)."""

    tail_low: float
    tail_high: float
    head: float
    gap: float
    fill: float = 1.0
    tail_hat: float = 0.0
    scale: float = 0.0

    def optimistic_tail(self, alpha: float) -> float:
        """The tail's optimistic end at level ``alpha``: ``T_hat - b ln(1/(2 alpha))``, clamped
        at 0 (``P[Lap(b) >= b ln(1/(2 alpha))] = alpha``); ``tail_low`` is this at ``ALPHA``."""
        return max(self.tail_hat - self.scale * math.log(1.0 / (2.0 * alpha)), 0.0)

    @classmethod
    def of(
        cls, tail_hat: float, trace_hat: float, k: int, scale: float, capacity: float = 0.0
    ) -> Estimate:
        head = max(trace_hat - max(tail_hat, 0.0), scale)
        margin = scale * math.log(1.0 / (2.0 * ALPHA))
        low, high = max(tail_hat - margin, 0.0), max(tail_hat + margin, 0.0)
        fill = min(1.0, max(trace_hat, scale) / capacity) if capacity > 0 else 1.0
        return cls(low, high, head, max(head / k, scale), fill, tail_hat, scale)


def friendly_wins(
    friendly: Choice, gauss: Choice, tail: float, estimate: Estimate, n: int, d: int, k: int
) -> bool:
    """Whether friendly's predicted error with the subsets ``r = 2 sqrt(t T S/n)/g`` apart (in
    its metric: times ``sqrt(q)`` for reference points) is below analyze_gauss's."""
    params: Any = friendly.params
    scale = 1.0 if params.aggregator == "projection" else math.sqrt(params.q or 2 * k)
    r = scale * 2.0 * math.sqrt(params.t * tail * estimate.head / max(n, 1)) / estimate.gap
    f_error = predicted_friendly_error(friendly, r, d, k)
    return f_error < predicted_error(gauss, estimate, d, k)
