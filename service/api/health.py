"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sqlalchemy import text
from sqlalchemy.orm import Session

from api_schemas.common import ErrorBody, Health
from service.api.deps import database_of

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers.")
async def healthz() -> Health:
    return Health(status="ok")


def _ping(session: Session) -> None:
    session.execute(text("SELECT 1"))


@router.get(
    "/readyz",
    response_model=Health,
    summary="Readiness: the database answers.",
    responses={
        503: {
            "model": ErrorBody,
            "description": "The database is unreachable or busy (`service_unavailable`, with "
            "`Retry-After`).",
        }
    },
)
async def readyz(request: Request) -> Health:
    # Through the same slots as every request: a readiness probe never takes the connection a
    # request was promised, and it reports 503 exactly when requests would get 503.
    await database_of(request).run(_ping)
    return Health(status="ok")
