"""Workers live through database outages: a real PostgreSQL server that stops and starts again
(a private cluster on its own port, never the shared server) during claim, heartbeat and
finish, and a SQLite file that another process keeps locked. Each time the job ends once, with
one charge and one audit event, the outage is logged once, and the worker keeps running."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from scripts.harness import PrivatePostgres, have_private_postgres
from service import auth
from service.app import create_app
from service.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.db.models import AuditEvent, LedgerEntry, Release
from service.migrate import upgrade_to_head
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import _empty_tables, bearer, npy_bytes

needs_cluster = pytest.mark.skipif(
    not have_private_postgres(), reason="needs PostgreSQL's initdb and pg_ctl"
)
UNAVAILABLE = "database unavailable"
BUDGET = {"epsilon_budget": "1", "delta_budget": "1e-5", "row_norm_bound": "1"}
BACK = "database available again"


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivatePostgres]:
    if not have_private_postgres():
        pytest.skip("needs PostgreSQL's initdb and pg_ctl")
    pg = PrivatePostgres()
    try:
        pg.start()
        upgrade_to_head(pg.create_database("dpss"))
        yield pg
    finally:
        pg.destroy()


@pytest.fixture
def pg_url(cluster: PrivatePostgres) -> Iterator[str]:
    if not cluster.running:
        cluster.start()
    url = cluster.url("dpss")
    engine = make_engine(url)
    _empty_tables(engine)
    engine.dispose()
    yield url
    if not cluster.running:
        cluster.start()


def outage_settings(tmp_path: Path, url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "database_url": url,
        "admin_api_key": None,
        "worker_poll_seconds": 0.05,
        "worker_heartbeat_seconds": 3600,
        "worker_lease_seconds": 120,
        "worker_db_retry_initial_seconds": 0.05,
        "worker_db_retry_max_seconds": 0.2,
        # Workers calibrate before their first claim (issue 30); these tests time outages.
        "worker_calibrate_seconds": 0,
        **overrides,
    }
    return Settings(**values)


def queue_release(
    settings: Settings,
    factory: sessionmaker[Session],
    data: np.ndarray[Any, Any] | None = None,
    *,
    k: int = 2,
    epsilon: str = "0.2",
) -> tuple[uuid.UUID, str]:
    """A dataset (``data``; by default 60 small rows of 5 columns) and one queued, charged
    ``analyze_gauss`` release of rank ``k`` on it; returns the release id and the analyst key."""
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
        _, analyst = auth.create_key(session, "analyst", "a", None)
    if data is None:
        data = np.random.default_rng(1).normal(size=(60, 5)) * 0.2
    with TestClient(create_app(settings, session_factory=factory)) as client:
        dataset = client.post(
            "/v1/datasets",
            headers=bearer(owner),
            files={"file": ("x.npy", npy_bytes(data), "application/octet-stream")},
            data={"name": "d", **BUDGET},
        )
        assert dataset.status_code == 201, dataset.text
        release = client.post(
            f"/v1/datasets/{dataset.json()['id']}/releases",
            headers=bearer(analyst),
            json={"mechanism": "analyze_gauss", "k": k, "epsilon": epsilon, "delta": "1e-6"},
        )
        assert release.status_code == 202, release.text
    return uuid.UUID(release.json()["id"]), analyst


class Gate:
    """Holds ``analyze_gauss`` inside the run until opened, so an outage lands mid-job."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from service.mechanisms import analyze_gauss

        self.entered = threading.Event()
        self.open = threading.Event()
        original = analyze_gauss.gauss_release

        def held(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            assert self.open.wait(60)
            return original(*args, **kwargs)

        monkeypatch.setattr(analyze_gauss, "gauss_release", held)


class WorkerThread:
    def __init__(self, settings: Settings, factory: sessionmaker[Session]) -> None:
        store = DatasetStore(settings.datasets_dir)
        store.ensure()
        self.worker = Worker(factory, store, settings, worker_id="outage-worker")
        self.thread = threading.Thread(target=self.worker.run_forever, daemon=True)

    def __enter__(self) -> WorkerThread:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.worker.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def wait_for(predicate: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.02)


def logged(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in record.getMessage() for record in caplog.records)


def waited_out(caplog: pytest.LogCaptureFixture, operation: str) -> bool:
    """Whether the outage's closing line counts failed attempts of ``operation``. The opening
    line names whichever of the worker's threads met the outage first (the reference re-check
    often beats the claim), so the closing line is where an operation's part is read."""
    back = [r.getMessage() for r in caplog.records if BACK in r.getMessage()]
    return len(back) == 1 and f" {operation} " in back[0].split("failed attempts:")[1] + " "


def status_of(factory: sessionmaker[Session], release_id: uuid.UUID) -> str | None:
    """The release's status, or None while the database cannot be read."""
    try:
        with factory() as session:
            return session.scalar(select(Release.status).where(Release.id == release_id))
    except Exception:
        return None


def assert_finished_once(factory: sessionmaker[Session], release_id: uuid.UUID) -> None:
    with factory() as session:
        release = session.get(Release, release_id)
        assert release is not None
        assert (release.status, release.attempts) == ("succeeded", 1)
        assert release.result_sha256 is not None
        charges = session.scalars(select(LedgerEntry.kind)).all()
        assert charges == ["charge"]
        finished = select(func.count()).where(
            AuditEvent.event_type.like("release_%"), AuditEvent.event_type != "release_requested"
        )
        assert session.scalar(finished) == 1


@needs_cluster
def test_claim_waits_out_a_stopped_database(
    cluster: PrivatePostgres, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dpss.worker")
    settings = outage_settings(tmp_path, pg_url)
    factory = make_session_factory(make_engine(pg_url))
    release_id, _ = queue_release(settings, factory)
    cluster.stop()
    with WorkerThread(settings, factory) as running:
        wait_for(lambda: logged(caplog, UNAVAILABLE) == 1, what="the outage to be noticed")
        time.sleep(1)  # several retries at 0.05..0.2 s: still one line
        assert running.thread.is_alive()
        cluster.start()
        wait_for(lambda: status_of(factory, release_id) == "succeeded", what="the job")
    assert_finished_once(factory, release_id)
    assert logged(caplog, UNAVAILABLE) == 1 and logged(caplog, BACK) == 1
    assert waited_out(caplog, "claim"), caplog.text


@needs_cluster
def test_heartbeat_waits_out_a_stopped_database_and_keeps_the_lease(
    cluster: PrivatePostgres,
    pg_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="dpss.worker")
    settings = outage_settings(tmp_path, pg_url, worker_heartbeat_seconds=0.05)
    factory = make_session_factory(make_engine(pg_url))
    release_id, _ = queue_release(settings, factory)
    gate = Gate(monkeypatch)
    with WorkerThread(settings, factory):
        assert gate.entered.wait(30)
        cluster.stop()
        wait_for(lambda: logged(caplog, UNAVAILABLE) == 1, what="outage")
        time.sleep(0.5)
        cluster.start()
        wait_for(lambda: logged(caplog, BACK) == 1, what="the heartbeat to get through")
        gate.open.set()
        wait_for(lambda: status_of(factory, release_id) == "succeeded", what="the job")
    assert_finished_once(factory, release_id)
    assert logged(caplog, UNAVAILABLE) == 1
    assert waited_out(caplog, "heartbeat"), caplog.text
    assert logged(caplog, "lease lost") == 0


@needs_cluster
def test_finish_keeps_the_outcome_until_the_database_is_back(
    cluster: PrivatePostgres,
    pg_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="dpss.worker")
    settings = outage_settings(tmp_path, pg_url)
    factory = make_session_factory(make_engine(pg_url))
    release_id, _ = queue_release(settings, factory)
    gate = Gate(monkeypatch)
    with WorkerThread(settings, factory) as running:
        assert gate.entered.wait(30)
        cluster.stop()
        gate.open.set()
        wait_for(lambda: logged(caplog, UNAVAILABLE) == 1, what="outage")
        time.sleep(1)
        assert running.thread.is_alive()
        cluster.start()
        wait_for(lambda: status_of(factory, release_id) == "succeeded", what="the job")
    assert_finished_once(factory, release_id)
    assert logged(caplog, UNAVAILABLE) == 1 and logged(caplog, BACK) == 1
    assert waited_out(caplog, "finish"), caplog.text


# -- SQLite: the file is locked by another process for longer than the busy timeout ----------


@pytest.fixture
def sqlite_db(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "dpss.sqlite3"
    url = f"sqlite:///{path}"
    upgrade_to_head(url)
    return url, path


class ImpatientSqlite:
    """The service's SQLite engine whose connections give up on a lock after 50 ms (so a lock
    held outside is an outage soon) until :meth:`be_patient`; then a connection checked out
    waits up to a hang guard. Impatient for good, the worker's own threads met each other's
    write transactions as outages: under load its claim or finish held the lock past 50 ms
    and the re-check logged a second outage after the first had ended."""

    def __init__(self, url: str) -> None:
        engine = make_engine(url)
        self.factory = make_session_factory(engine)
        self._impatient = True
        #: Connections checked out with the 50 ms timeout and not returned yet.
        self.impatient_out = 0
        self._lock = threading.Lock()

        @event.listens_for(engine, "checkout")
        def _checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
            with self._lock:
                impatient = record.info["impatient"] = self._impatient
                self.impatient_out += impatient
            dbapi_connection.execute(f"PRAGMA busy_timeout={50 if impatient else 60_000}")

        @event.listens_for(engine, "checkin")
        def _checkin(_dbapi_connection: Any, record: Any) -> None:
            with self._lock:
                self.impatient_out -= record.info.pop("impatient", False)

    def be_patient(self) -> None:
        """Connections checked out from now on wait for a lock; wait until those checked out
        before have been returned (they fail within 50 ms while the outside lock is held)."""
        with self._lock:
            self._impatient = False
        wait_for(lambda: self.impatient_out == 0, what="impatient connections returned")


class ExclusiveLock:
    """Another connection holding SQLite's write lock (``BEGIN EXCLUSIVE``)."""

    def __init__(self, path: Path) -> None:
        self.connection = sqlite3.connect(path, isolation_level=None)
        self.connection.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        self.connection.execute("ROLLBACK")
        self.connection.close()


@pytest.mark.parametrize("phase", ["claim", "finish"])
def test_a_locked_sqlite_file_is_waited_out(
    sqlite_db: tuple[str, Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    phase: str,
) -> None:
    caplog.set_level(logging.INFO, logger="dpss.worker")
    url, path = sqlite_db
    settings = outage_settings(tmp_path, url)
    release_id, _ = queue_release(settings, make_session_factory(make_engine(url)))
    impatient = ImpatientSqlite(url)
    factory = impatient.factory
    gate = Gate(monkeypatch)
    lock = ExclusiveLock(path) if phase == "claim" else None
    with WorkerThread(settings, factory) as running:
        if lock is None:
            assert gate.entered.wait(30)
            lock = ExclusiveLock(path)
        gate.open.set()
        wait_for(lambda: logged(caplog, UNAVAILABLE) == 1, what="lock")
        # Not a fixed sleep: the opening line may be the re-check thread's (it often meets the
        # lock first), and under load the job loop could make its first attempt only after the
        # lock was gone, a claim (or finish) never failed, and the closing line would not name
        # it. Held until the phase's own operation has failed and retried.
        outage = running.worker._outage  # the worker's log of outages (the closing line's counts)
        wait_for(lambda: outage.failures[phase] >= 2, what=f"{phase} retried under the lock")
        assert running.thread.is_alive()
        impatient.be_patient()  # the outage is the outside lock's only
        lock.release()
        wait_for(lambda: status_of(factory, release_id) == "succeeded", what="the job")
    assert_finished_once(factory, release_id)
    assert logged(caplog, UNAVAILABLE) == 1 and logged(caplog, BACK) == 1
    assert waited_out(caplog, phase), caplog.text


# -- the `dpss worker` process itself ------------------------------------------------------


@needs_cluster
@pytest.mark.slow
def test_the_worker_process_survives_a_database_restart_mid_job(
    cluster: PrivatePostgres, pg_url: str, tmp_path: Path
) -> None:
    """A `dpss worker` process whose database stops while it computes (and stays down past the
    job's end) finishes the job once when the database returns, and keeps serving."""
    settings = outage_settings(tmp_path, pg_url, max_upload_mb=100)
    factory = make_session_factory(make_engine(pg_url))
    wide = np.random.default_rng(3).normal(size=(1500, 1800)) / 60
    slow_id, _ = queue_release(settings, factory, wide, k=1800, epsilon="0.5")
    env = {
        **os.environ,
        "DPSS_DATABASE_URL": pg_url,
        "DPSS_DATA_DIR": str(settings.data_dir),
        "DPSS_WORKER_HEARTBEAT_SECONDS": "0.2",
        "DPSS_WORKER_POLL_SECONDS": "0.05",
        "DPSS_WORKER_DB_RETRY_MAX_SECONDS": "0.5",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "service", "worker"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: status_of(factory, slow_id) == "running", timeout=60, what="claim")
        cluster.stop()
        time.sleep(8)  # longer than the job: finish meets the outage too
        assert process.poll() is None, "the worker exited during the outage"
        cluster.start()
        wait_for(lambda: status_of(factory, slow_id) == "succeeded", timeout=60, what="finish")
        next_id, _ = queue_release(settings, factory)
        wait_for(lambda: status_of(factory, next_id) == "succeeded", timeout=30, what="next job")
        assert process.poll() is None
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0
    assert stderr.count(UNAVAILABLE) >= 1
    with factory() as session:
        release = session.get(Release, slow_id)
        assert release is not None and release.attempts == 1
        kinds = session.scalars(
            select(LedgerEntry.kind).where(LedgerEntry.release_id == slow_id)
        ).all()
        assert kinds == ["charge"]


# -- a late outcome whose store waits out an outage ------------------------------------------

LATE = "ended after its visible_at"


def failing_commits(engine: Any, failures: int) -> Callable[[], None]:
    """Make the next ``failures`` COMMITs on ``engine`` fail as a database that went away (or
    whose disk is full) at the commit fails: the driver's own transient error, raised at the
    commit after the transaction's statements ran (each is rolled back). Returns the remover."""
    left = [failures]

    def fail(_connection: Any) -> None:
        if left[0] <= 0:
            return
        left[0] -= 1
        if engine.dialect.name == "sqlite":
            orig: Exception = sqlite3.OperationalError("database or disk is full")
            orig.sqlite_errorname = "SQLITE_FULL"  # type: ignore[attr-defined]
        else:
            import psycopg

            orig = psycopg.OperationalError("server closed the connection unexpectedly")
        raise OperationalError("COMMIT", None, orig)

    event.listen(engine, "commit", fail)
    return lambda: event.remove(engine, "commit", fail)


def test_a_late_outcome_stored_through_an_outage_is_logged_late_once(
    committed_db: tuple[str, sessionmaker[Session]],
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no padding every outcome ends after its ``visible_at``; the store's commit then
    fails eight times (an outage, a full disk). Each attempt recorded the end again, and the
    "late" warning came with every retry (about 20 lines for a 4 s outage): the outage was
    logged once, its consequence once per retry. Now once per release."""
    caplog.set_level(logging.INFO, logger="dpss.worker")
    _, factory = committed_db
    settings = settings.model_copy(
        update={"worker_db_retry_initial_seconds": 0.01, "worker_db_retry_max_seconds": 0.02}
    )
    release_id, _ = queue_release(settings, factory)
    gate = Gate(monkeypatch)
    store = DatasetStore(settings.datasets_dir)
    worker = Worker(factory, store, settings, worker_id="late-worker")
    ran = threading.Thread(target=worker.run_pending, daemon=True)
    ran.start()
    assert gate.entered.wait(30)
    remove = failing_commits(factory.kw["bind"], 8)
    try:
        gate.open.set()
        ran.join(timeout=60)
        assert not ran.is_alive()
    finally:
        remove()
        worker.close()
    assert_finished_once(factory, release_id)
    assert logged(caplog, UNAVAILABLE) == 1
    assert logged(caplog, "database available again") == 1
    assert "(8 failed attempts: finish 8)" in caplog.text
    assert logged(caplog, LATE) == 1
