"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session

from api_schemas.common import ErrorBody, Health, Readiness
from service import operations
from service.api.deps import database_of
from service.db.models import utcnow

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers.")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Readiness: the database answers; how many workers are alive.",
    responses={
        503: {
            "model": ErrorBody,
            "description": "The database is unreachable or busy (`service_unavailable`, with "
            "`Retry-After`).",
        }
    },
)
async def readyz(request: Request) -> Readiness:
    # Through the same slots as every request: a readiness probe never takes the connection a
    # request was promised, and it reports 503 exactly when requests would get 503.
    settings = request.app.state.settings

    def alive(session: Session) -> int:
        # An operator's fact, not the data's: how a client waiting on a release that no worker
        # will compute (the API started alone) can say why instead of waiting in silence.
        return operations.workers_alive(session, settings, utcnow())

    return Readiness(status="ok", workers_alive=await database_of(request).run(alive))
