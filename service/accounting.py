"""Accounting across releases: the ledger as a privacy filter (ALGORITHMS.md, "Accounting across
releases"). Pure: exact decimals and high-precision reals, no database, no HTTP.

A dataset has one of three accountings, each a filter proven for fully adaptive (and concurrent)
composition:

* ``basic``: sums of ``(epsilon_i, delta_i)`` (Rogers, Roth, Ullman & Vadhan 2016);
* ``gaussian``: every step of every release is a Gaussian mechanism, release ``i`` is
  ``mu_i``-GDP (``mu_i^2 = sum_j (Delta_j/sigma_j)^2``); the filter stops before
  ``sum mu_i^2 > mu_B^2`` and the whole interaction is ``mu_B``-GDP (Smith & Thakurta 2022).
  ``mu_B`` is the largest ``mu`` with ``delta_G(mu, eps_B) <= delta_B``;
* ``zcdp``: release ``i`` is ``delta_i``-approximately ``rho_i``-zCDP; the filter stops before
  ``sum rho_i > rho_B`` or ``sum delta_i > delta_B - delta_conversion`` (Whitehouse, Ramdas,
  Rogers & Wu, ICML 2023); ``rho_B`` is the largest ``rho`` whose CKS conversion
  (Canonne, Kamath & Steinke 2020) is ``<= delta_conversion`` at ``eps_B``.

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

from api_schemas.common import BUDGET_PLACES
from service.mechanisms.base import ApproximateStep, GaussianStep, PrivacyStep

Accounting = Literal["basic", "gaussian", "zcdp"]
ACCOUNTINGS: tuple[Accounting, ...] = ("basic", "gaussian", "zcdp")

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


def pure_mu(epsilon: Decimal) -> Decimal:
    """``mu = -2 Phi^-1(1/(1 + e^eps))`` rounded up: an ``eps``-DP step is ``mu``-GDP. The
    tradeoff curve of ``eps``-DP is the two chords of ``G_mu`` through its symmetric point
    ``(a, a)``, ``a = 1/(1 + e^eps) = Phi(-mu/2)``, and ``G_mu`` is convex, so it lies below
    them (Dong, Roth & Su 2022, Section 2). Not used by a filter: the ``gaussian`` filter's
    fully adaptive theorem (Smith & Thakurta 2022) is applied here to Gaussian steps only."""
    with mpmath.workprec(PRECISION_BITS):
        a = 1 / (1 + mpmath.exp(_mp(epsilon)))
        return round_up(-2 * mpmath.sqrt(2) * mpmath.erfinv(2 * a - 1))


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
    the ledger charges ``rho``).
    """

    rho: Decimal | None
    delta: Decimal | None
    gaussian: bool

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
    operation rounded up, then rounded up to 30 places."""
    if steps is None:
        return StepCosts(None, None, False)
    up = Context(prec=120, rounding=ROUND_CEILING)
    rho = Decimal(0)
    delta = Decimal(0)
    gaussian = True
    for step in steps:
        if isinstance(step, GaussianStep):
            ratio = up.divide(Decimal(step.sensitivity), Decimal(step.sigma))
            rho = up.add(rho, up.divide(up.multiply(ratio, ratio), 2))
        else:
            epsilon = Decimal(step.epsilon)
            rho = up.add(rho, up.divide(up.multiply(epsilon, epsilon), 2))
            gaussian = False
            if isinstance(step, ApproximateStep):
                delta = up.add(delta, Decimal(step.delta))
    return StepCosts(round_up(rho), round_up(delta), gaussian)


def releases_affordable(remaining: Decimal, cost: Decimal) -> int | None:
    """How many more releases of ``cost`` fit in ``remaining`` (``None`` when free)."""
    if cost <= 0:
        return None
    if remaining <= 0:
        return 0
    return int(_CONTEXT.divide_int(remaining, cost))


def sqrt_down(value: Decimal) -> Decimal:
    """``sqrt(value)`` rounded down at 30 places (a remaining ``mu`` for display)."""
    with mpmath.workprec(PRECISION_BITS):
        return round_down(mpmath.sqrt(_mp(max(value, Decimal(0)))))


def sqrt_up(value: Decimal) -> Decimal:
    """``sqrt(value)`` rounded up at 30 places (a spent ``mu`` for display)."""
    with mpmath.workprec(PRECISION_BITS):
        return round_up(mpmath.sqrt(_mp(max(value, Decimal(0))))) if value > 0 else Decimal(0)


# ---------------------------------------------------------------------------------------------
# Either of three filters (issue 31, item 5): the rule, not yet a dataset accounting


@dataclass(frozen=True)
class HybridShares:
    """How a hybrid budget splits ``delta_B`` between its filters (fractions summing to 1):
    ``gaussian`` (filter A's ``delta_A``), ``conversion`` and ``mechanisms`` (filter B, zCDP:
    the CKS conversion's share and its approximate steps' share) and ``basic`` (filter C's)."""

    gaussian: Decimal
    conversion: Decimal
    mechanisms: Decimal
    basic: Decimal

    def __post_init__(self) -> None:
        parts = (self.gaussian, self.conversion, self.mechanisms, self.basic)
        if any(part < 0 for part in parts) or sum(parts) != 1:
            raise ValueError("the shares of delta must be >= 0 and sum to 1")


#: The measured default (bench/bench_accounting_hybrid.py, docs/benchmarks.md): filter A gets
#: 95% of delta, so a single Gaussian release is within 1% of ``basic`` for every budget
#: measured (``delta <= 1e-3``); the rest is split between B and C.
DEFAULT_HYBRID_SHARES = HybridShares(
    Decimal("0.95"), Decimal("0.02"), Decimal("0.02"), Decimal("0.01")
)


@dataclass(frozen=True)
class HybridBudget:
    """The three filters' budgets of a stated ``(epsilon, delta)``: A, ``gaussian`` on
    ``(epsilon, delta_A)`` (``mu_total``, stored as ``rho_gaussian = mu^2/2`` rounded down);
    B, ``zcdp`` (``rho_total`` at ``delta_conversion``, approximate steps up to
    ``delta_mechanisms``); C, ``basic`` on ``(epsilon, delta_basic)``."""

    epsilon: Decimal
    delta: Decimal
    mu_total: Decimal
    rho_gaussian: Decimal
    rho_total: Decimal
    delta_conversion: Decimal
    delta_mechanisms: Decimal
    delta_basic: Decimal


def hybrid_budget(
    epsilon: Decimal, delta: Decimal, shares: HybridShares = DEFAULT_HYBRID_SHARES
) -> HybridBudget:
    """The filters' budgets, each share of ``delta`` rounded down (their sum stays within
    ``delta``), each derived budget rounded down as the filter's own."""
    delta_a = round_down(_CONTEXT.multiply(delta, shares.gaussian))
    conversion = round_down(_CONTEXT.multiply(delta, shares.conversion))
    mechanisms = round_down(_CONTEXT.multiply(delta, shares.mechanisms))
    basic = round_down(_CONTEXT.multiply(delta, shares.basic))
    mu = mu_budget(epsilon, delta_a) if delta_a > 0 else Decimal(0)
    rho = rho_budget(epsilon, conversion) if conversion > 0 else Decimal(0)
    return HybridBudget(
        epsilon, delta, mu, budget_rho_of_mu(mu), rho, conversion, mechanisms, basic
    )


@dataclass(frozen=True)
class ReleaseCost:
    """What one release costs under each filter: ``(epsilon, delta)``, the single release it
    is calibrated as (C); ``rho``/``zcdp_delta`` from its declared steps (B; ``None``: no
    profile); ``gaussian`` whether every step is Gaussian (A charges ``rho = mu^2/2``)."""

    epsilon: Decimal
    delta: Decimal
    rho: Decimal | None
    zcdp_delta: Decimal | None
    gaussian: bool


@dataclass(frozen=True)
class HybridState:
    """What the admitted releases spent, per filter, and which filters still hold.

    Admit a release iff A, B or C would admit the whole sequence including it. Why the result
    is ``(epsilon, delta)``-DP, fully adaptively (ALGORITHMS.md, "Either of two filters",
    generalised to ``k`` filters): each filter's condition ``cond_j`` on a sequence of costs is
    **monotone** (sums only grow and the "every step Gaussian / profiled" flags only fall: once
    false, false for every longer sequence). Costs are public, so ``cond_j`` of the admitted
    sequence is a function of the transcript (refusals included). Partition the transcripts:
    ``T_j`` is "``j`` is the first of A, B, C whose condition holds on the final admitted
    sequence" (some does: the last admission was allowed by some filter on exactly that
    sequence; with no admission, A holds). On ``T_j``, ``cond_j`` holds on every prefix
    (monotone), so ``j`` alone would have admitted every release the ledger admitted, and it
    refuses whatever the ledger refused (the ledger refuses only what every filter refuses):
    step by step the ledger and filter ``j`` alone make the same decision given the same
    history, and the mechanisms' outputs have the same conditional laws, so every transcript in
    ``T_j`` has the same probability under both. Hence for any event ``S``: ``P[M(x) in S, T_j]
    = P[M_j(x) in S, T_j] <= e^eps P[M_j(x') in S, T_j] + delta_j = e^eps P[M(x') in S, T_j] +
    delta_j``, by filter ``j``'s own fully adaptive theorem (Smith & Thakurta 2022; Whitehouse,
    Ramdas, Rogers & Wu 2023; Rogers, Roth, Ullman & Vadhan 2016). Summing over the partition:
    ``(epsilon, delta_A + delta_B + delta_C)``-DP. Every filter's sums include every admitted
    release, whichever filter let it in (the argument is about each filter's condition on the
    whole sequence).
    """

    budget: HybridBudget
    epsilon_spent: Decimal = Decimal(0)
    delta_spent: Decimal = Decimal(0)
    rho_spent: Decimal = Decimal(0)
    zcdp_delta_spent: Decimal = Decimal(0)
    all_gaussian: bool = True
    all_profiled: bool = True

    def _a(self, cost: ReleaseCost) -> bool:
        if not (self.all_gaussian and cost.gaussian and cost.rho is not None):
            return False
        return _CONTEXT.add(self.rho_spent, cost.rho) <= self.budget.rho_gaussian

    def _b(self, cost: ReleaseCost) -> bool:
        if not self.all_profiled or cost.rho is None or cost.zcdp_delta is None:
            return False
        rho_ok = _CONTEXT.add(self.rho_spent, cost.rho) <= self.budget.rho_total
        delta = _CONTEXT.add(self.zcdp_delta_spent, cost.zcdp_delta)
        return rho_ok and delta <= self.budget.delta_mechanisms

    def _c(self, cost: ReleaseCost) -> bool:
        epsilon_ok = _CONTEXT.add(self.epsilon_spent, cost.epsilon) <= self.budget.epsilon
        return epsilon_ok and _CONTEXT.add(self.delta_spent, cost.delta) <= self.budget.delta_basic

    def admits(self, cost: ReleaseCost) -> bool:
        """Whether A, B or C admits the sequence with ``cost`` appended (each checks the
        whole sequence: its sums include every admitted release, whichever filter let it in)."""
        return self._a(cost) or self._b(cost) or self._c(cost)

    def after(self, cost: ReleaseCost) -> HybridState:
        """The state once ``cost`` is admitted: every filter's sums move (each filter's
        condition is about the whole sequence)."""
        return HybridState(
            self.budget,
            _CONTEXT.add(self.epsilon_spent, cost.epsilon),
            _CONTEXT.add(self.delta_spent, cost.delta),
            _CONTEXT.add(self.rho_spent, cost.rho or Decimal(0)),
            _CONTEXT.add(self.zcdp_delta_spent, cost.zcdp_delta or Decimal(0)),
            self.all_gaussian and cost.gaussian,
            self.all_profiled and cost.rho is not None,
        )
