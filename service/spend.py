"""How spend is stated: one statement of a budget (a dataset's or a grant's) for every surface.

The user's currency is ``(epsilon, delta)``. Every response, 409, grant, table, chart, metric and
audit line states a budget's total, spent and remaining as ``epsilon`` at the dataset's
``delta_total`` (the delta its owner reserved at upload; a ``hybrid`` grant at its own
``delta``, the delta its filters enforce: :func:`service.grants.grant_budget`), with the
accounting's native figure (``rho``, ``mu``) beside it, never instead of it.
:func:`statement` is that statement; nothing else converts a native figure to epsilon for
display (docs/mechanisms.md, "Reading a budget").

What ``epsilon_spent`` means, per accounting (each an epsilon, rounded **up**, at which
everything spent is ``(epsilon, delta_total)``-DP, read at the delta the budget's filter holds
for it, so that ``remaining``, ``total - spent`` rounded **down**, is what the ledger admits:
a request for exactly it is admitted, tests/api/test_stated_is_admitted.py):

* ``basic``: the sum of the charges' epsilons (their delta adds up to ``delta_spent``);
* ``gaussian``: the Gaussian-DP curve at ``mu_spent`` (:func:`service.accounting.gdp_epsilon`);
  its ``remaining`` (as ``hybrid``'s) is what a Gaussian release at the stated delta is
  admitted at, its ``mu`` within ``mu_remaining`` (more than ``total - spent``);
* ``zcdp``: the CKS conversion of ``rho_spent`` at the delta held for the conversion,
  ``delta_conversion`` (the one its ``rho_total`` is derived at, so a spent ``rho_total``
  reads as ``epsilon_total``: at ``delta_total - delta_spent`` a dataset whose rho was all
  spent said 0.03 of 1 remained, which nothing could spend; a valid figure at
  ``delta_total`` still, ``delta_conversion + delta_spent <= delta_total``);
* ``hybrid``: the smallest of the three filters' figures, over the filters whose condition
  still holds on what was spent (:func:`hybrid_epsilon`); its total is at most what its
  filters admit at ``delta_total`` (:func:`hybrid_admitted`), and its ``remaining`` is not
  ``total - spent`` but what the next Gaussian release (the default kind) asked at
  ``delta_total`` is admitted at (:func:`hybrid_next_gaussian`): its GDP filter adds up
  ``mu^2``, not epsilon, so after a release that is more than ``total - spent`` (0.571
  against 0.217 after ``auto`` at ``(1, 1e-7)`` on ``(1, 1e-5)``), and ``spent`` stays the
  guarantee of what was spent.

A new accounting kind adds one function to :data:`_NATIVE` (its native figures and its
epsilon at a delta); every surface then states it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from service import accounting
from service.ledger import BUDGET_CONTEXT, SUMS, BudgetState, BudgetTotals, spent_of, state_of

__all__ = [
    "Native",
    "Running",
    "Statement",
    "epsilon_of",
    "hybrid_epsilon",
    "hybrid_next_gaussian",
    "pure_remaining",
    "running_epsilon",
    "statement",
]


@dataclass(frozen=True)
class Native:
    """An accounting's own figures for a budget: ``rho`` (``gaussian``, ``zcdp``) and ``mu``
    (``gaussian``); ``None`` where the accounting has no such currency."""

    rho_total: Decimal | None = None
    rho_spent: Decimal | None = None
    rho_remaining: Decimal | None = None
    mu_total: Decimal | None = None
    mu_spent: Decimal | None = None
    mu_remaining: Decimal | None = None


@dataclass(frozen=True)
class Statement:
    """A budget stated in ``(epsilon, delta)`` at the dataset's ``delta_total``, with its
    native figures beside it (exact decimals; rounded the safe way: spent up, remaining down).

    ``delta_total`` is the budget's delta (a grant's: what its mechanisms may spend);
    ``delta_remaining`` what releases' mechanisms may still spend; ``delta_reserved_for_conversion``
    the dataset's delta held back to convert ``rho`` to ``(epsilon, delta)`` (``zcdp``; all of
    ``delta_total`` under ``gaussian``; A''s share and B's conversion share under ``hybrid``;
    ``None`` under ``basic``) and never spent by a mechanism. Under ``hybrid``
    ``delta_spent``/``delta_remaining`` are B's share for approximate steps and C's share for
    single releases together (:func:`_hybrid_delta`): the three delta figures add up to
    ``delta_total``.
    """

    accounting: str
    epsilon_total: Decimal
    epsilon_spent: Decimal
    epsilon_remaining: Decimal
    delta_total: Decimal
    delta_spent: Decimal
    delta_remaining: Decimal
    delta_reserved_for_conversion: Decimal | None
    #: The delta the epsilon figures are stated at: the dataset's ``delta_total``.
    stated_at_delta: Decimal
    native: Native
    #: The largest epsilon a pure release (``delta = 0``) is admitted at now
    #: (:func:`pure_remaining`); ``None`` where the accounting admits none (``gaussian``).
    epsilon_remaining_pure: Decimal | None = None

    def remaining_fields(self) -> dict[str, Decimal]:
        """What a 409 and a dry run say remains: the same figures as ``GET .../budget``."""
        fields = {
            "epsilon_remaining": self.epsilon_remaining,
            "delta_remaining": self.delta_remaining,
        }
        for name in ("rho_remaining", "mu_remaining"):
            value = getattr(self.native, name)
            if value is not None:
                fields[name] = value
        if self.delta_reserved_for_conversion is not None:
            fields["delta_reserved_for_conversion"] = self.delta_reserved_for_conversion
        if self.epsilon_remaining_pure is not None:
            fields["epsilon_remaining_pure"] = self.epsilon_remaining_pure
        # The delta epsilon_remaining holds at (a refusal's epsilon_admissible is at the
        # request's own): said with the figures, and in the 409's message.
        fields["stated_at_delta"] = self.stated_at_delta
        return fields


# -- per accounting: the native figures and the epsilon a spend amounts to ---------------------


@dataclass(frozen=True)
class _Kind:
    """One accounting's part of the statement."""

    #: ``(rho, what mechanisms may spend of delta, delta_total) -> epsilon`` (rounded up), for
    #: rho > 0.
    epsilon_at: Callable[[Decimal, Decimal, Decimal], Decimal | None]
    native: Callable[[BudgetState], Native]
    #: The delta held for the conversion, from the dataset's ``delta_total`` and its share.
    reserved: Callable[[Decimal, Decimal | None], Decimal | None]


def _gaussian_epsilon(rho: Decimal, _delta_limit: Decimal, delta_total: Decimal) -> Decimal:
    return accounting.gdp_epsilon(accounting.sqrt_up(2 * rho), delta_total)


def _zcdp_epsilon(rho: Decimal, delta_limit: Decimal, delta_total: Decimal) -> Decimal | None:
    # At the delta the budget holds for the conversion (delta_total less what mechanisms may
    # spend), the one its rho_total is derived at: a spent rho_total reads as epsilon_total.
    return accounting.zcdp_epsilon(rho, BUDGET_CONTEXT.subtract(delta_total, delta_limit))


def _rho_native(state: BudgetState) -> Native:
    total = Decimal(0) if state.rho_total is None else state.rho_total
    return Native(rho_total=total, rho_spent=state.rho_spent, rho_remaining=state.rho_remaining)


def _gaussian_native(state: BudgetState) -> Native:
    total = Decimal(0) if state.rho_total is None else state.rho_total
    mu_total = state.mu_total if state.mu_total is not None else accounting.sqrt_down(2 * total)
    return Native(
        rho_total=total,
        rho_spent=state.rho_spent,
        rho_remaining=state.rho_remaining,
        mu_total=mu_total,
        mu_spent=accounting.sqrt_up(2 * state.rho_spent),
        mu_remaining=accounting.sqrt_down(2 * state.rho_remaining),
    )


def hybrid_epsilon(state: accounting.HybridState, delta_total: Decimal) -> Decimal | None:
    """The epsilon (rounded up) at which what a ``hybrid`` budget spent is ``(epsilon,
    delta_total)``-DP, read by a filter whose condition still holds on it (the smallest):

    * A' (every release has a GDP figure, ``sum mu_i^2 <= mu_total^2``): the spend is
      ``sqrt(gdp_spent)``-GDP (Smith & Thakurta 2022; ``sqrt`` rounded up), converted at
      ``delta_total`` by the GDP curve (:func:`service.accounting.gdp_epsilon`, rounded up);
    * B (every release profiled, sums within B's budget): ``rho_spent``-zCDP with the steps'
      ``zcdp_delta_spent``, converted by CKS at B's conversion share ``delta_conversion`` (the
      delta its ``rho_total`` is derived at, so a spent B reads as the budget's epsilon; at
      ``delta_total - zcdp_delta_spent`` a spent B read 0.83 of 1);
    * C (sums within C's budget): ``epsilon_spent``, its ``delta_spent <= delta_basic <=
      delta_total``.

    Each is what that filter alone, given a budget of exactly what was spent, would have
    admitted the same sequence under, and its own fully adaptive theorem (the one
    :class:`service.accounting.HybridState` cites) makes that spend ``(epsilon,
    delta_total)``-DP: the figure is the statement's convention for every accounting (an
    epsilon at the dataset's ``delta_total``), and the smallest of them is stated. A filter
    that no longer holds is not read (the ledger's admissions are no longer its). ``None`` when
    none holds (a budget overspent by rounding only; callers state the total as spent)."""
    figures: list[Decimal] = []
    if state.a_holds(accounting.NO_COST):
        mu = accounting.sqrt_up(state.gdp_spent)
        figures.append(accounting.gdp_epsilon(mu, delta_total) if mu > 0 else Decimal(0))
    if state.b_holds(accounting.NO_COST):
        if state.rho_spent <= 0:
            figures.append(Decimal(0))
        else:
            converted = accounting.zcdp_epsilon(state.rho_spent, state.budget.delta_conversion)
            if converted is not None:
                figures.append(converted)
    if state.c_holds(accounting.NO_COST):
        figures.append(state.epsilon_spent)
    return min(figures) if figures else None


def hybrid_admitted(budget: accounting.HybridBudget, delta_at: Decimal) -> Decimal:
    """The largest epsilon at which an unspent ``hybrid`` budget admits a Gaussian release
    asked at ``(epsilon, delta_at)``, the delta its figures are stated at: a ``hybrid`` budget's
    stated ``epsilon_total`` is at most this, so that what it states remains is what it admits.

    No filter holds all of ``delta``: A' (GDP) holds 96% of it, so its ``mu_total`` is ``mu``
    at ``(epsilon, 0.96 delta)`` and a release asked at ``(epsilon, delta)`` (more ``mu``) is
    refused by it; B admits one whose ``mu^2/2`` is within ``rho_total``; C one whose ``delta``
    is within its 1% share (never ``delta_at``, unless shares put all of it there). The
    budget's guarantee is still ``(epsilon, delta)`` (the filters' shares sum to ``delta``), but
    a ``(1, 1e-6)`` budget admitted a Gaussian release of at most 0.9979 at ``1e-6`` while it
    stated 1 remaining, and once A' was spent it stated 0.0021 left that nothing could spend.
    Stated at the admitted figure, what is stated is what can be spent (it can only err low:
    a pure release C admits up to the owner's epsilon is stated as at most this)."""
    if budget.delta_basic >= delta_at:
        return budget.epsilon
    widest = max(budget.mu_total, accounting.sqrt_down(2 * budget.rho_total))
    return accounting.gdp_epsilon_admitted(widest, delta_at)


def hybrid_next_gaussian(state: accounting.HybridState, delta_at: Decimal) -> Decimal:
    """The largest epsilon (rounded down) at which a ``hybrid`` budget that spent ``state``
    admits a Gaussian release asked at ``(epsilon, delta_at)`` now: what it states remains.

    The ledger admits a release when any filter would admit the whole sequence with it
    (:meth:`service.accounting.HybridState.admits`), so this is the largest of the filters'
    figures: A' (while every release had a GDP figure) a release of ``mu`` up to
    ``sqrt(mu_total^2 - sum mu_i^2)``; B (while every release had a profile and its sums are
    within its budget) ``mu^2/2`` up to ``rho_total - rho_spent`` (a Gaussian release spends
    none of B's delta share); C (while it holds and ``delta_at`` fits its delta share)
    ``epsilon - epsilon_spent``. The GDP filter's ``mu^2`` add up while epsilon at a fixed delta
    does not (it is not linear in ``mu``), so after a release this is more than ``total -
    spent``: a ``(1, 1e-5)`` budget after ``auto`` at ``(1, 1e-7)`` stated 0.217 remaining
    while a Gaussian release of 0.571 at ``1e-5`` was admitted. At a fresh budget it is
    :func:`hybrid_admitted`."""
    zero = Decimal(0)
    figures = [zero]
    budget = state.budget
    if state.all_gdp:
        gdp_left = BUDGET_CONTEXT.subtract(budget.gdp_total, state.gdp_spent)
        if gdp_left > 0:
            mu = accounting.sqrt_down(gdp_left)
            figures.append(accounting.gdp_epsilon_admitted(mu, delta_at))
    if state.b_holds(accounting.NO_COST):
        rho_left = BUDGET_CONTEXT.subtract(budget.rho_total, state.rho_spent)
        if rho_left > 0:
            mu = accounting.sqrt_down(2 * rho_left)
            figures.append(accounting.gdp_epsilon_admitted(mu, delta_at))
    if (
        state.c_holds(accounting.NO_COST)
        and BUDGET_CONTEXT.add(state.delta_spent, delta_at) <= budget.delta_basic
    ):
        figures.append(BUDGET_CONTEXT.subtract(budget.epsilon, state.epsilon_spent))
    return max(figures)


def hybrid_next_pure(state: accounting.HybridState) -> Decimal:
    """The largest epsilon (rounded down) at which a ``hybrid`` budget that spent ``state``
    admits a pure release (``delta = 0``, its pure steps' epsilons adding up to it) now: the
    largest of the filters' figures, as :func:`hybrid_next_gaussian`. A' (while every release
    had a GDP figure) charges a pure ``eps`` step ``pure_mu(eps)^2``: the largest ``eps`` with
    ``pure_mu(eps)`` within the ``mu`` left (:func:`service.accounting.pure_epsilon_admitted`);
    B (while it holds) ``eps^2/2``: ``sqrt(2 rho_left)``; C (while it holds: a pure release
    needs none of its delta share) ``epsilon - epsilon_spent``. Both ``pure_mu(eps)^2`` and
    ``eps^2/2`` grow faster than ``eps`` (``pure_mu(eps)^2/eps`` increases: 1.57 at 0.001, 7.5
    at 50), so a release whose several pure steps add up to ``eps`` costs at most what one
    step of ``eps`` does. Not capped at the stated ``epsilon_total`` (the Gaussian figure,
    :func:`hybrid_admitted`): C admits a pure release up to the owner's whole epsilon, 1 of a
    ``(1, 1e-5)`` budget whose Gaussian figure is 0.9973."""
    figures = [Decimal(0)]
    budget = state.budget
    if state.all_gdp:
        # gdp_total (mu_total^2) has 60 places: the mu left is read from what is left rounded
        # down to the ledger's 30, so that a cost rounded up to 30 places still fits.
        gdp_left = accounting.round_down(BUDGET_CONTEXT.subtract(budget.gdp_total, state.gdp_spent))
        if gdp_left > 0:
            figures.append(accounting.pure_epsilon_admitted(accounting.sqrt_down(gdp_left)))
    if state.b_holds(accounting.NO_COST):
        rho_left = BUDGET_CONTEXT.subtract(budget.rho_total, state.rho_spent)
        figures.append(accounting.sqrt_down(2 * rho_left))
    if state.c_holds(accounting.NO_COST):
        figures.append(BUDGET_CONTEXT.subtract(budget.epsilon, state.epsilon_spent))
    return max(figures)


def pure_remaining(state: BudgetState) -> Decimal | None:
    """The largest epsilon (rounded down) a pure release (``delta = 0``: the pure Cauchy
    variant of ``smooth_sensitivity``, ``auto`` at ``delta = 0``) is admitted at now, per
    accounting: ``basic`` its ``epsilon_remaining`` (a pure release spends no delta);
    ``gaussian`` none (``None``: it admits Gaussian steps only); ``zcdp`` ``sqrt(2
    rho_remaining)`` (a pure ``eps`` step is charged ``eps^2/2``, Bun & Steinke 2016, Prop.
    1.4); ``hybrid`` :func:`hybrid_next_pure`. Beside ``epsilon_remaining``, which states what
    a Gaussian release at the budget's delta is admitted at: the two differ (under ``hybrid``
    a fresh ``(1, 1e-5)`` budget admits a Gaussian release of 0.9973 at ``1e-5`` and a pure
    one of 1)."""
    if state.accounting == "basic":
        return max(Decimal(0), state.epsilon_remaining)
    if state.accounting == "gaussian":
        return None
    if state.accounting == "zcdp":
        return accounting.sqrt_down(2 * max(Decimal(0), state.rho_remaining))
    if state.accounting == "hybrid":
        return hybrid_next_pure(state.hybrid())
    return None


def _hybrid_native(state: BudgetState) -> Native:
    hybrid = state.hybrid()
    mu_total = hybrid.budget.mu_total
    gdp_left = BUDGET_CONTEXT.subtract(hybrid.budget.gdp_total, state.gdp_spent)
    # A filter another one outran (its sums past its budget) has nothing left: never a
    # negative remaining figure.
    rho_left = state.rho_remaining if hybrid.b_holds(accounting.NO_COST) else Decimal(0)
    gdp_left = gdp_left if hybrid.a_holds(accounting.NO_COST) else Decimal(0)
    return Native(
        rho_total=hybrid.budget.rho_total,
        rho_spent=state.rho_spent,
        rho_remaining=max(Decimal(0), rho_left),
        mu_total=mu_total,
        mu_spent=accounting.sqrt_up(state.gdp_spent),
        mu_remaining=accounting.sqrt_down(max(Decimal(0), gdp_left)),
    )


def _hybrid_reserved(state: BudgetState) -> Decimal:
    """The delta ``hybrid`` holds for converting: A''s share (its GDP curve) and B's
    conversion share; never spent by a mechanism."""
    zero = Decimal(0)
    return BUDGET_CONTEXT.add(
        zero if state.delta_gaussian is None else state.delta_gaussian,
        zero if state.delta_conversion is None else state.delta_conversion,
    )


def _hybrid_delta(state: BudgetState, hybrid: accounting.HybridState) -> tuple[Decimal, Decimal]:
    """``(delta_spent, delta_remaining)`` of a ``hybrid`` budget: the part of ``delta_total``
    that is not held for a conversion is B's share for approximate steps plus C's share for
    single releases, and each filter counts every admitted release (one release may move
    both). ``remaining`` is what approximate steps may still spend under B (``delta_mechanisms``
    less their ``zcdp_delta`` sum) plus what single releases may still spend under C
    (``delta_basic`` less the releases' deltas), each 0 once its filter no longer holds (it
    will never admit again); ``spent`` is the rest of the two shares (spent, or closed with its
    filter). So ``delta_reserved_for_conversion + delta_spent + delta_remaining =
    delta_total`` (the four shares are stored so that they sum to it)."""
    zero = Decimal(0)
    mechanisms = zero if state.delta_mechanisms is None else state.delta_mechanisms
    basic = zero if state.delta_basic is None else state.delta_basic
    b_left = BUDGET_CONTEXT.subtract(mechanisms, state.zcdp_delta_spent)
    c_left = BUDGET_CONTEXT.subtract(basic, state.delta_spent)
    b_left = max(zero, b_left) if hybrid.b_holds(accounting.NO_COST) else zero
    c_left = max(zero, c_left) if hybrid.c_holds(accounting.NO_COST) else zero
    remaining = BUDGET_CONTEXT.add(b_left, c_left)
    spent = BUDGET_CONTEXT.subtract(BUDGET_CONTEXT.add(mechanisms, basic), remaining)
    return spent, remaining


def _hybrid_statement(state: BudgetState, delta_at: Decimal) -> Statement:
    """:func:`statement` of a ``hybrid`` budget: ``delta_reserved_for_conversion`` is A''s
    share and B's conversion share, ``delta_spent``/``delta_remaining`` B's share for
    approximate steps and C's share for single releases (:func:`_hybrid_delta`)."""
    hybrid = state.hybrid()
    epsilon_total = (
        state.epsilon_stated if state.epsilon_stated is not None else state.epsilon_total
    )
    if state.epsilon_ceiling is not None:
        epsilon_total = min(epsilon_total, state.epsilon_ceiling)
    epsilon_total = min(epsilon_total, hybrid_admitted(hybrid.budget, delta_at))
    spent = hybrid_epsilon(hybrid, delta_at)
    # What remains is what the next Gaussian release (the default kind) at the stated delta
    # is admitted at, not total - spent: the Gaussian-DP filter's mu^2 add up, epsilons do not
    # (a spent figure at or past the total, or none holding, leaves nothing).
    remaining = min(epsilon_total, hybrid_next_gaussian(hybrid, delta_at))
    if spent is None or spent >= epsilon_total:
        spent, remaining = (epsilon_total if spent is None else spent), Decimal(0)
    delta_spent, delta_remaining = _hybrid_delta(state, hybrid)
    return Statement(
        accounting="hybrid",
        epsilon_total=epsilon_total,
        epsilon_spent=spent,
        epsilon_remaining=remaining,
        delta_total=state.delta_total,
        delta_spent=delta_spent,
        delta_remaining=delta_remaining,
        delta_reserved_for_conversion=_hybrid_reserved(state),
        stated_at_delta=delta_at,
        native=_hybrid_native(state),
        epsilon_remaining_pure=pure_remaining(state),
    )


_NATIVE: dict[str, _Kind] = {
    "gaussian": _Kind(_gaussian_epsilon, _gaussian_native, lambda total, _share: total),
    "zcdp": _Kind(_zcdp_epsilon, _rho_native, lambda _total, share: share),
    # hybrid's figures need every filter's sums: stated by _hybrid_statement.
    "hybrid": _Kind(lambda _rho, _spent, _total: None, _hybrid_native, lambda _t, share: share),
}


def epsilon_of(
    kind: str, epsilon: Decimal, rho: Decimal, delta_limit: Decimal, delta_total: Decimal
) -> Decimal:
    """The epsilon (rounded up) at which a spend of ``epsilon`` or ``rho`` in the ledger's
    columns is ``(epsilon, delta_total)``-DP under accounting ``kind``, on a budget whose
    mechanisms may spend ``delta_limit`` of ``delta_total``. ``basic`` spends its ``epsilon``
    column; the others convert ``rho`` (``zcdp`` at ``delta_total - delta_limit``, the delta
    held for the conversion)."""
    found = _NATIVE.get(kind)
    if found is None:
        return epsilon
    if rho <= 0:
        return Decimal(0)
    converted = found.epsilon_at(rho, delta_limit, delta_total)
    # No finite epsilon (no delta left for the conversion): the spend is stated as infinite
    # by callers; here it is the figure no budget can exceed.
    return converted if converted is not None else Decimal("Infinity")


def statement(state: BudgetState) -> Statement:
    """The one statement of ``state`` in ``(epsilon, delta)`` with its native figures.

    A dataset's ``epsilon_total`` is the one its owner stated (its whole interaction is
    ``(epsilon_total, delta_total)``-DP by construction of ``rho_total`` / ``mu_total``); a
    grant's is what its native total amounts to (:attr:`BudgetState.epsilon_stated` unset).
    """
    delta_at = state.delta_total if state.stated_delta is None else state.stated_delta
    if state.accounting == "hybrid":
        return _hybrid_statement(state, delta_at)
    kind = _NATIVE.get(state.accounting)
    if kind is None:
        return Statement(
            accounting=state.accounting,
            epsilon_total=state.epsilon_total,
            epsilon_spent=state.epsilon_spent,
            epsilon_remaining=max(Decimal(0), state.epsilon_remaining),
            delta_total=state.delta_total,
            delta_spent=state.delta_spent,
            delta_remaining=max(Decimal(0), state.delta_remaining),
            delta_reserved_for_conversion=None,
            stated_at_delta=delta_at,
            native=Native(),
            epsilon_remaining_pure=pure_remaining(state),
        )
    native = kind.native(state)
    delta_limit = state.delta_total if state.delta_limit is None else state.delta_limit
    if state.epsilon_stated is not None:
        epsilon_total = state.epsilon_stated
    else:
        rho_total = Decimal(0) if state.rho_total is None else state.rho_total
        epsilon_total = epsilon_of(state.accounting, Decimal(0), rho_total, delta_limit, delta_at)
        if state.epsilon_ceiling is not None:
            # A grant's rho is at most the dataset's, whose conversion is within the dataset's
            # epsilon: above it is only the round trip's rounding (down, then up).
            epsilon_total = min(epsilon_total, state.epsilon_ceiling)
    spent = epsilon_of(state.accounting, Decimal(0), state.rho_spent, delta_limit, delta_at)
    spent = min(spent, epsilon_total) if spent.is_infinite() else spent
    remaining = max(Decimal(0), BUDGET_CONTEXT.subtract(epsilon_total, spent))
    if state.accounting == "gaussian" and state.rho_spent > 0 and native.mu_remaining is not None:
        # As hybrid's A': what a Gaussian release at the stated delta is admitted at, its mu
        # within mu_remaining (mu^2 add up, epsilons do not: a (1, 1e-5) budget after a
        # (0.5, 1e-5) release admits 0.834, where total - spent said 0.5).
        admitted = accounting.gdp_epsilon_admitted(native.mu_remaining, delta_at)
        remaining = min(epsilon_total, admitted) if spent < epsilon_total else Decimal(0)
    if state.accounting == "zcdp":
        # The zCDP filter admits in rho: what remains is what a Gaussian release asked at the
        # stated delta is admitted at, its mu^2/2 within rho_remaining. Not total - spent (CKS
        # conversions do not subtract): a fresh (1, 1e-6) budget said 1 remained and refused a
        # Gaussian release at (1, 1e-6) (admitted at most 0.897: CKS is looser than the
        # Gaussian's own curve and holds half the delta), and after a third of its rho said
        # 0.442 while 0.722 was admitted. epsilon_total stays the owner's (a spent rho_total
        # converts to it); what a pure release is admitted at is epsilon_remaining_pure.
        rho_left = max(Decimal(0), state.rho_remaining)
        admitted = accounting.gdp_epsilon_admitted(accounting.sqrt_down(2 * rho_left), delta_at)
        remaining = min(epsilon_total, admitted)
    return Statement(
        accounting=state.accounting,
        epsilon_total=epsilon_total,
        epsilon_spent=spent,
        epsilon_remaining=remaining,
        delta_total=state.delta_total,
        delta_spent=state.delta_spent,
        delta_remaining=max(Decimal(0), state.delta_remaining),
        delta_reserved_for_conversion=kind.reserved(delta_at, state.delta_conversion),
        stated_at_delta=delta_at,
        native=native,
        epsilon_remaining_pure=pure_remaining(state),
    )


@dataclass(frozen=True)
class Running:
    """One ledger entry stated in epsilon: the dataset's net spend after it, as
    :func:`statement` would state it (``epsilon_after``, at the dataset's ``delta_total``), the
    change it made (``epsilon_increment``: negative for a refund), and its native ``mu``
    (``gaussian``: ``sqrt(2 rho)`` of the entry, rounded up)."""

    epsilon_after: Decimal
    epsilon_increment: Decimal
    mu: Decimal | None


def running_epsilon(
    kind: str,
    delta_total: Decimal,
    before: Sequence[Decimal],
    entries: Sequence[Sequence[Any]],
    totals: BudgetTotals | None = None,
) -> list[Running]:
    """Each of ``entries`` (``(kind, epsilon, delta, rho[, gdp, zcdp_delta])``, in ledger
    order, after a net spend of ``before``, :data:`service.ledger.SUMS`) stated in epsilon.
    Under ``basic`` the increments are the entries' epsilons; under the others epsilons do not
    add up (the conversion is concave in ``rho``), so the increment is the difference of the
    running figures: what the chart's step is. ``hybrid`` needs the dataset's ``totals`` (which
    filters still hold); a refund there zeroes its release in every filter
    (:func:`service.ledger.refund`)."""
    if kind == "hybrid":
        assert totals is not None
        return _hybrid_running(totals, before, entries)
    epsilon, rho = before[0], before[2]
    # What mechanisms may spend (zcdp: delta_total less the conversion's share), as
    # :func:`statement` reads it.
    conversion = None if totals is None else totals.delta_conversion
    limit = delta_total if conversion is None else BUDGET_CONTEXT.subtract(delta_total, conversion)
    previous = epsilon_of(kind, epsilon, rho, limit, delta_total)
    shown: list[Running] = []
    for entry in entries:
        entry_kind, entry_epsilon, entry_rho = entry[0], entry[1], entry[3]
        step = BUDGET_CONTEXT.add if entry_kind == "charge" else BUDGET_CONTEXT.subtract
        epsilon = step(epsilon, entry_epsilon)
        rho = step(rho, entry_rho)
        after = epsilon_of(kind, epsilon, max(rho, Decimal(0)), limit, delta_total)
        increment = BUDGET_CONTEXT.subtract(after, previous) if after.is_finite() else after
        mu = accounting.sqrt_up(2 * entry_rho) if kind == "gaussian" else None
        shown.append(Running(after, increment, mu))
        previous = after
    return shown


def _hybrid_running(
    totals: BudgetTotals, before: Sequence[Decimal], entries: Sequence[Sequence[Any]]
) -> list[Running]:
    sums = list(before) + [Decimal(0)] * (len(SUMS) - len(before))

    def stated() -> Decimal:
        state = state_of(totals, *sums)
        found = hybrid_epsilon(state.hybrid(), totals.delta_total)
        return totals.epsilon_total if found is None else found

    previous = stated()
    shown: list[Running] = []
    for entry in entries:
        # a refund's row moves every sum (and count) back: spent_of signs it
        added = spent_of([entry])
        sums = [BUDGET_CONTEXT.add(a, b) for a, b in zip(sums, added, strict=True)]
        after = stated()
        gdp = entry[4] if len(entry) > 4 else None
        mu = None if gdp is None else accounting.sqrt_up(gdp)
        shown.append(Running(after, BUDGET_CONTEXT.subtract(after, previous), mu))
        previous = after
    return shown
