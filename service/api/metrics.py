"""``GET /metrics``: the Prometheus exposition (:mod:`service.metrics`), for admin keys only.

Not in the API manual (it is not JSON). Prometheus sends the key as a bearer token
(``authorization: {credentials_file: ...}`` in its scrape config; see docs/deployment.md).
"""

from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from service import metrics, operations
from service.api.deps import SettingsDep, UnitOfWorkDep, database_of
from service.auth import Principal, require_role
from service.db.models import utcnow

router = APIRouter()


def pool_figures(request: Request) -> metrics.PoolFigures | None:
    """This process's pool and request slots; ``None`` when the app does not own its engine
    (tests hand it a session factory)."""
    engine = getattr(request.app.state, "engine", None)
    if engine is None:
        return None
    pool = engine.pool
    database = database_of(request)
    size = getattr(pool, "size", lambda: 0)()
    return metrics.PoolFigures(
        size=size,
        checked_out=getattr(pool, "checkedout", lambda: 0)(),
        overflow=max(0, getattr(pool, "overflow", lambda: 0)()),
        slots=database.size,
        slots_in_use=database.size - database.gate().slots.value,
    )


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(
    request: Request, uow: UnitOfWorkDep, settings: SettingsDep
) -> Response:
    def work(session: Session, principal: Principal) -> operations.Figures:
        require_role(principal, "admin")
        return operations.figures(session, settings, utcnow())

    figures = await uow(work)
    body = await anyio.to_thread.run_sync(metrics.exposition, figures, pool_figures(request))
    return Response(body, media_type=metrics.CONTENT_TYPE)
