"""A worker's statement that meets a lock another session holds waits at most
``DPSS_WORKER_DB_LOCK_TIMEOUT_SECONDS``, then fails as an outage: the transaction rolls back,
the worker retries with its backoff and logs the outage once, and the job ends once the lock
is gone. Before, on PostgreSQL the worker waited for ever (holding its connection, its lease
and the release's row) and on SQLite 60 s per attempt.

Real commits on both databases, the engine ``dpss worker`` uses
(:func:`service.db.engine.make_worker_engine`), and a lock held by another connection: on
PostgreSQL the audit chain's head, as an idle-in-transaction session would hold it; on SQLite
the file's write lock."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from service import reference_recheck
from service.db.engine import is_sqlite, make_engine, make_session_factory, make_worker_engine
from tests.test_worker_outages import (
    BACK,
    UNAVAILABLE,
    ExclusiveLock,
    Gate,
    WorkerThread,
    assert_finished_once,
    logged,
    outage_settings,
    queue_release,
    status_of,
    wait_for,
    waited_out,
)


def hold_lock(url: str) -> Callable[[], None]:
    """Take, from another connection, a lock the worker's finish needs; returns its release."""
    if is_sqlite(url):
        database = url.removeprefix("sqlite:///")
        sqlite_lock = ExclusiveLock(Path(database))
        return sqlite_lock.release
    engine = make_engine(url)
    connection = engine.connect()
    transaction = connection.begin()
    # Every audited change appends to the chain and locks its head first (service.audit).
    connection.execute(text("SELECT last_seq FROM audit_head WHERE id = 1 FOR UPDATE"))

    def release() -> None:
        transaction.rollback()
        connection.close()
        engine.dispose()

    return release


def test_the_worker_waits_out_a_lock_held_elsewhere(
    committed_db: tuple[str, sessionmaker[Session]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="dpss.worker")
    url, api_factory = committed_db
    settings = outage_settings(tmp_path, url, worker_db_lock_timeout_seconds=0.2)
    release_id, _ = queue_release(settings, api_factory)
    engine: Engine = make_worker_engine(settings)
    factory = make_session_factory(engine)
    gate = Gate(monkeypatch)
    looks = [0]
    next_due = reference_recheck.next_due

    def counted(session: Session) -> Any:
        looks[0] += 1
        return next_due(session)

    monkeypatch.setattr(reference_recheck, "next_due", counted)
    try:
        with WorkerThread(settings, factory) as running:
            assert gate.entered.wait(30)
            outage = running.worker._outage
            # The finish's failed attempts, counted here (the log's own count starts afresh
            # with each outage it logs).
            lock_waits = [0]
            log_failure = outage.failed

            def failed(operation: str, exc: BaseException) -> None:
                lock_waits[0] += operation == "finish"
                log_failure(operation, exc)

            monkeypatch.setattr(outage, "failed", failed)
            release_lock = hold_lock(url)
            try:
                gate.open.set()
                # The finish itself must give up on the lock (on SQLite the re-check thread
                # may meet it first). Before the bound it never did on PostgreSQL (it waited on
                # the head for as long as the other session kept it), and only after 60 s on
                # SQLite: past this wait's 30 s.
                wait_for(lambda: lock_waits[0] >= 1, what="the finish's lock wait")
                if not is_sqlite(url):
                    # The re-check thread meanwhile reads the database without trouble (on
                    # SQLite the whole file is locked): two of its rounds (the first's success
                    # surely counted), then one more failed finish. Its successes must not end
                    # the outage while the finish still waits, or the next failed finish logs
                    # the outage again.
                    rounds = looks[0]
                    wait_for(lambda: looks[0] >= rounds + 2, what="the re-check's rounds")
                    waits = lock_waits[0]
                    wait_for(lambda: lock_waits[0] > waits, what="a later lock wait")
                assert running.thread.is_alive()
            finally:
                release_lock()
            wait_for(lambda: status_of(api_factory, release_id) == "succeeded", what="the job")
        assert_finished_once(api_factory, release_id)
        assert logged(caplog, UNAVAILABLE) == 1 and logged(caplog, BACK) == 1
        assert waited_out(caplog, "finish"), caplog.text
    finally:
        engine.dispose()


def test_the_worker_engine_reports_its_lock_bound(
    committed_db: tuple[str, sessionmaker[Session]], tmp_path: Path
) -> None:
    """What each of the worker's connections is told: 1500 ms, on either database."""
    url, _ = committed_db
    settings = outage_settings(tmp_path, url, worker_db_lock_timeout_seconds=1.5)
    engine = make_worker_engine(settings)
    try:
        with engine.connect() as connection:
            if is_sqlite(url):
                assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 1500
            else:
                assert connection.exec_driver_sql("SHOW lock_timeout").scalar() == "1500ms"
                # The API's connect timeout too: an unanswering host is an outage, not a hang.
                params = connection.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
                assert params["connect_timeout"] == str(settings.db_connect_timeout_seconds)
    finally:
        engine.dispose()
