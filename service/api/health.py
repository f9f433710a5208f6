"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from api_schemas.common import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers.")
def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    summary="Readiness: the database answers.",
    responses={503: {"description": "The database is unreachable."}},
)
def readyz(request: Request) -> Health | JSONResponse:
    factory: sessionmaker[Session] = request.app.state.session_factory
    try:
        with factory() as session:
            session.execute(text("SELECT 1"))
    except Exception:
        return JSONResponse({"error": "not_ready", "detail": "database unreachable"}, 503)
    return Health(status="ok")
