"""The audit log (auditors and admins)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from api_schemas.audit import AuditEvent, AuditPage
from service import audit
from service.api.deps import MAX_QUERY_INT, Cursor, Limit, UnitOfWorkDep
from service.api.routing import GuardedRoute
from service.auth import Principal, require_role
from service.pagination import list_scope, parse_seq_cursor, seq_cursor

AUDIT_CURSOR = "audit"
AUDIT_SCOPE = list_scope("audit")

router = APIRouter(prefix="/v1", tags=["audit"], route_class=GuardedRoute)

After = Annotated[
    int, Query(ge=0, le=MAX_QUERY_INT, description="Return events with seq greater than this.")
]


@router.get("/audit", response_model=AuditPage, summary="Audit events in chain order, paginated.")
async def list_audit(
    uow: UnitOfWorkDep, after: After = 0, limit: Limit = 100, cursor: Cursor = None
) -> AuditPage:
    """``cursor`` (the previous page's ``next``) and ``after`` (its ``next_after``, kept for old
    clients) name the same position; given both, the cursor wins."""

    def work(session: Session, principal: Principal) -> AuditPage:
        require_role(principal, "auditor", "admin")
        start = parse_seq_cursor(cursor, AUDIT_CURSOR, AUDIT_SCOPE) if cursor is not None else after
        events = audit.list_events(session, start, limit + 1)
        more = len(events) > limit
        events = events[:limit]
        total = audit.count_events(session)
        last = events[-1].seq if more else None
        return AuditPage(
            items=[AuditEvent.model_validate(event) for event in events],
            next_after=last,
            total=total,
            next=seq_cursor(AUDIT_CURSOR, AUDIT_SCOPE, last) if last is not None else None,
        )

    return await uow(work)
