"""Accounting across releases: the ledger as a privacy filter (ALGORITHMS.md, "Accounting across
releases"). Pure: exact decimals and high-precision reals, no database, no HTTP.

A dataset has one of four accountings, each a filter (or a union of filters) proven for fully
adaptive (and concurrent) composition:

* ``basic``: sums of ``(epsilon_i, delta_i)`` (Rogers, Roth, Ullman & Vadhan 2016);
* ``gaussian``: every step of every release is a Gaussian mechanism, release ``i`` is
  ``mu_i``-GDP (``mu_i^2 = sum_j (Delta_j/sigma_j)^2``); the filter stops before
  ``sum mu_i^2 > mu_B^2`` and the whole interaction is ``mu_B``-GDP (Smith & Thakurta 2022).
  ``mu_B`` is the largest ``mu`` with ``delta_G(mu, eps_B) <= delta_B``;
* ``zcdp``: release ``i`` is ``delta_i``-approximately ``rho_i``-zCDP; the filter stops before
  ``sum rho_i > rho_B`` or ``sum delta_i > delta_B - delta_conversion`` (Whitehouse, Ramdas,
  Rogers & Wu, ICML 2023); ``rho_B`` is the largest ``rho`` whose CKS conversion
  (Canonne, Kamath & Steinke 2020) is ``<= delta_conversion`` at ``eps_B``;
* ``hybrid`` (the product default): admit a release iff one of three filters admits the whole
  sequence with it, A' (GDP, Gaussian and pure steps), B (``zcdp``) or C (``basic``), each on
  its share of ``delta`` (:class:`HybridState`, :data:`DEFAULT_HYBRID_SHARES`).

The ledger stores what a release spends in one column ``rho`` for both new accountings: a
``mu``-GDP Gaussian release is exactly ``mu^2/2``-zCDP, so ``sum mu_i^2 <= mu_B^2`` is
``sum mu_i^2/2 <= mu_B^2/2``; a ``gaussian`` dataset's ``rho_total`` is ``mu_B^2/2``.

Exactness: every real is computed with mpmath at :data:`PRECISION_BITS` bits; costs are rounded
**up** and budgets **down** to the ledger's 30 places (``BUDGET_PLACES``), so rounding can only
strengthen the guarantee. Every derived budget is re-checked at its rounded value before it is
returned (``delta_G`` increases in ``mu``; the CKS bound increases in ``rho``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from typing import Literal

import mpmath

from api_schemas.common import BUDGET_CONTEXT, BUDGET_PLACES
from service.mechanisms.base import ApproximateStep, GaussianStep, PrivacyStep, PureStep
from service.refusal_figures import both_lacks, filter_lacks
from service.refusal_figures import lacks as lacks
from service.refusal_figures import short_figure as short_figure
from service.refusal_figures import significant_digits as significant_digits

Accounting = Literal["basic", "gaussian", "zcdp", "hybrid"]
ACCOUNTINGS: tuple[Accounting, ...] = ("basic", "gaussian", "zcdp", "hybrid")

#: Working precision of every real computation here (about 60 significant digits): twice the
#: ledger's 30 places, so a value rounded to 30 places is on the right side of the real one.
PRECISION_BITS = 200

#: Added to a cost (subtracted from a budget) before rounding it to 30 places: far above
#: mpmath's error at :data:`PRECISION_BITS`, far below the ledger's resolution.
SAFETY = Decimal("1e-45")

#: The default share of ``delta_budget`` that a ``zcdp`` dataset reserves for the CKS
#: conversion; the rest is what mechanisms' approximate steps may spend. Measured at
#: ``(1, 1e-6)``: 9/10 for the conversion would give 2.5% less Gaussian noise, all of it 3.0%
#: (and no approximate step could run); half leaves room for a thousand steps of ``5e-10``
#: (docs/mechanisms.md, "Accounting across releases").
DEFAULT_CONVERSION_SHARE = Decimal("0.5")

_QUANTUM = Decimal(1).scaleb(-BUDGET_PLACES)
_CONTEXT = Context(prec=120)


def _mp(value: Decimal | float | int | str) -> mpmath.mpf:
    # At the working precision whatever the caller's context: a decimal read at mpmath's
    # global 53 bits could round up past the budget it states.
    with mpmath.workprec(PRECISION_BITS):
        return mpmath.mpf(str(value)) if isinstance(value, Decimal) else mpmath.mpf(value)


def _decimal(value: mpmath.mpf | Decimal, margin: Decimal) -> Decimal:
    """``value`` as a decimal; an mpmath real is moved by ``margin`` (its own error is far
    smaller) so that rounding it cannot cross the real value."""
    if isinstance(value, Decimal):
        return value
    return _CONTEXT.add(Decimal(mpmath.nstr(value, 70, strip_zeros=False)), margin)


def round_up(value: mpmath.mpf | Decimal) -> Decimal:
    """A cost at the ledger's 30 places, never below ``value``."""
    exact = _decimal(value, SAFETY)
    return exact.quantize(_QUANTUM, rounding=ROUND_CEILING, context=_CONTEXT).normalize(_CONTEXT)


def round_down(value: mpmath.mpf | Decimal) -> Decimal:
    """A budget at the ledger's 30 places, never above ``value`` (and never below 0)."""
    exact = _decimal(value, -SAFETY)
    rounded = exact.quantize(_QUANTUM, rounding=ROUND_FLOOR, context=_CONTEXT)
    return max(Decimal(0), rounded).normalize(_CONTEXT)


# ---------------------------------------------------------------------------------------------
# Gaussian DP


def gdp_delta(
    mu: mpmath.mpf | Decimal | float, epsilon: mpmath.mpf | Decimal | float
) -> mpmath.mpf:
    """``delta_G(mu, eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``: the tight
    ``delta`` of a ``mu``-GDP mechanism at ``epsilon`` (Dong, Roth & Su 2022, Corollary 2.13;
    the analytic-Gaussian curve of Balle & Wang 2018). Increasing in ``mu``."""
    with mpmath.workprec(PRECISION_BITS):
        m, e = _mp(mu) if not isinstance(mu, mpmath.mpf) else mu, _mp(epsilon)
        if m <= 0:
            return mpmath.mpf(max(0, -mpmath.expm1(e)))
        return +(mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2))


def _largest(fits: Callable[[mpmath.mpf], bool], start: mpmath.mpf) -> mpmath.mpf:
    """The largest ``x > 0`` with ``fits(x)`` for a predicate true below a point and false
    above it (to 1e-40 relative); 0 when nothing fits."""
    with mpmath.workprec(PRECISION_BITS):
        low, high = mpmath.mpf(0), start
        while fits(high):
            low, high = high, high * 2
            if high > 1e12:
                return low
        for _ in range(400):
            mid = (low + high) / 2
            if fits(mid):
                low = mid
            else:
                high = mid
            if high - low <= high * mpmath.mpf("1e-40"):
                break
        return low


@functools.lru_cache(maxsize=256)
def mu_budget(epsilon: Decimal, delta: Decimal) -> Decimal:
    """The largest ``mu`` at 30 places with ``delta_G(mu, epsilon) <= delta``: the GDP budget of
    a ``gaussian`` dataset whose owner stated ``(epsilon, delta)``. One release with all of it
    gets exactly the analytic-Gaussian ``sigma`` at ``(epsilon, delta)``."""
    if delta <= 0:
        raise ValueError("a Gaussian-DP budget needs delta > 0")
    target = _mp(delta)
    found = _largest(lambda mu: gdp_delta(mu, epsilon) <= target, mpmath.mpf(1))
    mu = round_down(found)
    while mu > 0 and gdp_delta(mu, epsilon) > target:  # the check the rounding must pass
        mu -= _QUANTUM
    return mu


@functools.lru_cache(maxsize=4096)
def gdp_epsilon(mu: Decimal, delta: Decimal) -> Decimal:
    """The smallest ``epsilon`` (30 places, rounded up) at which a ``mu``-GDP interaction is
    ``(epsilon, delta)``-DP: what a spent ``mu`` amounts to at the dataset's ``delta``."""
    if mu <= 0:
        return Decimal(0)
    target = _mp(delta)
    # delta_G decreases in epsilon: the largest epsilon that does NOT fit bounds the answer.
    low = _largest(lambda e: gdp_delta(mu, e) > target, mpmath.mpf(1))
    return round_up(low)


@functools.lru_cache(maxsize=256)
def gdp_epsilon_admitted(mu: Decimal, delta: Decimal) -> Decimal:
    """The largest ``epsilon`` (30 places, rounded **down**) at which a Gaussian release asked
    at ``(epsilon, delta)`` is at most ``mu``-GDP: ``delta_G(mu, epsilon) >= delta`` (its ``mu``
    is the one with ``delta_G(mu', epsilon) = delta``, and ``delta_G`` grows with ``mu``). The
    other side of :func:`gdp_epsilon`, which rounds up: what a budget of ``mu`` admits."""
    if mu <= 0:
        return Decimal(0)
    target = _mp(delta)
    return round_down(_largest(lambda e: gdp_delta(mu, e) > target, mpmath.mpf(1)))


@functools.lru_cache(maxsize=4096)
def pure_mu(epsilon: Decimal) -> Decimal:
    """``mu = -2 Phi^-1(1/(1 + e^eps))`` rounded up: an ``eps``-DP step is ``mu``-GDP
    (ALGORITHMS.md, "Accounting across releases", the conversions list). The tradeoff curve of
    ``eps``-DP is ``max(0, 1 - e^eps a, e^-eps (1 - a))``: two chords meeting at its symmetric
    point ``(a*, a*)``, ``a* = 1/(1 + e^eps)``, where ``G_mu(a*) = Phi(Phi^-1(1 - a*) - mu) =
    a*`` for this ``mu``. Both chords join ``(0, 1)`` and ``(1, 0)`` (points of ``G_mu``) to
    ``(a*, a*)`` (on ``G_mu``), and ``G_mu`` is convex, so it lies below each chord on its
    interval: ``eps``-DP is ``mu``-GDP (Dong, Roth & Su 2022, Section 2; tested numerically in
    tests/test_accounting_hybrid.py). Filter A' of ``hybrid`` charges a pure step ``mu^2``:
    Smith & Thakurta's (2022) fully adaptive composition holds for any adaptively chosen
    ``mu_i``-GDP mechanisms, not only Gaussian ones."""
    with mpmath.workprec(PRECISION_BITS):
        return round_up(2 * mpmath.sqrt(2) * _erfcinv_of_2a(_mp(epsilon)))


@functools.lru_cache(maxsize=256)
def pure_epsilon_admitted(mu: Decimal) -> Decimal:
    """The largest ``eps`` (30 places, rounded down) whose :func:`pure_mu` is within ``mu``: the
    pure release a GDP filter with ``mu`` left admits. The inverse in closed form: ``mu = -2
    Phi^-1(a)``, ``a = 1/(1 + e^eps)``, so ``eps = log Phi(mu/2) - log Phi(-mu/2)``; checked at
    the rounded figure (``pure_mu`` rounds up) and moved down until it passes."""
    if mu <= 0:
        return Decimal(0)
    with mpmath.workprec(PRECISION_BITS):
        half = _mp(mu) / 2
        epsilon = round_down(mpmath.log(mpmath.ncdf(half)) - mpmath.log(mpmath.ncdf(-half)))
    while epsilon > 0 and pure_mu(epsilon) > mu:
        epsilon -= _QUANTUM
    return epsilon


def _erfcinv_of_2a(epsilon: mpmath.mpf) -> mpmath.mpf:
    """``y`` with ``erfc(y) = 2a``, ``a = 1/(1 + e^eps)``: ``-erfinv(2a - 1)``, so ``mu = 2 sqrt(2)
    y``. Solved for ``log erfc(y) = log 2a`` without forming ``2a - 1``, which at the working
    precision keeps only ``PRECISION_BITS - eps log2(e)`` bits of ``a`` (an error of 6e-20 in
    ``mu`` at eps = 100, below the value ``round_up`` must not go under) and is -1 exactly from
    eps ~ 139, where ``erfinv`` was -inf and the request a 500. ``erfc`` keeps its relative
    precision in the tail. Newton's method on ``g(y) = log erfc(y) - log 2a`` (concave,
    decreasing) from a point right of the root stays right of it and converges monotonically:
    ``y0^2 > eps + 1`` gives ``log erfc(y0) < -y0^2 < log 2a`` (``erfc(y) <= e^-y^2``)."""
    with mpmath.workprec(PRECISION_BITS):
        # log 2a = log 2 - log(1 + e^eps), with e^-eps for large eps (no overflow, no cancel).
        target = mpmath.log(2) - epsilon - mpmath.log1p(mpmath.exp(-epsilon))
        y = mpmath.sqrt(epsilon + 1) + 1
        tolerance = mpmath.ldexp(1, 16 - PRECISION_BITS)
        for _ in range(400):
            tail = mpmath.erfc(y)
            # g'(y) = -(2/sqrt(pi)) e^-y^2 / erfc(y)
            step = (
                (mpmath.log(tail) - target)
                * tail
                / (-2 / mpmath.sqrt(mpmath.pi) * mpmath.exp(-y * y))
            )
            y -= step
            if abs(step) <= tolerance * y:
                break
        return +y


def pure_rho(epsilon: Decimal) -> Decimal:
    """``eps^2/2`` rounded up: an ``eps``-DP step is ``eps^2/2``-zCDP (Bun & Steinke 2016,
    Proposition 1.4)."""
    return round_up(_CONTEXT.multiply(_CONTEXT.multiply(epsilon, epsilon), Decimal("0.5")))


# ---------------------------------------------------------------------------------------------
# zCDP and its conversion


def _cks_log_factor(a: mpmath.mpf) -> mpmath.mpf:
    """``log[(1 - 1/a)^(a-1) / a]``: the factor CKS gain over ``exp((a-1)(a rho - eps))``."""
    return (a - 1) * mpmath.log1p(-1 / a) - mpmath.log(a)


def _golden_min(f: Callable[[mpmath.mpf], mpmath.mpf]) -> tuple[mpmath.mpf, mpmath.mpf]:
    """``(min f(a), a)`` over orders ``a = 1 + e^x``, ``x`` in ``[-14, 14]`` (``a`` from
    ``1 + 1e-6`` to ``1 + 1e6``), by golden section. Every order gives a valid CKS bound, so
    whatever order the search ends at, the value there is a bound that holds (never better than
    the infimum)."""
    with mpmath.workprec(PRECISION_BITS):
        ratio = (mpmath.sqrt(5) - 1) / 2
        lo, hi = mpmath.mpf(-14), mpmath.mpf(14)

        def g(x: mpmath.mpf) -> mpmath.mpf:
            return f(1 + mpmath.exp(x))

        x1, x2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        f1, f2 = g(x1), g(x2)
        # 140 steps shrink the bracket to 1e-28 of its width; the objective is flat at its
        # minimum, so what is left is far below the ledger's 30 places.
        for _ in range(140):
            if f1 < f2:
                hi, x2, f2 = x2, x1, f1
                x1 = hi - ratio * (hi - lo)
                f1 = g(x1)
            else:
                lo, x1, f1 = x1, x2, f2
                x2 = lo + ratio * (hi - lo)
                f2 = g(x2)
        return (f1, 1 + mpmath.exp(x1)) if f1 < f2 else (f2, 1 + mpmath.exp(x2))


def cks_delta(rho: Decimal | float, epsilon: Decimal | float) -> mpmath.mpf:
    """``rho``-zCDP to ``(epsilon, delta)``: Canonne, Kamath & Steinke (NeurIPS 2020),
    Proposition 12 / Corollary 13, ``delta = inf_{a > 1} exp((a-1)(a rho - eps))/a
    (1 - 1/a)^(a-1)`` (capped at 1). An upper bound on the infimum (see :func:`_golden_min`);
    :func:`service.mechanisms.composition.cks_delta` is the same bound in doubles on a grid."""
    with mpmath.workprec(PRECISION_BITS):
        r, e = _mp(rho), _mp(epsilon)
        if r <= 0:
            return mpmath.mpf(0)
        best, _ = _golden_min(lambda a: (a - 1) * (a * r - e) + _cks_log_factor(a))
        return +min(mpmath.mpf(1), mpmath.exp(best))


@functools.lru_cache(maxsize=256)
def rho_budget(epsilon: Decimal, delta_conversion: Decimal) -> Decimal:
    """The largest ``rho`` at 30 places whose CKS conversion is within
    ``(epsilon, delta_conversion)``: the zCDP budget of a ``zcdp`` dataset.

    Solving CKS's bound at order ``a`` for ``rho``: ``rho(a) = (eps + (log delta -
    log[(1-1/a)^(a-1)/a])/(a-1))/a``; the budget is the supremum over ``a`` (each order certifies
    its own ``rho(a)``), rounded down and checked again with :func:`cks_delta`."""
    if delta_conversion <= 0:
        raise ValueError("a zCDP budget needs delta_conversion > 0")
    with mpmath.workprec(PRECISION_BITS):
        e, log_delta = _mp(epsilon), mpmath.log(_mp(delta_conversion))
        negative, order = _golden_min(
            lambda a: -(e + (log_delta - _cks_log_factor(a)) / (a - 1)) / a
        )
        rho = round_down(-negative)
        if rho == 0:
            # No order of the search (up to 1 + 1e6) certifies a positive rho: rho(a) > 0 needs
            # about eps (a - 1) + log(e a delta) > 0, so a beyond min(log(1/delta)/eps,
            # 1/(e delta)) when both are small. A larger order would certify a rho far too small
            # to run anything; 0 is a sound budget (it holds at any delta and admits no step
            # with a cost), and the certificate below is for a positive rho.
            return rho
        # The certificate: CKS's bound at this order, for the rounded rho, is within the target.
        certified = (order - 1) * (order * _mp(rho) - e) + _cks_log_factor(order)
        if not certified <= log_delta:  # pragma: no cover - rounding down only lowers it
            raise ArithmeticError("the derived rho budget failed its certificate")
    return rho


@functools.lru_cache(maxsize=4096)
def zcdp_epsilon(rho: Decimal, delta: Decimal) -> Decimal | None:
    """The smallest ``epsilon`` (rounded up) at which ``rho``-zCDP converts (CKS) to
    ``(epsilon, delta)``: ``inf_a a rho + (log[(1-1/a)^(a-1)/a] - log delta)/(a-1)``;
    ``None`` when ``delta <= 0`` (no finite epsilon)."""
    if delta <= 0:
        return None
    if rho <= 0:
        return Decimal(0)
    with mpmath.workprec(PRECISION_BITS):
        r, log_delta = _mp(rho), mpmath.log(_mp(delta))
        best, _ = _golden_min(lambda a: a * r + (_cks_log_factor(a) - log_delta) / (a - 1))
    return round_up(max(best, mpmath.mpf(0)))


# ---------------------------------------------------------------------------------------------
# What a release costs


@dataclass(frozen=True)
class StepCosts:
    """A release's cost in each currency its steps support, from its declared steps.

    ``rho`` and ``delta`` (approximate zCDP) are ``None`` when the mechanism declared no steps
    (its profile is not proven: only ``basic`` admits it); ``mu`` is ``None`` unless every step
    is Gaussian. ``rho`` is rounded up; ``mu`` is ``sqrt(2 rho)`` (rounded up, display only:
    the ledger charges ``rho``). ``gdp`` is the release's GDP ``mu^2`` for ``hybrid``'s filter
    A' (Gaussian steps' ``(Delta/sigma)^2`` plus pure steps' :func:`pure_mu` squared, rounded
    up), ``None`` when a step is approximate or the profile is unproven.
    """

    rho: Decimal | None
    delta: Decimal | None
    gaussian: bool
    gdp: Decimal | None = None
    #: Every step is pure (at least one step, none Gaussian or approximate): the release is
    #: ``(sum eps_i, 0)``-DP, it spends no delta.
    pure: bool = False

    @property
    def mu(self) -> Decimal | None:
        if not self.gaussian or self.rho is None:
            return None
        return mu_of_rho(self.rho)


def mu_of_rho(rho: Decimal) -> Decimal:
    """``sqrt(2 rho)`` rounded up: the ``mu`` of a Gaussian release of ``rho`` (display)."""
    with mpmath.workprec(PRECISION_BITS):
        return round_up(mpmath.sqrt(2 * _mp(rho)))


def rho_of_mu(mu: Decimal) -> Decimal:
    """``mu^2/2`` rounded up: what a ``mu``-GDP Gaussian release is charged."""
    return round_up(_CONTEXT.multiply(_CONTEXT.multiply(mu, mu), Decimal("0.5")))


def rho_of_mu_exact(mu: Decimal) -> Decimal:
    """``mu^2/2`` exactly (``mu`` has at most 30 places, so at most 61 digits)."""
    return _CONTEXT.multiply(_CONTEXT.multiply(mu, mu), Decimal("0.5"))


def budget_rho_of_mu(mu: Decimal) -> Decimal:
    """``mu^2/2`` rounded down: a ``gaussian`` dataset's (or grant's) budget in the ledger."""
    return round_down(_CONTEXT.multiply(_CONTEXT.multiply(mu, mu), Decimal("0.5")))


def step_costs(steps: Sequence[PrivacyStep] | None) -> StepCosts:
    """Sum the declared steps: Gaussian ``Delta^2/(2 sigma^2)``, pure ``eps^2/2`` (Bun & Steinke
    2016, Proposition 1.4), approximate ``eps^2/2`` plus its ``delta`` (Bun & Steinke, Section
    8). Exact from the doubles the mechanism uses (a double is a finite decimal), every
    operation rounded up, then rounded up to 30 places. Beside it the GDP ``mu^2`` (filter A'
    of ``hybrid``): Gaussian ``(Delta/sigma)^2``, pure :func:`pure_mu` squared; ``None`` with
    an approximate step (A' has no event-based rule)."""
    if steps is None:
        return StepCosts(None, None, False, None)
    up = Context(prec=120, rounding=ROUND_CEILING)
    rho = Decimal(0)
    delta = Decimal(0)
    gdp: Decimal | None = Decimal(0)
    gaussian = True
    for step in steps:
        if isinstance(step, GaussianStep):
            ratio = up.divide(Decimal(step.sensitivity), Decimal(step.sigma))
            square = up.multiply(ratio, ratio)
            rho = up.add(rho, up.divide(square, 2))
            gdp = None if gdp is None else up.add(gdp, square)
        else:
            epsilon = Decimal(step.epsilon)
            rho = up.add(rho, up.divide(up.multiply(epsilon, epsilon), 2))
            gaussian = False
            if isinstance(step, ApproximateStep):
                delta = up.add(delta, Decimal(step.delta))
                gdp = None
            elif gdp is not None:
                mu = pure_mu(epsilon)
                gdp = up.add(gdp, up.multiply(mu, mu))
    pure = bool(steps) and all(
        isinstance(step, PureStep) and not isinstance(step, ApproximateStep) for step in steps
    )
    return StepCosts(
        round_up(rho), round_up(delta), gaussian, None if gdp is None else round_up(gdp), pure
    )


def releases_affordable(remaining: Decimal, cost: Decimal) -> int | None:
    """How many more releases of ``cost`` fit in ``remaining`` (``None`` when free). A
    ``remaining`` below 0 (a ``hybrid`` filter whose sum the releases other filters admitted
    already took past its budget) fits none, free ones included: the filter is closed."""
    if remaining < 0:
        return 0
    if cost <= 0:
        return None
    if remaining == 0:
        return 0
    return int(_CONTEXT.divide_int(remaining, cost))


def sqrt_down(value: Decimal) -> Decimal:
    """``sqrt(value)`` rounded down at 30 places (a remaining ``mu`` for display): the largest
    30-place ``r`` with ``r^2 <= value``. The high-precision root, moved down by its margin,
    lands one place short where the root is itself a 30-place number (an unspent budget's
    ``mu_total``, whose square ``gdp_total`` is exact): checked exactly and moved up then, so
    an unspent budget's ``mu_remaining`` is its ``mu_total``."""
    value = max(value, Decimal(0))
    with mpmath.workprec(PRECISION_BITS):
        root = round_down(mpmath.sqrt(_mp(value)))
    above = _CONTEXT.add(root, _QUANTUM)
    return above.normalize(_CONTEXT) if _CONTEXT.multiply(above, above) <= value else root


def sqrt_up(value: Decimal) -> Decimal:
    """``sqrt(value)`` rounded up at 30 places (a spent ``mu`` for display): the smallest
    30-place ``r`` with ``r^2 >= value`` (moved down one place where the margin overshot an
    exact root, as :func:`sqrt_down`)."""
    if value <= 0:
        return Decimal(0)
    with mpmath.workprec(PRECISION_BITS):
        root = round_up(mpmath.sqrt(_mp(value)))
    below = _CONTEXT.subtract(root, _QUANTUM)
    if below >= 0 and _CONTEXT.multiply(below, below) >= value:
        return below.normalize(_CONTEXT)
    return root


# ---------------------------------------------------------------------------------------------
# Either of three filters (issue 31, item 5): the ``hybrid`` accounting


@dataclass(frozen=True)
class HybridShares:
    """How a hybrid budget splits ``delta_B`` between its filters (fractions summing to 1):
    ``gaussian`` (filter A''s ``delta_A``), ``conversion`` and ``mechanisms`` (filter B, zCDP:
    the CKS conversion's share and its approximate steps' share) and ``basic`` (filter C's)."""

    gaussian: Decimal
    conversion: Decimal
    mechanisms: Decimal
    basic: Decimal

    def __post_init__(self) -> None:
        parts = (self.gaussian, self.conversion, self.mechanisms, self.basic)
        if any(part < 0 for part in parts) or sum(parts) != 1:
            raise ValueError("the shares of delta must be >= 0 and sum to 1")


#: The measured default (bench/bench_accounting_default.py, docs/benchmarks.md "Which
#: accounting can be the default"). Filter A' gets 96% of delta: one Gaussian release with the
#: whole budget then has ``sigma`` at most 1.0077x ``basic``'s over eps in {0.1, 0.5, 1, 2, 8} x
#: delta in {1e-8, 1e-6, 1e-5, 1e-3} (the worst is (0.1, 1e-3); 95% would give 1.0097x, too
#: close to the 1% bar once calibration rounds), and N = 10 or 100 Gaussian releases the same
#: ratio to the PLD accountant's (a GDP filter is exact for Gaussian releases). The other 4%:
#: B's approximate steps get 2% (the aggregators' PTR tests, exact_gapmax's truncated Laplace
#: spend delta from it: 2e-7 of a 1e-5 budget), B's conversion 1% (its rho budget shrinks only
#: with ``log(1/delta)``: 0.8x the rho of a half share at (1, 1e-5)), C 1% (a mechanism with no
#: proven profile, e.g. smooth_sensitivity's Gaussian variant asked by name, still runs once at
#: a small delta). Pure mechanisms need none of it: A' charges them ``pure_mu(eps)^2``.
DEFAULT_HYBRID_SHARES = HybridShares(
    Decimal("0.96"), Decimal("0.01"), Decimal("0.02"), Decimal("0.01")
)


@dataclass(frozen=True)
class HybridBudget:
    """The three filters' budgets of a stated ``(epsilon, delta)``: A', GDP on ``(epsilon,
    delta_A)`` (``mu_total``; its filter compares sums of ``mu_i^2`` with ``gdp_total =
    mu_total^2``, exact: ``mu_total`` has 30 places); B, ``zcdp`` (``rho_total`` at
    ``delta_conversion``, approximate steps up to ``delta_mechanisms``); C, ``basic`` on
    ``(epsilon, delta_basic)``."""

    epsilon: Decimal
    delta: Decimal
    mu_total: Decimal
    delta_gaussian: Decimal
    rho_total: Decimal
    delta_conversion: Decimal
    delta_mechanisms: Decimal
    delta_basic: Decimal

    @property
    def gdp_total(self) -> Decimal:
        """``mu_total^2``, exact (at most 61 digits in an 120-digit context)."""
        return _CONTEXT.multiply(self.mu_total, self.mu_total)


def hybrid_budget(
    epsilon: Decimal, delta: Decimal, shares: HybridShares = DEFAULT_HYBRID_SHARES
) -> HybridBudget:
    """The filters' budgets, each share of ``delta`` rounded down (their sum stays within
    ``delta``), each derived budget rounded down as the filter's own."""
    delta_a = round_down(_CONTEXT.multiply(delta, shares.gaussian))
    conversion = round_down(_CONTEXT.multiply(delta, shares.conversion))
    mechanisms = round_down(_CONTEXT.multiply(delta, shares.mechanisms))
    basic = round_down(_CONTEXT.multiply(delta, shares.basic))
    return hybrid_budget_of(epsilon, delta, delta_a, conversion, mechanisms, basic)


def hybrid_budget_of(
    epsilon: Decimal,
    delta: Decimal,
    delta_gaussian: Decimal,
    delta_conversion: Decimal,
    delta_mechanisms: Decimal,
    delta_basic: Decimal,
) -> HybridBudget:
    """The filters' budgets from stored shares of ``delta`` (their sum must be within it)."""
    if (
        _CONTEXT.add(
            _CONTEXT.add(delta_gaussian, delta_conversion),
            _CONTEXT.add(delta_mechanisms, delta_basic),
        )
        > delta
        or min(delta_gaussian, delta_conversion, delta_mechanisms, delta_basic) < 0
    ):
        raise ValueError("the filters' shares of delta must be >= 0 and sum to at most delta")
    mu = mu_budget(epsilon, delta_gaussian) if delta_gaussian > 0 else Decimal(0)
    rho = rho_budget(epsilon, delta_conversion) if delta_conversion > 0 else Decimal(0)
    return HybridBudget(
        epsilon,
        delta,
        mu,
        delta_gaussian,
        rho,
        delta_conversion,
        delta_mechanisms,
        delta_basic,
    )


def hybrid_sub_budget(dataset: HybridBudget, epsilon: Decimal, delta: Decimal) -> HybridBudget:
    """A grant's filters on a ``hybrid`` dataset whose filters are ``dataset``: a hybrid
    sub-budget of ``(epsilon, delta)`` with the dataset's shares of delta (each share rounded
    down, so their sum stays within ``delta``), each filter's budget derived as the dataset's
    (rounded down) and capped at the dataset's. Pure, so that the grants and the audit compute
    one thing (:func:`service.grants.hybrid_grant_budget`, :mod:`service.audit_hybrid`)."""
    total = dataset.delta

    def share(part: Decimal) -> Decimal:
        if total <= 0:
            return Decimal(0)
        return round_down(BUDGET_CONTEXT.divide(BUDGET_CONTEXT.multiply(delta, part), total))

    budget = hybrid_budget_of(
        epsilon,
        delta,
        share(dataset.delta_gaussian),
        share(dataset.delta_conversion),
        share(dataset.delta_mechanisms),
        share(dataset.delta_basic),
    )
    return HybridBudget(
        budget.epsilon,
        budget.delta,
        min(budget.mu_total, dataset.mu_total),
        budget.delta_gaussian,
        min(budget.rho_total, dataset.rho_total),
        budget.delta_conversion,
        budget.delta_mechanisms,
        budget.delta_basic,
    )


@dataclass(frozen=True)
class ReleaseCost:
    """What one release costs under each filter: ``(epsilon, delta)``, the single release it
    is calibrated as (C); ``rho``/``zcdp_delta`` from its declared steps (B; ``None``: no
    profile); ``gdp``, its GDP ``mu^2`` (A': Gaussian steps' ``(Delta/sigma)^2`` plus pure
    steps' ``pure_mu(eps)^2``; ``None`` with an approximate step or no profile)."""

    epsilon: Decimal
    delta: Decimal
    rho: Decimal | None
    zcdp_delta: Decimal | None
    gdp: Decimal | None

    @staticmethod
    def of(epsilon: Decimal, delta: Decimal, costs: StepCosts) -> ReleaseCost:
        """A prepared release's cost from its single-release target and declared steps."""
        zcdp_delta = None if costs.rho is None else costs.delta
        return ReleaseCost(epsilon, delta, costs.rho, zcdp_delta, costs.gdp)


#: A release that costs nothing in every filter: ``state.a_holds(NO_COST)`` (and ``b_``,
#: ``c_``) is whether that filter still holds on what was spent.
NO_COST = ReleaseCost(Decimal(0), Decimal(0), Decimal(0), Decimal(0), Decimal(0))


@dataclass(frozen=True)
class HybridState:
    """What the admitted releases spent, per filter, and which filters still hold.

    Admit a release iff A', B or C would admit the whole sequence including it:

    * A' (GDP, Smith & Thakurta 2022): every release so far has a GDP figure (Gaussian and
      pure steps only) and ``sum mu_i^2 <= mu_total^2``. Smith & Thakurta's fully adaptive
      theorem is about any adaptively chosen ``mu_i``-GDP mechanisms (GDP defined by
      simulation from ``N(0, 1)``, ``N(mu, 1)``), and a release whose steps are Gaussian
      (``(Delta/sigma)``-GDP) and pure (``pure_mu(eps)``-GDP, :func:`pure_mu`) is ``mu_i``-GDP
      with ``mu_i^2`` the sum of its steps' (GDP composes so, Dong, Roth & Su 2022, Cor. 3.3);
      the filter is then ``mu_total``-GDP, so ``(epsilon, delta_A)``-DP by ``mu_budget``;
    * B (approximate zCDP, Whitehouse, Ramdas, Rogers & Wu 2023): every release has a profile,
      ``sum rho_i <= rho_total`` and ``sum zcdp_delta_i <= delta_mechanisms``;
    * C (basic, Rogers, Roth, Ullman & Vadhan 2016): ``sum epsilon_i <= epsilon`` and ``sum
      delta_i <= delta_basic``.

    Why the result is ``(epsilon, delta)``-DP, fully adaptively (ALGORITHMS.md, "Either of two
    filters", generalised to ``k`` filters): each filter's condition ``cond_j`` on a sequence of
    costs is **monotone** (sums only grow and the "every release has a GDP figure / a profile"
    flags only fall: once false, false for every longer sequence). Costs are public, so
    ``cond_j`` of the admitted sequence is a function of the transcript (refusals included).
    Partition the transcripts: ``T_j`` is "``j`` is the first of A', B, C whose condition holds
    on the final admitted sequence" (some does: the last admission was allowed by some filter on
    exactly that sequence; with no admission, A' holds). On ``T_j``, ``cond_j`` holds on every
    prefix (monotone), so ``j`` alone would have admitted every release the ledger admitted, and
    it refuses whatever the ledger refused (the ledger refuses only what every filter refuses):
    step by step the ledger and filter ``j`` alone make the same decision given the same
    history, and the mechanisms' outputs have the same conditional laws, so every transcript in
    ``T_j`` has the same probability under both. Hence for any event ``S``: ``P[M(x) in S, T_j]
    = P[M_j(x) in S, T_j] <= e^eps P[M_j(x') in S, T_j] + delta_j = e^eps P[M(x') in S, T_j] +
    delta_j``, by filter ``j``'s own fully adaptive theorem (above). Summing over the partition:
    ``(epsilon, delta_A + delta_conversion + delta_mechanisms + delta_C)``-DP, within
    ``delta``. Every filter's sums include every admitted release, whichever filter let it in
    (the argument is about each filter's condition on the whole sequence). A refunded release
    (one that provably never read the data) counts as a zero-cost step in every filter once
    its refund takes effect; why the argument still holds is in
    :func:`service.ledger.refund`'s docstring.
    """

    budget: HybridBudget
    epsilon_spent: Decimal = Decimal(0)
    delta_spent: Decimal = Decimal(0)
    rho_spent: Decimal = Decimal(0)
    zcdp_delta_spent: Decimal = Decimal(0)
    gdp_spent: Decimal = Decimal(0)
    all_gdp: bool = True
    all_profiled: bool = True

    def a_holds(self, cost: ReleaseCost) -> bool:
        """Filter A' (GDP) on the sequence with ``cost`` appended."""
        if not self.all_gdp or cost.gdp is None:
            return False
        return _CONTEXT.add(self.gdp_spent, cost.gdp) <= self.budget.gdp_total

    def b_holds(self, cost: ReleaseCost) -> bool:
        """Filter B (approximate zCDP) on the sequence with ``cost`` appended."""
        if not self.all_profiled or cost.rho is None or cost.zcdp_delta is None:
            return False
        rho_ok = _CONTEXT.add(self.rho_spent, cost.rho) <= self.budget.rho_total
        delta = _CONTEXT.add(self.zcdp_delta_spent, cost.zcdp_delta)
        return rho_ok and delta <= self.budget.delta_mechanisms

    def c_holds(self, cost: ReleaseCost) -> bool:
        """Filter C (basic) on the sequence with ``cost`` appended."""
        epsilon_ok = _CONTEXT.add(self.epsilon_spent, cost.epsilon) <= self.budget.epsilon
        return epsilon_ok and _CONTEXT.add(self.delta_spent, cost.delta) <= self.budget.delta_basic

    # The names the rule's tests use.
    _a = a_holds
    _b = b_holds
    _c = c_holds

    def filters_admitting(self, cost: ReleaseCost) -> list[str]:
        """Which filters (``gdp``, ``zcdp``, ``basic``) admit the sequence with ``cost``."""
        checks = (("gdp", self.a_holds), ("zcdp", self.b_holds), ("basic", self.c_holds))
        return [name for name, holds in checks if holds(cost)]

    def refusals(self, cost: ReleaseCost) -> list[str]:
        """Why each filter that refuses ``cost`` does (public figures only: costs and budgets),
        for the 409's message: A' closed for good after a release without a GDP figure, or
        short of ``mu^2``; B without a profile, short of ``rho`` or of its share of delta; C
        short of epsilon or of its share of delta; any of them closed for good where releases
        the other filters admitted already spent more than that sum holds
        (:func:`_filter_lacks`)."""
        reasons: list[str] = []
        if not self.a_holds(cost):
            if not self.all_gdp:
                reasons.append(
                    "filter A (Gaussian-DP) is closed: an earlier release had no Gaussian-DP "
                    "figure (an approximate step)"
                )
            elif cost.gdp is None:
                reasons.append("filter A (Gaussian-DP) cannot charge it (an approximate step)")
            else:
                reasons.append(
                    filter_lacks(
                        "filter A (Gaussian-DP)",
                        "mu^2",
                        self.budget.gdp_total,
                        self.gdp_spent,
                        cost.gdp,
                    )
                )
        if not self.b_holds(cost):
            if not self.all_profiled or cost.rho is None or cost.zcdp_delta is None:
                reasons.append("filter B (zCDP) is closed to it (a release without a profile)")
            else:
                b = "filter B (zCDP)"
                budget, rho, delta = self.budget, self.rho_spent, self.zcdp_delta_spent
                if _CONTEXT.add(rho, cost.rho) > budget.rho_total:
                    reasons.append(filter_lacks(b, "rho", budget.rho_total, rho, cost.rho))
                if _CONTEXT.add(delta, cost.zcdp_delta) > budget.delta_mechanisms:
                    share = "delta share for approximate steps"
                    needs = cost.zcdp_delta
                    reasons.append(filter_lacks(b, share, budget.delta_mechanisms, delta, needs))
        if not self.c_holds(cost):
            # One clause for C, naming it once, with what it lacks of epsilon and/or of its
            # delta share ("filter C (basic) has epsilon 0 left, it needs 0.9; filter C
            # (basic) has, of its delta share, ..." named it twice in one sentence).
            c, budget = "filter C (basic)", self.budget
            short: list[str] = []
            if _CONTEXT.add(self.epsilon_spent, cost.epsilon) > budget.epsilon:
                spent = self.epsilon_spent
                short.append(filter_lacks(c, "epsilon", budget.epsilon, spent, cost.epsilon))
            if _CONTEXT.add(self.delta_spent, cost.delta) > budget.delta_basic:
                spent = self.delta_spent
                share = "delta share"
                short.append(filter_lacks(c, share, budget.delta_basic, spent, cost.delta))
            if len(short) == 2:
                short = [
                    both_lacks(
                        c,
                        (budget.epsilon, self.epsilon_spent, cost.epsilon),
                        (budget.delta_basic, self.delta_spent, cost.delta),
                    )
                ]
            reasons.extend(short)
        return reasons

    def admits(self, cost: ReleaseCost) -> bool:
        """Whether A', B or C admits the sequence with ``cost`` appended (each checks the
        whole sequence: its sums include every admitted release, whichever filter let it in)."""
        return self.a_holds(cost) or self.b_holds(cost) or self.c_holds(cost)

    def after(self, cost: ReleaseCost) -> HybridState:
        """The state once ``cost`` is admitted: every filter's sums move (each filter's
        condition is about the whole sequence)."""
        return HybridState(
            self.budget,
            _CONTEXT.add(self.epsilon_spent, cost.epsilon),
            _CONTEXT.add(self.delta_spent, cost.delta),
            _CONTEXT.add(self.rho_spent, cost.rho or Decimal(0)),
            _CONTEXT.add(self.zcdp_delta_spent, cost.zcdp_delta or Decimal(0)),
            _CONTEXT.add(self.gdp_spent, cost.gdp or Decimal(0)),
            self.all_gdp and cost.gdp is not None,
            self.all_profiled and cost.rho is not None,
        )
