"""The privacy budget ledger: append-only charges and refunds in exact decimal arithmetic.

``remaining = total - sum(charges) + sum(refunds)``. Callers check and charge inside one
transaction that holds the dataset's lock (``releases.request_release``), so concurrent
requests cannot overspend.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Dataset, LedgerEntry


@dataclass(frozen=True)
class BudgetState:
    epsilon_total: Decimal
    delta_total: Decimal
    epsilon_spent: Decimal
    delta_spent: Decimal

    @property
    def epsilon_remaining(self) -> Decimal:
        return self.epsilon_total - self.epsilon_spent

    @property
    def delta_remaining(self) -> Decimal:
        return self.delta_total - self.delta_spent

    def affords(self, epsilon: Decimal, delta: Decimal) -> bool:
        return epsilon <= self.epsilon_remaining and delta <= self.delta_remaining


def budget_of(session: Session, dataset: Dataset) -> BudgetState:
    """The dataset's budget from its ledger (summed in Python: exact on every database)."""
    rows = session.execute(
        select(LedgerEntry.kind, LedgerEntry.epsilon, LedgerEntry.delta).where(
            LedgerEntry.dataset_id == dataset.id
        )
    ).all()
    epsilon_spent = Decimal(0)
    delta_spent = Decimal(0)
    for kind, epsilon, delta in rows:
        sign = 1 if kind == "charge" else -1
        epsilon_spent += sign * epsilon
        delta_spent += sign * delta
    return BudgetState(dataset.epsilon_total, dataset.delta_total, epsilon_spent, delta_spent)


def charge(
    session: Session, dataset_id: uuid.UUID, release_id: uuid.UUID, epsilon: Decimal, delta: Decimal
) -> None:
    """Append a charge (at most one per release: a unique constraint enforces it)."""
    session.add(
        LedgerEntry(
            dataset_id=dataset_id,
            release_id=release_id,
            kind="charge",
            epsilon=epsilon,
            delta=delta,
        )
    )


def refund(
    session: Session, dataset_id: uuid.UUID, release_id: uuid.UUID, epsilon: Decimal, delta: Decimal
) -> None:
    """Append a refund; only for a release that provably never read the data."""
    session.add(
        LedgerEntry(
            dataset_id=dataset_id,
            release_id=release_id,
            kind="refund",
            epsilon=epsilon,
            delta=delta,
        )
    )
