"""What the audit events say the tables must hold, read from the chain event by event.

:class:`_Recorded` folds each event (a budget set, a request and its outcome, a grant, a key,
an epoch, a prior, a dataset by reference's record) into the figures :mod:`service.audit_reconcile`
then compares with the tables. Guarantee: an event whose details are not in the form this
version writes is recorded as a problem, never an exception.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from api_schemas.common import BUDGET_CONTEXT
from service import audit_hybrid
from service.accounting import HybridBudget, ReleaseCost
from service.audit_events import TERMINAL_EVENTS
from service.audit_references import REFERENCED, Referenced
from service.db.models import AuditEvent


@dataclass(frozen=True)
class _Request:
    seq: int
    dataset_id: uuid.UUID | None
    mechanism: Any
    k: Any
    params: Any
    epsilon: Decimal
    delta: Decimal
    #: The grant the release was charged to, or None (spent the dataset's budget directly).
    grant_id: uuid.UUID | None = None
    #: What the ledger moved, ``(epsilon, delta, rho)``: the cost on ``basic`` datasets; ``(0,
    #: zcdp_delta, rho)`` on ``gaussian``/``zcdp`` ones (events carry the accounting).
    charge: tuple[Decimal, Decimal, Decimal] = (Decimal(0), Decimal(0), Decimal(0))
    #: ``hybrid``: what the charge moved in every filter (GDP and zCDP figures included).
    cost: ReleaseCost | None = None


@dataclass(frozen=True)
class _GrantCreated:
    seq: int
    dataset_id: uuid.UUID | None
    analyst_key_id: uuid.UUID | None
    epsilon: Decimal
    delta: Decimal
    rho: Decimal = Decimal(0)


@dataclass(frozen=True)
class _Outcome:
    seq: int
    status: str
    basis_sha256: Any
    reason: Any
    refund: tuple[Decimal, Decimal, Decimal] | None


#: The ``datasets`` budget columns besides the totals and ``accounting`` that ``budget_set``
#: events record and the ledger admits by.
BUDGET_SHARES = (
    "mu_total",
    "delta_conversion",
    "delta_gaussian",
    "delta_mechanisms",
    "delta_basic",
)


@dataclass(frozen=True)
class _Budget:
    """A ``budget_set`` event: the totals, and for ``gaussian``/``zcdp`` the filter's rho and
    the delta mechanisms may spend (``delta_total - delta_conversion``; 0 for gaussian)."""

    seq: int
    epsilon: Decimal
    delta: Decimal
    accounting: str = "basic"
    rho: Decimal = Decimal(0)
    delta_limit: Decimal = Decimal(0)
    #: ``hybrid``: the filters' budgets the event recorded.
    hybrid: HybridBudget | None = None
    #: The event's other figures the ledger admits by (``mu_total``, ``delta_conversion`` and
    #: hybrid's shares of delta), as recorded; a name the event lacks (written before it
    #: carried it) is not compared.
    shares: tuple[tuple[str, Decimal | None], ...] = ()

    def exceeded_by(self, spent: tuple[Decimal, Decimal, Decimal]) -> bool:
        if self.accounting == "hybrid":
            # Either of three filters: whether the spend fits depends on the order and on
            # every filter's figures, not on three sums; _check_hybrid_spending replays it.
            return False
        if self.accounting == "basic":
            return spent[0] > self.epsilon or spent[1] > self.delta
        return spent[1] > self.delta_limit or spent[2] > self.rho


def _money(details: dict[str, Any]) -> tuple[Decimal, Decimal, Decimal]:
    """``(epsilon, delta, rho)`` of a refund's details (``rho`` 0 when absent)."""
    return (
        Decimal(details["epsilon"]),
        Decimal(details["delta"]),
        Decimal(details.get("rho", 0)),
    )


def _charge_of(cost: dict[str, Any]) -> tuple[Decimal, Decimal, Decimal]:
    """What a ``release_requested`` cost moved in the ledger."""
    if cost.get("accounting") == "hybrid":
        # every filter's figure: C's (epsilon, delta) and B's rho (0 without a profile)
        rho = cost.get("rho")
        return (Decimal(cost["epsilon"]), Decimal(cost["delta"]), Decimal(rho or 0))
    if "accounting" in cost:
        return (Decimal(0), Decimal(cost["zcdp_delta"]), Decimal(cost["rho"]))
    return (Decimal(cost["epsilon"]), Decimal(cost["delta"]), Decimal(0))


@dataclass
class _Recorded:
    """What the events say the tables must hold."""

    created: dict[uuid.UUID, int] = field(default_factory=dict)
    #: Each dataset's unit as ``dataset_created`` states it (older events: ``row``, the only one).
    units: dict[uuid.UUID, str] = field(default_factory=dict)
    budgets: dict[uuid.UUID, _Budget] = field(default_factory=dict)
    deleted: dict[uuid.UUID, int] = field(default_factory=dict)
    requests: dict[uuid.UUID, _Request] = field(default_factory=dict)
    outcomes: dict[uuid.UUID, _Outcome] = field(default_factory=dict)
    keys: dict[uuid.UUID, tuple[int, Any]] = field(default_factory=dict)
    revoked: dict[uuid.UUID, int] = field(default_factory=dict)
    grants: dict[uuid.UUID, _GrantCreated] = field(default_factory=dict)
    #: ``release_epoch`` events: ``(release, epoch) -> (seq, basis_sha256)``.
    epochs: dict[tuple[uuid.UUID, int], tuple[int, Any]] = field(default_factory=dict)
    grants_revoked: dict[uuid.UUID, int] = field(default_factory=dict)
    #: A dataset by reference's record, as its events describe it.
    references: dict[uuid.UUID, Referenced] = field(default_factory=dict)
    #: ``prior_stored`` events: ``prior id -> (seq, sha256, d, m)``.
    priors: dict[uuid.UUID, tuple[int, str, int, int]] = field(default_factory=dict)

    def add(self, event: AuditEvent, problems: list[str]) -> None:
        try:
            self._add(event, problems)
        except (KeyError, TypeError, ValueError, InvalidOperation):
            problems.append(f"event {event.seq}: details are not in the form this version writes")

    def _add(self, event: AuditEvent, problems: list[str]) -> None:
        kind, details, seq = event.event_type, event.details, event.seq
        if kind == "dataset_created" and event.dataset_id is not None:
            self.created[event.dataset_id] = seq
            self.units[event.dataset_id] = str(details.get("privacy_unit", "row"))
        elif kind == "budget_set" and event.dataset_id is not None:
            epsilon, delta = Decimal(details["epsilon_total"]), Decimal(details["delta_total"])
            kind_of = details.get("accounting", "basic")
            limit = Decimal(0)
            if kind_of == "zcdp":
                limit = BUDGET_CONTEXT.subtract(delta, Decimal(details["delta_conversion"]))
            rho = details.get("rho_total")
            hybrid = audit_hybrid.budget_of_event(details) if kind_of == "hybrid" else None
            shares = tuple(
                (name, None if details[name] is None else Decimal(details[name]))
                for name in BUDGET_SHARES
                if name in details
            )
            self.budgets[event.dataset_id] = _Budget(
                seq, epsilon, delta, kind_of, Decimal(rho or 0), limit, hybrid, shares
            )
        elif kind in REFERENCED and event.dataset_id is not None:
            before = self.references.get(event.dataset_id)
            objects = () if before is None or kind == "dataset_referenced" else before.objects
            self.references[event.dataset_id] = Referenced(
                seq,
                details.get("reference_sha256"),
                (*objects, *(details.get("objects") or ())),
                details.get("n_rows_total", details.get("n_rows")),
            )
        elif kind == "dataset_deleted" and event.dataset_id is not None:
            self.deleted[event.dataset_id] = seq
        elif kind == "release_requested" and event.release_id is not None:
            if event.release_id in self.requests:
                problems.append(f"event {seq}: release {event.release_id} was already requested")
            cost = details["cost"]
            # Events written before grants existed have no "grant_id": no grant.
            grant_id = details.get("grant_id")
            self.requests[event.release_id] = _Request(
                seq,
                event.dataset_id,
                details["mechanism"],
                details["k"],
                details["params"],
                Decimal(cost["epsilon"]),
                Decimal(cost["delta"]),
                None if grant_id is None else uuid.UUID(grant_id),
                _charge_of(cost),
                audit_hybrid.cost_of_event(cost) if cost.get("accounting") == "hybrid" else None,
            )
        elif kind in TERMINAL_EVENTS and event.release_id is not None:
            if event.release_id in self.outcomes:
                problems.append(f"event {seq}: release {event.release_id} already had an outcome")
            refunded = details.get("refunded")
            self.outcomes[event.release_id] = _Outcome(
                seq,
                kind.removeprefix("release_"),
                details.get("basis_sha256"),
                details.get("reason"),
                None if refunded is None else _money(refunded),
            )
        elif kind == "release_epoch" and event.release_id is not None:
            epoch = (event.release_id, int(details["epoch"]))
            if epoch in self.epochs:
                problems.append(f"event {seq}: epoch {epoch[1]} of {epoch[0]} was already released")
            self.epochs[epoch] = (seq, details["basis_sha256"])
        elif kind == "release_previewed":
            # A dry run moves no money and creates no release: it may name neither.
            if event.release_id is not None:
                problems.append(f"event {seq}: a release_previewed event names a release")
            Decimal(details["cost"]["epsilon"]), Decimal(details["cost"]["delta"])
        elif kind == "key_created":
            self.keys[uuid.UUID(details["key_id"])] = (seq, details["role"])
        elif kind == "key_revoked":
            self.revoked[uuid.UUID(details["key_id"])] = seq
        elif kind == "grant_created":
            grant_id = uuid.UUID(details["grant_id"])
            if grant_id in self.grants:
                problems.append(f"event {seq}: grant {grant_id} was already created")
            analyst = details["analyst_key_id"]
            self.grants[grant_id] = _GrantCreated(
                seq,
                event.dataset_id,
                None if analyst is None else uuid.UUID(analyst),
                Decimal(details["epsilon"]),
                Decimal(details["delta"]),
                Decimal(details.get("rho", 0)),
            )
        elif kind == "grant_revoked":
            self.grants_revoked[uuid.UUID(details["grant_id"])] = seq
        elif kind == "prior_stored":
            prior_id = uuid.UUID(str(details["prior_id"]))
            if prior_id in self.priors:
                problems.append(f"event {seq}: prior {prior_id} was already stored")
            self.priors[prior_id] = (
                seq,
                str(details["sha256"]),
                int(details["d"]),
                int(details["m"]),
            )
