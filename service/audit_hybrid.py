"""The audit re-checks ``hybrid`` spend: every charge replayed through the ledger's own rule.

Under ``basic``/``gaussian``/``zcdp`` the audit sums what the recorded releases spent and
compares the sums with the budget (:func:`service.audit_reconcile._check_spending`). A
``hybrid`` budget admits a release iff one of its three filters admits the whole sequence with
it (:class:`service.accounting.HybridState`): whether a charge was admissible depends on the
order and on every filter's figures, not on three sums. So the audit replays, in order, the
charges of each hybrid dataset (and of each grant on one) through :class:`HybridState` on the
budget its ``budget_set`` event (or ``grant_created`` event) recorded, refunds counted as the
ledger counts them (a refunded release becomes a zero-cost step once its refund takes effect,
:func:`service.ledger.refund`), and names every charge no filter admitted:

* the recorded charges, in event order (``release_requested`` events' costs; a refund at its
  outcome event, which is no later than it took effect: lenient, never stricter than the
  ledger);
* the ledger's rows, in the order they took effect (:func:`ledger_entries`), with their
  stored figures, so a row changed in the database so that no filter admits it is named by
  its id.

Pure decisions on exact decimals (the same comparisons the ledger made); a problem names an
event or a row and an id, never a stored value.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api_schemas.common import BUDGET_CONTEXT
from service.accounting import HybridBudget, HybridState, ReleaseCost, hybrid_sub_budget
from service.db.models import LedgerEntry

__all__ = [
    "Entry",
    "Step",
    "budget_of_event",
    "cost_of_event",
    "grant_budget",
    "ledger_entries",
    "refused",
    "steps_of",
]


def _optional(value: Any) -> Decimal | None:
    return None if value is None else Decimal(value)


def budget_of_event(details: dict[str, Any]) -> HybridBudget:
    """The filters' budgets a hybrid ``budget_set`` event recorded (its own figures, not
    derived again)."""
    return HybridBudget(
        Decimal(details["epsilon_total"]),
        Decimal(details["delta_total"]),
        Decimal(details["mu_total"]),
        Decimal(details["delta_gaussian"]),
        Decimal(details["rho_total"]),
        Decimal(details["delta_conversion"]),
        Decimal(details["delta_mechanisms"]),
        Decimal(details["delta_basic"]),
    )


def cost_of_event(cost: dict[str, Any]) -> ReleaseCost:
    """What a hybrid ``release_requested`` event's cost charged every filter
    (:func:`service.charges.details`: ``rho``/``zcdp_delta`` null without a profile, ``gdp``
    null with a step A' cannot charge)."""
    zcdp_delta = _optional(cost.get("zcdp_delta"))
    return ReleaseCost(
        Decimal(cost["epsilon"]),
        Decimal(cost["delta"]),
        None if zcdp_delta is None else Decimal(cost.get("rho") or 0),
        zcdp_delta,
        _optional(cost.get("gdp")),
    )


@dataclass
class _Sums:
    """What the steps in effect spent, per filter, with the counts of steps missing a GDP
    figure or a profile (as :data:`service.ledger.SUMS`: a refund moves them back)."""

    epsilon: Decimal = Decimal(0)
    delta: Decimal = Decimal(0)
    rho: Decimal = Decimal(0)
    zcdp_delta: Decimal = Decimal(0)
    gdp: Decimal = Decimal(0)
    not_gdp: int = 0
    not_profiled: int = 0

    def move(self, cost: ReleaseCost, sign: int) -> None:
        step = BUDGET_CONTEXT.add if sign > 0 else BUDGET_CONTEXT.subtract
        self.epsilon = step(self.epsilon, cost.epsilon)
        self.delta = step(self.delta, cost.delta)
        self.rho = step(self.rho, cost.rho or Decimal(0))
        self.zcdp_delta = step(self.zcdp_delta, cost.zcdp_delta or Decimal(0))
        self.gdp = step(self.gdp, cost.gdp or Decimal(0))
        self.not_gdp += sign if cost.gdp is None else 0
        self.not_profiled += sign if cost.rho is None or cost.zcdp_delta is None else 0

    def state(self, budget: HybridBudget) -> HybridState:
        return HybridState(
            budget,
            self.epsilon,
            self.delta,
            self.rho,
            self.zcdp_delta,
            self.gdp,
            self.not_gdp <= 0,
            self.not_profiled <= 0,
        )


#: One step of a replay: its name, +1 (a charge) or -1 (a refund taking effect), its cost.
Step = tuple[str, int, ReleaseCost]


def refused(budget: HybridBudget, steps: Iterable[Step]) -> list[str]:
    """The names of the charges (in the order given) that no filter admitted when they were
    made, refunds taking effect where they come (a refunded release then counts as a zero-cost
    step, :func:`service.ledger.refund`). A refused charge still moves every filter's sums
    afterwards: the ledger holds it."""
    sums = _Sums()
    found: list[str] = []
    for name, sign, cost in steps:
        if sign > 0 and not sums.state(budget).admits(cost):
            found.append(name)
        sums.move(cost, sign)
    return found


@dataclass(frozen=True)
class Entry:
    """A ledger row as the replay reads it."""

    id: int
    kind: str
    created_at: datetime
    grant_id: uuid.UUID | None
    cost: ReleaseCost


def ledger_entries(
    session: Session, dataset_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, list[Entry]]:
    """Each dataset's charges and refunds in the order the ledger counted them: by the time
    each takes effect (``created_at``; a refund's is when its release's outcome became
    visible, :func:`service.ledger.refund`), a refund before a charge at the same time, then
    by id. A charge's ``created_at`` is set just after its admission check, so a refund this
    order counts before a charge may have been uncounted by the check only if it took effect
    in between: the replay is then more lenient than the ledger, never stricter, so an honest
    ledger is never flagged."""
    wanted = list(dataset_ids)
    found: dict[uuid.UUID, list[Entry]] = {key: [] for key in wanted}
    if not wanted:
        return found
    rows = session.execute(
        select(
            LedgerEntry.id,
            LedgerEntry.dataset_id,
            LedgerEntry.kind,
            LedgerEntry.created_at,
            LedgerEntry.grant_id,
            LedgerEntry.epsilon,
            LedgerEntry.delta,
            LedgerEntry.rho,
            LedgerEntry.gdp,
            LedgerEntry.zcdp_delta,
        ).where(LedgerEntry.dataset_id.in_(wanted))
    )
    for entry_id, dataset_id, kind, at, grant_id, epsilon, delta, rho, gdp, zcdp in rows:
        cost = ReleaseCost(epsilon, delta, None if zcdp is None else rho, zcdp, gdp)
        found[dataset_id].append(Entry(entry_id, kind, at, grant_id, cost))
    for entries in found.values():
        entries.sort(key=lambda e: (e.created_at, e.kind == "charge", e.id))
    return found


def steps_of(entries: Iterable[Entry]) -> list[Step]:
    """The replay's steps of ledger entries (named by their ids)."""
    return [(str(e.id), 1 if e.kind == "charge" else -1, e.cost) for e in entries]


def grant_budget(dataset: HybridBudget, epsilon: Decimal, delta: Decimal) -> HybridBudget:
    """A grant's filters on a hybrid dataset whose filters are ``dataset``: the sub-budget the
    service gives it (:func:`service.accounting.hybrid_sub_budget`, as
    :func:`service.grants.hybrid_grant_budget`)."""
    return hybrid_sub_budget(dataset, epsilon, delta)
