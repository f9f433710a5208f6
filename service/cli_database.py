"""How ``dpss`` commands that open the database say they cannot: one line on stderr naming the
URL tried (never its password) and the driver's reason, exit status 2; never a traceback.

``dpss serve`` migrates and ``dpss api`` bootstraps ``DPSS_ADMIN_API_KEY`` before serving: with
the database down either printed an uncaught ``OperationalError`` (a traceback, or the JSON log
line of one). Both now exit 2 with that line; a supervisor (compose, systemd) restarts them.
``dpss api`` without an admin key to bootstrap starts and answers 503 until the database is
back, and ``dpss worker`` retries with backoff and never exits on a database error
(``service.worker``), as DESIGN.md says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from service.config import Settings

#: The one-line hint every command that opens the local database prints when it cannot.
DATABASE_HINT = (
    "set DPSS_DATABASE_URL to the service's database (sqlite:////path/dpss.db or "
    "postgresql+psycopg://user@host/db) or DPSS_DATA_DIR to its data directory"
)


def cannot_check(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def shown_url(url: str) -> str:
    """The URL as it may be printed: never its password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "DPSS_DATABASE_URL (not a valid SQLAlchemy URL)"


def database_failure(url: str, reason: str) -> NoReturn:
    cannot_check(f"cannot open the database at {shown_url(url)}: {reason}; {DATABASE_HINT}")


def driver_reason(exc: BaseException) -> str:
    """The driver's own first line (connection refused, no such table, ...): never SQL text."""
    orig = getattr(exc, "orig", None)
    return str(orig).strip().splitlines()[0][:200] if orig else type(exc).__name__


def _fail_on(url: str, exc: BaseException) -> NoReturn:
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    if isinstance(exc, ImportError):
        database_failure(url, f"its driver is not installed ({exc.name or type(exc).__name__})")
    if isinstance(exc, ArgumentError):
        database_failure(url, type(exc).__name__)
    if isinstance(exc, OSError):
        database_failure(url, exc.strerror or type(exc).__name__)
    if isinstance(exc, SQLAlchemyError):
        database_failure(url, driver_reason(exc))
    raise exc


def engine_or_exit(url: str) -> Engine:
    """An engine for ``url`` (no connection yet), or one line saying why there cannot be one
    (exit 2): a URL that is not one, or a driver that is not installed. Retrying cannot fix
    those, so the worker, which retries a database that is down, exits on them (it printed an
    uncaught ``ArgumentError`` or ``ModuleNotFoundError``, and so did ``dpss api``)."""
    from service.db.engine import make_engine

    try:
        return make_engine(url)
    except Exception as exc:
        _fail_on(url, exc)


def worker_engine_or_exit(settings: Settings) -> Engine:
    """:func:`engine_or_exit` for ``dpss worker``: the worker's engine, whose lock waits are
    bounded (:func:`service.db.engine.make_worker_engine`)."""
    from service.db.engine import make_worker_engine

    try:
        return make_worker_engine(settings)
    except Exception as exc:
        _fail_on(settings.resolved_database_url, exc)


def migrate_or_exit(url: str) -> None:
    """Bring the database to the newest schema, or say in one line why it cannot (exit 2)."""
    from service.migrate import upgrade_to_head

    try:
        upgrade_to_head(url)
    except Exception as exc:
        _fail_on(url, exc)


def bootstrap_admin_or_exit(settings: Settings) -> None:
    """Create the ``DPSS_ADMIN_API_KEY`` admin key if missing, or say in one line why the
    database cannot be written (exit 2)."""
    from service import audit, auth
    from service.db.engine import make_session_factory

    assert settings.admin_api_key is not None
    url = settings.resolved_database_url
    engine = engine_or_exit(url)
    try:
        factory = make_session_factory(engine)
        audit.use_hmac_key(factory, settings.audit_hmac_key)
        with factory.begin() as session:
            auth.ensure_admin_key(session, settings.admin_api_key.get_secret_value())
    except Exception as exc:
        _fail_on(url, exc)
    finally:
        engine.dispose()
