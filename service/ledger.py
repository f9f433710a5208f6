"""The privacy budget ledger: append-only charges and refunds in exact decimal arithmetic.

``remaining = total - sum(charges) + sum(refunds)``. Callers check and charge inside one
transaction that holds the dataset's lock (``releases.request_release``), so concurrent
requests cannot overspend.

Every computation uses :data:`BUDGET_CONTEXT` (80 digits, rounding trapped), never Python's
default 28-digit context: stored values have up to 38 digits, and in 28 digits
``0.99...9 (31 nines) - 0`` rounds up to 1, which let a budget just under 1 pay for a release
of epsilon 1 and then show a negative remainder. Comparisons between decimals are exact in any
context. Values the ledger cannot store exactly are refused before they get here
(:func:`check_storable`).
"""

from __future__ import annotations

import typing
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

from sqlalchemy import (
    ColumnElement,
    Row,
    Select,
    Table,
    and_,
    bindparam,
    case,
    func,
    insert,
    or_,
    select,
)
from sqlalchemy.orm import Session

from api_schemas.common import BUDGET_CONTEXT, budget_storable
from service.accounting import HybridBudget, HybridState, ReleaseCost, lacks
from service.db.models import Dataset, LedgerEntry, Release, utcnow
from service.db.prepared import Prepared
from service.errors import InvalidInput

__all__ = [
    "BUDGET_CONTEXT",
    "BudgetState",
    "BudgetTotals",
    "Charge",
    "budget_of",
    "budget_row_of",
    "budget_select",
    "budgets_of",
    "charge",
    "check_storable",
    "dialect_of",
    "refund",
    "spent_by_dataset",
    "spent_of",
    "state_of",
]


def check_storable(field: str, value: Decimal) -> None:
    """Refuse a budget or cost the ledger (NUMERIC(38, 30)) would round when storing it."""
    problem = budget_storable(value)
    if problem is not None:
        raise InvalidInput(field, problem)


@dataclass(frozen=True)
class Charge:
    """What one release moves in the ledger: ``(epsilon, delta)`` on a ``basic`` dataset,
    ``(rho, delta)`` on a ``zcdp`` one (approximate zCDP), ``rho = mu^2/2`` on a ``gaussian``
    one (see :mod:`service.accounting`). Exact decimals at the ledger's 30 places.

    On a ``hybrid`` dataset one charge moves every filter's currency at once (each filter's
    sums include every admitted release): ``(epsilon, delta)`` the single release it is
    calibrated as (filter C), ``rho`` and ``zcdp_delta`` (B; ``zcdp_delta`` ``None``: no proven
    profile, B can no longer hold) and ``gdp``, its GDP ``mu^2`` (A'; ``None``: a step A'
    cannot charge)."""

    epsilon: Decimal
    delta: Decimal
    rho: Decimal = Decimal(0)
    gdp: Decimal | None = None
    zcdp_delta: Decimal | None = None

    def release_cost(self) -> ReleaseCost:
        """The charge as :class:`service.HybridState` reads it."""
        rho = None if self.zcdp_delta is None else self.rho
        return ReleaseCost(self.epsilon, self.delta, rho, self.zcdp_delta, self.gdp)


@dataclass(frozen=True)
class BudgetState:
    """A budget (a dataset's or a grant's) and what its ledger entries spent.

    ``basic``: ``epsilon``/``delta`` totals and sums. ``gaussian``: ``rho_total = mu_B^2/2`` and
    the sum of ``rho = mu_i^2/2``; no delta is spent. ``zcdp``: ``rho_total`` and
    ``delta_limit`` (``delta_total - delta_conversion``) against the sums of ``rho`` and
    ``delta``."""

    epsilon_total: Decimal
    delta_total: Decimal
    epsilon_spent: Decimal
    delta_spent: Decimal
    accounting: str = "basic"
    rho_total: Decimal | None = None
    rho_spent: Decimal = Decimal(0)
    #: The delta mechanisms may spend: ``delta_total`` (``basic``), ``delta_total -
    #: delta_conversion`` (``zcdp``), 0 (``gaussian``).
    delta_limit: Decimal | None = None
    #: What :mod:`service.spend` needs to state the budget in ``(epsilon, delta)``: the
    #: dataset's ``delta_total`` the epsilon figures are at (a grant's own ``delta_total`` is
    #: its mechanisms' share), the owner's stated epsilon (a dataset's; ``None`` for a grant,
    #: whose epsilon is its native total converted, at most ``epsilon_ceiling``, the
    #: dataset's), the dataset's conversion share and ``mu``.
    stated_delta: Decimal | None = None
    epsilon_stated: Decimal | None = None
    epsilon_ceiling: Decimal | None = None
    delta_conversion: Decimal | None = None
    mu_total: Decimal | None = None
    #: ``hybrid``: the filters' shares of delta (A', B's steps, C; B's conversion is
    #: ``delta_conversion``) and what the entries spent beyond ``epsilon``/``delta`` (C's) and
    #: ``rho``: the sums of ``gdp`` (``mu^2``) and of ``zcdp_delta``, and how many entries in
    #: effect have no GDP figure / no profile (a filter with one such release never holds).
    delta_gaussian: Decimal | None = None
    delta_mechanisms: Decimal | None = None
    delta_basic: Decimal | None = None
    gdp_spent: Decimal = Decimal(0)
    zcdp_delta_spent: Decimal = Decimal(0)
    not_gdp: Decimal = Decimal(0)
    not_profiled: Decimal = Decimal(0)

    def hybrid(self) -> HybridState:
        """A ``hybrid`` budget's filters and what they spent (:class:`HybridState`)."""
        zero = Decimal(0)
        budget = HybridBudget(
            self.epsilon_total,
            self.delta_total,
            zero if self.mu_total is None else self.mu_total,
            zero if self.delta_gaussian is None else self.delta_gaussian,
            zero if self.rho_total is None else self.rho_total,
            zero if self.delta_conversion is None else self.delta_conversion,
            zero if self.delta_mechanisms is None else self.delta_mechanisms,
            zero if self.delta_basic is None else self.delta_basic,
        )
        return HybridState(
            budget,
            self.epsilon_spent,
            self.delta_spent,
            self.rho_spent,
            self.zcdp_delta_spent,
            self.gdp_spent,
            self.not_gdp <= 0,
            self.not_profiled <= 0,
        )

    @property
    def epsilon_remaining(self) -> Decimal:
        return BUDGET_CONTEXT.subtract(self.epsilon_total, self.epsilon_spent)

    @property
    def delta_remaining(self) -> Decimal:
        limit = self.delta_total if self.delta_limit is None else self.delta_limit
        return BUDGET_CONTEXT.subtract(limit, self.delta_spent)

    @property
    def rho_remaining(self) -> Decimal:
        total = Decimal(0) if self.rho_total is None else self.rho_total
        return BUDGET_CONTEXT.subtract(total, self.rho_spent)

    def shortfalls(self, charge: Charge) -> list[str]:
        """What ``charge`` lacks here, in public figures (empty when it is afforded)."""
        if self.accounting == "hybrid":
            return self.hybrid().refusals(charge.release_cost())
        reasons = []
        if self.accounting == "basic":
            if BUDGET_CONTEXT.compare(charge.epsilon, self.epsilon_remaining) > 0:
                reasons.append(lacks("epsilon", self.epsilon_remaining, charge.epsilon))
        elif BUDGET_CONTEXT.compare(charge.rho, self.rho_remaining) > 0:
            reasons.append(lacks("rho", self.rho_remaining, charge.rho))
        if BUDGET_CONTEXT.compare(charge.delta, self.delta_remaining) > 0:
            reasons.append(lacks("delta", self.delta_remaining, charge.delta))
        return reasons

    def affords(self, charge: Charge) -> bool:
        """Whether the filter lets ``charge`` through (exact comparisons); ``hybrid``: whether
        one of its filters admits the whole sequence with it."""
        if self.accounting == "hybrid":
            return self.hybrid().admits(charge.release_cost())
        delta_ok = BUDGET_CONTEXT.compare(charge.delta, self.delta_remaining) <= 0
        if self.accounting == "basic":
            epsilon_ok = BUDGET_CONTEXT.compare(charge.epsilon, self.epsilon_remaining) <= 0
            return epsilon_ok and delta_ok
        return BUDGET_CONTEXT.compare(charge.rho, self.rho_remaining) <= 0 and delta_ok


class BudgetTotals(Protocol):
    """What a budget is made of: a dataset row (:class:`~service.db.models.Dataset`) or the
    columns :func:`budget_select` reads of it."""

    @property
    def accounting(self) -> str: ...
    @property
    def epsilon_total(self) -> Decimal: ...
    @property
    def delta_total(self) -> Decimal: ...
    @property
    def rho_total(self) -> Decimal | None: ...
    @property
    def mu_total(self) -> Decimal | None: ...
    @property
    def delta_conversion(self) -> Decimal | None: ...
    @property
    def delta_gaussian(self) -> Decimal | None: ...
    @property
    def delta_mechanisms(self) -> Decimal | None: ...
    @property
    def delta_basic(self) -> Decimal | None: ...


def state_of(
    dataset: BudgetTotals,
    epsilon_spent: Decimal,
    delta_spent: Decimal,
    rho_spent: Decimal,
    gdp_spent: Decimal = Decimal(0),
    zcdp_delta_spent: Decimal = Decimal(0),
    not_gdp: Decimal = Decimal(0),
    not_profiled: Decimal = Decimal(0),
) -> BudgetState:
    """The dataset's budget state from its totals and its ledger sums."""
    limit: Decimal | None = None
    if dataset.accounting == "gaussian":
        limit = Decimal(0)
    elif dataset.accounting == "zcdp" and dataset.delta_conversion is not None:
        limit = BUDGET_CONTEXT.subtract(dataset.delta_total, dataset.delta_conversion)
    elif dataset.accounting == "hybrid":
        limit = dataset.delta_basic
    return BudgetState(
        dataset.epsilon_total,
        dataset.delta_total,
        epsilon_spent,
        delta_spent,
        accounting=dataset.accounting,
        rho_total=dataset.rho_total,
        rho_spent=rho_spent,
        delta_limit=limit,
        stated_delta=dataset.delta_total,
        epsilon_stated=dataset.epsilon_total,
        delta_conversion=dataset.delta_conversion,
        mu_total=dataset.mu_total,
        delta_gaussian=dataset.delta_gaussian,
        delta_mechanisms=dataset.delta_mechanisms,
        delta_basic=dataset.delta_basic,
        gdp_spent=gdp_spent,
        zcdp_delta_spent=zcdp_delta_spent,
        not_gdp=not_gdp,
        not_profiled=not_profiled,
    )


def in_effect(now: datetime | ColumnElement[Any] | None = None) -> ColumnElement[bool]:
    """Entries that count at ``now`` (default: the current time; may be a bound parameter):
    every charge, and a refund once its ``created_at`` (the moment its release's outcome
    becomes visible to analysts, see :func:`refund`) has passed."""
    entries = LedgerEntry.__table__.c
    return or_(entries.kind == "charge", entries.created_at <= (utcnow() if now is None else now))


def budget_of(session: Session, dataset: Dataset) -> BudgetState:
    """The dataset's budget from its ledger."""
    return budgets_of(session, [dataset])[dataset.id]


def budgets_of(session: Session, datasets: Sequence[Dataset]) -> dict[uuid.UUID, BudgetState]:
    """Each dataset's budget from its ledger, in one statement for all of them. PostgreSQL:
    the budget read's own statement (:func:`budget_select`, for the datasets ``ids``) and its
    own sums (:func:`spent_by_dataset`), so that this and :func:`service.datasets.get_budget`
    are one computation of what remains. SQLite: the same entries (the datasets', in effect
    at ``now``) without the datasets' columns, summed by the same :func:`spent_of`
    (``tests/api/test_budget_read.py`` checks the two reads agree). The totals are the ORM
    rows' (the ones the caller holds, locked when it charges)."""
    if not datasets:
        return {}
    dialect = dialect_of(session)
    ids = [dataset.id for dataset in datasets]
    zero = (Decimal(0),) * len(SUMS)
    if session.autoflush:
        # As the session's own execute would (the reads below go on its connection).
        session.flush()
    connection = session.connection()
    if dialect == "sqlite":
        # One row per entry in effect, its own columns only: the totals are the ORM rows'
        # (below), and each row of :func:`budget_select` repeated the dataset's id and nine
        # totals, decoded per row (two thirds of a read's CPU, which grows with the ledger:
        # docs/benchmarks.md). The same entries (``dataset_id`` in ``ids``, in effect at
        # ``now``) and the same sums (:func:`spent_of`).
        listed: dict[uuid.UUID, list[Any]] = {}
        if len(ids) == 1:  # the request's own read: not even the id per row
            # ``all()``: fetched at once, not a row at a time (``list()`` of the result made a
            # fetch call per entry: a read that grows with the ledger).
            # Compiled once, run on the driver's cursor (:mod:`service.db.prepared`).
            listed[ids[0]] = list(_ONE_ENTRIES.all(connection, {"id": ids[0], "now": utcnow()}))
        else:
            for row in _MANY_ENTRIES.all(connection, {"ids": ids, "now": utcnow()}):
                listed.setdefault(row[0], []).append(row[1:])
        return {
            dataset.id: state_of(
                dataset, *(spent_of(listed[dataset.id]) if dataset.id in listed else zero)
            )
            for dataset in datasets
        }
    rows = _MANY_BUDGETS_PREPARED[dialect].all(connection, {"ids": ids, "now": utcnow()})
    spent = spent_by_dataset(dialect, rows)
    return {
        dataset.id: state_of(dataset, *spent.get(dataset.id, (None, zero))[1])
        for dataset in datasets
    }


def dialect_of(session: Session) -> str:
    """The shape of the budget statements for ``session``'s database: ``postgresql`` sums in
    the database, anything else (SQLite) here."""
    return "postgresql" if session.get_bind().dialect.name == "postgresql" else "sqlite"


#: The columns of a dataset that make its budget (:class:`BudgetTotals`), in this order.
TOTALS = (
    "accounting",
    "epsilon_total",
    "delta_total",
    "rho_total",
    "mu_total",
    "delta_conversion",
    "delta_gaussian",
    "delta_mechanisms",
    "delta_basic",
    # Not a total: the unit the totals protect (a row, or a person named by the column), read
    # with them so that every statement of the budget can say it.
    "privacy_unit_column",
)

#: What a budget's entries sum, in this order (:data:`Spent`): ``epsilon``, ``delta``, ``rho``,
#: ``gdp``, ``zcdp_delta``, and the entries without a ``gdp`` / ``zcdp_delta`` (hybrid's flags:
#: a charge without one counts 1, its refund -1).
SUMS = ("epsilon", "delta", "rho", "gdp", "zcdp_delta", "not_gdp", "not_profiled")


def budget_select(dialect: str, where: Sequence[ColumnElement[bool]]) -> Select[Any]:
    """The one statement of what a budget spent: each dataset ``where`` selects, its id,
    :data:`TOTALS` and its ledger's sums, with entries in effect at the bound parameter
    ``now`` (:func:`in_effect`). Core, not ORM: built once and kept, so a read pays neither for
    building it nor for loading an ORM object (read it with :func:`spent_by_dataset` or
    :func:`budget_row_of`).

    On PostgreSQL the database sums: ``NUMERIC`` addition is exact (the sum's scale is the
    operands' and its precision unbounded), so one row per dataset comes back whatever the
    ledger's size (sums null without entries). SQLite would sum the decimal text as binary
    floats, so there it is one row per entry in effect (one with null entry columns without
    any), summed exactly in :data:`BUDGET_CONTEXT` by :func:`spent_by_dataset`. The ledger is
    joined (left), so a dataset with no entries still answers.
    """
    datasets, entries = Dataset.__table__, LedgerEntry.__table__
    totals = [datasets.c[name] for name in TOTALS]
    joined = datasets.outerjoin(
        entries,
        and_(
            entries.c.dataset_id == datasets.c.id,
            in_effect(bindparam("now")),
        ),
    )
    if dialect == "postgresql":
        sign = case((entries.c.kind == "charge", 1), else_=-1)

        def missing(column: ColumnElement[Any]) -> ColumnElement[Any]:
            # an entry (not the outer join's empty row) without the figure
            return case((and_(entries.c.id.is_not(None), column.is_(None)), sign), else_=0)

        return (
            select(
                datasets.c.id,
                *totals,
                func.sum(sign * entries.c.epsilon),
                func.sum(sign * entries.c.delta),
                func.sum(sign * entries.c.rho),
                func.sum(sign * entries.c.gdp),
                func.sum(sign * entries.c.zcdp_delta),
                func.sum(missing(entries.c.gdp)),
                func.sum(missing(entries.c.zcdp_delta)),
            )
            .select_from(joined)
            .where(*where)
            .group_by(datasets.c.id, *totals)
        )
    return (
        select(
            datasets.c.id,
            *totals,
            entries.c.kind,
            entries.c.epsilon,
            entries.c.delta,
            entries.c.rho,
            entries.c.gdp,
            entries.c.zcdp_delta,
        )
        .select_from(joined)
        .where(*where)
    )


#: :func:`budget_select` for the datasets of the expanding bound parameter ``ids``.
_MANY_BUDGETS = {
    dialect: budget_select(dialect, [Dataset.__table__.c.id.in_(bindparam("ids", expanding=True))])
    for dialect in ("postgresql", "sqlite")
}
#: SQLite's :func:`budgets_of`: the ledger entries of the datasets ``ids`` (``_ONE_ENTRIES``:
#: of the dataset ``id``) in effect at ``now`` (:func:`in_effect`), as :func:`budget_select`
#: joins them, without the datasets' columns; each row as :func:`spent_of` reads it.
_ENTRY_SUMMED = [
    LedgerEntry.__table__.c[name] for name in ("kind", "epsilon", "delta", "rho", "gdp")
] + [LedgerEntry.__table__.c.zcdp_delta]
_MANY_ENTRIES = Prepared(
    select(LedgerEntry.__table__.c.dataset_id, *_ENTRY_SUMMED).where(
        LedgerEntry.__table__.c.dataset_id.in_(bindparam("ids", expanding=True)),
        in_effect(bindparam("now")),
    )
)
_ONE_ENTRIES = Prepared(
    select(*_ENTRY_SUMMED).where(
        LedgerEntry.__table__.c.dataset_id == bindparam("id"), in_effect(bindparam("now"))
    )
)
#: :data:`_MANY_BUDGETS`, compiled once per dialect (:mod:`service.db.prepared`).
_MANY_BUDGETS_PREPARED = {dialect: Prepared(look) for dialect, look in _MANY_BUDGETS.items()}


@dataclass(frozen=True)
class Totals:
    """A dataset's :class:`BudgetTotals` as :func:`budget_select` read them."""

    accounting: str
    epsilon_total: Decimal
    delta_total: Decimal
    rho_total: Decimal | None
    mu_total: Decimal | None
    delta_conversion: Decimal | None
    delta_gaussian: Decimal | None = None
    delta_mechanisms: Decimal | None = None
    delta_basic: Decimal | None = None
    #: The dataset's ``privacy_unit_column`` (``None``: the unit is the row).
    privacy_unit_column: str | None = None


#: A budget's sums, as :data:`SUMS` names them.
Spent = tuple[Decimal, Decimal, Decimal, Decimal, Decimal, Decimal, Decimal]


def spent_by_dataset(dialect: str, rows: Sequence[Any]) -> dict[uuid.UUID, tuple[Totals, Spent]]:
    """Each dataset's totals and sums (:data:`SUMS`) from :func:`budget_select`'s
    rows: the database's sums (PostgreSQL), or the entries summed exactly (SQLite)."""
    width = 1 + len(TOTALS)
    found: dict[uuid.UUID, tuple[Totals, Spent]] = {}
    if dialect == "postgresql":
        for row in rows:
            sums = row[width:]
            spent = tuple(Decimal(0) if value is None else Decimal(value) for value in sums)
            found[row[0]] = (Totals(*row[1:width]), spent)  # type: ignore[assignment]
        return found
    entries: dict[uuid.UUID, list[Any]] = {}
    totals: dict[uuid.UUID, Totals] = {}
    for row in rows:
        if row[0] not in totals:
            totals[row[0]] = Totals(*row[1:width])
        listed = entries.setdefault(row[0], [])
        if row[width] is not None:
            listed.append(row[width:])
    return {key: (totals[key], spent_of(entries[key])) for key in totals}


def budget_row_of(dialect: str, rows: Sequence[Row[Any]]) -> tuple[Totals, BudgetState] | None:
    """The totals and budget state of the one dataset :func:`budget_select`'s rows are about;
    ``None`` if there are none (no such dataset, or not one the statement's conditions let
    through)."""
    for totals, spent in spent_by_dataset(dialect, rows).values():
        return totals, state_of(totals, *spent)
    return None


def spent_of(rows: Iterable[Sequence[Any]]) -> Spent:
    """``sum(charges) - sum(refunds)`` of ``(kind, epsilon, delta, rho[, gdp, zcdp_delta])``
    rows, exactly: :data:`SUMS` (without the last two columns, no entry counts as missing
    them: entries of the other accountings)."""
    epsilon_spent = Decimal(0)
    delta_spent = Decimal(0)
    rho_spent = Decimal(0)
    gdp_spent = Decimal(0)
    zcdp_delta_spent = Decimal(0)
    not_gdp = Decimal(0)
    not_profiled = Decimal(0)
    for row in rows:
        kind, epsilon, delta, rho = row[0], row[1], row[2], row[3]
        step = BUDGET_CONTEXT.add if kind == "charge" else BUDGET_CONTEXT.subtract
        epsilon_spent = step(epsilon_spent, epsilon)
        delta_spent = step(delta_spent, delta)
        rho_spent = step(rho_spent, rho)
        if len(row) > 4:
            gdp, zcdp_delta = row[4], row[5]
            if gdp is None:
                not_gdp = step(not_gdp, Decimal(1))
            else:
                gdp_spent = step(gdp_spent, gdp)
            if zcdp_delta is None:
                not_profiled = step(not_profiled, Decimal(1))
            else:
                zcdp_delta_spent = step(zcdp_delta_spent, zcdp_delta)
    return (
        epsilon_spent,
        delta_spent,
        rho_spent,
        gdp_spent,
        zcdp_delta_spent,
        not_gdp,
        not_profiled,
    )


def _entry(
    kind: str,
    dataset_id: uuid.UUID,
    release_id: uuid.UUID,
    amount: Charge | LedgerEntry,
    grant_id: uuid.UUID | None,
) -> LedgerEntry:
    """A ledger row of ``kind`` moving every currency ``amount`` names (a refund: exactly the
    charge's)."""
    return LedgerEntry(
        dataset_id=dataset_id,
        release_id=release_id,
        kind=kind,
        epsilon=amount.epsilon,
        delta=amount.delta,
        rho=amount.rho,
        gdp=amount.gdp,
        zcdp_delta=amount.zcdp_delta,
        grant_id=grant_id,
    )


def charge(
    session: Session,
    dataset_id: uuid.UUID,
    release_id: uuid.UUID,
    amount: Charge,
    grant_id: uuid.UUID | None = None,
) -> None:
    """Append a charge (at most one per release: a unique constraint enforces it), to the
    dataset and, when ``grant_id`` is given, to that grant in the same entry.

    Written at once, as a prebuilt statement on the transaction's connection (the release it
    names is flushed already): an ORM object flushed later cost a millisecond on every
    release (``bench/bench_release_cpu.py``). The same row as :func:`_entry` makes."""
    _INSERT_ENTRY.run(
        session.connection(),
        {
            "dataset_id": dataset_id,
            "release_id": release_id,
            "kind": "charge",
            "epsilon": amount.epsilon,
            "delta": amount.delta,
            "rho": amount.rho,
            "gdp": amount.gdp,
            "zcdp_delta": amount.zcdp_delta,
            "created_at": utcnow(),
            "grant_id": grant_id,
        },
    )


#: :func:`charge`'s insert, built once and compiled once per dialect (:mod:`service.db.
#: prepared`).
_INSERT_ENTRY = Prepared(insert(typing.cast(Table, LedgerEntry.__table__)))


def refund(session: Session, dataset_id: uuid.UUID, release_id: uuid.UUID) -> LedgerEntry:
    """Append a refund of exactly the release's charge (every currency it moved); only for a
    release that provably never read the data. It goes back to the grant the charge named.

    It takes effect (its ``created_at``) when the release's outcome becomes visible to analysts
    (``outcome_visible_at`` or ``visible_at``), not when the worker records it: a budget that
    grew back before then would tell an analyst that the job had ended, and when, through the
    padding (the budget endpoint, or a request accepted only thanks to the refund). Until
    then the charge stands, which only makes the ledger stricter.

    On a ``hybrid`` dataset the refunded release counts, from then on, as a zero-cost step in
    every filter (GDP 0, rho 0, approximate delta 0, epsilon and delta 0; it no longer counts
    as a release without a GDP figure or a profile, so a flag it had broken is restored: the
    sums and counts of :data:`SUMS` subtract it). Why the union of filters stays
    ``(epsilon, delta)``-DP (:class:`service.accounting.HybridState`'s argument, extended):

    1. *The refunded step costs 0.* It provably never read the data, and whether it did is
       decided from public facts (the dataset deleted, a fault before any read), so its output
       is data-independent: a 0-GDP, 0-zCDP, (0, 0)-DP mechanism, which every filter's fully
       adaptive theorem admits at cost 0 (its flags unaffected: it has both figures, 0).
       Model it as submitted when it would have read the data (its execution), with cost 0.
    2. *Some filter holds on the final sequence with refunded steps zeroed.* The last
       admission was allowed by a filter ``j`` on the sequence then in effect (earlier refunds
       zeroed); later refunds only zero more steps, and every condition is monotone (sums
       fall, flags come back), so ``j`` still holds. Partition the transcripts by the first
       filter whose condition holds on the final zeroed sequence, as before; the partition is
       a function of the transcript (refunds and their times are in it).
    3. *On its part ``T_j``, filter ``j`` alone with another analyst yields the same
       transcripts with the same probabilities.* The analyst ``B`` submits to ``j`` exactly
       what the ledger admitted, each non-refunded release with its cost and each refunded one
       as the constant step of cost 0 (point 1), and never submits what the ledger refused:
       the ledger's refusals, including those made while a later-refunded charge stood, are
       functions of the public history (costs, charges and refunds are public), so they are
       ``B``'s own choice not to submit, which a fully adaptive theorem allows. On ``T_j``,
       ``j``'s condition holds on the whole zeroed sequence, hence on every prefix in any
       order (sums of nonnegative costs, monotone flags), so ``j`` admits every submission of
       ``B``; the outputs have the same conditional laws. So ``P[M(x) in S, T_j] =
       P[M_j,B(x) in S, T_j] <= e^eps P[M_j,B(x') in S, T_j] + delta_j``, and summing over the
       parts gives ``(epsilon, delta)`` as in :class:`service.accounting.HybridState`.

    The admissions made while the charge stood are admissible on the zeroed sequence too (a
    smaller cost only helps every filter), and a request refused then may be admitted once
    the refund takes effect: both are covered by point 3. Tested in
    tests/test_accounting_hybrid_refunds.py (hypothesis: after any sequence of requests and
    refunds, the admitted sequence with refunded steps zeroed satisfies some filter's
    condition on every prefix).
    """
    release = session.get(Release, release_id)
    effective = utcnow()
    if release is not None:
        shown = release.outcome_visible_at or release.visible_at
        if shown is not None and shown > effective:
            effective = shown
    charged = session.execute(
        select(LedgerEntry).where(
            LedgerEntry.release_id == release_id, LedgerEntry.kind == "charge"
        )
    ).scalar_one()
    entry = _entry("refund", dataset_id, release_id, charged, charged.grant_id)
    entry.created_at = effective
    session.add(entry)
    return entry
