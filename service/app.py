"""The FastAPI application."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import fastapi.routing
from fastapi import Depends, FastAPI
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from service import anchors, auth
from service import audit as audit_log
from service.api import (
    audit,
    datasets,
    grants,
    health,
    history,
    keys,
    mechanisms,
    operations,
    priors,
    releases,
)
from service.api import metrics as metrics_api
from service.api.dashboard import install_dashboard
from service.api.deps import Database
from service.api.docs import install_docs
from service.api.errors import install_error_handlers
from service.api.observability import ObservedApp
from service.api.openapi import install_openapi, reject_unknown_query_parameters
from service.config import Settings
from service.db.engine import make_pooled_engine, make_session_factory
from service.store import DatasetStore, secure_data_dir
from service.waiters import ReleaseWaiters

log = logging.getLogger("dpss.api")

DESCRIPTION = """
Keeps sensitive datasets and releases only **differentially private low-dimensional
subspaces** of them. Owners upload a matrix with an (epsilon, delta) budget; analysts request a
rank-k release with a mechanism (`GET /v1/mechanisms`); a worker computes it; the ledger charges
the budget exactly once; a hash-chained audit log records every release.

Authenticate with `Authorization: Bearer <key>`. Errors are `{"error": code, "detail": message}`.
When the database is busy or unreachable the answer is 503 with a `Retry-After` header and the
same number of seconds in the body's `retry_after` field: nothing was done, retry after it.
"""

#: One line per tag of the manual, in the order a new user needs them.
TAGS = [
    {"name": "health", "description": "Liveness and readiness; no key needed."},
    {
        "name": "keys",
        "description": "API keys (admin): create one per owner or analyst, list and revoke.",
    },
    {
        "name": "datasets",
        "description": "Owners upload a matrix with its public row-norm bound and its "
        "(epsilon, delta) budget; the rows never leave the store.",
    },
    {
        "name": "grants",
        "description": "Owners give an analyst (or every analyst) a share of a dataset's budget.",
    },
    {
        "name": "releases",
        "description": "Analysts request a private rank-k subspace; the budget is charged once; "
        "list and fetch releases.",
    },
    {
        "name": "priors",
        "description": "Public priors: bases (from public data or a fixed transform, never the "
        "private rows) a release is estimated inside, named with params.prior_id; free.",
    },
    {
        "name": "mechanisms",
        "description": "The mechanisms, their parameters and what they guarantee.",
    },
    {
        "name": "audit",
        "description": "The hash-chained audit log of every key, upload, grant and release.",
    },
    {
        "name": "operations",
        "description": "Read-only views for the dashboard and operators: who a key is, "
        "workers, the queue, a dataset's ledger, an analyst's grants, the chain's verification.",
    },
]


def create_app(
    settings: Settings | None = None, session_factory: sessionmaker[Session] | None = None
) -> FastAPI:
    """Build the app. Tests pass a session factory bound to a rolled-back transaction.

    Without one, the app owns an engine whose pool is sized by the settings (see the sizing rule
    in ``Settings``) and disposes of it at shutdown.
    """
    settings = settings or Settings()
    logging.getLogger("dpss").setLevel(settings.log_level.upper())
    engine = None
    if session_factory is None:
        engine = make_pooled_engine(settings)
        session_factory = make_session_factory(engine)
    audit_log.use_hmac_key(session_factory, settings.audit_hmac_key)
    store = DatasetStore(
        settings.datasets_dir, max_cols=settings.max_cols, max_bytes=settings.max_dataset_bytes
    )
    database = Database(session_factory, settings)
    bind = session_factory.kw.get("bind")
    waiters = ReleaseWaiters(bind.engine if bind is not None else None, settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        database.gate()
        secure_data_dir(settings.data_dir)
        store.ensure()
        # Before serving: a database restored from an older backup must not be served as if
        # nothing happened (the hold refuses charges and key use until accepted).
        anchor_key = settings.audit_hmac_key
        log.info("audit anchors: %s", settings.resolved_audit_anchor_path)
        try:
            anchors.detect_restore(
                session_factory,
                settings,
                anchor_key.get_secret_value().encode("utf-8") if anchor_key is not None else None,
            )
        except (OSError, SQLAlchemyError) as exc:
            log.warning("audit anchors not checked at start (%s)", type(exc).__name__)
        if settings.admin_api_key is not None:
            with session_factory.begin() as session:
                auth.ensure_admin_key(session, settings.admin_api_key.get_secret_value())
        else:
            # A new user who started `dpss serve` without the key met only "invalid or revoked
            # API key" on POST /v1/keys, with nothing saying why.
            try:
                with session_factory() as session:
                    missing = not auth.has_admin_key(session)
            except SQLAlchemyError:
                # The database may be down at start; the API still starts and answers 503
                # until it is back (the hint is only a hint).
                missing = False
            if missing:
                log.warning(auth.NO_ADMIN_KEY)
        yield
        waiters.close()
        if engine is not None:
            engine.dispose()

    app = ObservedApp(
        title="dp-subspace-service",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        dependencies=[Depends(reject_unknown_query_parameters)],
        openapi_tags=TAGS,
        # The manual's pages are served from packaged assets instead (service.api.docs).
        docs_url=None,
        redoc_url=None,
    )
    # No 307 from /v1/datasets/ to /v1/datasets: a 404 that names the path without the slash
    # (service.api.errors).
    app.router.redirect_slashes = False
    app.state.settings = settings
    app.state.session_factory = session_factory
    app.state.database = database
    app.state.store = store
    #: The app's own engine (None when a test hands it a session factory): /metrics reads its pool.
    app.state.engine = engine
    app.state.release_waiters = waiters
    install_error_handlers(app)
    for router in (
        health.router,
        keys.router,
        datasets.router,
        datasets.references,
        releases.router,
        priors.router,
        grants.router,
        history.router,
        mechanisms.router,
        audit.router,
        operations.router,
        metrics_api.router,
    ):
        app.include_router(router)
    install_docs(app)
    install_dashboard(app)
    install_openapi(app)
    build_routes(app)
    return app


def build_routes(app: FastAPI) -> None:
    """Build every route's request validators now, in the thread creating the app, rather
    than at its first request, in whatever thread serves it.

    FastAPI (0.16x) builds an included router's routes for each app lazily, at the app's first
    request or OpenAPI document. Each parameter's validator is a pydantic ``TypeAdapter`` over a
    ``Field`` carrying the alias FastAPI gives every parameter, which pydantic warns about
    (``UnsupportedFieldAttributeWarning``); FastAPI silences it with ``catch_warnings`` and an
    ``ignore`` filter. The filter list is one per process: two threads in ``catch_warnings`` at
    once (two apps serving their first requests, in tests) can restore each other's list
    without the filter, and the warning escaped in some test orders. Built here, before the
    app serves anything, no server thread builds any. Older FastAPI built them in
    ``include_router`` (no ``iter_route_contexts``): nothing is left to do then.
    """
    contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    if contexts is not None:
        for _ in contexts(app.routes):
            pass
