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
from decimal import Decimal

from sqlalchemy import Row, case, func, select
from sqlalchemy.orm import Session

from api_schemas.common import BUDGET_CONTEXT, budget_storable
from service.db.models import Dataset, LedgerEntry
from service.errors import InvalidInput

__all__ = [
    "BUDGET_CONTEXT",
    "BudgetState",
    "budget_of",
    "budgets_of",
    "charge",
    "check_storable",
    "refund",
    "spent",
]


def check_storable(field: str, value: Decimal) -> None:
    """Refuse a budget or cost the ledger (NUMERIC(38, 30)) would round when storing it."""
    problem = budget_storable(value)
    if problem is not None:
        raise InvalidInput(field, problem)


@dataclass(frozen=True)
class BudgetState:
    epsilon_total: Decimal
    delta_total: Decimal
    epsilon_spent: Decimal
    delta_spent: Decimal

    @property
    def epsilon_remaining(self) -> Decimal:
        return BUDGET_CONTEXT.subtract(self.epsilon_total, self.epsilon_spent)

    @property
    def delta_remaining(self) -> Decimal:
        return BUDGET_CONTEXT.subtract(self.delta_total, self.delta_spent)

    def affords(self, epsilon: Decimal, delta: Decimal) -> bool:
        return (
            BUDGET_CONTEXT.compare(epsilon, self.epsilon_remaining) <= 0
            and BUDGET_CONTEXT.compare(delta, self.delta_remaining) <= 0
        )


def budget_of(session: Session, dataset: Dataset) -> BudgetState:
    """The dataset's budget from its ledger."""
    return budgets_of(session, [dataset])[dataset.id]


def budgets_of(session: Session, datasets: Sequence[Dataset]) -> dict[uuid.UUID, BudgetState]:
    """Each dataset's budget from its ledger, in one statement for all of them.

    On PostgreSQL the database sums: ``NUMERIC`` addition is exact (the sum's scale is the
    operands' and its precision unbounded), so one row per dataset comes back whatever the
    ledger's size. SQLite would sum the decimal text as binary floats, so there the rows are
    summed here in :data:`BUDGET_CONTEXT` (exact, but proportional to the ledger).
    """
    ids = [dataset.id for dataset in datasets]
    spent: dict[uuid.UUID, tuple[Decimal, Decimal]] = {}
    if ids and session.get_bind().dialect.name == "postgresql":
        sign = case((LedgerEntry.kind == "charge", 1), else_=-1)
        sums = session.execute(
            select(
                LedgerEntry.dataset_id,
                func.sum(sign * LedgerEntry.epsilon),
                func.sum(sign * LedgerEntry.delta),
            )
            .where(LedgerEntry.dataset_id.in_(ids))
            .group_by(LedgerEntry.dataset_id)
        ).all()
        spent = {dataset_id: (Decimal(eps), Decimal(delta)) for dataset_id, eps, delta in sums}
    elif ids:
        rows = session.execute(
            select(
                LedgerEntry.dataset_id, LedgerEntry.kind, LedgerEntry.epsilon, LedgerEntry.delta
            ).where(LedgerEntry.dataset_id.in_(ids))
        ).all()
        for dataset_id, kind, epsilon, delta in rows:
            step = BUDGET_CONTEXT.add if kind == "charge" else BUDGET_CONTEXT.subtract
            eps_sum, delta_sum = spent.get(dataset_id, (Decimal(0), Decimal(0)))
            spent[dataset_id] = (step(eps_sum, epsilon), step(delta_sum, delta))
    zero = (Decimal(0), Decimal(0))
    return {
        dataset.id: BudgetState(
            dataset.epsilon_total, dataset.delta_total, *spent.get(dataset.id, zero)
        )
        for dataset in datasets
    }


def spent(rows: Iterable[Row[str, Decimal, Decimal]]) -> tuple[Decimal, Decimal]:
    """``sum(charges) - sum(refunds)`` of ``(kind, epsilon, delta)`` rows, exactly."""
    epsilon_spent = Decimal(0)
    delta_spent = Decimal(0)
    for kind, epsilon, delta in rows:
        step = BUDGET_CONTEXT.add if kind == "charge" else BUDGET_CONTEXT.subtract
        epsilon_spent = step(epsilon_spent, epsilon)
        delta_spent = step(delta_spent, delta)
    return epsilon_spent, delta_spent


def charge(
    session: Session,
    dataset_id: uuid.UUID,
    release_id: uuid.UUID,
    epsilon: Decimal,
    delta: Decimal,
    grant_id: uuid.UUID | None = None,
) -> None:
    """Append a charge (at most one per release: a unique constraint enforces it), to the
    dataset and, when ``grant_id`` is given, to that grant in the same entry."""
    session.add(
        LedgerEntry(
            dataset_id=dataset_id,
            release_id=release_id,
            kind="charge",
            epsilon=epsilon,
            delta=delta,
            grant_id=grant_id,
        )
    )


def refund(
    session: Session, dataset_id: uuid.UUID, release_id: uuid.UUID, epsilon: Decimal, delta: Decimal
) -> None:
    """Append a refund; only for a release that provably never read the data. It goes back to
    the grant the charge named, if any."""
    grant_id = session.execute(
        select(LedgerEntry.grant_id).where(
            LedgerEntry.release_id == release_id, LedgerEntry.kind == "charge"
        )
    ).scalar_one_or_none()
    session.add(
        LedgerEntry(
            dataset_id=dataset_id,
            release_id=release_id,
            kind="refund",
            epsilon=epsilon,
            delta=delta,
            grant_id=grant_id,
        )
    )
