"""Tight composition of a pure-DP step, a Laplace step and a Gaussian step (derivation F3).

``friendly_aggregate`` runs three steps: AboveThreshold (``eps0``-DP, pure), a Laplace count
(``eps1``-DP, pure, plus a failure event of probability ``delta1``) and a Gaussian mean. Summing
``(eps_i, delta_i)`` (basic composition) is loose; the exact privacy profile of their adaptive
composition is computed here from *dominating pairs* (f-DP, Dong, Roth & Su, JRSS-B 2022):

* an ``eps``-DP step is dominated by randomized response with parameter ``eps``
  (Kairouz, Oh & Viswanath, ICML 2015, Theorem 2.4; DRS22 Proposition 3): privacy loss
  ``+eps`` with probability ``e^eps/(1+e^eps)``, ``-eps`` otherwise;
* a Laplace count of sensitivity ``Delta`` and scale ``Delta/eps1`` is dominated by the pair
  ``Lap(0, 1/eps1)``, ``Lap(1, 1/eps1)`` (a smaller shift is a post-processing of it);
* a Gaussian of sensitivity ``D`` and standard deviation ``D/mu`` is ``mu``-GDP, dominated by
  ``N(0, 1)``, ``N(mu, 1)`` (Balle & Wang, ICML 2018, Theorem 8 for its profile);
* adaptive composition is dominated by the product of the dominating pairs (DRS22 Theorem 4,
  stated for every fixed pair of neighbours and every prefix of outputs).

The hockey-stick divergence of the product at ``e^eps`` is then
``E_{L1, L2}[delta_G(mu, eps - L1 - L2)]`` over the first two steps' privacy losses, where
``delta_G(mu, x) = Phi(mu/2 - x/mu) - e^x Phi(-mu/2 - x/mu)`` is the Gaussian profile (for any
real ``x``). The Laplace loss is continuous; on ``(0, 1)`` the integrand is decreasing, so a left
Riemann sum is an upper bound and the function below never under-reports ``delta``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.special import log_ndtr

from service.mechanisms.linalg import FloatArray
from service.mechanisms.noise import gaussian_delta

#: Nodes of the left Riemann sum over the Laplace loss's continuous part (an upper bound; the
#: relative excess is below ``eps1 / NODES`` of that part).
NODES = 2048


def gaussian_profile(mu: float, epsilon: float) -> float:
    """``delta_G(mu, eps)``: the hockey-stick divergence of ``N(0,1)`` and ``N(mu,1)`` at
    ``e^eps`` (any real ``eps``; ``mu = 0`` gives ``max(0, 1 - e^eps)``)."""
    if mu <= 0.0:
        # 1 - e^eps < 0 for eps >= 0 (and expm1 would overflow for eps above ~709).
        return 0.0 if epsilon >= 0.0 else -math.expm1(epsilon)
    return gaussian_delta(1.0, mu, epsilon)


def gaussian_profiles(mu: float, epsilons: FloatArray) -> FloatArray:
    """:func:`gaussian_profile` elementwise (log space, as ``noise.gaussian_delta``)."""
    if mu <= 0.0:
        return np.asarray(-np.expm1(np.minimum(epsilons, 0.0)), dtype=np.float64)
    log_first = log_ndtr(mu / 2.0 - epsilons / mu)
    log_second = epsilons + log_ndtr(-mu / 2.0 - epsilons / mu)
    gap = np.minimum(log_second - log_first, 0.0)
    return np.asarray(np.exp(log_first) * -np.expm1(gap), dtype=np.float64)


def composed_delta(epsilon: float, eps0: float, eps1: float, mu2: float) -> float:
    """Upper bound on the ``delta`` at which ``eps0``-DP, then the ``eps1`` Laplace count, then
    a ``mu2``-GDP Gaussian compose to ``epsilon`` (adaptively, for any neighbours).

    ``sum_{s = +-1} p_s [ delta_G(eps - s eps0 - eps1)/2 + e^{-eps1} delta_G(eps - s eps0 +
    eps1)/2 + int_0^1 (eps1/2) e^{-eps1 x} delta_G(eps - s eps0 - eps1 (1 - 2x)) dx ]`` with
    ``p_+ = e^eps0/(1+e^eps0)``; the integral by a left Riemann sum (its integrand decreases in
    ``x``: both factors do), hence an upper bound. ``eps0 = 0`` drops the first step.
    """
    signs: tuple[tuple[float, float], ...]
    if eps0 > 0.0:
        p_plus = 1.0 / (1.0 + math.exp(-eps0))
        signs = ((p_plus, eps0), (1.0 - p_plus, -eps0))
    else:
        signs = ((1.0, 0.0),)
    total = 0.0
    for prob, loss0 in signs:
        at = epsilon - loss0
        atoms = 0.5 * gaussian_profile(mu2, at - eps1)
        atoms += 0.5 * math.exp(-eps1) * gaussian_profile(mu2, at + eps1)
        x = np.arange(NODES, dtype=np.float64) / NODES
        riemann = float(np.sum(np.exp(-eps1 * x) * gaussian_profiles(mu2, at - eps1 * (1 - 2 * x))))
        total += prob * (atoms + 0.5 * eps1 * riemann / NODES)
    return total


@functools.lru_cache(maxsize=1024)
def largest_mean_mu(
    epsilon: float, delta: float, eps0: float, eps1: float, delta1: float, rel_tol: float = 1e-9
) -> float:
    """The largest ``mu2`` (to ``rel_tol``, rounded down) with
    ``delta1 + composed_delta(epsilon, eps0, eps1, mu2) <= delta``; 0 when even ``mu2 = 0``
    fails (``eps0 + eps1`` too close to ``epsilon``).

    ``composed_delta`` increases with ``mu2`` (a larger ``mu`` is a less noisy Gaussian), so
    bisection applies; the lower end of the final bracket is returned.
    """
    budget = delta - delta1

    def fits(mu: float) -> bool:
        return composed_delta(epsilon, eps0, eps1, mu) <= budget

    if budget <= 0.0 or not fits(0.0):
        return 0.0
    low, high = 0.0, max(epsilon, 1e-3)
    while fits(high):
        low, high = high, 2.0 * high
    while high - low > rel_tol * high:
        mid = 0.5 * (low + high)
        if fits(mid):
            low = mid
        else:
            high = mid
    return low


def gaussian_total_mu(epsilon: float, delta: float, eps0: float, delta1: float) -> float:
    """The largest ``mu`` with ``delta1 + composed_delta(epsilon, eps0, 0, mu) <= delta``: the
    GDP parameter that an ``eps0``-DP step followed by Gaussian steps may jointly use.

    Gaussian steps of ``mu_1, mu_2`` compose exactly to ``sqrt(mu_1^2 + mu_2^2)``-GDP (DRS22
    Corollary 2), so any ``mu_1^2 + mu_2^2 <= mu^2`` is within ``(epsilon, delta)`` together with
    the ``eps0`` step (``eps1 = 0``: the Laplace factor of :func:`composed_delta` is the point
    mass at loss 0)."""
    return largest_mean_mu(epsilon, delta, eps0, 0.0, delta1)


def cks_delta(rho: float, epsilon: float) -> float:
    """``rho``-zCDP to ``(epsilon, delta)``: Canonne, Kamath & Steinke (NeurIPS 2020),
    Proposition 12 / Corollary 13, ``delta = inf_{a > 1} exp((a-1)(a rho - eps)) / (a-1)
    (1 - 1/a)^a``, minimised over a log grid of ``a`` (for comparison only)."""
    a = 1.0 + np.logspace(-4, 4, 4001)
    log_d = (a - 1) * (a * rho - epsilon) - np.log(a - 1) + a * np.log1p(-1 / a)
    return float(min(1.0, np.exp(np.min(log_d))))


def cks_total_mu(epsilon: float, delta: float, eps0: float, delta1: float) -> float:
    """The seed's accounting: ``eps0``-DP as ``eps0^2/2``-zCDP (Bun & Steinke 2016,
    Proposition 3.3), Gaussians as ``mu^2/2``-zCDP, total ``rho`` converted by :func:`cks_delta`
    at ``delta - delta1``; the largest ``mu`` (0 if none)."""
    budget = delta - delta1
    if cks_delta(eps0 * eps0 / 2.0, epsilon) > budget:
        return 0.0
    low, high = 0.0, 2.0 * epsilon + 1.0
    for _ in range(60):
        mid = 0.5 * (low + high)
        if cks_delta((eps0 * eps0 + mid * mid) / 2.0, epsilon) <= budget:
            low = mid
        else:
            high = mid
    return low
