"""Derivation F3: the exact composition accountant and friendly_aggregate's Gaussian-test split.

The accountant (``service.mechanisms.composition``) uses closed-form Gaussian profiles and a
Riemann sum over the Laplace loss. The tests check it against an independent computation: the
privacy-loss distributions of the three steps discretised on a grid with every loss rounded
*up* (an upper bound on ``delta``), and the Gaussian's loss ``N(mu^2/2, mu^2)`` summed bin by
bin instead of through ``Phi``. Then every F3 split the service can choose is checked to cost at
most the requested ``(epsilon, delta)`` by that independent computation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ndtr

from service.mechanisms import friendly_aggregate as fa
from service.mechanisms import friendly_aggregators as fagg
from service.mechanisms import friendly_ptr as fp
from service.mechanisms.composition import (
    composed_delta,
    gaussian_profile,
    gaussian_total_mu,
    largest_mean_mu,
)
from service.mechanisms.noise import analytic_gaussian_sigma, laplace
from tests.mechanisms.privacy_audit import audit

#: Loss grid of the independent computation.
STEP = 2e-5


def gaussian_loss_tail(mu: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The Gaussian pair's privacy loss ``L ~ N(mu^2/2, mu^2)`` under ``P``, in bins of
    ``STEP`` with each bin's mass put at its upper end; returns the upper ends, the tail sums
    ``S0(i) = sum_{j >= i} m_j`` and ``S1(i) = sum_{j >= i} m_j e^{-L_j}`` (summed from the
    smallest terms), and the mass above the grid (counted as loss ``+inf``)."""
    centre, spread = mu * mu / 2, mu
    low, high = centre - 14 * spread, centre + 14 * spread
    edges = np.arange(low, high + STEP, STEP)
    cdf = ndtr((edges - centre) / spread)
    mass = np.diff(cdf)
    upper = edges[1:]
    s0 = np.cumsum(mass[::-1])[::-1]
    s1 = np.cumsum((mass * np.exp(-upper))[::-1])[::-1]
    return upper, s0, s1, float(1.0 - cdf[-1])


def independent_delta(epsilon: float, eps0: float, eps1: float, mu: float) -> float:
    """Upper bound on ``delta(epsilon)`` of RR(eps0) x Laplace(eps1) x Gaussian(mu): sum over
    the first two steps' (rounded-up) losses ``l`` of ``E[(1 - e^{eps - l - L})_+]`` over the
    discretised Gaussian loss ``L``."""
    atoms: list[tuple[float, float]] = []
    rr = [(1 / (1 + math.exp(-eps0)), eps0), (1 / (1 + math.exp(eps0)), -eps0)] if eps0 else []
    lap: list[tuple[float, float]] = [(1.0, 0.0)]
    if eps1 > 0:
        # x ~ Lap(0, 1/eps1) against Lap(1, 1/eps1): loss eps1 for x <= 0, -eps1 for x >= 1,
        # eps1 (1 - 2x) between; bins of x with the loss at the bin's left end (its largest).
        lap = [(0.5, eps1), (0.5 * math.exp(-eps1), -eps1)]
        bins = max(200, int(2 * eps1 / STEP))
        x = np.linspace(0.0, 1.0, bins + 1)
        masses = 0.5 * (np.exp(-eps1 * x[:-1]) - np.exp(-eps1 * x[1:]))
        lap += list(zip(masses.tolist(), (eps1 * (1 - 2 * x[:-1])).tolist(), strict=True))
    for p0, l0 in rr or [(1.0, 0.0)]:
        for p1, l1 in lap:
            atoms.append((p0 * p1, l0 + l1))
    upper, s0, s1, beyond = gaussian_loss_tail(mu)
    total = beyond
    for prob, loss in atoms:
        threshold = epsilon - loss  # contributes where L > threshold
        i = int(np.searchsorted(upper, threshold, side="right"))
        if i < upper.size:
            total += prob * (s0[i] - math.exp(threshold) * s1[i])
    return total


@pytest.mark.parametrize(
    ("epsilon", "eps0", "eps1", "mu"),
    [(1.0, 0.25, 0.25, 0.13), (0.1, 0.025, 0.05, 0.015), (3.0, 0.75, 0.0, 0.5), (1.0, 0, 0.5, 0.1)],
)
def test_composed_delta_matches_an_independent_discretisation(
    epsilon: float, eps0: float, eps1: float, mu: float
) -> None:
    exact = composed_delta(epsilon, eps0, eps1, mu)
    other = independent_delta(epsilon, eps0, eps1, mu)
    assert exact > 0
    # the grid rounds losses up: an upper bound, within 2% of the accountant's value
    assert exact <= other * (1 + 1e-6)
    assert other <= exact * 1.02


def test_gaussian_profile_alone_is_balle_wang() -> None:
    for eps, delta in ((0.5, 5e-7), (2.0, 1e-5)):
        sigma = analytic_gaussian_sigma(1.0, eps, delta)
        assert gaussian_profile(1 / sigma, eps) == pytest.approx(delta, rel=1e-6)
        assert composed_delta(eps, 0.0, 0.0, 1 / sigma) == pytest.approx(delta, rel=1e-6)


def test_basic_split_is_within_budget_by_the_exact_accountant() -> None:
    """Sanity check of the direction: today's shares, composed exactly, cost less than the
    basic sum says (so the tight-Laplace row of F3's table is a free, small gain)."""
    for eps in (0.1, 1.0, 3.0):
        split = fa.standard_split(eps, 1e-6, radius_given=False)
        mu2 = 1 / analytic_gaussian_sigma(1.0, split.eps2, split.delta2)
        spent = split.delta1 + composed_delta(eps, split.eps0, split.eps1, mu2)
        assert spent < 1e-6
        tight = largest_mean_mu(eps, 1e-6, split.eps0, split.eps1, split.delta1)
        assert 1.04 < tight / mu2 < 1.15


@pytest.mark.parametrize("eps", [0.1, 0.3, 1.0, 3.0])
@pytest.mark.parametrize("given", [False, True])
def test_every_gdp_split_costs_at_most_the_request(eps: float, given: bool) -> None:
    """The calibration test of F3: for each fraction of the grid, ``delta1`` plus the
    independent ``delta`` of RR(eps0) x N(ptr_mu) x N(mean_mu) at ``eps`` is at most the
    requested ``delta`` (the discretisation's excess aside), and tight."""
    delta = 1e-6
    for fraction in (fa.GDP_FRACTIONS[0], 0.5, fa.GDP_FRACTIONS[-1]):
        split = fa.gdp_split(eps, delta, given, fraction)
        assert split.eps0 == (0.0 if given else eps / 4) and split.delta1 == delta / 2
        mu = math.hypot(split.ptr_mu, split.mean_mu)
        assert mu == pytest.approx(gaussian_total_mu(eps, delta, split.eps0, delta / 2))
        # Gaussian steps compose to sqrt(mu1^2 + mu2^2): one Gaussian of that mu
        spent = split.delta1 + independent_delta(eps, split.eps0, 0.0, mu)
        assert spent <= delta * 1.01
        assert spent >= delta * 0.97
        exact = split.delta1 + composed_delta(eps, split.eps0, 0.0, mu)
        assert exact <= delta


def test_gaussian_test_shift_leaves_delta1_above() -> None:
    split = fa.gdp_split(1.0, 1e-6, False, 0.5)
    sens = fa.weight_sensitivity(400, fa.ramp_width(400))
    scale = fa.split_noise_scale(split, sens)
    assert scale == pytest.approx(sens / split.ptr_mu)
    # P[W + N(0, scale^2) - shift > W] = delta1
    assert float(ndtr(-fa.split_shift(split, sens) / scale)) == pytest.approx(5e-7, rel=1e-9)


def test_split_helpers_reproduce_the_basic_arithmetic() -> None:
    """With a BudgetSplit the new helpers are the old functions (so wiring them into
    friendly_aggregate() changes nothing until ACCOUNTING is flipped), draws included."""
    for t in (90, 400, 1666):
        split = fa.budget_split(0.7, 1e-6, False, t=t)
        sens = fa.weight_sensitivity(t, fa.ramp_width(t))
        assert fa.split_shift(split, sens) == fa.weight_shift(sens, split.eps1, split.delta1)
        assert fa.split_margin(t, split, 3.0) == fa.ptr_margin(t, split.eps1, split.delta1, 3.0)
        assert fa.split_no_result_if_agreeing(t, split) == fa.ptr_no_result_if_agreeing(
            t, split.eps1, split.delta1
        )
        assert fa.split_search_threshold(t, split) == fa.radius_search_threshold(
            t, split.eps1, split.delta1
        )
        assert fa.split_mean_sigma(0.3, split) == analytic_gaussian_sigma(
            0.3, split.eps2, split.delta2
        )
        assert fa.release_split(0.7, 1e-6, False, t=t, accounting="basic") == split
        old_rng, new_rng = np.random.default_rng(t), np.random.default_rng(t)
        noisy = 250.0 + float(laplace(fa.weight_noise_scale(sens, split.eps1), old_rng))
        old = fa.weight_lower_bound(noisy, sens, split.eps1, split.delta1)
        assert fa.noisy_weight_lower_bound(250.0, sens, split, new_rng) == old


def test_gdp_t_min_is_the_boundary_and_the_rule_is_public() -> None:
    for eps in (0.1, 1.0):
        gdp_min = fa.gdp_t_min(eps, 1e-6, False)
        top = fa.gdp_split(eps, 1e-6, False, fa.GDP_FRACTIONS[-1])
        assert fa.split_margin(gdp_min, top) >= 0 > fa.split_margin(gdp_min - 1, top)
        # below it no fraction passes on agreeing subsets
        for fraction in fa.GDP_FRACTIONS:
            split = fa.gdp_split(eps, 1e-6, False, fraction)
            assert fa.agreeing_noise(gdp_min - 1, split) == math.inf
        t_min = fa.t_min_for(eps, 1e-6, False, accounting="gdp")
        assert t_min == min(gdp_min, fa.t_min_for(eps, 1e-6, False, accounting="basic"))
        # from t_min on, the split release_split picks can pass on agreeing subsets
        for t in range(t_min, t_min + 200):
            chosen = fa.release_split(eps, 1e-6, False, t=t, accounting="gdp")
            assert fa.split_margin(t, chosen) >= 0
        comfortable = fa.t_comfortable_for(eps, 1e-6, False, accounting="gdp")
        if comfortable < fa.t_comfortable_for(eps, 1e-6, False, accounting="basic"):
            assert fa.split_no_result_if_agreeing(comfortable, top) <= fa.COMFORTABLE_NO_RESULT
    assert fa.t_min_for(0.1, 1e-6, False, accounting="gdp") == 721  # basic: 834
    assert fa.t_min_for(1.0, 1e-6, False, accounting="gdp") == 88  # gdp alone: 89


def test_gdp_fraction_minimises_the_release_noise() -> None:
    chosen = fa.gdp_budget_split(0.1, 1e-6, False, t=1666)
    best = fa.release_noise(1666, chosen, False)
    assert math.isfinite(best)
    for fraction in fa.GDP_FRACTIONS:
        other = fa.gdp_split(0.1, 1e-6, False, fraction)
        assert best <= fa.release_noise(1666, other, False)
    # release_noise caps the no-result probability at the typical weight
    assert fa.no_result_at(1666, chosen, fa.release_weight(1666, chosen, False)) <= (
        fa.COMFORTABLE_NO_RESULT
    )
    # with a radius given every subset agrees: the weight is t
    assert fa.release_weight(400, chosen, True) == 400.0


@pytest.mark.parametrize(
    ("eps", "t", "expected"),
    [
        (0.1, 1666, "gdp"),
        (0.3, 1666, "gdp"),
        (1.0, 1666, "gdp"),
        (3.0, 1666, "gdp"),
        (3.0, 166, "gdp"),
        # n = 5,000, eps = 1: the Gaussian test's shift is a large part of t = 166 and the
        # search stops near 0.75 t, where the Gaussian test would fail often: basic stays
        (1.0, 166, "basic"),
    ],
)
def test_release_split_picks_gdp_where_it_wins(eps: float, t: int, expected: str) -> None:
    """F3's table: where the rule picks the Gaussian test, the mean's sigma is at least 1.2x
    smaller than the basic accounting's, on all-agreeing subsets and at the search threshold."""
    basic = fa.release_split(eps, 1e-6, False, t=t, accounting="basic")
    chosen = fa.release_split(eps, 1e-6, False, t=t, accounting="gdp")
    assert ("gdp" if isinstance(chosen, fa.GdpSplit) else "basic") == expected
    if expected == "gdp":
        assert fa.agreeing_noise(t, basic) / fa.agreeing_noise(t, chosen) >= 1.2
        assert fa.release_noise(t, basic, False) / fa.release_noise(t, chosen, False) >= 1.2
    else:
        assert chosen == basic


def test_releases_use_f3_where_its_rule_prefers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default accounting is F3's rule, and a release with a Gaussian-test split draws the
    Gaussian test (not the Laplace one) through the split-aware helpers."""
    assert fp.ACCOUNTING == "gdp"
    split = fa.release_split(0.1, 1e-6, False, t=1666)
    assert isinstance(split, fa.GdpSplit)
    seen: list[object] = []
    real = fa.noisy_weight_lower_bound

    def spy(total: float, sens: float, used: fa.AnySplit, rng: np.random.Generator) -> float:
        seen.append(used)
        return real(total, sens, used, rng)

    monkeypatch.setattr(fagg, "noisy_weight_lower_bound", spy)
    rng = np.random.default_rng(5)
    data = rng.standard_normal((2_000, 6)) / 6.0
    fa.friendly_aggregate(data, 1, 2.0, 1e-6, np.random.default_rng(6), t=200)
    assert len(seen) == 1
    assert seen[0] == fa.release_split(2.0, 1e-6, False, t=200)


# ---------------------------------------------------------------------------------------------
# Empirical audit of the Gaussian test (the step F3 changes), on a pair that straddles its
# threshold by Delta_W/2 on each side: W and W - Delta_W (derivation F1's tight pair).

GAUSS_EPS, GAUSS_DELTA, GAUSS_T = 1.0, 1e-3, 101


def _gaussian_test_runs(divisor: float, runs: int, seed: int) -> float:
    """Audit the event "the test passes" (``W_low >= Delta_W + 1``); ``divisor`` divides the
    test's noise (negative control) while its threshold ``floor + shift`` stays the real one."""
    real = fa.gdp_split(GAUSS_EPS, GAUSS_DELTA, True, fa.GDP_FRACTIONS[-1])
    split = fa.GdpSplit(real.eps0, real.delta1, real.ptr_mu * divisor, real.mean_mu, real.fraction)
    sens = fa.weight_sensitivity(GAUSS_T, fa.ramp_width(GAUSS_T))
    needed = fa.weight_floor(sens) + fa.split_shift(real, sens)
    totals = (needed + sens / 2, needed - sens / 2)

    def test_passes(which: np.ndarray, rng: np.random.Generator) -> bool:
        w_low = fa.noisy_weight_lower_bound(totals[int(which[0])], sens, split, rng)
        # divisor 1: exactly the release's decision w_low >= floor
        return w_low + fa.split_shift(split, sens) >= needed

    return audit(
        test_passes, np.array([0]), np.array([1]), bool, runs, GAUSS_DELTA, seed=seed
    ).eps_lower_bound


def test_gaussian_test_audit_passes_and_its_negative_control_fails() -> None:
    assert _gaussian_test_runs(1.0, runs=3000, seed=30) <= GAUSS_EPS
    assert _gaussian_test_runs(10.0, runs=3000, seed=31) > GAUSS_EPS
