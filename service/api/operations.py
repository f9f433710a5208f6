"""Read-only views for the dashboard and operators (thin routes over :mod:`service.operations`):
who a key is, the workers and the queue (admins), a dataset's ledger (its owner), the grants
that apply to an analyst, and the audit chain's verification (auditors and admins)."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from api_schemas.common import ErrorBody
from api_schemas.operations import (
    AuditVerification,
    LedgerEntry,
    LedgerPage,
    MyGrantList,
    QueuedJob,
    QueueState,
    Whoami,
    WorkerInfo,
    WorkerList,
)
from service import operations, spend
from service.api.deps import (
    Cursor,
    DatasetId,
    Limit,
    SettingsDep,
    UnitOfWorkDep,
    bearer_secret,
    database_of,
)
from service.api.grants import grant_out
from service.api.routing import GuardedRoute
from service.auth import Principal, authenticate
from service.db.models import utcnow

router = APIRouter(prefix="/v1", tags=["operations"], route_class=GuardedRoute)

FORBIDDEN: dict[int | str, dict[str, Any]] = {
    403: {"model": ErrorBody, "description": "The key's role may not do this."}
}


@router.get("/whoami", response_model=Whoami, summary="The calling key's id, role and name.")
async def whoami(uow: UnitOfWorkDep) -> Whoami:
    def work(session: Session, principal: Principal) -> Whoami:
        key = operations.key_info(session, principal)
        return Whoami(
            id=key.id,
            role=principal.role,
            name=key.name,
            restore_unaccepted=operations.restore_unaccepted(session),
        )

    return await uow(work)


@router.get(
    "/workers",
    response_model=WorkerList,
    summary="Workers and their heartbeats (admin).",
    responses=FORBIDDEN,
)
async def list_workers(uow: UnitOfWorkDep, settings: SettingsDep) -> WorkerList:
    def work(session: Session, principal: Principal) -> WorkerList:
        views = operations.list_workers(session, principal, settings, utcnow())
        items = [
            WorkerInfo(
                worker_id=view.heartbeat.worker_id,
                started_at=view.heartbeat.started_at,
                last_seen_at=view.heartbeat.last_seen_at,
                alive=view.alive,
                running_release_id=view.running_release_id,
            )
            for view in views
        ]
        return WorkerList(items=items, total=len(items), alive=sum(i.alive for i in items))

    return await uow(work)


@router.get(
    "/queue",
    response_model=QueueState,
    summary="The job queue: releases waiting and running, the oldest wait (admin).",
    responses=FORBIDDEN,
)
async def queue(uow: UnitOfWorkDep) -> QueueState:
    def work(session: Session, principal: Principal) -> QueueState:
        view = operations.queue_state(session, principal)
        now = utcnow()
        age = (now - view.oldest_queued_at).total_seconds() if view.oldest_queued_at else None
        return QueueState(
            queued=view.queued,
            running=view.running,
            oldest_queued_at=view.oldest_queued_at,
            oldest_queued_age_seconds=max(0.0, age) if age is not None else None,
            items=[
                QueuedJob(
                    release_id=job.id,
                    dataset_id=job.dataset_id,
                    mechanism=job.mechanism,
                    k=job.k,
                    status=job.status,
                    attempts=job.attempts,
                    created_at=job.created_at,
                    lease_owner=job.lease_owner,
                    lease_expires_at=job.lease_expires_at,
                )
                for job in view.jobs
            ],
            late=view.late,
        )

    return await uow(work)


@router.get(
    "/datasets/{dataset_id}/ledger",
    response_model=LedgerPage,
    summary="A dataset's charges and refunds, oldest first (owner).",
    responses={
        **FORBIDDEN,
        404: {"model": ErrorBody, "description": "No such dataset of yours."},
    },
)
async def ledger(
    dataset_id: DatasetId, uow: UnitOfWorkDep, limit: Limit = 100, cursor: Cursor = None
) -> LedgerPage:
    def work(session: Session, principal: Principal) -> operations.LedgerView:
        return operations.page_ledger(session, principal, dataset_id, limit, cursor)

    view = await uow(work)
    entries = [(e.kind, e.epsilon, e.delta, e.rho, e.gdp, e.zcdp_delta) for e in view.page.items]

    def state() -> list[spend.Running]:
        # Conversions cost milliseconds each: computed after the unit of work (its database
        # connection is back in the pool) and off the event loop.
        return spend.running_epsilon(
            view.accounting, view.delta_total, view.before, entries, view.totals
        )

    running = await anyio.to_thread.run_sync(state)
    return LedgerPage(
        items=[
            LedgerEntry(
                id=view.first_place + place,
                release_id=entry.release_id,
                kind=entry.kind,
                epsilon=entry.epsilon,
                delta=entry.delta,
                rho=entry.rho,
                mu=shown.mu,
                epsilon_after=shown.epsilon_after,
                epsilon_increment=shown.epsilon_increment,
                grant_id=entry.grant_id,
                created_at=entry.created_at,
            )
            for place, (entry, shown) in enumerate(zip(view.page.items, running, strict=True))
        ],
        total=view.page.total,
        next=view.page.next,
        accounting=view.accounting,
        stated_at_delta=view.delta_total,
        privacy_unit=view.unit,
    )


@router.get(
    "/grants",
    response_model=MyGrantList,
    summary="The grants an analyst's releases are charged to, with what each has left.",
    responses=FORBIDDEN,
)
async def my_grants(uow: UnitOfWorkDep) -> MyGrantList:
    def work(session: Session, principal: Principal) -> MyGrantList:
        views = operations.my_grants(session, principal)
        return MyGrantList(items=[grant_out(view) for view in views], total=len(views))

    return await uow(work)


@router.get(
    "/audit/verification",
    response_model=AuditVerification,
    summary="Verify the audit chain now, as `dpss audit verify` does (auditor, admin).",
    description=(
        "Reads the whole chain and the tables it covers in one snapshot: its cost grows with "
        "the log. `anchor` is `DPSS_AUDIT_ANCHOR`; MACs are checked when the service holds "
        "`DPSS_AUDIT_HMAC_KEY`."
    ),
    responses=FORBIDDEN,
)
async def audit_verification(request: Request, settings: SettingsDep) -> AuditVerification:
    secret = bearer_secret(request)

    def work(session: Session) -> AuditVerification:
        bind = session.get_bind()
        if isinstance(bind, Engine) and bind.dialect.name == "postgresql":
            # One snapshot, as `dpss audit verify` reads: rows and events written meanwhile
            # cannot disagree. (Set before the first statement: the key check comes next.)
            snapshot = {"isolation_level": "REPEATABLE READ", "postgresql_readonly": True}
            session.connection(execution_options=snapshot)
        principal = authenticate(session, secret)
        verification = operations.verify_audit(session, principal, settings)
        report = verification.report
        return AuditVerification(
            ok=report.ok,
            checked=report.checked,
            problems=report.problems,
            notes=report.notes,
            head=report.head.token(),
            anchor=verification.anchor.token() if verification.anchor else None,
            anchor_found=verification.anchor_found,
            macs_checked=settings.audit_hmac_key is not None,
            restore_unaccepted=verification.restore_unaccepted,
            verified_at=utcnow(),
        )

    return await database_of(request).run(work)
