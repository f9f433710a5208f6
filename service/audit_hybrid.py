"""The audit re-checks ``hybrid`` spend: every charge replayed through the ledger's own rule.

Under ``basic``/``gaussian``/``zcdp`` the audit sums what the recorded releases spent and
compares the sums with the budget (:func:`service.audit_reconcile._check_spending`). A
``hybrid`` budget admits a release iff one of its three filters admits the whole sequence with
it (:class:`service.accounting.HybridState`): whether a charge was admissible depends on the
order and on every filter's figures, not on three sums. So the audit replays, in order, the
charges of each hybrid dataset (and of each grant on one) through :class:`HybridState` on the
budget its ``budget_set`` event (or ``grant_created`` event) recorded, counting charges only,
as the ledger does (a refund on a hybrid dataset gives nothing back, :func:`service.ledger.refund`),
and names every charge no filter admitted:

* the recorded charges, in event order (``release_requested`` events' costs);
* the ledger's rows, in ledger order (the ``id``: charges are appended under the dataset's
  lock, so ids follow the order the ledger admitted them), with their stored figures, so a
  row changed in the database so that no filter admits it is named by its id even where
  events and rows are not otherwise compared.

Pure decisions on exact decimals (the same comparisons the ledger made); a problem names an
event or a row and an id, never a stored value.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.accounting import HybridBudget, HybridState, ReleaseCost, hybrid_sub_budget
from service.db.models import LedgerEntry

__all__ = ["budget_of_event", "cost_of_event", "grant_budget", "ledger_charges", "refused"]


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


def refused(budget: HybridBudget, costs: Iterable[tuple[str, ReleaseCost]]) -> list[str]:
    """The names of the charges (in the order given) that no filter admitted when they were
    made. A refused charge still moves every filter's sums afterwards: the ledger holds it."""
    state = HybridState(budget)
    found: list[str] = []
    for name, cost in costs:
        if not state.admits(cost):
            found.append(name)
        state = state.after(cost)
    return found


def ledger_charges(
    session: Session, dataset_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, list[tuple[int, uuid.UUID | None, ReleaseCost]]]:
    """Each dataset's charges in ledger order: ``(entry id, grant id, cost)`` from the stored
    figures (:meth:`service.ledger.Charge.release_cost`'s reading of them)."""
    wanted = list(dataset_ids)
    found: dict[uuid.UUID, list[tuple[int, uuid.UUID | None, ReleaseCost]]] = {
        key: [] for key in wanted
    }
    if not wanted:
        return found
    rows = session.execute(
        select(
            LedgerEntry.id,
            LedgerEntry.dataset_id,
            LedgerEntry.grant_id,
            LedgerEntry.epsilon,
            LedgerEntry.delta,
            LedgerEntry.rho,
            LedgerEntry.gdp,
            LedgerEntry.zcdp_delta,
        )
        .where(LedgerEntry.kind == "charge", LedgerEntry.dataset_id.in_(wanted))
        .order_by(LedgerEntry.id)
    )
    for entry_id, dataset_id, grant_id, epsilon, delta, rho, gdp, zcdp_delta in rows:
        cost = ReleaseCost(epsilon, delta, None if zcdp_delta is None else rho, zcdp_delta, gdp)
        found[dataset_id].append((entry_id, grant_id, cost))
    return found


def grant_budget(dataset: HybridBudget, epsilon: Decimal, delta: Decimal) -> HybridBudget:
    """A grant's filters on a hybrid dataset whose filters are ``dataset``: the sub-budget the
    service gives it (:func:`service.accounting.hybrid_sub_budget`, as
    :func:`service.grants.hybrid_grant_budget`)."""
    return hybrid_sub_budget(dataset, epsilon, delta)
