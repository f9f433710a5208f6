"""M6 ``friendly_aggregate``: random-partition sample-and-aggregate with friendly averaging.

Tsfadia, "On Differentially Private Subspace Estimation in a Distribution-Free Setting",
NeurIPS 2024, Section 4.1 with FriendlyCore averaging (seed 001); constants as in ALGORITHMS.md M6.

Privacy: a replaced row moves one of the ``t`` points ``y_j``. The radius comes from AboveThreshold
over ``W(r_i)`` (sensitivity ``Delta_W = 1 + (t-1)/b``), ``eps0``-DP. The weighted mean moves by at
most ``r (4(t-1)/b + 6)/W``; PTR releases ``W_low``, a lower bound on ``W`` except with probability
``delta1`` (``(eps1, 0)`` for the Laplace count), and Gaussian noise for ``D = r(4(t-1)/b+6)/W_low``
is ``(eps2, delta2)``-DP on the good event, exactly as M2. Total ``(eps0+eps1+eps2, delta1+delta2)``
``= (eps, delta)`` by sequential composition; everything after the noisy mean is post-processing.
The shares are a public function of ``(t, eps, delta, radius given)`` (:func:`release_split`):
M6's split, or near ``t_min`` one giving the test ``eps/2`` and the mean ``eps/4``; the
composition argument is the same for any public shares. Where a public rule prefers it
(:func:`prefer_gdp`), derivation F3 replaces the Laplace test by a Gaussian one
(``W + N(0, (Delta_W/mu1)^2)`` shifted by ``(Delta_W/mu1) z_{delta1}``) and accounts the search
(pure ``eps0``), the test (``mu1``-GDP) and the mean (``mu2``-GDP) by their exact composition
(:mod:`service.mechanisms.composition`), plus ``delta1`` for the test's failure event: still
exactly within ``(eps, delta)``.

What the guarantee assumes in floating point (and how the code meets it):

* One row moves one *computed* ``y_j``. Each subset's rows are scaled by a power of two of their
  own before its Gram matrix or SVD, and a subset LAPACK cannot decompose gets the fixed public
  basis ``e_1..e_k`` (``sample_aggregate``); so ``U_j`` and ``y_j`` depend on subset ``j`` alone,
  and no finite input raises (1e-300 to 1e300, zero and duplicate rows).
* ``|W - W'| <= Delta_W`` for the *computed* weights. Every distance is a per-pair formula: direct
  differences ``||y_j - y_l||`` (scipy's ``cdist``, in tiles and blocks; never centred on a global
  mean, never through a Gram matrix of all points), or for projections the ``k x k`` cross
  products of the pair; counts are integers and ``W`` is summed exactly rounded (``math.fsum``).
  One moved point changes only the distances of its own pairs, as in the real-number argument.
* The mean's sensitivity. Radii are floored at ``r_max 2^-26`` (projections ``r_max 2^-17``), far
  above the rounding of the distances, and the noise is calibrated for ``D`` at the radius
  inflated by a public rounding allowance (``2^-16`` relative; projections: an absolute bound on
  the distance rounding and the mean's rounding), see :func:`calibrated_sensitivity`.
* What remains: the samplers are the textbook ones on doubles (see ``noise.py``), so the result
  is the idealised guarantee for the computed points, not a proof for floating-point noise.
  With ``W = 0`` passing PTR (probability ``<= delta1``) the mean is the public zero vector, and a
  noisy estimate LAPACK cannot decompose gets the public fallback basis: both never raise.

Memory is bounded by :func:`friendly_memory_bytes` (a function of ``n, d, k`` and params): the
points ``t q d``, blocks of distances, and integer counts ``t x 27``, never a ``t x t`` matrix.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field
from scipy.spatial.distance import cdist
from scipy.special import ndtr, ndtri

from api_schemas.common import format_budget
from service.mechanisms.base import (
    ApproximateStep,
    GaussianStep,
    InvalidParameter,
    Mechanism,
    MechanismOutput,
    MechanismParams,
    Preview,
    PreviewValue,
    PrivacyStep,
    PublicContext,
    PureStep,
    ReleaseSpec,
    gaussian_test_event_delta,
    laplace_test_step,
)
from service.mechanisms.composition import gaussian_total_mu
from service.mechanisms.linalg import FloatArray, top_k_eigh
from service.mechanisms.noise import analytic_gaussian_sigma, laplace
from service.mechanisms.sample_aggregate import (
    allowance,
    embeddings_bytes,
    fallback_basis,
    partition_and_bases,
    power_of_two_exponents,
    reference_embeddings,
    reference_points,
    safe_top_right_singular_vectors,
    subset_bases_bytes,
)
from service.mechanisms.usefulness import WARNING_CODE

Aggregator = Literal["reference_points", "projection"]
#: ``basic``: sequential composition of the three steps' ``(eps_i, delta_i)`` with a Laplace test
#: (M6, derivations F1, F2). ``gdp``: a Gaussian test and the exact composition (derivation F3).
Accounting = Literal["basic", "gdp"]
#: The accounting releases use: ``gdp``, i.e. :func:`release_split` picks F3's Gaussian-test
#: split where a public rule says its mean's noise is smaller, else the basic one (derivation F3).
ACCOUNTING: Accounting = "gdp"

#: Default ``t`` keeps ``m = floor(n/t) >= ROWS_PER_DIMENSION * k`` rows per subset.
ROWS_PER_DIMENSION = 10
#: The preview reports the smallest ``t`` whose all-agreeing total weight clears the PTR floor
#: with this many Laplace scales of the noisy weight to spare (then a charged no-result on data
#: whose subsets all agree has probability ``<= exp(-3)/2 ~ 2.5%``).
SPARE_NOISE_SCALES = 3.0
#: Largest ``t`` accepted at all: the ``t x t`` distance matrix is 800 MB at 10,000.
MAX_T = 10_000
#: Largest ``t q d`` accepted (the stacked points, 8 bytes each: 2 GB).
MAX_POINT_FLOATS = 250_000_000
#: The projection aggregator averages ``d x d`` matrices: ``d^2`` memory, ``d^3`` for the final
#: eigendecomposition and ``d^2`` noise coordinates; above this ``d`` use ``reference_points``.
PROJECTION_MAX_D = 1000
#: Radii searched: ``r_i = r_max 2^{-i}`` for ``i = RADIUS_STEPS, ..., 1, 0`` (smallest first),
#: and the public floor on any radius (given or searched): ``r_max 2^{-26} ~ 1.5e-8 r_max``, the
#: first power of two above ``1e-8 r_max``. It is far above the rounding of the direct-difference
#: distances (a few ``eps_machine`` relative) and of the weighted mean (``~ eps_machine r_max``),
#: so a distance compared with the radius, and the mean whose sensitivity is proportional to
#: it, are not dominated by rounding. Every extra radius is also one more chance for
#: AboveThreshold to stop spuriously, so the grid stops there.
RADIUS_STEPS = 26
#: The same for the projection aggregator, whose distances ``sqrt(2k - 2||U_j^T U_l||_F^2)``
#: carry an absolute rounding of ``~ 2e-8 r_max``: floor ``r_max 2^{-17} ~ 7.6e-6 r_max``.
PROJECTION_RADIUS_STEPS = 17
#: AboveThreshold stops at the first radius whose total weight exceeds this fraction of ``t``
#: (or the weight the test needs, if larger: :func:`radius_search_threshold`).
THRESHOLD_FRACTION = 0.75


class FriendlyAggregateParams(MechanismParams):
    """Params of ``friendly_aggregate``."""

    t: int | None = Field(
        default=None,
        ge=3,
        description=(
            "Number of subsets of the random partition (>= 3: the weight ramp is t/2 - 1 wide). "
            "Default: the largest t that keeps floor(n/t) >= 10k rows per subset, fits the "
            "worker memory (DPSS_WORKER_MEMORY_MB) and is at most 10,000; refused when that is "
            "below t_min, the least t whose test can pass."
        ),
    )
    q: int | None = Field(
        default=None,
        ge=1,
        description="Number of Gaussian reference points (reference_points only); default 2k.",
    )
    aggregator: Aggregator | None = Field(
        default=None,
        description=(
            "reference_points: average P U_j U_j^T for q public Gaussian points P (any d). "
            "projection: average the d x d projectors U_j U_j^T (d <= 1000). Default: "
            "projection when d <= 1000 and q is not given (about 2x more accurate), else "
            "reference_points."
        ),
    )
    radius: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Friendly-averaging radius r (distance between aggregated points). Default: chosen "
            "privately by AboveThreshold over r_max 2^-i, using a quarter of epsilon."
        ),
    )


@dataclass(frozen=True)
class BudgetSplit:
    """Fixed fractions of the request's ``(epsilon, delta)``."""

    eps0: float
    eps1: float
    eps2: float
    delta1: float
    delta2: float


@dataclass(frozen=True)
class FriendlyResult:
    """What :func:`friendly_aggregate` releases (every field is private output or public)."""

    basis: FloatArray | None
    radius: float
    #: ``i`` with ``radius = r_max 2^{-i}`` when AboveThreshold stopped; ``None`` otherwise.
    radius_exponent: int | None
    weight_low: float
    noise_sigma: float | None
    #: How many of the noisy mean's top-k singular values (projections: eigenvalues) stand
    #: out (:func:`components_above_noise`; post-processing of the noisy mean).
    components_above_noise: int = 0


# ---------------------------------------------------------------------------------------------
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


def ramp_width(t: int) -> float:
    """``b = t/2 - 1``: weights ramp from 0 at ``c = t/2 + 1`` friends to 1 at ``c = t``.

    The widest ramp that still reaches 1 (a point cannot have more than ``t`` friends), so
    ``Delta_W = 1 + (t-1)/b`` is smallest (``~3`` instead of ``~5`` for ``t/4``); derivation F1 in
    ``docs/mechanisms.md``. Needs ``t >= 3`` (``b > 0``).
    """
    if t < 3:
        raise ValueError(f"t = {t}: the ramp t/2 - 1 needs t >= 3")
    return t / 2.0 - 1.0


def weight_sensitivity(t: int, b: float) -> float:
    """``Delta_W = 1 + (t-1)/b``: the replaced point's own weight moves by 1, each other by 1/b."""
    return 1.0 + (t - 1) / b


def mean_sensitivity(radius: float, t: int, b: float, weight: float) -> float:
    """``r (4(t-1)/b + 6) / W``: l2 sensitivity of the weighted mean at total weight ``W``."""
    return radius * (4.0 * (t - 1) / b + 6.0) / weight


#: Relative allowance for rounding in the reference-point route: a computed distance is within
#: ``(q d + 3) eps_machine`` (relative) of the distance of the computed points, and the computed
#: mean (:func:`weighted_mean`) within ``eps_machine r_max + 3 t eps_machine r`` of the exact
#: one, which is below ``6e-6 D`` for ``t <= 10^4`` at the radius floor (``D >= 14 r/t``).
REFERENCE_ROUNDING = 2.0**-16


def projection_rounding(d: int, k: int) -> float:
    """Public bound on the absolute rounding of a computed projector distance,
    ``4 k sqrt(d eps_machine)`` (each of the ``k^2`` entries of ``U_j^T U_l`` is a length-``d``
    dot product; the squared distance is a difference of sums of their squares)."""
    return 4.0 * k * math.sqrt(d * float(np.finfo(np.float64).eps))


def projection_mean_rounding(d: int, k: int, t: int) -> float:
    """Public bound on the Frobenius rounding of the computed ``sum_j w_j U_j U_j^T / W`` on
    both neighbours together: ``2 d t k^2 eps_machine``."""
    return 2.0 * d * t * k * k * float(np.finfo(np.float64).eps)


def calibrated_sensitivity(
    radius: float, t: int, b: float, weight: float, aggregator: Aggregator, d: int, k: int
) -> float:
    """The ``D`` the Gaussian noise is calibrated for: :func:`mean_sensitivity` at the radius
    plus the public rounding allowances of the computed distances and mean.

    A computed distance ``<= r`` only guarantees a distance ``<= r (1 + 2^-16)`` between the
    computed points (reference points) or ``<= r + projection_rounding(d, k)`` (projections),
    so the ``2r`` argument runs with that radius; the projection mean's own rounding is added.
    """
    if aggregator == "reference_points":
        return mean_sensitivity(radius * (1.0 + REFERENCE_ROUNDING), t, b, weight)
    inflated = mean_sensitivity(radius + projection_rounding(d, k), t, b, weight)
    return inflated + projection_mean_rounding(d, k, t)


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


def rows_cap_t(n: int, k: int) -> int:
    """``floor(n/(10k))``: the most subsets that keep ``m >= 10k`` rows each."""
    return n // (ROWS_PER_DIMENSION * k)


def default_t(n: int, k: int) -> int:
    """``floor(n/(10k))`` (the row cap alone; :func:`choose_t` applies the budget and memory)."""
    return rows_cap_t(n, k)


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


def memory_cap_t(
    n: int,
    d: int,
    k: int,
    q: int | None,
    aggregator: Aggregator,
    radius: float | None,
    limit_bytes: int,
    high: int,
    low: int = 3,
) -> int:
    """Largest ``t`` in ``[low, high]`` whose :func:`friendly_memory_bytes` fits
    ``limit_bytes``; 0 when none does.

    The estimate is not monotone in ``t`` (few subsets mean large ``m x m`` subset Gram
    matrices, many subsets large distance blocks and points), so the range is scanned from the
    top; each estimate is a few arithmetic operations on public facts.
    """
    for t in range(high, max(3, low) - 1, -1):
        if friendly_memory_bytes(n, d, k, t, q, aggregator, radius) <= limit_bytes:
            return t
    return 0


@dataclass(frozen=True)
class TChoice:
    """How the default ``t`` was chosen (all from public facts)."""

    t: int
    t_min: int
    t_comfortable: int
    rows_cap: int
    #: largest ``t`` in ``[t_min, min(rows_cap, MAX_T)]`` that fits the memory limit, or 0
    memory_cap: int
    reason: str


def choose_t(
    n: int,
    d: int,
    k: int,
    epsilon: float,
    delta: float,
    q: int | None,
    aggregator: Aggregator,
    radius: float | None,
    limit_bytes: int,
) -> TChoice:
    """The default ``t``: the largest ``t`` that keeps ``m >= 10k`` rows per subset, fits the
    worker memory and :data:`MAX_T`; ``t < t_min`` means refuse.

    The largest, not the smallest that passes the test: the mean's noise is
    ``r (4(t-1)/b + 6)/W_low ~ 14 r/(t - shift)``, so more subsets lower it (about ``1/t``
    once the radius reaches the grid's floor), and they make both the test and the radius
    search more reliable (measured in ``bench/experiments/bench_small_budgets.py``).
    """
    t_min = t_min_for(epsilon, delta, radius is not None)
    t_comf = t_comfortable_for(epsilon, delta, radius is not None)
    rows_cap = rows_cap_t(n, k)
    upper = min(rows_cap, MAX_T)
    if upper < t_min:  # too few rows: refused whatever the memory
        return TChoice(upper, t_min, t_comf, rows_cap, 0, "too few rows")
    # the largest t in [t_min, upper] that fits (0: none does, refused)
    mem_cap = memory_cap_t(n, d, k, q, aggregator, radius, limit_bytes, upper, t_min)
    t = mem_cap
    if t == 0:
        reason = "no t >= t_min fits the worker memory"
    elif t == rows_cap:
        reason = f"the largest t that keeps m >= 10k rows per subset, floor(n/(10k)) = {t}"
    elif t == MAX_T:
        reason = f"the largest t accepted, {MAX_T}"
    else:
        reason = f"the largest t that fits the worker memory (DPSS_WORKER_MEMORY_MB), {t}"
    return TChoice(t, t_min, t_comf, rows_cap, mem_cap, reason)


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


def radius_grid(r_max: float, steps: int = RADIUS_STEPS) -> FloatArray:
    """``r_max 2^{-i}`` for ``i = steps, ..., 0``: ascending, as AboveThreshold asks them."""
    return np.asarray(r_max * np.exp2(-np.arange(steps, -1, -1, dtype=np.float64)))


# ---------------------------------------------------------------------------------------------
# Friendly averaging: distances by direct differences, counts in blocks


#: The distance step runs on this many threads at most (scipy's distance kernels release the
#: GIL); the memory estimate assumes all of them are busy.
MAX_DISTANCE_WORKERS = 4
#: Entries of one block of distances (``rows x columns``) a worker holds at once: 8 MB.
BLOCK_FLOATS = 1 << 20
#: Points per chunk when the weighted mean is accumulated.
MEAN_CHUNK_FLOATS = 1 << 20

#: Points per tile of the direct-difference distances (rows x columns).
ROW_TILE, COL_TILE = 16, 32

BlockFn = Callable[[int, int], FloatArray]


def reference_distance_block(points: FloatArray) -> BlockFn:
    """``(start, stop) -> ||y_j - y_l||`` for ``j in [start, stop)``, ``l in [start, t)``.

    Direct differences: ``sqrt(sum_c (y_jc - y_lc)^2)`` pair by pair (scipy's ``cdist``, which
    subtracts, squares and sums each pair's coordinates in a fixed order). A computed distance
    is therefore a function of the two points alone: no centring, no Gram matrix, no norm of
    any other point enters it, and its relative error is a few units of ``eps_machine``.

    Parameters
    ----------
    points : (t, p) array
    """

    t = points.shape[0]

    def block(start: int, stop: int) -> FloatArray:
        out = np.zeros((stop - start, t - start), dtype=np.float64)
        # Tiles of ROW_TILE x COL_TILE points keep both tiles in cache while every pair of them
        # is computed (about twice as fast as whole rows at q d = 10^4); tiles left of the
        # diagonal are skipped (the block's square part is symmetrised from its upper half).
        for r0 in range(start, stop, ROW_TILE):
            r1 = min(stop, r0 + ROW_TILE)
            rows = points[r0:r1]
            for c0 in range(r0, t, COL_TILE):
                c1 = min(t, c0 + COL_TILE)
                out[r0 - start : r1 - start, c0 - start : c1 - start] = cdist(rows, points[c0:c1])
        return out

    return block


def projection_distance_block(bases: FloatArray) -> BlockFn:
    """``(start, stop) -> ||U_j U_j^T - U_l U_l^T||_F``, as
    ``sqrt(||U_j^T U_j||_F^2 + ||U_l^T U_l||_F^2 - 2 ||U_j^T U_l||_F^2)``.

    For ``j in [start, stop)``, ``l in [start, t)``, from the ``k x k`` cross products of the
    stacked bases (one matrix product per block, never the ``d x d`` projectors): each entry of
    ``U_j^T U_l`` is a dot product of a column of ``U_j`` and one of ``U_l``, so the computed
    distance is a function of the pair alone. Its absolute error is at most
    :func:`projection_rounding` (``~ 2e-8 r_max`` measured at ``d = 1000``), hence the higher
    radius floor of this aggregator and the allowance in :func:`calibrated_sensitivity`.

    Parameters
    ----------
    bases : (t, d, k) array
    """
    t, d, k = bases.shape
    stacked = np.ascontiguousarray(bases.transpose(1, 0, 2).reshape(d, t * k))
    # ||U_j U_j^T||_F^2 = ||U_j^T U_j||_F^2 of the computed basis itself (k only up to its
    # loss of orthogonality), so the formula is exact for the projectors the mean averages.
    self_overlap = np.square(np.matmul(bases.transpose(0, 2, 1), bases)).sum(axis=(1, 2))

    def block(start: int, stop: int) -> FloatArray:
        # One triangle of the cross-Gram: the block's own square part as ``A^T A`` of one
        # buffer (numpy hands that to BLAS syrk, which computes one triangle and mirrors it,
        # so each of its entries is still one dot product of two columns), and the pairs with
        # later points as a plain product. Without the split a block holding all t points
        # computed both triangles, twice the work. Pairs left of the block are never formed.
        own = stacked[:, start * k : stop * k]
        cross = np.empty(((stop - start) * k, (t - start) * k), dtype=np.float64)
        cross[:, : (stop - start) * k] = own.T @ own
        if stop < t:
            np.matmul(own.T, stacked[:, stop * k :], out=cross[:, (stop - start) * k :])
        overlap = np.square(cross.reshape(stop - start, k, t - start, k)).sum(axis=(1, 3))
        dist2 = self_overlap[start:stop, None] + self_overlap[None, start:] - 2.0 * overlap
        np.maximum(dist2, 0.0, out=dist2)
        return np.asarray(np.sqrt(dist2, out=dist2), dtype=np.float64)

    return block


def block_rows(t: int, width: int = 1) -> int:
    """Rows per block so that a ``rows x t`` block of ``width`` floats each fits
    :data:`BLOCK_FLOATS`."""
    return max(1, min(t, BLOCK_FLOATS // max(1, t * width)))


def _square_part_symmetric(dist: FloatArray) -> None:
    """Within a block's own rows, use the ``j <= l`` value for both orders and 0 on the
    diagonal, so the pair ``(j, l)`` has one computed distance (in place)."""
    rows = dist.shape[0]
    square = dist[:, :rows]
    upper = np.triu(square, 1)
    square[...] = upper + upper.T


def count_friends(
    block: BlockFn, t: int, radii: FloatArray, *, rows: int, workers: int = 1
) -> npt.NDArray[np.int64]:
    """``c_j(r_i) = #{l : dist(j, l) <= r_i}`` (``j`` itself included) for every radius.

    Each unordered pair's distance is computed once, in the block of the smaller index, and
    counted for both points; only integer counts leave a block, so memory is
    ``O(workers rows t + t R)`` whatever ``t``, and the counts do not depend on the blocking or
    on the threads' schedule.

    Parameters
    ----------
    block : callable ``(start, stop) -> (stop - start, t - start)`` distances
    t : int
    radii : (R,) ascending array
    rows : int
        Rows per block.
    workers : int
        Threads (blocks are dealt round-robin; each worker keeps its own counts).

    Returns
    -------
    (t, R) int array
    """
    n_radii = radii.shape[0]
    starts = list(range(0, t, rows))

    def work(mine: list[int]) -> npt.NDArray[np.int64]:
        # bins[j, l] = smallest i with dist <= radii[i] (n_radii: beyond every radius)
        hist = np.zeros((t, n_radii + 1), dtype=np.int64)
        for start in mine:
            stop = min(t, start + rows)
            dist = block(start, stop)
            _square_part_symmetric(dist)
            bins = np.searchsorted(radii, dist, side="left")
            size = stop - start
            offsets = np.arange(size, dtype=np.int64)[:, None] * (n_radii + 1)
            hist[start:stop] += np.bincount(
                (bins + offsets).ravel(), minlength=size * (n_radii + 1)
            ).reshape(size, n_radii + 1)
            if stop < t:
                later = bins[:, size:]
                offsets = np.arange(t - stop, dtype=np.int64)[None, :] * (n_radii + 1)
                hist[stop:] += np.bincount(
                    (later + offsets).ravel(), minlength=(t - stop) * (n_radii + 1)
                ).reshape(t - stop, n_radii + 1)
        return hist

    shares = [starts[w::workers] for w in range(max(1, min(workers, len(starts))))]
    if len(shares) == 1:
        hist = work(shares[0])
    else:
        with ThreadPoolExecutor(max_workers=len(shares)) as pool:
            hist = sum(pool.map(work, shares), np.zeros((t, n_radii + 1), dtype=np.int64))
    return np.asarray(np.cumsum(hist, axis=1)[:, :n_radii], dtype=np.int64)


def distance_workers() -> int:
    """Threads for the distance step: the CPUs this process may use, at most
    :data:`MAX_DISTANCE_WORKERS` (the counts are the same for any number)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_DISTANCE_WORKERS, cpus))


def pairwise_distances(points: FloatArray) -> FloatArray:
    """All distances ``||y_j - y_l||`` by direct differences, as a ``(t, t)`` array (tests and
    small ``t``; the mechanism itself only keeps counts)."""
    t = points.shape[0]
    block = reference_distance_block(points)(0, t)
    _square_part_symmetric(block)
    return block


def projection_distances(bases: FloatArray) -> FloatArray:
    """All projector distances as a ``(t, t)`` array (tests and small ``t``)."""
    t = bases.shape[0]
    block = projection_distance_block(bases)(0, t)
    _square_part_symmetric(block)
    return block


def friend_counts(distances: FloatArray, radius: float) -> npt.NDArray[np.int64]:
    """``c_j = #{l : ||y_j - y_l|| <= r}``, the point itself included, from a full matrix."""
    return np.asarray(np.count_nonzero(distances <= radius, axis=1), dtype=np.int64)


def weights_from_counts(counts: npt.NDArray[np.int64], t: int, b: float) -> FloatArray:
    """``w_j = clip((c_j - t/2 - 1)/b, 0, 1)`` elementwise (any shape of counts)."""
    return np.asarray(np.clip((counts - t / 2.0 - 1.0) / b, 0.0, 1.0), dtype=np.float64)


def total_weight(weights: FloatArray) -> float:
    """``W = sum_j w_j``, correctly rounded (``math.fsum``): the sum's rounding cannot add to
    ``|W - W'|`` beyond one rounding of each side."""
    return math.fsum(weights.tolist())


def friendly_weights(distances: FloatArray, radius: float, b: float) -> FloatArray:
    """``w_j = clip((c_j - t/2 - 1)/b, 0, 1)`` from a full distance matrix.

    Parameters
    ----------
    distances : (t, t) array
    radius : float
    b : float
        Ramp width.

    Returns
    -------
    (t,) array of weights in ``[0, 1]``.
    """
    t = distances.shape[0]
    return weights_from_counts(friend_counts(distances, radius), t, b)


def radius_steps(aggregator: Aggregator) -> int:
    """Grid depth: the floor ``r_max 2^{-steps}`` of each aggregator's distances."""
    return RADIUS_STEPS if aggregator == "reference_points" else PROJECTION_RADIUS_STEPS


def radius_floor(r_max: float, aggregator: Aggregator) -> float:
    """Public floor on any radius used: ``r_max 2^{-26} ~ 1.5e-8 r_max`` (reference points),
    ``r_max 2^{-17} ~ 7.6e-6 r_max`` (projections); the smallest point of the search grid."""
    return float(r_max * 2.0 ** -radius_steps(aggregator))


def weighted_mean(points: FloatArray, weights: FloatArray, total: float) -> FloatArray:
    """``mu = sum_j w_j y_j / W``, accumulated as ``y_a + sum_j w_j (y_j - y_a) / W``.

    ``y_a`` is the first point of positive weight; every positive-weight point is within
    ``2r`` of it, so the rounding of the sum is ``O(t eps_machine r)`` plus one rounding of
    ``y_a`` (``eps_machine r_max``), not ``O(t eps_machine r_max)``. Memory: one chunk of points.
    With ``W = 0`` (possible only in PTR's bad event) the mean is the public zero vector.

    Parameters
    ----------
    points : (t, p) array
    weights : (t,) array
    total : float

    Returns
    -------
    (p,) array
    """
    used = np.flatnonzero(weights > 0)
    if used.size == 0 or not total > 0:
        return np.zeros(points.shape[1], dtype=np.float64)
    anchor = points[used[0]]
    acc = np.zeros(points.shape[1], dtype=np.float64)
    chunk = max(1, MEAN_CHUNK_FLOATS // points.shape[1])
    for start in range(0, used.size, chunk):
        idx = used[start : start + chunk]
        acc += weights[idx] @ (points[idx] - anchor)
    return np.asarray(anchor + acc / total, dtype=np.float64)


def projection_mean(bases: FloatArray, weights: FloatArray, total: float) -> FloatArray:
    """``sum_j w_j U_j U_j^T / W`` over the subsets of positive weight (zero when ``W = 0``).

    One symmetric rank-``tk`` update ``B B^T`` with ``B = [sqrt(w_j / W) U_j]`` (``d x tk``):
    numpy hands ``B @ B.T`` of one buffer to BLAS syrk, which computes one triangle, half the
    work of the general product ``(S diag(w/W)) S^T``. Taking ``sqrt`` and squaring again
    changes each weight by at most 2 ulps, far inside :func:`projection_mean_rounding`.

    Parameters
    ----------
    bases : (t, d, k) array
    weights : (t,) array of non-negative weights
    total : float
        ``W = sum_j w_j``.

    Returns
    -------
    (d, d) symmetric array
    """
    _, d, k = bases.shape
    used = weights > 0
    if not used.any() or not total > 0:
        return np.zeros((d, d), dtype=np.float64)
    root = np.sqrt(np.repeat(weights[used] / total, k))
    factor = bases[used].transpose(1, 0, 2).reshape(d, -1) * root  # (d, k * used)
    return np.asarray(factor @ factor.T, dtype=np.float64)


def safe_top_k_eigh(matrix: FloatArray, k: int) -> FloatArray:
    """Top-k eigenvectors of a symmetric matrix, or :func:`fallback_basis` if LAPACK fails or
    returns non-finite vectors (total on every input; the matrix is scaled by a power of two)."""
    d = matrix.shape[0]
    if not np.all(np.isfinite(matrix)):
        return fallback_basis(d, k)
    scaled = np.ldexp(matrix, -power_of_two_exponents(matrix[None])[0])
    try:
        _, vectors = top_k_eigh(scaled, k)
    except (np.linalg.LinAlgError, ValueError):
        return fallback_basis(d, k)
    if not np.all(np.isfinite(vectors)):
        return fallback_basis(d, k)
    return vectors


def above_threshold(
    answers: FloatArray,
    threshold: float,
    sensitivity: float,
    epsilon: float,
    rng: np.random.Generator,
) -> int | None:
    """AboveThreshold (sparse vector, one positive answer): index of the first noisy answer
    above the noisy threshold, or ``None``.

    Dwork & Roth, The Algorithmic Foundations of Differential Privacy (2014), Algorithm 1, for
    queries of sensitivity ``Delta``: noisy threshold ``T + Lap(2 Delta/eps)``, each query
    ``f_i + Lap(4 Delta/eps)``, halt at the first ``f_i + nu_i >= T_hat``. ``eps``-DP however many
    queries are asked. Answers are computed up front (they are cheap); that is the same
    distribution as asking them one at a time.

    Parameters
    ----------
    answers : (r,) array
        True query answers in the order asked.
    """
    noisy_threshold = threshold + float(laplace(2.0 * sensitivity / epsilon, rng))
    query_noise = laplace(4.0 * sensitivity / epsilon, rng, size=answers.shape[0])
    above = np.flatnonzero(answers + query_noise >= noisy_threshold)
    return int(above[0]) if above.size else None


def search_radius(
    block: BlockFn,
    t: int,
    radii: FloatArray,
    eps0: float,
    rng: np.random.Generator,
    *,
    rows: int,
    workers: int = 1,
    threshold: float | None = None,
) -> tuple[int | None, FloatArray]:
    """The private radius search: AboveThreshold over ``W(r_i)``, smallest radius first.

    Queries ``W(r_i)`` (sensitivity ``Delta_W``: the counts come from per-pair distances, so one
    moved point changes its own weight by at most 1 and each other weight by at most ``1/b``)
    against the public ``threshold`` (default ``0.75 t``; the mechanism passes
    :func:`radius_search_threshold`), ``eps0``-DP.

    Parameters
    ----------
    block : distance blocks of the ``t`` points
    radii : (R,) ascending grid
    eps0 : float

    Returns
    -------
    stop : int or None
        Index of the first radius above the noisy threshold, ``None`` when none is.
    weights : (t, R) array
        The weights at every radius (so the chosen one needs no second pass).
    """
    b = ramp_width(t)
    counts = count_friends(block, t, radii, rows=rows, workers=workers)
    weights = weights_from_counts(counts, t, b)
    totals = np.array([total_weight(column) for column in weights.T])
    sens = weight_sensitivity(t, b)
    bar = THRESHOLD_FRACTION * t if threshold is None else threshold
    return above_threshold(totals, bar, sens, eps0, rng), weights


def friendly_aggregate(
    data: npt.NDArray[Any],
    k: int,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    *,
    t: int,
    q: int | None = None,
    aggregator: Aggregator = "reference_points",
    radius: float | None = None,
) -> FriendlyResult:
    """Release a k-dimensional subspace by friendly averaging of ``t`` subset estimates.

    Parameters
    ----------
    data : (n, d) array
        The rows; may be a read-only memory map (read one group of subsets at a time; memory
        ``O(t q d)`` for reference points, ``O(t d k + d^2)`` for projections).
    k : int
        Subspace dimension; ``k <= floor(n/t)``.
    epsilon, delta : float
        Privacy cost, split by :func:`budget_split`.
    rng : numpy.random.Generator
        The release's generator: partition, reference points and all noise, in that order.
    t : int
        Number of subsets.
    q : int, optional
        Reference points (default ``2k``); ignored by ``projection``.
    aggregator : {"reference_points", "projection"}
    radius : float, optional
        Friendly-averaging radius; chosen by AboveThreshold when absent.

    Returns
    -------
    FriendlyResult
        ``basis`` ``(d, k)`` orthonormal, or ``None`` when the PTR test fails.
    """
    state = friendly_search(
        data, k, epsilon, delta, rng, t=t, q=q, aggregator=aggregator, radius=radius
    )
    return friendly_continue(state, rng)


@dataclass(frozen=True)
class FriendlySearch:
    """The state of :func:`friendly_aggregate` after its radius search (or given radius).

    Holds private intermediate values (bases, points, weights): only ``radius`` and
    ``radius_exponent`` are released (the search's ``(eps0, 0)``-DP output, or
    public when the radius is given); the rest must go through :func:`friendly_continue`.
    """

    split: AnySplit
    t: int
    k: int
    d: int
    aggregator: Aggregator
    bases: FloatArray
    points: FloatArray | None
    radius: float
    #: ``i`` with ``radius = r_max 2^{-i}`` when AboveThreshold stopped; ``None`` otherwise.
    radius_exponent: int | None
    weights: FloatArray


def friendly_search(
    data: npt.NDArray[Any],
    k: int,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    *,
    t: int,
    q: int | None = None,
    aggregator: Aggregator = "reference_points",
    radius: float | None = None,
) -> FriendlySearch:
    """The first phase of :func:`friendly_aggregate` (same parameters): the partition, the
    subset bases, the reference points and the radius search with ``eps0`` (or the weights at
    the given radius), drawing from ``rng`` exactly as :func:`friendly_aggregate` does."""
    d = data.shape[1]
    split = release_split(epsilon, delta, radius is not None, t=t)
    _, bases = partition_and_bases(data, t, k, rng)
    b = ramp_width(t)

    points: FloatArray | None = None
    if aggregator == "reference_points":
        ref = reference_points(2 * k if q is None else q, d, rng)
        points = reference_embeddings(bases, ref)
        r_max = float(np.linalg.norm(ref))
        block = reference_distance_block(points)
        rows, workers = block_rows(t), distance_workers()
    else:
        block = projection_distance_block(bases)
        r_max = math.sqrt(2.0 * k)
        rows, workers = block_rows(t, k * k), 1
    steps = radius_steps(aggregator)

    radius_exponent: int | None = None
    if radius is None:
        radii = radius_grid(r_max, steps)
        stop, weights_by_radius = search_radius(
            block,
            t,
            radii,
            split.eps0,
            rng,
            rows=rows,
            workers=workers,
            threshold=split_search_threshold(t, split),
        )
        radius_index = steps if stop is None else stop  # none above: r = r_max
        radius_exponent = None if stop is None else steps - stop
        radius = float(radii[radius_index])
        weights = weights_by_radius[:, radius_index].copy()
    else:
        radius = max(radius, radius_floor(r_max, aggregator))
        counts = count_friends(block, t, np.array([radius]), rows=rows, workers=workers)
        weights = weights_from_counts(counts[:, 0], t, b)

    return FriendlySearch(
        split, t, k, d, aggregator, bases, points, radius, radius_exponent, weights
    )


def friendly_continue(state: FriendlySearch, rng: np.random.Generator) -> FriendlyResult:
    """The second phase of :func:`friendly_aggregate`: the PTR test (``eps1, delta1``) and the
    noisy mean (``eps2, delta2``) at the searched radius."""
    split, t, d, k = state.split, state.t, state.d, state.k
    radius, radius_exponent, weights = state.radius, state.radius_exponent, state.weights
    points, bases, aggregator = state.points, state.bases, state.aggregator
    b = ramp_width(t)
    sens_w = weight_sensitivity(t, b)
    total = total_weight(weights)
    w_low = noisy_weight_lower_bound(total, sens_w, split, rng)
    if w_low < weight_floor(sens_w):
        return FriendlyResult(None, radius, radius_exponent, w_low, None)

    sens_mean = calibrated_sensitivity(radius, t, b, w_low, aggregator, d, k)
    sigma = split_mean_sigma(sens_mean, split)
    if points is not None:
        mean = weighted_mean(points, weights, total)
        noisy = mean + rng.normal(0.0, sigma, size=mean.shape)
        matrix = noisy.reshape(-1, d)
        basis = safe_top_right_singular_vectors(matrix, k)
        values = _top_values(matrix, k + 1, symmetric=False)
    else:
        noisy = projection_mean(bases, weights, total) + rng.normal(0.0, sigma, size=(d, d))
        basis = safe_top_k_eigh(0.5 * (noisy + noisy.T), k)
        values = _top_values(0.5 * (noisy + noisy.T), k + 1, symmetric=True)
    q = 0 if points is None else points.shape[1] // d
    above = components_above_noise(values, k, noise_norm(aggregator, sigma, d, q))
    return FriendlyResult(basis, radius, radius_exponent, w_low, sigma, above)


def noise_norm(aggregator: Aggregator, sigma: float, d: int, q: int) -> float:
    """Spectral norm of the mean's noise: ``sigma (sqrt(q) + sqrt(d))`` for the ``q x d``
    reference-point matrix, ``2 sigma sqrt(d)`` for the symmetrised ``d x d`` projection."""
    if aggregator == "projection":
        return 2.0 * sigma * math.sqrt(d)
    return sigma * (math.sqrt(q) + math.sqrt(d))


def components_above_noise(values: FloatArray, k: int, noise: float) -> int:
    """How many of the top-k singular values (eigenvalues) of the noisy mean stand out (issue 24,
    item 5): above the noise's spectral norm and above twice the ``(k+1)``-th. Subsets that
    agree average to a rank-k matrix plus noise (a clear gap after the k-th value); subsets
    whose subspaces do not agree average to about ``k/d`` times the reference points, whose
    singular values decay slowly (no gap), so their top-k directions are random-like."""
    beyond = float(values[k]) if values.shape[0] > k else 0.0
    return int(np.count_nonzero(values[:k] > max(noise, 2.0 * beyond)))


def _top_values(matrix: FloatArray, k: int, symmetric: bool) -> FloatArray:
    """Top-k singular values (or eigenvalues) of a noisy matrix, zeros where it cannot be
    decomposed (a non-finite or failing input: no claim that anything stands out)."""
    if not np.all(np.isfinite(matrix)):
        return np.zeros(k)
    try:
        if symmetric:
            return np.asarray(np.linalg.eigvalsh(matrix)[::-1][:k], dtype=np.float64)
        return np.asarray(np.linalg.svd(matrix, compute_uv=False)[:k], dtype=np.float64)
    except np.linalg.LinAlgError:
        return np.zeros(k)


def friendly_memory_bytes(
    n: int,
    d: int,
    k: int,
    t: int,
    q: int | None,
    aggregator: Aggregator,
    radius: float | None,
    workers: int = MAX_DISTANCE_WORKERS,
) -> int:
    """Peak bytes of :func:`friendly_aggregate`, from its own allocations (public facts only).

    The partition (``n`` permutation indices and ``t m`` kept), then the larger of: the subset
    step (:func:`subset_bases_bytes`); the distance step, which holds the bases, the points
    (``t q d`` and the reference points; projections: the stacked bases), per worker one block
    of distances with its bins and one indexed copy of them (projections: also the ``k x k``
    cross products and their squares), and the counts and weights of every radius; the
    release step (a chunk of points and its differences, the mean, noise and noisy estimate,
    the SVD's factors; for projections the used bases three more times and seven ``d x d``
    matrices). Plus :func:`allowance`.
    """
    m = n // t
    qq = 2 * k if q is None else q
    n_radii = 1 if radius is not None else (radius_steps(aggregator) + 1)
    partition = 8 * (2 * n + t * m)
    bases = 8 * t * d * k
    subset_step = subset_bases_bytes(t, m, d, k)
    counts = 8 * t * (n_radii + 1) * (workers + 3) + 8 * 2 * t * n_radii
    if aggregator == "reference_points":
        rows = block_rows(t)
        workers = min(workers, -(-t // rows))
        held = bases + embeddings_bytes(t, qq, d, k)
        # a block of distances, its bins and one indexed copy of them (the symmetrising
        # temporaries, 2 rows^2, come and go before the bins exist)
        per_worker = 8 * 3 * rows * t
        p = qq * d
        chunk = max(1, MEAN_CHUNK_FLOATS // p) * p
        release = 8 * (2 * chunk + 6 * p + qq * qq + qq)
    else:
        rows = block_rows(t, k * k)
        held = 2 * bases
        per_worker = 8 * (2 * rows * k * t * k + 3 * rows * t)
        workers = 1
        release = 3 * bases + 8 * (7 * d * d + d * k)
    distance_step = held + counts + workers * per_worker
    release_step = held + counts + release
    return allowance(partition + max(subset_step, distance_step, release_step))


def resolve_aggregator(params: FriendlyAggregateParams, d: int) -> Aggregator:
    """The given aggregator, else ``projection`` when ``d <= 1000`` and ``q`` is not given (it
    was about 2x more accurate than ``reference_points`` where both run), else
    ``reference_points``."""
    if params.aggregator is not None:
        return params.aggregator
    if params.q is None and d <= PROJECTION_MAX_D:
        return "projection"
    return "reference_points"


# ---------------------------------------------------------------------------------------------
# The service's mechanism


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


class FriendlyAggregate(Mechanism[FriendlyAggregateParams]):
    name: ClassVar[str] = "friendly_aggregate"
    accountings: ClassVar[frozenset[str]] = frozenset({"basic", "zcdp"})
    title: ClassVar[str] = "Friendly aggregation of subset subspaces (sample and aggregate)"
    paper: ClassVar[str] = (
        "Tsfadia, On Differentially Private Subspace Estimation in a Distribution-Free "
        "Setting, NeurIPS 2024, Section 4.1 (random-partition sample-and-aggregate with "
        "FriendlyCore averaging)"
    )
    summary: ClassVar[str] = (
        "Splits the rows into t random subsets, computes each subset's top-k subspace, and "
        "privately averages those that agree (friendly averaging with a privately chosen "
        "radius and a propose-test-release check). Needs no row norm bound. When the data lies "
        "within ~1e-4 of a k-dimensional subspace it is 10-1000 times more accurate than "
        "analyze_gauss in any d; farther from low rank it loses. May return no result when "
        "the subsets do not agree or n is small for the budget."
    )
    params_model: ClassVar[type[FriendlyAggregateParams]] = FriendlyAggregateParams

    def prepare(
        self,
        ctx: PublicContext,
        k: int,
        epsilon: float,
        delta: float,
        params: FriendlyAggregateParams,
    ) -> FriendlyAggregateParams:
        self.check_common(ctx, k, epsilon, delta)
        n, d = ctx.n_rows, ctx.n_cols
        aggregator = resolve_aggregator(params, d)

        if aggregator == "projection":
            if params.q is not None:
                raise InvalidParameter("q", "q applies only to aggregator 'reference_points'")
            if d > PROJECTION_MAX_D:
                raise InvalidParameter(
                    "aggregator",
                    f"'projection' averages d x d projectors; with d = {d} > {PROJECTION_MAX_D} "
                    "its d^2 memory, d^3 eigendecomposition and d^2 noise coordinates are too "
                    "costly: use 'reference_points' (error does not grow with d^2)",
                )
        q = params.q if params.q is not None else 2 * k
        if aggregator == "reference_points" and q < k:
            raise InvalidParameter("q", f"must be >= k = {k} (the q x d average has rank <= q)")
        q_used = q if aggregator == "reference_points" else None

        budget = f"epsilon = {format_budget(epsilon)}, delta = {format_budget(delta)}"
        if params.t is None:
            choice = choose_t(
                n, d, k, epsilon, delta, q_used, aggregator, params.radius, ctx.memory_limit
            )
            t = choice.t
            if t < choice.t_min:
                rows = ROWS_PER_DIMENSION * k
                if choice.rows_cap >= choice.t_min:
                    raise InvalidParameter(
                        "t",
                        f"at {budget} the propose-test-release check needs t >= {choice.t_min} "
                        "subsets even if every subset agreed, but none of "
                        f"t = {choice.t_min}..{min(choice.rows_cap, MAX_T)} fits "
                        "the worker memory (DPSS_WORKER_MEMORY_MB): try a smaller q, or a "
                        "larger epsilon or delta",
                    )
                raise InvalidParameter(
                    "t",
                    f"n = {n} rows give at most t = {choice.rows_cap} subsets of {rows} rows, "
                    f"but at {budget} the propose-test-release check needs t >= "
                    f"{choice.t_min} even if every subset agreed; needs n >= "
                    f"{choice.t_min * rows} rows (t = {choice.t_min} subsets of {rows}), or a "
                    "larger epsilon or delta",
                )
        else:
            t = params.t
            t_min = t_min_for(epsilon, delta, params.radius is not None)
            if t < t_min:
                raise InvalidParameter(
                    "t",
                    f"t = {t} is too small for {budget}: the propose-test-release check needs "
                    f"t >= {t_min} even if every subset agreed (and n >= {t_min * k})",
                )
        if n // t < k:
            raise InvalidParameter(
                "t",
                f"t = {t} subsets of n = {n} rows have {n // t} rows each, fewer than k = {k}; "
                f"needs t <= {n // k}",
            )
        if t > MAX_T:
            raise InvalidParameter("t", f"must be <= {MAX_T} (t x t pairwise distances)")
        if aggregator == "reference_points" and t * q * d > MAX_POINT_FLOATS:
            raise InvalidParameter(
                "t",
                f"t q d = {t * q * d} exceeds {MAX_POINT_FLOATS} (memory of the stacked "
                "points); lower t or q",
            )
        return params.model_copy(update={"t": t, "q": q_used, "aggregator": aggregator})

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[FriendlyAggregateParams]
    ) -> list[PrivacyStep] | None:
        """:func:`split_steps` of the split :meth:`run` uses (public: ``t``, epsilon, delta)."""
        params = spec.params
        assert params.t is not None  # resolved by prepare
        radius_given = params.radius is not None
        return split_steps(release_split(spec.epsilon, spec.delta, radius_given, t=params.t))

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[FriendlyAggregateParams]) -> Preview:
        params = spec.params
        assert params.t is not None and params.aggregator is not None  # resolved by prepare
        t, k = params.t, spec.k
        split = release_split(spec.epsilon, spec.delta, params.radius is not None, t=t)
        ramp = ramp_width(t)
        sens = weight_sensitivity(t, ramp)
        choice = choose_t(
            ctx.n_rows,
            ctx.n_cols,
            k,
            spec.epsilon,
            spec.delta,
            params.q,
            params.aggregator,
            params.radius,
            ctx.memory_limit,
        )
        no_result = split_no_result_if_agreeing(t, split)
        standard = standard_split(spec.epsilon, spec.delta, params.radius is not None)
        if isinstance(split, GdpSplit):
            split_name = "gaussian_test"
        else:
            split_name = "standard" if split == standard else "test_heavy"
        floor = weight_floor(sens)
        scale = split_noise_scale(split, sens)
        shift = split_shift(split, sens)
        steps = radius_steps(params.aggregator)
        # Projections lie within sqrt(2k) of each other; the reference points' r_max is the
        # norm of the q x d Gaussian points drawn at run time (about sqrt(q d)).
        if params.aggregator == "projection":
            r_max: float = math.sqrt(2.0 * k)
            where = f"r_max = sqrt(2k) = {r_max:.4g}"
        else:
            assert params.q is not None
            r_max = math.sqrt(params.q * ctx.n_cols)
            where = (
                f"r_max = the norm of the public reference points, about sqrt(q d) = {r_max:.4g}"
            )
        scales: dict[str, PreviewValue] = {
            "t": t,
            "t_min": choice.t_min,
            "t_default": choice.t,
            "t_reason": choice.reason if t == choice.t else "given in the request",
            "t_comfortable": choice.t_comfortable,
            "ptr_no_result_if_agreeing": no_result,
            "budget_split": split_name,
            "epsilon0": split.eps0,
            "ramp_width": ramp,
            "weight_sensitivity": sens,
            "aggregator": params.aggregator,
            "m": ctx.n_rows // t,
            "weight_noise_scale": scale,
            "weight_shift": shift,
            "ptr_floor": floor,
            "no_result_weight": floor + shift,
            "radius_steps": steps,
            "r_max": r_max,
        }
        if isinstance(split, GdpSplit):
            scales["test_mu"] = split.ptr_mu
            scales["mean_mu"] = split.mean_mu
            scales["test_share"] = split.fraction
            shares = (
                f"Budget split gaussian_test (derivation F3): epsilon0 = {split.eps0:.4g} "
                f"(radius search, pure); a Gaussian test of mu1 = {split.ptr_mu:.4g} and a "
                f"Gaussian mean of mu2 = {split.mean_mu:.4g} (Gaussian DP), composed exactly "
                f"with the search to ({format_budget(spec.epsilon)}, "
                f"{format_budget(spec.delta)}) including the test's "
                f"failure probability {split.delta1:.3g}; chosen because its mean's noise is "
                "smaller here than the basic split's."
            )
            test_noise = f"N(0, {scale:.4g}^2)"
            test_budget = f"mu1 = {split.ptr_mu:.4g}"
        else:
            scales["epsilon1"] = split.eps1
            scales["epsilon2"] = split.eps2
            shares = (
                f"Budget split {split_name}: epsilon0 = {split.eps0:.4g} (radius search), "
                f"epsilon1 = {split.eps1:.4g} (test), epsilon2 = {split.eps2:.4g} (mean); "
                + (
                    "the standard split of ALGORITHMS.md M6."
                    if split_name == "standard"
                    else "at this t the standard split's test would fail often even on "
                    "agreeing subsets and leave a small W_low (a noisier mean), so a quarter "
                    "of epsilon moved from the mean to the test (derivation F2)."
                )
            )
            test_noise = f"Laplace({scale:.4g})"
            test_budget = f"epsilon1 = {split.eps1:.4g}"
        chosen = (
            f"t = {t} is {choice.reason}"
            if t == choice.t
            else f"t = {t} as given (the default would be {choice.t}: {choice.reason})"
        )
        meaning = [
            f"The rows are split into t = {t} subsets of {ctx.n_rows // t} rows; each gives a "
            "top-k subspace, weighted by how many others lie within the radius: a subset with "
            f"c friends gets weight clip((c - t/2 - 1)/{ramp:.4g}, 0, 1) (ramp b = t/2 - 1), "
            f"so the total weight moves by at most Delta_W = {sens:.4g} when one row changes.",
            f"{chosen}; t_min = {choice.t_min} is the least t for which even full agreement "
            f"can pass the test, and t >= {choice.t_comfortable} passes it with "
            "a chance of failing on all-agreeing subsets of at most "
            f"{COMFORTABLE_NO_RESULT:.2g}. At t = {t}, if every subset agrees "
            f"the test still ends in no_result with probability {no_result:.2g}.",
            shares,
            f"Test ({test_budget}): W_low = W + {test_noise} - "
            f"{shift:.4g}; the release ends in no_result (charged) when W_low < {floor:.4g}. "
            f"W is at most t = {t}, so the total weight of agreeing subsets must be above about "
            f"{floor + shift:.4g}.",
        ]
        if params.radius is None:
            bar = split_search_threshold(t, split)
            scales["radius_search_threshold"] = bar
            meaning.append(
                f"The radius is chosen privately (epsilon0 = {split.eps0:.4g}) on the grid "
                f"r_max 2^-i, i = {steps}..0, {where}: the smallest radius whose noisy total "
                f"weight reaches {bar:.4g} (the larger of 0.75 t and the weight the test needs)."
            )
        else:
            meaning.append(
                f"The radius {params.radius:.4g} is used as given (raised to the floor "
                f"r_max 2^-{steps} if below it; {where})."
            )
        return Preview(scales=scales, meaning=meaning)

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[FriendlyAggregateParams]) -> int:
        """Peak bytes of :meth:`run` from its own allocations (``n``, ``d``, ``k``, params)."""
        params = spec.params
        assert params.t is not None and params.aggregator is not None
        return friendly_memory_bytes(
            ctx.n_rows, ctx.n_cols, spec.k, params.t, params.q, params.aggregator, params.radius
        )

    def search(
        self,
        data: FloatArray,
        spec: ReleaseSpec[FriendlyAggregateParams],
        rng: np.random.Generator,
    ) -> FriendlySearch:
        """The first phase of :meth:`run` (:func:`friendly_search`); :meth:`finish` ends it."""
        params = spec.params
        assert params.t is not None and params.aggregator is not None  # resolved by prepare
        return friendly_search(
            data,
            spec.k,
            spec.epsilon,
            spec.delta,
            rng,
            t=params.t,
            q=params.q,
            aggregator=params.aggregator,
            radius=params.radius,
        )

    def run(
        self,
        data: FloatArray,
        spec: ReleaseSpec[FriendlyAggregateParams],
        rng: np.random.Generator,
    ) -> MechanismOutput:
        return self.finish(self.search(data, spec, rng), spec, rng)

    def finish(
        self,
        state: FriendlySearch,
        spec: ReleaseSpec[FriendlyAggregateParams],
        rng: np.random.Generator,
    ) -> MechanismOutput:
        """The second phase of :meth:`run`: PTR, noisy mean and the output."""
        params = spec.params
        assert params.t is not None and params.aggregator is not None  # resolved by prepare
        result = friendly_continue(state, rng)
        # Raw noisy doubles (W_low, and sigma, which is a function of it) are not returned: see
        # the floating-point note in noise.py. The radius is a point of the public grid.
        extras: dict[str, Any] = {
            "t": params.t,
            "aggregator": params.aggregator,
            "radius": result.radius,
            "radius_searched": params.radius is None,
            "radius_exponent": result.radius_exponent,
        }
        if params.q is not None:
            extras["q"] = params.q
        if result.basis is None:
            sens = weight_sensitivity(params.t, ramp_width(params.t))
            return MechanismOutput.no_result(
                f"the subsets' subspaces do not agree enough at radius {result.radius:.3g}: the "
                f"noisy lower bound on the total weight is below the floor {weight_floor(sens):.2f}"
                f" (data not close enough to a {spec.k}-dimensional subspace, or too few rows "
                "for this budget)",
                **extras,
            )
        extras["components_above_noise"] = result.components_above_noise
        if result.components_above_noise < spec.k:
            extras["warning"] = (
                f"only {result.components_above_noise} of the {spec.k} directions of the noisy "
                "average stand above its noise and clearly above the next one: the subsets' "
                "subspaces do not agree at this radius, and the others are indistinguishable "
                "from random directions"
            )
            extras["warning_code"] = WARNING_CODE
        return MechanismOutput(basis=result.basis, extras=extras)
