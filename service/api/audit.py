"""The audit log (auditors and admins)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from api_schemas.audit import AuditEvent, AuditPage
from service import audit
from service.api.deps import MAX_QUERY_INT, Limit, UnitOfWorkDep
from service.api.routing import GuardedRoute
from service.auth import Principal, require_role

router = APIRouter(prefix="/v1", tags=["audit"], route_class=GuardedRoute)

After = Annotated[
    int, Query(ge=0, le=MAX_QUERY_INT, description="Return events with seq greater than this.")
]


@router.get("/audit", response_model=AuditPage, summary="Audit events in chain order, paginated.")
async def list_audit(uow: UnitOfWorkDep, after: After = 0, limit: Limit = 100) -> AuditPage:
    def work(session: Session, principal: Principal) -> AuditPage:
        require_role(principal, "auditor", "admin")
        events = audit.list_events(session, after, limit)
        return AuditPage(
            items=[AuditEvent.model_validate(event) for event in events],
            next_after=events[-1].seq if len(events) == limit else None,
        )

    return await uow(work)
