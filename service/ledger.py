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
    and_,
    bindparam,
    case,
    func,
    or_,
    select,
)
from sqlalchemy.orm import Session

from api_schemas.common import BUDGET_CONTEXT, budget_storable
from service.db.models import Dataset, LedgerEntry, Release, utcnow
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
    one (see :mod:`service.accounting`). Exact decimals at the ledger's 30 places."""

    epsilon: Decimal
    delta: Decimal
    rho: Decimal = Decimal(0)


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

    def affords(self, charge: Charge) -> bool:
        """Whether the filter lets ``charge`` through (exact comparisons)."""
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


def state_of(
    dataset: BudgetTotals, epsilon_spent: Decimal, delta_spent: Decimal, rho_spent: Decimal
) -> BudgetState:
    """The dataset's budget state from its totals and its ledger sums."""
    limit: Decimal | None = None
    if dataset.accounting == "gaussian":
        limit = Decimal(0)
    elif dataset.accounting == "zcdp" and dataset.delta_conversion is not None:
        limit = BUDGET_CONTEXT.subtract(dataset.delta_total, dataset.delta_conversion)
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
    """Each dataset's budget from its ledger, in one statement for all of them: the budget
    read's own statement (:func:`budget_select`, for the datasets ``ids``) and its own sums
    (:func:`spent_by_dataset`), so that this and :func:`service.datasets.get_budget` are one
    computation of what remains, not two kept equal by a test. The totals are the ORM rows'
    (the ones the caller holds, locked when it charges)."""
    if not datasets:
        return {}
    dialect = dialect_of(session)
    rows = session.execute(
        _MANY_BUDGETS[dialect], {"ids": [dataset.id for dataset in datasets], "now": utcnow()}
    ).all()
    spent = spent_by_dataset(dialect, rows)
    zero = (Decimal(0), Decimal(0), Decimal(0))
    return {
        dataset.id: state_of(dataset, *spent.get(dataset.id, (None, zero))[1])
        for dataset in datasets
    }


def dialect_of(session: Session) -> str:
    """The shape of the budget statements for ``session``'s database: ``postgresql`` sums in
    the database, anything else (SQLite) here."""
    return "postgresql" if session.get_bind().dialect.name == "postgresql" else "sqlite"


#: The columns of a dataset that make its budget (:class:`BudgetTotals`), in this order.
TOTALS = ("accounting", "epsilon_total", "delta_total", "rho_total", "mu_total", "delta_conversion")


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
        return (
            select(
                datasets.c.id,
                *totals,
                func.sum(sign * entries.c.epsilon),
                func.sum(sign * entries.c.delta),
                func.sum(sign * entries.c.rho),
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
        )
        .select_from(joined)
        .where(*where)
    )


#: :func:`budget_select` for the datasets of the expanding bound parameter ``ids``.
_MANY_BUDGETS = {
    dialect: budget_select(dialect, [Dataset.__table__.c.id.in_(bindparam("ids", expanding=True))])
    for dialect in ("postgresql", "sqlite")
}


@dataclass(frozen=True)
class Totals:
    """A dataset's :class:`BudgetTotals` as :func:`budget_select` read them."""

    accounting: str
    epsilon_total: Decimal
    delta_total: Decimal
    rho_total: Decimal | None
    mu_total: Decimal | None
    delta_conversion: Decimal | None


Spent = tuple[Decimal, Decimal, Decimal]


def spent_by_dataset(
    dialect: str, rows: Sequence[Row[Any]]
) -> dict[uuid.UUID, tuple[Totals, Spent]]:
    """Each dataset's totals and ``(epsilon, delta, rho)`` spent from :func:`budget_select`'s
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
        totals.setdefault(row[0], Totals(*row[1:width]))
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


def spent_of(
    rows: Iterable[Row[str, Decimal, Decimal, Decimal] | tuple[str, Decimal, Decimal, Decimal]],
) -> tuple[Decimal, Decimal, Decimal]:
    """``sum(charges) - sum(refunds)`` of ``(kind, epsilon, delta, rho)`` rows, exactly."""
    epsilon_spent = Decimal(0)
    delta_spent = Decimal(0)
    rho_spent = Decimal(0)
    for kind, epsilon, delta, rho in rows:
        step = BUDGET_CONTEXT.add if kind == "charge" else BUDGET_CONTEXT.subtract
        epsilon_spent = step(epsilon_spent, epsilon)
        delta_spent = step(delta_spent, delta)
        rho_spent = step(rho_spent, rho)
    return epsilon_spent, delta_spent, rho_spent


def charge(
    session: Session,
    dataset_id: uuid.UUID,
    release_id: uuid.UUID,
    amount: Charge,
    grant_id: uuid.UUID | None = None,
) -> None:
    """Append a charge (at most one per release: a unique constraint enforces it), to the
    dataset and, when ``grant_id`` is given, to that grant in the same entry."""
    session.add(
        LedgerEntry(
            dataset_id=dataset_id,
            release_id=release_id,
            kind="charge",
            epsilon=amount.epsilon,
            delta=amount.delta,
            rho=amount.rho,
            grant_id=grant_id,
        )
    )


def refund(session: Session, dataset_id: uuid.UUID, release_id: uuid.UUID) -> None:
    """Append a refund of exactly the release's charge (every currency it moved); only for a
    release that provably never read the data. It goes back to the grant the charge named.

    It takes effect (its ``created_at``) when the release's outcome becomes visible to analysts
    (``outcome_visible_at`` or ``visible_at``), not when the worker records it: a budget that
    grew back before then would tell an analyst that the job had ended, and when, through the
    padding (the budget endpoint, or a request accepted only thanks to the refund). Until
    then the charge stands, which only makes the ledger stricter.
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
    session.add(
        LedgerEntry(
            dataset_id=dataset_id,
            release_id=release_id,
            kind="refund",
            epsilon=charged.epsilon,
            delta=charged.delta,
            rho=charged.rho,
            grant_id=charged.grant_id,
            created_at=effective,
        )
    )
