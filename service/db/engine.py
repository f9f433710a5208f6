"""Engines and sessions for SQLite (embedded default) and PostgreSQL.

On SQLite every transaction starts with ``BEGIN IMMEDIATE``: it takes the database's write lock
at once, so two budget checks can never interleave (the PostgreSQL equivalent is the row lock on
the dataset). WAL mode lets readers proceed while a writer holds the lock.

:func:`make_pooled_engine` sizes the pool from the settings for the API (see the sizing rule in
``service.config.Settings``), and :func:`database_unavailable` tells a database that cannot serve
now (a retry may succeed: 503) from a fault of the request or of the code.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _private_sqlite_file(url: str) -> None:
    """Create the SQLite file ``0600`` (in an existing directory) before SQLite does with the
    umask's ``0644``: it holds the ledger and key hashes. SQLite gives its ``-wal`` and ``-shm``
    files the database file's mode."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if not path.parent.is_dir():
        # Not ours to create (``dpss serve``/``migrate`` make the data directory ``0700``): a
        # mistyped URL must fail to open (503, and /readyz says so), not create an empty database.
        return
    try:
        # O_EXCL: never open (and so never close) a descriptor of an existing database. Closing
        # any descriptor of a file drops every POSIX lock this process holds on it, including
        # those of SQLite connections already open here; another process could then take the
        # database for unused and delete its WAL under them ("disk I/O error").
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        # Mode only (no descriptor): databases made before this rule become private too.
        os.chmod(path, 0o600)


#: A pooled PostgreSQL connection unused for longer than this is pinged before it is handed out.
IDLE_PING_SECONDS = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection at checkout only if it sat idle for :data:`IDLE_PING_SECONDS`.

    ``pool_pre_ping`` pings on every checkout: one extra round trip per unit of work, about a
    fifth of a budget read's CPU in the API. A connection in steady use was just used
    successfully, so the ping can only help one that sat idle (a server restarted or a
    firewall dropped it meanwhile). A connection that breaks under use still fails its
    request with a disconnect error (503), which invalidates the pool's older connections
    as before. A failed ping raises ``DisconnectionError``: the pool discards the connection
    and tries a fresh one (SQLAlchemy's pessimistic disconnect handling).
    """

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["dpss_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.pop("dpss_idle_since", None)
        if idle_since is None or time.monotonic() - idle_since < IDLE_PING_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise sa_exc.DisconnectionError() from exc


#: How long a connection waits for a lock unless told otherwise (SQLite's busy timeout; no
#: bound on PostgreSQL): the command line, whose waits hold nothing a client needs. The API
#: and the workers bound theirs (:func:`make_pooled_engine`, :func:`make_worker_engine`).
DEFAULT_SQLITE_BUSY_SECONDS = 60.0


def make_engine(url: str, *, lock_timeout_seconds: float | None = None, **kwargs: Any) -> Engine:
    """An engine for ``url`` configured for this service's transaction discipline.

    ``lock_timeout_seconds`` bounds every wait of a statement for a lock another session holds:
    PostgreSQL's ``lock_timeout`` (set at connect, no extra round trip), SQLite's busy timeout.
    Either way the statement then fails with an ``OperationalError`` (``LockNotAvailable``,
    ``SQLITE_BUSY``), which :func:`database_unavailable` counts as an outage: the API answers
    503 with ``Retry-After`` instead of holding its connection, slot and thread for as long as
    the other session keeps its lock.
    """
    if not is_sqlite(url):
        if lock_timeout_seconds is not None:
            connect_args = dict(kwargs.pop("connect_args", {}))
            # libpq's "options": a GUC for the whole session, in whole milliseconds (0 would
            # mean "no bound", hence at least 1).
            milliseconds = max(1, round(lock_timeout_seconds * 1000))
            extra = connect_args.get("options", "")
            connect_args["options"] = f"{extra} -c lock_timeout={milliseconds}".strip()
            kwargs["connect_args"] = connect_args
        engine = create_engine(url, **kwargs)
        _ping_when_idle(engine)
        return engine
    _private_sqlite_file(url)
    busy_seconds = (
        DEFAULT_SQLITE_BUSY_SECONDS if lock_timeout_seconds is None else lock_timeout_seconds
    )
    busy_milliseconds = max(1, round(busy_seconds * 1000))
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": busy_seconds}, **kwargs
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Hand transaction control to SQLAlchemy's "begin" event below (pysqlite's own
        # implicit BEGIN would be DEFERRED and too late for a read-then-write check).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={busy_milliseconds}")
        if ":memory:" not in url:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def make_pooled_engine(settings: Settings) -> Engine:
    """The API's engine: ``db_pool_size`` connections kept, ``db_max_overflow`` more under load.

    ``pool_timeout`` is short because the API never asks for more connections than the pool
    holds (``service.api.deps.Database``); waiting on the pool would mean another user of the
    engine took one, and a quick 503 is then better than a request hanging for 30 s. The
    PostgreSQL connect timeout makes an unreachable host a 503 too, not a hang.
    """
    url = settings.resolved_database_url
    lock_timeout = settings.db_lock_timeout_seconds
    if is_sqlite(url) and ":memory:" in url:
        # One connection per thread (SingletonThreadPool): there is no pool to size.
        return make_engine(url, lock_timeout_seconds=lock_timeout)
    options: dict[str, Any] = {
        "pool_size": settings.db_pool_size,
        "max_overflow": settings.db_max_overflow,
        "pool_timeout": settings.db_pool_timeout_seconds,
    }
    return make_engine(
        url, lock_timeout_seconds=lock_timeout, **options, **_connect_options(settings, url)
    )


def _connect_options(settings: Settings, url: str) -> dict[str, Any]:
    """PostgreSQL's connect timeout, for the API's and the workers' engines alike: an
    unanswering host (a black-holed route, not a refused connection) is then an outage after
    ``db_connect_timeout_seconds``, not a wait for the kernel's TCP retries."""
    if is_sqlite(url):
        return {}
    return {"connect_args": {"connect_timeout": settings.db_connect_timeout_seconds}}


def make_worker_engine(settings: Settings) -> Engine:
    """A worker's engine (``dpss worker``): every lock wait bounded by
    ``worker_db_lock_timeout_seconds``.

    A worker that met a lock held elsewhere (an idle-in-transaction session holding the audit
    head, a dataset's or a release's row) waited for ever on PostgreSQL, holding its
    connection, its lease and every row its transaction had locked so far (the release's row,
    which the API's requests on that release then waited for), and a stop request could not
    end the wait. Bounded, the statement fails with ``LockNotAvailable`` (``SQLITE_BUSY``),
    an outage to :func:`service.outages.is_transient_db_error`: the transaction rolls back and
    the worker retries with its backoff, logging the outage once.

    The PostgreSQL connect timeout is the API's (:func:`_connect_options`); without it a worker
    whose database host stopped answering waited about two minutes per attempt.
    """
    url = settings.resolved_database_url
    return make_engine(
        url,
        lock_timeout_seconds=settings.worker_db_lock_timeout_seconds,
        **_connect_options(settings, url),
    )


#: SQLite result codes (and their extended codes) of a database that cannot serve now: busy or
#: locked by another connection, a file that cannot be opened or read, a full disk.
SQLITE_TRANSIENT = (
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_CANTOPEN",
    "SQLITE_IOERR",
    "SQLITE_FULL",
)


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot serve now, so that a retry may succeed.

    That is: no pooled connection in time (``TimeoutError``), a connection refused, lost or
    invalidated, a server shutting down or restarting, a lock or serialization timeout
    (``OperationalError``, ``InterfaceError``, or any DBAPI error flagged as a disconnect).
    Integrity and programming errors are faults of the request or of the code, not outages.
    """
    if isinstance(exc, sa_exc.TimeoutError):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        if isinstance(exc.orig, sqlite3.Error):
            # sqlite3 raises OperationalError for syntax errors and missing tables too (a fault
            # of the code, answered 500); only these result codes mean "not now".
            name = getattr(exc.orig, "sqlite_errorname", "")
            return name.startswith(SQLITE_TRANSIENT)
        return isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError)
    return False


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)
