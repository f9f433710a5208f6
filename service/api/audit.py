"""The audit log (auditors and admins)."""

from __future__ import annotations

from fastapi import APIRouter, Query

from api_schemas.audit import AuditEvent, AuditPage
from service import audit
from service.api.deps import PrincipalDep, SessionDep
from service.auth import require_role

router = APIRouter(prefix="/v1", tags=["audit"])


@router.get("/audit", response_model=AuditPage, summary="Audit events in chain order, paginated.")
def list_audit(
    session: SessionDep,
    principal: PrincipalDep,
    after: int = Query(0, ge=0, description="Return events with seq greater than this."),
    limit: int = Query(100, ge=1, le=1000, description="Page size."),
) -> AuditPage:
    require_role(principal, "auditor", "admin")
    events = audit.list_events(session, after, limit)
    return AuditPage(
        items=[AuditEvent.model_validate(event) for event in events],
        next_after=events[-1].seq if len(events) == limit else None,
    )
