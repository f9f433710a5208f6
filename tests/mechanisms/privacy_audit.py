"""A reusable empirical privacy audit (a lower bound on epsilon from samples).

For a neighbouring pair ``X ~ X'`` and an event ``E`` on the output, ``(eps, delta)``-DP implies
``P[M(X) in E] <= e^eps P[M(X') in E] + delta``. Running the mechanism ``runs`` times on each side
gives Clopper-Pearson intervals; with ``p_low`` the lower end for ``X`` and ``p_high`` the upper
end for ``X'``, ``eps_hat = ln((p_low - delta) / p_high)`` is a lower bound on the true epsilon
with the stated confidence. A correct mechanism must give ``eps_hat <= eps``; a mechanism whose
noise is divided by 10 (the negative control) must give ``eps_hat > eps``, which shows the audit
can fail.

The audit tries the event and its complement, in both directions, and reports the largest bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import beta as beta_dist


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Two-sided ``1 - alpha`` Clopper-Pearson interval for a binomial proportion."""
    low = (
        0.0
        if successes == 0
        else float(beta_dist.ppf(alpha / 2, successes, trials - successes + 1))
    )
    high = (
        1.0
        if successes == trials
        else float(beta_dist.ppf(1 - alpha / 2, successes + 1, trials - successes))
    )
    return low, high


def epsilon_lower_bound(
    hits_a: int, hits_b: int, runs: int, delta: float, alpha: float = 0.05
) -> float:
    """``ln((p_low(A) - delta) / p_high(B))``, or ``0`` when the numerator is not positive."""
    p_low, _ = clopper_pearson(hits_a, runs, alpha)
    _, p_high = clopper_pearson(hits_b, runs, alpha)
    if p_low - delta <= 0 or p_high <= 0:
        return 0.0
    return max(0.0, math.log((p_low - delta) / p_high))


@dataclass(frozen=True)
class AuditResult:
    eps_lower_bound: float
    hits: int
    hits_neighbour: int
    runs: int


def audit(
    mechanism: Callable[[np.ndarray, np.random.Generator], Any],
    data: np.ndarray,
    neighbour: np.ndarray,
    event: Callable[[Any], bool],
    runs: int,
    delta: float,
    *,
    seed: int = 0,
    alpha: float = 0.05,
) -> AuditResult:
    """Estimate a lower bound on epsilon for ``mechanism`` on the pair ``(data, neighbour)``.

    Parameters
    ----------
    mechanism : callable ``(data, rng) -> output``
        One run of the mechanism with the given generator.
    data, neighbour : arrays
        A neighbouring pair (one row replaced).
    event : callable ``output -> bool``
        The threshold event, fixed before the runs.
    runs : int
        Runs on each side.
    delta : float
        The mechanism's delta (subtracted from the larger probability).
    seed : int
        Seeds the test generator (tests are reproducible; production never seeds).
    alpha : float
        One minus the confidence of each Clopper-Pearson interval.
    """
    rng = np.random.default_rng(seed)
    hits = sum(bool(event(mechanism(data, rng))) for _ in range(runs))
    hits_neighbour = sum(bool(event(mechanism(neighbour, rng))) for _ in range(runs))
    bound = max(
        epsilon_lower_bound(hits, hits_neighbour, runs, delta, alpha),
        epsilon_lower_bound(hits_neighbour, hits, runs, delta, alpha),
        epsilon_lower_bound(runs - hits, runs - hits_neighbour, runs, delta, alpha),
        epsilon_lower_bound(runs - hits_neighbour, runs - hits, runs, delta, alpha),
    )
    return AuditResult(bound, hits, hits_neighbour, runs)
