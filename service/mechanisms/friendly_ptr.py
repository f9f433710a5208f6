"""The budget shares and the propose-test-release step of M6 ``friendly_aggregate``.

ALGORITHMS.md M6: the test releases ``W_low``, a lower bound on ``W`` (``friendly_weights``), and
ends in no result when ``W_low < Delta_W + 1``; the shares ``(eps0, eps1, eps2, delta1, delta2)``
of the request are a public function of ``(t, eps, delta, radius given)``
(:func:`release_split`): M6's split, or near ``t_min`` one giving the test ``eps/2`` and the mean
``eps/4`` (derivation F2); derivation F3's Gaussian test where a public rule prefers it
(:func:`prefer_gdp`). Also the least ``t`` whose test can pass (:func:`t_min_for`).

Privacy argument: ``W`` has sensitivity ``Delta_W``. Basic accounting: ``W_hat = W +
Lap(Delta_W/eps1)`` is ``(eps1, 0)``-DP and ``W_low = W_hat - (Delta_W/eps1) ln(1/(2 delta1))`` is
below ``W`` except with probability ``delta1``; on that good event the mean's sensitivity
``D = r (4(t-1)/b + 6)/W_low`` bounds ``r (4(t-1)/b + 6)/W`` on both neighbours (the floor
``Delta_W + 1`` keeps ``W > 0`` on both sides), and Gaussian noise for ``D`` is
``(eps2, delta2)``-DP, exactly as M2. With the search's ``(eps0, 0)`` the release is
``(eps0+eps1+eps2, delta1+delta2) = (eps, delta)`` by sequential composition, for any public
shares. F3: ``W + N(0, (Delta_W/mu1)^2)`` shifted by ``(Delta_W/mu1) z_{delta1}``, accounting the
search (pure ``eps0``), the test (``mu1``-GDP) and the mean (``mu2``-GDP) by their exact
composition (:mod:`service.mechanisms.composition`) plus ``delta1`` for the test's failure event:
still exactly within ``(eps, delta)``. Every function here except :func:`noisy_weight_lower_bound`
(the test's one draw) is a public function of ``t`` and the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.special import ndtr, ndtri

from service.mechanisms.base import (
    ApproximateStep,
    GaussianStep,
    PrivacyStep,
    PureStep,
    gaussian_test_event_delta,
    laplace_test_step,
)
from service.mechanisms.composition import gaussian_total_mu
from service.mechanisms.friendly_radius import THRESHOLD_FRACTION
from service.mechanisms.friendly_weights import mean_sensitivity, ramp_width, weight_sensitivity
from service.mechanisms.noise import analytic_gaussian_sigma, laplace

#: ``basic``: sequential composition of the three steps' ``(eps_i, delta_i)`` with a Laplace test
#: (M6, derivations F1, F2). ``gdp``: a Gaussian test and the exact composition (derivation F3).
Accounting = Literal["basic", "gdp"]
#: The accounting releases use: ``gdp``, i.e. :func:`release_split` picks F3's Gaussian-test
#: split where a public rule says its mean's noise is smaller, else the basic one (derivation F3).
ACCOUNTING: Accounting = "gdp"

#: The preview reports the smallest ``t`` whose all-agreeing total weight clears the PTR floor
#: with this many Laplace scales of the noisy weight to spare (then a charged no-result on data
#: whose subsets all agree has probability ``<= exp(-3)/2 ~ 2.5%``).
SPARE_NOISE_SCALES = 3.0


@dataclass(frozen=True)
class BudgetSplit:
    """Fixed fractions of the request's ``(epsilon, delta)``."""

    eps0: float
    eps1: float
    eps2: float
    delta1: float
    delta2: float


# Calibration (each formula of ALGORITHMS.md M6 as a function, so tests can check it)


def standard_split(epsilon: float, delta: float, radius_given: bool) -> BudgetSplit:
    """ALGORITHMS.md M6: ``eps0 = eps1 = eps/4, eps2 = eps/2``; ``eps0 = 0, eps1 = eps2 = eps/2``
    with a radius; ``delta1 = delta2 = delta/2``."""
    if radius_given:
        return BudgetSplit(0.0, epsilon / 2, epsilon / 2, delta / 2, delta / 2)
    return BudgetSplit(epsilon / 4, epsilon / 4, epsilon / 2, delta / 2, delta / 2)


def ptr_heavy_split(epsilon: float, delta: float, radius_given: bool) -> BudgetSplit:
    """The split near ``t_min``: ``eps/4`` moves from the Gaussian step to the test,
    ``eps0 = eps/4, eps1 = eps/2, eps2 = eps/4``; with a radius ``eps1 = 3 eps/4, eps2 = eps/4``;
    ``delta1 = delta2 = delta/2``."""
    if radius_given:
        return BudgetSplit(0.0, 3 * epsilon / 4, epsilon / 4, delta / 2, delta / 2)
    return BudgetSplit(epsilon / 4, epsilon / 2, epsilon / 4, delta / 2, delta / 2)


def budget_split(epsilon: float, delta: float, radius_given: bool, *, t: int | None) -> BudgetSplit:
    """The split for ``t`` subsets, a public function of ``(t, epsilon, delta, radius_given)``.

    :func:`ptr_heavy_split` when ``t`` is below the ``t`` from which :func:`standard_split`'s
    test clears the floor on all-agreeing subsets with :data:`SPARE_NOISE_SCALES` Laplace
    scales to spare, or when its mean's noise on all-agreeing subsets is smaller
    (:func:`agreeing_noise`); else the standard split (derivation F2 in
    ``docs/mechanisms.md``). Near ``t_min`` the standard test fails about half the time even
    when every subset agrees, and when it passes ``W_low`` is small, so the mean's noise is
    large; doubling ``eps1`` halves the test's shift, which both makes the test pass and
    raises ``W_low`` by more than the halved ``eps2`` costs. Either way it is the sequential
    composition of the same three steps with public shares summing to ``(epsilon, delta)``.
    ``t = None``: the standard split.
    """
    standard = standard_split(epsilon, delta, radius_given)
    if t is None:
        return standard
    heavy = ptr_heavy_split(epsilon, delta, radius_given)
    if t < comfortable_t(standard.eps1, standard.delta1):
        return heavy
    if agreeing_noise(t, heavy) < agreeing_noise(t, standard):
        return heavy
    return standard


def agreeing_noise(t: int, split: AnySplit) -> float:
    """The mean's Gaussian ``sigma`` per unit radius when every subset agrees and the test's
    noise is zero: ``D = (4(t-1)/b + 6)/W_low`` at ``W_low = t - shift`` (the median
    ``W_low``), ``inf`` when that fails the floor. Public (``t`` and the shares only); the
    rounding allowances of :func:`calibrated_sensitivity` are left out (tiny, and the same for
    every split). Either accounting (:func:`split_shift`, :func:`split_mean_sigma`)."""
    b = ramp_width(t)
    sens = weight_sensitivity(t, b)
    w_low = float(t) - split_shift(split, sens)
    if w_low < weight_floor(sens):
        return math.inf
    return split_mean_sigma(mean_sensitivity(1.0, t, b, w_low), split)


def t_min_for(
    epsilon: float, delta: float, radius_given: bool, *, accounting: Accounting | None = None
) -> int:
    """``t_min``: the least ``t`` whose test can pass on all-agreeing subsets under
    :func:`release_split`. Basic accounting: below the standard split's ``comfortable_t`` the
    split is the test-heavy one, whose ``t_min`` is smaller, and feasibility is monotone in
    ``t`` within each split (and certain above the switch), so ``t_min`` is the test-heavy
    split's. ``gdp``: the smaller of that and :func:`gdp_t_min` (the least ``t`` feasible with
    the largest Gaussian-test share): between the two only one split can pass, and
    :func:`prefer_gdp` picks it."""
    heavy = ptr_heavy_split(epsilon, delta, radius_given)
    basic = min_feasible_t(heavy.eps1, heavy.delta1)
    if resolve_accounting(accounting) == "gdp":
        return min(basic, gdp_t_min(epsilon, delta, radius_given))
    return basic


def t_comfortable_for(
    epsilon: float, delta: float, radius_given: bool, *, accounting: Accounting | None = None
) -> int:
    """The least ``t`` from which the test has :data:`SPARE_NOISE_SCALES` to spare under
    :func:`release_split` (basic: the test-heavy split's ``comfortable_t``; from the switch on
    the standard split has them by construction; ``gdp``: the smaller of that and F3's)."""
    heavy = ptr_heavy_split(epsilon, delta, radius_given)
    basic = comfortable_t(heavy.eps1, heavy.delta1)
    if resolve_accounting(accounting) == "gdp":
        return min(basic, gdp_t_min(epsilon, delta, radius_given, spare=GDP_SPARE_SCALES))
    return basic


def weight_noise_scale(sens: float, eps1: float) -> float:
    """Laplace scale ``Delta_W/eps1`` of the noisy total weight."""
    return sens / eps1


def weight_shift(sens: float, eps1: float, delta1: float) -> float:
    """``(Delta_W/eps1) ln(1/(2 delta1))``: subtracted so that ``P[W_low > W] = delta1``."""
    return weight_noise_scale(sens, eps1) * math.log(1.0 / (2.0 * delta1))


def weight_lower_bound(noisy_weight: float, sens: float, eps1: float, delta1: float) -> float:
    """``W_low = W_hat - (Delta_W/eps1) ln(1/(2 delta1))``, so ``P[W_low > W] = delta1``."""
    return noisy_weight - weight_shift(sens, eps1, delta1)


def weight_floor(sens: float) -> float:
    """PTR floor ``Delta_W + 1``: above it ``W > 0`` on both neighbours in the good event."""
    return sens + 1.0


def ptr_margin(t: int, eps1: float, delta1: float, spare: float = 0.0) -> float:
    """``t - spare Delta_W/eps1 - (Delta_W/eps1) ln(1/(2 delta1)) - (Delta_W + 1)``: how far
    all-ones weights (``W = t``), lowered by ``spare`` Laplace scales, clear the PTR floor.

    Increasing in ``t`` (``Delta_W = 1 + 2(t-1)/(t-2)`` decreases), so the boundary can be found
    by bisection. ``-inf`` for ``t < 3``.
    """
    if t < 3:
        return -math.inf
    sens = weight_sensitivity(t, ramp_width(t))
    shifted = float(t) - spare * weight_noise_scale(sens, eps1)
    return weight_lower_bound(shifted, sens, eps1, delta1) - weight_floor(sens)


def ptr_feasible(t: int, eps1: float, delta1: float) -> bool:
    """Whether all-ones weights (``W = t``, noise-free) would clear the PTR floor."""
    return ptr_margin(t, eps1, delta1) >= 0.0


def _smallest_t(holds: Callable[[int], bool]) -> int:
    """Smallest ``t >= 3`` with ``holds(t)``, for a predicate monotone in ``t`` (doubling, then
    bisection on the exact condition)."""
    high = 3
    while not holds(high):
        high *= 2
    low = high // 2  # holds(low) is false (or low < 3)
    while high - low > 1:
        mid = (low + high) // 2
        if mid >= 3 and holds(mid):
            high = mid
        else:
            low = mid
    return high


def min_feasible_t(eps1: float, delta1: float) -> int:
    """``t_min``: smallest ``t`` for which :func:`ptr_feasible` holds, by bisection on the exact
    floor condition ``t - (Delta_W/eps1) ln(1/(2 delta1)) >= Delta_W + 1``."""
    return _smallest_t(lambda t: ptr_feasible(t, eps1, delta1))


def comfortable_t(eps1: float, delta1: float, spare: float = SPARE_NOISE_SCALES) -> int:
    """Smallest ``t`` whose all-ones weights clear the PTR floor with ``spare`` Laplace scales
    of the noisy weight to spare: on data whose subsets all agree, PTR then fails with
    probability ``<= exp(-spare)/2``."""
    return _smallest_t(lambda t: ptr_margin(t, eps1, delta1, spare) >= 0.0)


def ptr_no_result_if_agreeing(t: int, eps1: float, delta1: float) -> float:
    """Probability that PTR ends in no result when every subset agrees (``W = t``):
    ``P[Lap(scale) < -margin]`` for the margin of :func:`ptr_margin` and the scale
    ``Delta_W/eps1``, i.e. ``exp(-margin/scale)/2`` when the margin is positive."""
    margin = ptr_margin(t, eps1, delta1)
    if margin == -math.inf:
        return 1.0
    scale = weight_noise_scale(weight_sensitivity(t, ramp_width(t)), eps1)
    if margin >= 0:
        return 0.5 * math.exp(-margin / scale)
    return 1.0 - 0.5 * math.exp(margin / scale)


def radius_search_threshold(t: int, eps1: float, delta1: float) -> float:
    """``max(0.75 t, Delta_W + 1 + (Delta_W/eps1) ln(1/(2 delta1)))``: the search's threshold.

    The second term is the total weight the PTR test needs (its floor plus its shift); a radius
    with less weight is a certain no-result, so stopping there wastes the release. It matters
    only near ``t_min`` (small epsilon), where ``0.75 t`` is below it. A public function of
    ``t`` and the budget, so AboveThreshold's guarantee is unchanged.
    """
    sens = weight_sensitivity(t, ramp_width(t))
    needed = weight_floor(sens) + weight_shift(sens, eps1, delta1)
    return max(THRESHOLD_FRACTION * t, needed)


# ---------------------------------------------------------------------------------------------
# Derivation F3: a Gaussian test and the exact composition of the three steps
#
# Basic accounting (M6, F1, F2) sums (eps0, 0) + (eps1, delta1) + (eps2, delta2). "gdp" keeps
# AboveThreshold (eps0-DP), puts Gaussian noise on W (mu1-GDP, failure delta1 by the Gaussian
# tail) and on the mean (mu2-GDP), and computes the exact privacy profile of the composition
# (service.mechanisms.composition): mu1^2 + mu2^2 = mu^2 with mu the largest for which
# randomized response (eps0) composed with N(0,1) vs N(mu,1) is (epsilon, delta - delta1)-DP.
# The body of friendly_aggregate() calls these through release_split, noisy_weight_lower_bound,
# split_search_threshold and split_mean_sigma; each reproduces the basic accounting's
# arithmetic (and draws) exactly for a BudgetSplit.


@dataclass(frozen=True)
class GdpSplit:
    """Derivation F3's shares: ``eps0`` for the search (pure), a Gaussian test of ``ptr_mu``
    (noise ``Delta_W/ptr_mu``) failing with probability ``delta1``, and a Gaussian mean of
    ``mean_mu`` (noise ``D/mean_mu``); ``ptr_mu^2 + mean_mu^2 = mu^2``
    (:func:`~service.mechanisms.composition.gaussian_total_mu`), ``fraction = ptr_mu^2/mu^2``."""

    eps0: float
    delta1: float
    ptr_mu: float
    mean_mu: float
    fraction: float


AnySplit = BudgetSplit | GdpSplit

#: The test's share ``mu1^2/mu^2`` is chosen from these (a public grid).
GDP_FRACTIONS: tuple[float, ...] = tuple(i / 20 for i in range(1, 20))
#: The no-result probability on all-agreeing subsets that the basic accounting's
#: ``t_comfortable`` allows (``exp(-3)/2 ~ 2.5%``, three Laplace scales to spare); F3 chooses
#: its fraction among those within it.
COMFORTABLE_NO_RESULT = 0.5 * math.exp(-SPARE_NOISE_SCALES)
#: The Gaussian scales to spare for the same probability (``Phi^{-1}(1 - exp(-3)/2) ~ 1.96``).
GDP_SPARE_SCALES = float(-ndtri(COMFORTABLE_NO_RESULT))


def resolve_accounting(accounting: Accounting | None) -> Accounting:
    """``accounting``, or the module default :data:`ACCOUNTING` when ``None``."""
    return ACCOUNTING if accounting is None else accounting


def gdp_split(epsilon: float, delta: float, radius_given: bool, fraction: float) -> GdpSplit:
    """F3's split with the test's share ``fraction`` of ``mu^2``: ``eps0 = eps/4`` (0 with a
    radius, as in the basic splits), ``delta1 = delta/2``, ``mu`` the largest that composes
    with ``eps0`` to ``(epsilon, delta - delta1)`` exactly."""
    eps0 = 0.0 if radius_given else epsilon / 4
    delta1 = delta / 2
    mu = gaussian_total_mu(epsilon, delta, eps0, delta1)
    return GdpSplit(
        eps0, delta1, mu * math.sqrt(fraction), mu * math.sqrt(1.0 - fraction), fraction
    )


def release_weight(t: int, split: AnySplit, radius_given: bool) -> float:
    """The total weight a release on data near a subspace typically tests: ``t`` with a given
    radius (every subset agrees), else ``min(t, split_search_threshold)``: the search stops at
    the first radius whose weight reaches about its threshold, which can be well below ``t``
    when ``t`` is small (``m = n/t`` rows give rougher subset estimates). Public."""
    if radius_given:
        return float(t)
    return min(float(t), split_search_threshold(t, split))


def no_result_at(t: int, split: AnySplit, weight: float) -> float:
    """Probability that the test ends in no result at total weight ``weight``."""
    if t < 3:
        return 1.0
    sens = weight_sensitivity(t, ramp_width(t))
    margin = weight - split_shift(split, sens) - weight_floor(sens)
    scale = split_noise_scale(split, sens)
    if isinstance(split, GdpSplit):
        return float(ndtr(-margin / scale))
    if margin >= 0:
        return 0.5 * math.exp(-margin / scale)
    return 1.0 - 0.5 * math.exp(margin / scale)


def release_noise(t: int, split: AnySplit, radius_given: bool) -> float:
    """The mean's ``sigma`` per unit radius at :func:`release_weight` with the test's noise at
    zero; ``inf`` when the test there fails the floor or fails with probability above
    :data:`COMFORTABLE_NO_RESULT`. The criterion of derivation F3's choices (public)."""
    if t < 3:
        return math.inf
    weight = release_weight(t, split, radius_given)
    if no_result_at(t, split, weight) > COMFORTABLE_NO_RESULT:
        return math.inf
    b = ramp_width(t)
    sens = weight_sensitivity(t, b)
    w_low = weight - split_shift(split, sens)
    if w_low < weight_floor(sens):
        return math.inf
    return split_mean_sigma(mean_sensitivity(1.0, t, b, w_low), split)


def gdp_budget_split(epsilon: float, delta: float, radius_given: bool, *, t: int) -> GdpSplit:
    """F3's Gaussian-test split for ``t`` subsets: the fraction of :data:`GDP_FRACTIONS` with
    the smallest :func:`release_noise`; when every fraction's is ``inf``, the one whose test
    fails least on all-agreeing subsets (the largest fraction). Public facts only."""
    best = gdp_split(epsilon, delta, radius_given, GDP_FRACTIONS[-1])
    best_noise = release_noise(t, best, radius_given)
    for fraction in GDP_FRACTIONS[:-1]:
        split = gdp_split(epsilon, delta, radius_given, fraction)
        noise = release_noise(t, split, radius_given)
        if noise < best_noise:
            best, best_noise = split, noise
    return best


def prefer_gdp(t: int, basic: BudgetSplit, gdp: GdpSplit, radius_given: bool) -> bool:
    """F3's public choice between the accountings: the Gaussian-test split when its
    :func:`release_noise` is smaller than the basic split's, or, when both are ``inf`` (near
    ``t_min``), when its test fails less often on all-agreeing subsets."""
    basic_noise = release_noise(t, basic, radius_given)
    gdp_noise = release_noise(t, gdp, radius_given)
    if math.isfinite(basic_noise) or math.isfinite(gdp_noise):
        return gdp_noise < basic_noise
    return split_no_result_if_agreeing(t, gdp) < split_no_result_if_agreeing(t, basic)


def gdp_t_min(epsilon: float, delta: float, radius_given: bool, spare: float = 0.0) -> int:
    """The least ``t`` whose all-agreeing weight ``t`` clears floor and shift (and ``spare``
    Gaussian noise scales) under F3's split with the largest test share; monotone in ``t``
    (``Delta_W`` decreases), so bisected. ``spare = 0`` gives F3's ``t_min`` (below it no
    fraction of the grid can pass), ``spare = GDP_SPARE_SCALES`` its ``t_comfortable``."""
    split = gdp_split(epsilon, delta, radius_given, GDP_FRACTIONS[-1])
    return _smallest_t(lambda t: split_margin(t, split, spare) >= 0.0)


def release_split(
    epsilon: float,
    delta: float,
    radius_given: bool,
    *,
    t: int | None,
    accounting: Accounting | None = None,
) -> AnySplit:
    """The split a release of ``t`` subsets uses. ``basic``: :func:`budget_split`. ``gdp``:
    :func:`gdp_budget_split` where :func:`prefer_gdp` says it is better, else
    :func:`budget_split` (both are within the request, so either may be chosen by a public
    rule). :data:`ACCOUNTING` unless ``accounting`` is given."""
    basic = budget_split(epsilon, delta, radius_given, t=t)
    if resolve_accounting(accounting) != "gdp" or t is None:
        return basic
    gdp = gdp_budget_split(epsilon, delta, radius_given, t=t)
    return gdp if prefer_gdp(t, basic, gdp, radius_given) else basic


def gaussian_tail_quantile(delta1: float) -> float:
    """``z`` with ``P[N(0,1) > z] = delta1`` (``-Phi^{-1}(delta1)``)."""
    return float(-ndtri(delta1))


def split_noise_scale(split: AnySplit, sens: float) -> float:
    """The test's noise scale: Laplace ``Delta_W/eps1`` or Gaussian ``Delta_W/ptr_mu``."""
    if isinstance(split, GdpSplit):
        return sens / split.ptr_mu
    return weight_noise_scale(sens, split.eps1)


def split_shift(split: AnySplit, sens: float) -> float:
    """Subtracted from the noisy weight so that ``P[W_low > W] = delta1``: Laplace
    ``(Delta_W/eps1) ln(1/(2 delta1))``; Gaussian ``(Delta_W/ptr_mu) z`` with
    ``P[N(0,1) > z] = delta1``."""
    if isinstance(split, GdpSplit):
        return split_noise_scale(split, sens) * gaussian_tail_quantile(split.delta1)
    return weight_shift(sens, split.eps1, split.delta1)


def split_margin(t: int, split: AnySplit, spare: float = 0.0) -> float:
    """:func:`ptr_margin` for either accounting: ``t - spare scale - shift - (Delta_W + 1)``."""
    if t < 3:
        return -math.inf
    sens = weight_sensitivity(t, ramp_width(t))
    scale = split_noise_scale(split, sens)
    return float(t) - spare * scale - split_shift(split, sens) - weight_floor(sens)


def split_no_result_if_agreeing(t: int, split: AnySplit) -> float:
    """Probability that the test ends in no result when every subset agrees (``W = t``):
    :func:`ptr_no_result_if_agreeing`, or ``Phi(-margin/scale)`` for the Gaussian test."""
    if not isinstance(split, GdpSplit):
        return ptr_no_result_if_agreeing(t, split.eps1, split.delta1)
    margin = split_margin(t, split)
    if margin == -math.inf:
        return 1.0
    scale = split_noise_scale(split, weight_sensitivity(t, ramp_width(t)))
    return float(ndtr(-margin / scale))


def split_search_threshold(t: int, split: AnySplit) -> float:
    """:func:`radius_search_threshold` for either accounting:
    ``max(0.75 t, Delta_W + 1 + shift)``."""
    sens = weight_sensitivity(t, ramp_width(t))
    return max(THRESHOLD_FRACTION * t, weight_floor(sens) + split_shift(split, sens))


def split_mean_sigma(sens_mean: float, split: AnySplit) -> float:
    """The mean's noise: analytic Gaussian for ``(eps2, delta2)`` (basic) or ``D/mean_mu``
    (F3: ``mean_mu``-GDP for sensitivity ``D``)."""
    if isinstance(split, GdpSplit):
        return sens_mean / split.mean_mu
    return analytic_gaussian_sigma(sens_mean, split.eps2, split.delta2)


def noisy_weight_lower_bound(
    total: float, sens: float, split: AnySplit, rng: np.random.Generator
) -> float:
    """The test's ``W_low = W + noise - shift``: Laplace noise for a :class:`BudgetSplit` (the
    same draw and arithmetic as the basic code), ``N(0, (Delta_W/ptr_mu)^2)`` for F3."""
    if isinstance(split, GdpSplit):
        scale = split_noise_scale(split, sens)
        return total + float(rng.normal(0.0, scale)) - split_shift(split, sens)
    noisy_total = total + float(laplace(weight_noise_scale(sens, split.eps1), rng))
    return weight_lower_bound(noisy_total, sens, split.eps1, split.delta1)


def split_steps(split: AnySplit) -> list[PrivacyStep] | None:
    """The release's steps at ``split`` (approximate zCDP, ALGORITHMS.md "Accounting across
    releases"): AboveThreshold ``eps0``-DP (pure, when the radius is searched); the test
    through the event ``W_low <= min(W, W')``, one set of outputs for both neighbours, on which
    the mean's sensitivity bound holds on both sides (basic split: the Laplace count,
    :func:`~service.mechanisms.base.laplace_test_step`, ``e^eps1 delta1``-approximately; F3: a
    Gaussian count of ``ptr_mu``, still ``ptr_mu^2/2`` on the event, which has mass
    :func:`~service.mechanisms.base.gaussian_test_event_delta`); the Gaussian mean of ``mu =
    D/sigma`` (basic: the analytic-Gaussian ratio at ``(eps2, delta2)``; F3: ``mean_mu``). Not
    purely Gaussian, so ``gaussian`` accounting refuses it. ``None`` (basic only) when the
    Laplace test has no profile."""
    steps: list[PrivacyStep] = [PureStep(split.eps0)] if split.eps0 > 0 else []
    if isinstance(split, GdpSplit):
        steps += [
            GaussianStep(1.0, 1.0 / split.ptr_mu),
            ApproximateStep(0.0, gaussian_test_event_delta(split.ptr_mu, split.delta1)),
            GaussianStep(1.0, 1.0 / split.mean_mu),
        ]
    else:
        test = laplace_test_step(split.eps1, split.delta1)
        if test is None:
            return None
        steps += [test, GaussianStep(1.0, split_mean_sigma(1.0, split))]
    return steps
