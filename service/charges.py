"""What a release is charged in its dataset's currency, as the ledger, the release row and the
audit events record it (one charge per release; see :mod:`service.ledger`)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from typing import Any

from api_schemas.common import format_budget
from service import accounting, advice
from service.db.models import Dataset, LedgerEntry, Release
from service.errors import InvalidInput
from service.ledger import Charge

__all__ = [
    "cost_delta",
    "cost_rho",
    "details",
    "hybrid_charge",
    "hybrid_delta_refusal",
    "outcome_cost",
    "refund_details",
]

#: Significant digits of the largest delta a :func:`hybrid_delta_refusal` suggests (rounded
#: down, so the figure keeps a margin over a ratio that moves slightly with delta).
SUGGESTED_DIGITS = 2
#: How many smaller deltas :func:`hybrid_delta_refusal` tries before it suggests none.
SUGGESTION_TRIES = 40

#: The mechanisms that run with delta = 0 (named where no delta can be spent).
PURE_CHOICES = "smooth_sensitivity or auto, which run with delta = 0"

#: A release's charge at another asked delta (its other figures unchanged), or ``None`` where
#: the mechanism refuses that delta.
ChargeAt = Callable[[Decimal], Charge | None]

# The suggestion's arithmetic (BUDGET_CONTEXT traps inexact results): ratios rounded up,
# quotients down, so the suggested delta only errs small.
_UP = Context(prec=80, rounding=ROUND_CEILING)
_DOWN = Context(prec=80, rounding=ROUND_FLOOR)


def hybrid_charge(epsilon: Decimal, delta: Decimal, costs: accounting.StepCosts) -> Charge:
    """A release's charge on a ``hybrid`` dataset: every filter's figure at once (filter C its
    single-release ``(epsilon, delta)``, B its ``rho`` and approximate ``delta`` or none
    without a profile, A' its GDP ``mu^2`` or none with an approximate step)."""
    profiled = costs.rho is not None and costs.delta is not None
    return Charge(
        epsilon,
        delta,
        costs.rho if costs.rho is not None else Decimal(0),
        gdp=costs.gdp,
        zcdp_delta=costs.delta if profiled else None,
    )


def cost_rho(kind: str, charge: Charge) -> Decimal | None:
    """The release's stored ``cost_rho``: null on ``basic`` and for a ``hybrid`` release with no
    zCDP profile."""
    if kind == "basic" or (kind == "hybrid" and charge.zcdp_delta is None):
        return None
    return charge.rho


def cost_delta(kind: str, charge: Charge) -> Decimal | None:
    """The release's stored ``cost_delta`` (its approximate steps' delta under zCDP)."""
    if kind == "basic":
        return None
    return charge.zcdp_delta if kind == "hybrid" else charge.delta


def details(kind: str, epsilon: Decimal, delta: Decimal, charge: Charge) -> dict[str, Any]:
    """A release's cost as its audit events record it: ``(epsilon, delta)`` on ``basic`` (as
    before), plus the accounting and the ``(rho, delta)`` charged on the others."""
    shown: dict[str, Any] = {"epsilon": epsilon, "delta": delta}
    if kind != "basic":
        shown["accounting"] = kind
        shown["rho"] = cost_rho(kind, charge)
        shown["zcdp_delta"] = cost_delta(kind, charge)
    if kind == "hybrid":
        shown["gdp"] = charge.gdp
    return shown


def _percent(part: Decimal | None, whole: Decimal) -> str:
    if part is None or whole <= 0:
        return "0%"
    return f"{format_budget(_DOWN.multiply(_DOWN.divide(part, whole), 100).normalize())}%"


def filters_of(dataset: Dataset) -> accounting.HybridBudget:
    """A ``hybrid`` dataset's three filters' budgets, as stored."""
    zero = Decimal(0)
    return accounting.HybridBudget(
        dataset.epsilon_total,
        dataset.delta_total,
        dataset.mu_total or zero,
        dataset.delta_gaussian or zero,
        dataset.rho_total or zero,
        dataset.delta_conversion or zero,
        dataset.delta_mechanisms or zero,
        dataset.delta_basic or zero,
    )


def hybrid_delta_refusal(
    dataset: Dataset,
    asked_delta: Decimal | None,
    charge: Charge,
    charge_at: ChargeAt | None = None,
    grant_filters: accounting.HybridBudget | None = None,
) -> InvalidInput | None:
    """Why a release can never be admitted on a fresh ``hybrid`` dataset because of its delta
    (a 422 naming ``delta``, before anything is charged), or ``None``.

    ``grant_filters``: the filters of the grant the release would be charged to
    (:func:`service.grants.hybrid_grant_budget`). A grant's filters are each within the
    dataset's, so a release its unspent filters admit is admitted by the dataset's unspent
    ones: under a grant the question, and the suggested delta, are about the grant's filters
    (a delta the dataset's shares take but the grant's never could was a 409 naming the grant,
    as if something had been spent, and a figure read off the dataset's shares was refused).

    A release without a GDP figure (an approximate step, or no proven profile) can only be
    admitted by filter B (its ``rho`` within ``rho_total`` and its approximate steps'
    ``zcdp_delta`` within B's whole share ``delta_mechanisms``) or filter C (its ``epsilon``
    within ``epsilon_total`` and its single-release ``delta`` within C's whole share
    ``delta_basic``); each filter's sums only grow, so if neither could admit this one release
    even on an unspent budget, and a smaller delta would let one of them, the 409 it would get
    is not about what was spent: the answer is this 422. The suggested delta is the largest
    request delta either filter could take, from the release's own ratio of the charged delta
    to the asked one (B: ``zcdp_delta / asked``, C: ``delta / asked``; the approximate steps
    spend a fixed fraction of the asked delta), rounded down to :data:`SUGGESTED_DIGITS`
    significant digits. A filter is offered only
    where the release's other figure fits its fresh budget (B: ``rho <= rho_total``, C:
    ``epsilon <= epsilon_total``); when neither does, the budget check's 409 says what is
    short and ``None`` is returned.

    The ratio is the asked delta's; where a mechanism's charged delta is not proportional to
    the asked one (``friendly_aggregate`` sizes its partition to delta), the figure read off it
    may still be refused. So with ``charge_at`` the figure is checked: the release charged at
    it must be admitted by B or C on the unspent budget; if not, the figure is read again off
    the ratio at it (and at least one step of its last digit lower), up to
    :data:`SUGGESTION_TRIES` times. Without an admitted figure no delta is offered and
    ``None`` is returned (the budget check's 409 then says what is short)."""
    if dataset.accounting != "hybrid" or asked_delta is None or asked_delta <= 0:
        return None
    filters = filters_of(dataset) if grant_filters is None else grant_filters
    whose = "this dataset's" if grant_filters is None else "this grant's"
    if charge.delta > 0 and holds_no_delta(filters):
        return _no_delta_refusal(asked_delta, filters, grant_filters is not None)
    if charge.gdp is not None:
        return None
    fresh = accounting.HybridState(filters)
    cost = charge.release_cost()
    if fresh.b_holds(cost) or fresh.c_holds(cost):
        return None  # admitted on an unspent budget: any 409 is about what was spent
    mechanisms = filters.delta_mechanisms
    basic = filters.delta_basic
    rho_total = filters.rho_total
    rho_fits = charge.rho <= rho_total
    suggested = _suggested_delta(filters, asked_delta, charge)
    if suggested is None:
        return None
    figure, by = suggested
    if charge_at is not None:
        checked = _checked_figure(filters, fresh, figure, charge_at)
        if checked is None:
            return None
        figure, by = checked
    total = filters.delta
    if charge.zcdp_delta is None:
        b_reason = "filter B (zcdp) cannot charge it (no proven zCDP profile with these params)"
    elif not rho_fits:
        b_reason = (
            f"filter B (zcdp) charges it rho {format_budget(charge.rho)}, more than its whole "
            f"rho budget, {format_budget(rho_total)}"
        )
    else:
        b_reason = (
            f"filter B (zcdp) charges its approximate steps {format_budget(charge.zcdp_delta)}, "
            f"more than its whole share for approximate steps, {format_budget(mechanisms)} "
            f"({_percent(mechanisms, total)} of delta)"
        )
    if charge.epsilon > filters.epsilon:
        c_reason = (
            f"filter C (basic) charges it epsilon {format_budget(charge.epsilon)}, more than "
            f"{'the dataset' if grant_filters is None else 'the grant'}'s, "
            f"{format_budget(filters.epsilon)}"
        )
    else:
        c_reason = (
            f"filter C (basic) charges it as a single release of delta "
            f"{format_budget(charge.delta)}, more than its whole share, {format_budget(basic)} "
            f"({_percent(basic, total)} of delta)"
        )
    return InvalidInput(
        "delta",
        f"no filter of {whose} hybrid budget could ever admit this release at delta "
        f"{format_budget(asked_delta)}, even unspent: filter A' (gdp, "
        f"{_percent(filters.delta_gaussian, total)} of delta) cannot charge its approximate "
        f"steps (or unproven profile); {b_reason}; {c_reason}. The largest delta this release "
        f"fits at is {format_budget(figure)} (filter {'B' if by == 'zcdp' else 'C'}); see "
        "docs/mechanisms.md, 'Accounting across releases'",
    )


def holds_no_delta(filters: accounting.HybridBudget) -> bool:
    """Whether a hybrid budget (a dataset's or a grant's) can never admit a release that spends
    delta: each filter's share of its delta rounds to 0 at the ledger's 30 places (no
    ``mu_total`` for A', no ``rho_total`` for B, no delta for C), e.g. ``delta_budget`` 1e-30
    (:func:`service.advice.hybrid_holds_no_delta`)."""
    return advice.hybrid_holds_no_delta(
        "hybrid", filters.mu_total, filters.rho_total, filters.delta_basic
    )


def _no_delta_refusal(
    asked_delta: Decimal, filters: accounting.HybridBudget, granted: bool
) -> InvalidInput:
    """The 422 for a release that spends delta on a hybrid budget that holds none (whatever
    was spent: nothing smaller than the asked delta is admitted either, so neither "ask for
    less" nor the remaining epsilon is an answer)."""
    whose = "the grant it is charged to" if granted else "this dataset"
    remedy = (
        "ask the dataset's owner for a grant with a larger delta"
        if granted
        else "the owner uploads again with a larger delta_budget, or with accounting basic"
    )
    return InvalidInput(
        "delta",
        f"no delta can be spent on {whose}, at {format_budget(asked_delta)} or any other: its "
        f"delta, {format_budget(filters.delta)}, is too small for any share of its hybrid "
        "budget (96%, 3% and 1% each round to 0 at the ledger's 30 decimal places: mu_total, "
        "rho_total and filter C's delta are 0), so no Gaussian or approximate release can "
        f"ever be admitted; choose {PURE_CHOICES}, or {remedy}",
    )


def _suggested_delta(
    filters: accounting.HybridBudget, asked_delta: Decimal, charge: Charge
) -> tuple[Decimal, str] | None:
    """The largest asked delta B or C of ``filters`` could take if the charged delta scaled
    with the asked one as it does at ``asked_delta``, rounded down to
    :data:`SUGGESTED_DIGITS` digits, and the filter (``zcdp`` or ``basic``); ``None`` when
    neither filter could."""
    mechanisms = filters.delta_mechanisms
    basic = filters.delta_basic
    rho_fits = charge.rho <= filters.rho_total
    candidates: list[tuple[Decimal, str]] = []
    if charge.zcdp_delta is not None and charge.zcdp_delta > mechanisms and rho_fits:
        ratio = _UP.divide(charge.zcdp_delta, asked_delta)
        candidates.append((_DOWN.divide(mechanisms, ratio), "zcdp"))
    if charge.delta > basic and charge.epsilon <= filters.epsilon:
        ratio = _UP.divide(charge.delta, asked_delta)
        candidates.append((_DOWN.divide(basic, ratio), "basic"))
    candidates = [(value, name) for value, name in candidates if value > 0]
    if not candidates:
        return None
    largest, by = max(candidates)
    return accounting.significant_digits(largest, SUGGESTED_DIGITS, ROUND_FLOOR), by


def _checked_figure(
    filters: accounting.HybridBudget,
    fresh: accounting.HybridState,
    figure: Decimal,
    charge_at: ChargeAt,
) -> tuple[Decimal, str] | None:
    """The largest delta from ``figure`` down (see :func:`hybrid_delta_refusal`) at which the
    release, charged as ``charge_at`` says, is admitted by B or C on the unspent budget, and
    that filter; ``None`` if none is found."""
    for _ in range(SUGGESTION_TRIES):
        if figure <= 0:
            return None
        at = charge_at(figure)
        if at is not None:
            cost = at.release_cost()
            if fresh.b_holds(cost):
                return figure, "zcdp"
            if fresh.c_holds(cost):
                return figure, "basic"
        # One step of the last kept digit lower, or lower still where the ratio at this
        # figure says so (it is the one the release is charged at there).
        step = Decimal(1).scaleb(figure.adjusted() - SUGGESTED_DIGITS + 1)
        lower = _DOWN.subtract(figure, step)
        again = None if at is None else _suggested_delta(filters, figure, at)
        if again is not None and again[0] < lower:
            lower = again[0]
        if lower <= 0:
            return None
        figure = accounting.significant_digits(lower, SUGGESTED_DIGITS, ROUND_FLOOR)
    return None


def outcome_cost(release: Release) -> dict[str, Any]:
    """A release's cost in its outcome event: ``(epsilon, delta)`` as before, plus ``(rho,
    zcdp_delta)`` where the dataset's accounting charged those."""
    cost: dict[str, Any] = {"epsilon": release.epsilon, "delta": release.delta}
    if release.cost_rho is not None:
        cost.update(rho=release.cost_rho, zcdp_delta=release.cost_delta)
    return cost


def refund_details(release: Release, entry: LedgerEntry | None = None) -> dict[str, Any]:
    """What a refund gave back, as the ledger moved it (the charge's amounts: ``entry``, the
    refund written, whose columns are the charge's; a ``hybrid`` charge moves ``epsilon``,
    ``delta`` and ``rho`` at once)."""
    if entry is not None and (release.cost_rho is not None or entry.rho != 0):
        return {"epsilon": entry.epsilon, "delta": entry.delta, "rho": entry.rho}
    if entry is not None:
        return {"epsilon": entry.epsilon, "delta": entry.delta}
    if release.cost_rho is None:
        return {"epsilon": release.epsilon, "delta": release.delta}
    return {"epsilon": Decimal(0), "delta": release.cost_delta, "rho": release.cost_rho}
