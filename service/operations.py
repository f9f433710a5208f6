"""Read-only views for operators and the dashboard: workers, the queue, a dataset's ledger, the
grants that apply to an analyst, the audit chain's verification, and the figures ``/metrics``
exports. Each function checks the role it serves; routes stay thin.

Worker presence: each worker process upserts its row of ``worker_heartbeats`` every
``DPSS_WORKER_HEARTBEAT_SECONDS`` (idle or busy) and removes it when it stops. A row not renewed
within ``DPSS_WORKER_LEASE_SECONDS`` (the time after which its jobs are reclaimable anyway) is a
worker that died without saying so; rows older than a day are forgotten.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Literal

from sqlalchemy import ColumnElement, Float, and_, cast, delete, func, not_, or_, select, update
from sqlalchemy.orm import Session

from service import audit, ledger, privacy_unit, reference_recheck
from service.auth import Principal, require_role
from service.config import Settings
from service.db.models import (
    ApiKey,
    AuditEvent,
    Dataset,
    Grant,
    LedgerEntry,
    Release,
    RestoreHold,
    WorkerHeartbeat,
    utcnow,
)
from service.errors import NotFound
from service.grants import GrantView, view_of
from service.mechanisms.registry import MECHANISMS
from service.pagination import Page, ledger_cursor, list_scope, parse_ledger_cursor

#: Rows of workers not seen for this long are deleted by the next heartbeat of any worker.
FORGET_WORKERS_AFTER = timedelta(days=1)
#: The queue view lists at most this many jobs.
QUEUE_ITEMS = 100
LEDGER_CURSOR = "ledger"


# -- workers --------------------------------------------------------------------------------


def note_worker_alive(session: Session, worker_id: str, now: datetime) -> None:
    """Renew (or create) ``worker_id``'s heartbeat; forget workers silent for a day."""
    renewed = session.execute(
        update(WorkerHeartbeat)
        .where(WorkerHeartbeat.worker_id == worker_id)
        .values(last_seen_at=now)
    )
    if getattr(renewed, "rowcount", 0) != 1:
        session.add(WorkerHeartbeat(worker_id=worker_id, started_at=now, last_seen_at=now))
    session.execute(
        delete(WorkerHeartbeat).where(WorkerHeartbeat.last_seen_at < now - FORGET_WORKERS_AFTER)
    )


def forget_worker(session: Session, worker_id: str) -> None:
    """A worker stopping cleanly removes its heartbeat."""
    session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.worker_id == worker_id))


@dataclass(frozen=True)
class WorkerView:
    heartbeat: WorkerHeartbeat
    alive: bool
    running_release_id: uuid.UUID | None


def _alive_since(settings: Settings, now: datetime) -> datetime:
    return now - timedelta(seconds=settings.worker_lease_seconds)


def workers_alive(session: Session, settings: Settings, now: datetime) -> int:
    """How many workers renewed their heartbeat within the lease (``/readyz``; any caller)."""
    return session.execute(
        select(func.count())
        .select_from(WorkerHeartbeat)
        .where(WorkerHeartbeat.last_seen_at >= _alive_since(settings, now))
    ).scalar_one()


def list_workers(
    session: Session, principal: Principal, settings: Settings, now: datetime
) -> list[WorkerView]:
    """The workers known, newest heartbeat first, with the release each is running (admin)."""
    require_role(principal, "admin")
    rows = list(
        session.execute(
            select(WorkerHeartbeat).order_by(
                WorkerHeartbeat.last_seen_at.desc(), WorkerHeartbeat.worker_id
            )
        ).scalars()
    )
    running: dict[str | None, uuid.UUID] = {
        owner: release_id
        for owner, release_id in session.execute(
            select(Release.lease_owner, Release.id).where(
                Release.status == "running", Release.lease_owner.is_not(None)
            )
        )
    }
    since = _alive_since(settings, now)
    return [WorkerView(row, row.last_seen_at >= since, running.get(row.worker_id)) for row in rows]


# -- the queue ------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueView:
    queued: int
    running: int
    oldest_queued_at: datetime | None
    jobs: list[Release]
    #: Late one-shot releases by mechanism (:func:`late_counts`).
    late: dict[str, int] = field(default_factory=dict)


def _queue_counts(session: Session) -> tuple[dict[str, int], datetime | None]:
    counts: dict[str, int] = {
        status: count
        for status, count in session.execute(
            select(Release.status, func.count())
            .where(Release.status.in_(("queued", "running")))
            .group_by(Release.status)
        )
    }
    oldest = session.execute(
        select(func.min(Release.created_at)).where(Release.status == "queued")
    ).scalar_one_or_none()
    return counts, oldest


def queue_state(session: Session, principal: Principal) -> QueueView:
    """How many releases wait and run, the oldest wait, and the oldest jobs (admin)."""
    require_role(principal, "admin")
    counts, oldest = _queue_counts(session)
    jobs = list(
        session.execute(
            select(Release)
            .where(Release.status.in_(("queued", "running")))
            .order_by(Release.created_at, Release.id)
            .limit(QUEUE_ITEMS)
        ).scalars()
    )
    return QueueView(
        counts.get("queued", 0), counts.get("running", 0), oldest, jobs, late_counts(session)
    )


def late_counts(session: Session) -> dict[str, int]:
    """One-shot releases that ended after their ``visible_at``, by mechanism (continual releases
    run past it by design). Operators only: it moves when a job really ends
    (:func:`service.padding.late_schedule` bounds what analysts learn of lateness)."""
    rows = session.execute(
        select(Release.mechanism, func.count())
        .where(
            Release.visible_at.is_not(None),
            Release.finished_at.is_not(None),
            Release.finished_at > Release.visible_at,
        )
        .group_by(Release.mechanism)
    )
    return {
        name: count
        for name, count in rows
        if not (name in MECHANISMS and MECHANISMS[name].continual)
    }


# -- a dataset's ledger, an analyst's grants ------------------------------------------------


@dataclass(frozen=True)
class LedgerView:
    """A page of a dataset's ledger with what :func:`service.spend.running_epsilon` needs to
    state each entry in epsilon: the dataset's accounting and ``delta_total``, and the net
    sums (:data:`service.ledger.SUMS`) of the entries before the page, and the dataset's
    budget totals (``hybrid`` states a spend by the filters that still hold)."""

    page: Page[LedgerEntry]
    accounting: str
    delta_total: Decimal
    before: ledger.Spent
    totals: ledger.Totals | None = None
    #: What the figures protect (``row`` or ``person``): stated with them.
    unit: Literal["row", "person"] = "row"
    #: The place of the page's first entry in the dataset's ledger (1 for the first page): the
    #: ``id`` owners are shown, not the global entry id (:func:`page_ledger`).
    first_place: int = 1


def page_ledger(
    session: Session, principal: Principal, dataset_id: uuid.UUID, limit: int, cursor: str | None
) -> LedgerView:
    """A dataset's charges and refunds, oldest first (its owner only; 404 for anyone else,
    as for its grants)."""
    require_role(principal, "owner")
    dataset = session.get(Dataset, dataset_id)
    if dataset is None or dataset.owner_key_id != principal.key_id:
        raise NotFound(f"no dataset {dataset_id}")
    # A refund is listed from when it takes effect (its ``created_at``: when its release's
    # outcome shows, :func:`service.ledger.refund`), as the budget counts it: written when the
    # worker records the end, its row would show an owner when a release of theirs ended, and
    # so when the job ahead of it in the queue (on any dataset) did (service.visibility).
    # For the same reason the ledger is ordered and paged by when each entry takes effect, then
    # its release's id and kind (all public), and each entry is numbered by its place there:
    # not by its global ``id``, numbered in write order across every dataset's entries, which
    # placed a refund where the worker wrote it.
    now = utcnow()
    scope = list_scope("ledger", dataset_id=dataset_id)
    shown = [LedgerEntry.dataset_id == dataset_id, ledger.in_effect(now, dataset.deleted_at)]
    total = session.execute(
        select(func.count()).select_from(LedgerEntry).where(*shown)
    ).scalar_one()
    before_cursor: list[ColumnElement[bool]] = []
    if cursor is not None:
        at, release_id, kind = parse_ledger_cursor(cursor, LEDGER_CURSOR, scope)
        before_cursor = [_up_to(at, release_id, kind)]
    rows = list(
        session.execute(
            select(LedgerEntry)
            .where(*shown, *(not_(c) for c in before_cursor))
            .order_by(LedgerEntry.created_at, LedgerEntry.release_id, LedgerEntry.kind)
            .limit(limit + 1)
        ).scalars()
    )
    more = len(rows) > limit
    rows = rows[:limit]
    last = rows[-1] if rows else None
    following = (
        ledger_cursor(LEDGER_CURSOR, scope, last.created_at, last.release_id, last.kind)
        if more and last is not None
        else None
    )
    # The net spend before this page, summed exactly (in the order listed: a refund counts from
    # when it takes effect), and how many entries precede it (the first entry's place - 1).
    earlier = (
        session.execute(
            select(
                LedgerEntry.kind,
                LedgerEntry.epsilon,
                LedgerEntry.delta,
                LedgerEntry.rho,
                LedgerEntry.gdp,
                LedgerEntry.zcdp_delta,
            ).where(*shown, *before_cursor)
        ).all()
        if before_cursor
        else []
    )
    before = ledger.spent_of(earlier)
    totals = ledger.Totals(*(getattr(dataset, name) for name in ledger.TOTALS))
    return LedgerView(
        Page(items=rows, total=total, next=following),
        dataset.accounting,
        dataset.delta_total,
        before,
        totals,
        privacy_unit.unit_of(dataset),
        len(earlier) + 1,
    )


def _up_to(at: datetime, release_id: uuid.UUID, kind: str) -> ColumnElement[bool]:
    """Ledger entries at or before ``(at, release_id, kind)`` in the owner's order."""
    return or_(
        LedgerEntry.created_at < at,
        and_(
            LedgerEntry.created_at == at,
            or_(
                LedgerEntry.release_id < release_id,
                and_(LedgerEntry.release_id == release_id, LedgerEntry.kind <= kind),
            ),
        ),
    )


def my_grants(session: Session, principal: Principal) -> list[GrantView]:
    """For each live dataset, the grant an analyst's release there would be charged to (their
    own active grant, else the dataset's active all-analysts grant), with what it has left.
    The rule is :func:`service.grants.applicable_grant`'s, applied to every dataset at once."""
    require_role(principal, "analyst")
    grants = session.execute(
        select(Grant)
        .join(Dataset, Dataset.id == Grant.dataset_id)
        .where(
            Grant.revoked_at.is_(None),
            Dataset.deleted_at.is_(None),
            or_(Grant.analyst_key_id == principal.key_id, Grant.analyst_key_id.is_(None)),
        )
        .order_by(Grant.created_at, Grant.id)
    ).scalars()
    chosen: dict[uuid.UUID, Grant] = {}
    for grant in grants:
        if grant.dataset_id not in chosen or grant.analyst_key_id is not None:
            chosen[grant.dataset_id] = grant
    return [view_of(session, grant) for grant in chosen.values()]


# -- the audit chain --------------------------------------------------------------------------


@dataclass(frozen=True)
class Verification:
    report: audit.VerifyReport
    anchor: audit.Head | None
    #: Whether the chain holds the anchored event with the anchored hash (None: no anchor).
    anchor_found: bool | None
    #: The restore detected and not yet accepted (``dpss audit accept-restore``), if any.
    restore_unaccepted: str | None = None


def verify_audit(session: Session, principal: Principal, settings: Settings) -> Verification:
    """`dpss audit verify` with the service's anchor and MAC key (auditors and admins)."""
    require_role(principal, "auditor", "admin")
    anchor = audit.Head.parse(settings.audit_anchor) if settings.audit_anchor else None
    key = settings.audit_hmac_key
    report = audit.verify(
        session,
        anchor=anchor,
        hmac_key=key.get_secret_value().encode("utf-8") if key is not None else None,
    )
    found = None
    if anchor is not None:
        event = session.get(AuditEvent, anchor.seq)
        expected = audit.GENESIS_HASH if anchor.seq == 0 else (event.hash if event else None)
        found = expected == anchor.hash
    hold = session.get(RestoreHold, 1)
    restore = None
    if hold is not None:
        restore = hold.problem
        report.problems.insert(
            0,
            f"restore detected at {hold.detected_at.isoformat(timespec='seconds')} and not "
            f"accepted (charges and key use refused until `dpss audit accept-restore`): "
            f"{hold.problem}",
        )
    return Verification(report, anchor, found, restore)


def restore_unaccepted(session: Session) -> str | None:
    """The restore detected and not yet accepted, if any (``restore_hold``)."""
    hold = session.get(RestoreHold, 1)
    return hold.problem if hold is not None else None


def key_info(session: Session, principal: Principal) -> ApiKey:
    """The caller's own key row."""
    key = session.get(ApiKey, principal.key_id)
    assert key is not None  # authenticated in this transaction
    return key


# -- figures for /metrics ---------------------------------------------------------------------


@dataclass
class Figures:
    """What ``/metrics`` reads from the database at each scrape (shared by every process).

    Only counts, ages and declared costs: no figure depends on a dataset's values.
    """

    queued: int = 0
    running: int = 0
    oldest_queued_age_seconds: float = 0.0
    workers_alive: int = 0
    workers_known: int = 0
    releases: dict[tuple[str, str], int] = field(default_factory=dict)
    ledger_entries: dict[str, int] = field(default_factory=dict)
    ledger_epsilon: dict[str, float] = field(default_factory=dict)
    ledger_delta: dict[str, float] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)
    #: How long the earliest pending re-check of a dataset by reference is past its due moment
    #: (0 if none is): a worker's re-check thread stores each within about a second, so a
    #: figure that grows says no re-check thread runs (:mod:`service.reference_recheck`).
    recheck_overdue_seconds: float = 0.0
    #: Every dataset's budget (exact ledger sums), for the spend stated per accounting
    #: (:func:`service.spend.statement`, converted outside the unit of work).
    budgets: list[ledger.BudgetState] = field(default_factory=list)


def figures(session: Session, settings: Settings, now: datetime) -> Figures:
    """The database's side of the metrics (the caller checks that the key is an admin's)."""
    counts, oldest = _queue_counts(session)
    result = Figures(queued=counts.get("queued", 0), running=counts.get("running", 0))
    if oldest is not None:
        result.oldest_queued_age_seconds = max(0.0, (now - oldest).total_seconds())
    since = _alive_since(settings, now)
    count_workers = select(func.count()).select_from(WorkerHeartbeat)
    result.workers_known = session.execute(count_workers).scalar_one()
    result.late = late_counts(session)
    due = reference_recheck.next_due(session)
    if due is not None:
        result.recheck_overdue_seconds = max(0.0, (now - due).total_seconds())
    result.workers_alive = session.execute(
        count_workers.where(WorkerHeartbeat.last_seen_at >= since)
    ).scalar_one()
    for mechanism, status, count in session.execute(
        select(Release.mechanism, Release.status, func.count()).group_by(
            Release.mechanism, Release.status
        )
    ):
        result.releases[(mechanism, status)] = count
    # Floats: a metric is a float, and these sums are for graphs (the exact budgets are the
    # ledger's, in service.ledger).
    for kind, count, epsilon, delta in session.execute(
        select(
            LedgerEntry.kind,
            func.count(),
            func.sum(cast(LedgerEntry.epsilon, Float)),
            func.sum(cast(LedgerEntry.delta, Float)),
        ).group_by(LedgerEntry.kind)
    ):
        result.ledger_entries[kind] = count
        result.ledger_epsilon[kind] = float(epsilon or 0.0)
        result.ledger_delta[kind] = float(delta or 0.0)
    datasets = list(session.execute(select(Dataset)).scalars())
    result.budgets = list(ledger.budgets_of(session, datasets).values())
    return result


__all__ = [
    "Figures",
    "LedgerView",
    "QueueView",
    "Verification",
    "WorkerView",
    "figures",
    "forget_worker",
    "key_info",
    "list_workers",
    "my_grants",
    "note_worker_alive",
    "page_ledger",
    "queue_state",
    "verify_audit",
]
