"""Engines and sessions for SQLite (embedded default) and PostgreSQL.

On SQLite every transaction starts with ``BEGIN IMMEDIATE``: it takes the database's write lock
at once, so two budget checks can never interleave (the PostgreSQL equivalent is the row lock on
the dataset). WAL mode lets readers proceed while a writer holds the lock.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _private_sqlite_file(url: str) -> None:
    """Create the SQLite file ``0600`` (its directory ``0700``) before SQLite does with the
    umask's ``0644``: it holds the ledger and key hashes. SQLite gives its ``-wal`` and ``-shm``
    files the database file's mode."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url`` configured for this service's transaction discipline."""
    if not is_sqlite(url):
        return create_engine(url, pool_pre_ping=True, **kwargs)
    _private_sqlite_file(url)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60}, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Hand transaction control to SQLAlchemy's "begin" event below (pysqlite's own
        # implicit BEGIN would be DEFERRED and too late for a read-then-write check).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=60000")
        if ":memory:" not in url:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)
