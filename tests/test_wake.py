"""Workers are woken when a release is queued (service/wake.py): NOTIFY on PostgreSQL, a wake
file in embedded (SQLite) mode. The poll interval is set to a minute here, so a job that ends in
seconds was started by a wake-up, not by a poll. Wake-ups are hints: a rolled-back request wakes
nobody, and the PostgreSQL listener comes back after an outage."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from scripts.harness import PrivatePostgres
from service import auth, wake
from service.app import create_app
from service.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import bearer, npy_bytes
from tests.test_worker_outages import (  # noqa: F401 (fixtures)
    cluster,
    needs_cluster,
    pg_url,
    status_of,
    wait_for,
)

#: Far longer than any wait below: only a wake-up can start a job this early.
SLOW_POLL = 300.0
#: How long a wait for something that must happen may take before the test fails: a guard
#: against a hang, far beyond any delay a loaded machine adds, never a speed requirement.
HANG_GUARD = 60.0


def wake_settings(tmp_path: Path, url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "database_url": url,
        "admin_api_key": None,
        "worker_poll_seconds": SLOW_POLL,
        "worker_heartbeat_seconds": 3600,
        "worker_db_retry_initial_seconds": 0.05,
        "worker_db_retry_max_seconds": 0.2,
        "release_padding_floor_seconds": 0,
        "release_padding_multiplier": 0,
        "rate_limit_per_second": 0,
        # Workers calibrate before their first claim (issue 30); these tests time wake-ups.
        "worker_calibrate_seconds": 0,
        **overrides,
    }
    return Settings(**values)


class Service:
    """An API (TestClient) and a worker thread on one database, with an owner and an analyst."""

    def __init__(self, settings: Settings, factory: sessionmaker[Session]) -> None:
        self.settings, self.factory = settings, factory
        with factory.begin() as session:
            _, self.owner = auth.create_key(session, "owner", "o", None)
            _, self.analyst = auth.create_key(session, "analyst", "a", None)
        store = DatasetStore(settings.datasets_dir)
        store.ensure()
        self.worker = Worker(factory, store, settings, worker_id="wake-worker")
        self.thread = threading.Thread(target=self.worker.run_forever, daemon=True)
        self.client = TestClient(create_app(settings, session_factory=factory))

    def __enter__(self) -> Service:
        self.client.__enter__()
        data = np.random.default_rng(1).normal(size=(60, 5)) * 0.2
        self.dataset = self.client.post(
            "/v1/datasets",
            headers=bearer(self.owner),
            files={"file": ("x.npy", npy_bytes(data), "application/octet-stream")},
            data={"name": "d", "epsilon_budget": "5", "delta_budget": "1e-4"},
        ).json()["id"]
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.worker.stop.set()
        self.thread.join(timeout=30)
        self.client.__exit__(None, None, None)
        assert not self.thread.is_alive()

    def request(self, **body: Any) -> Any:
        payload = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-6"}
        payload.update({"params": {"clip_norm": 1.0}, **body})
        return self.client.post(
            f"/v1/datasets/{self.dataset}/releases", headers=bearer(self.analyst), json=payload
        )

    def release_finishes_without_a_poll(self) -> None:
        """Queue a release and see it succeed well before the workers' poll (SLOW_POLL): only a
        wake-up can have started it. Its own duration does not matter."""
        response = self.request()
        assert response.status_code == 202, response.text
        release_id = uuid.UUID(response.json()["id"])
        wait_for(
            lambda: status_of(self.factory, release_id) == "succeeded",
            timeout=SLOW_POLL / 3,
            what="a woken worker",
        )


class ListenerWatch:
    """The worker's PostgreSQL listener (caught as :func:`service.wake.waker_for` makes it), and
    whether the worker waits on it with the wake-up of its connection spent. Every
    (re)connection wakes the worker once (notifications sent while nobody listened are lost),
    so a release queued before that wake-up is spent would be started by it, not by the
    release's own NOTIFY: a test of the NOTIFY waits for :attr:`ready` first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        #: Set when the worker waits again after a wake-up that came while listening.
        self.ready = threading.Event()
        made = wake.waker_for

        def waker_for(*args: Any) -> wake.Waker:
            waker = made(*args)
            assert isinstance(waker, wake.PostgresListener)
            wait, spent = waker.wait, threading.Event()

            def watched(timeout: float) -> None:
                if spent.is_set():
                    self.ready.set()
                wait(timeout)
                # ``woken`` is set after ``listening`` on a connection, and the poll is far
                # longer than the test: a return while listening is a wake-up spent.
                if waker.listening.is_set():
                    spent.set()

            waker.wait = watched  # type: ignore[method-assign]
            return waker

        monkeypatch.setattr(wake, "waker_for", waker_for)


def idle_with_no_connection(engine: Engine) -> None:
    """The idle worker holds no pooled connection while it waits to be woken."""
    wait_for(lambda: engine.pool.checkedout() == 0, timeout=10, what="connections returned")  # type: ignore[attr-defined]


# -- embedded mode -----------------------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    from service.migrate import upgrade_to_head

    url = f"sqlite:///{tmp_path / 'dpss.sqlite3'}"
    upgrade_to_head(url)
    return url


def test_the_wake_file_changes_on_commit_only(tmp_path: Path, sqlite_url: str) -> None:
    settings = wake_settings(tmp_path, sqlite_url)
    factory = make_session_factory(make_engine(sqlite_url))
    path = wake.wake_file(settings)
    stop = threading.Event()
    watch = wake.FileWatch(path, stop)
    with factory() as session:
        session.begin()
        wake.announce(session, settings)
        session.rollback()
    # What woke a wait is read from the watch (the signature it saw), not from the clock.
    seen = watch.seen
    watch.wait(0.3)
    assert watch.seen == seen and not path.exists()  # rolled back: no wake
    for _ in range(3):  # each commit is seen, however close together
        with factory.begin() as session:
            wake.announce(session, settings)
        watch.wait(HANG_GUARD)
        assert watch.seen != seen, "the commit's wake-up was missed"
        seen = watch.seen
    stop.set()
    start = time.monotonic()
    watch.wait(HANG_GUARD)
    assert watch.seen == seen and time.monotonic() - start < HANG_GUARD / 2  # a stop ends it


def test_an_embedded_worker_is_woken_by_a_request(tmp_path: Path, sqlite_url: str) -> None:
    settings = wake_settings(tmp_path, sqlite_url)
    engine = make_engine(sqlite_url)
    with Service(settings, make_session_factory(engine)) as service:
        for _ in range(2):
            idle_with_no_connection(engine)
            service.release_finishes_without_a_poll()
        # A refused request (422) wakes nobody and changes nothing.
        before = wake.FileWatch(wake.wake_file(settings), threading.Event()).seen
        assert service.request(k=50).status_code == 422
        assert wake.FileWatch(wake.wake_file(settings), threading.Event()).seen == before


def test_a_wake_is_seen_whatever_the_modification_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:func:`wake.touch` writes into the file it finds (no new inode); each write is seen by a
    watcher even when the file system keeps the modification time (coarse clocks), and each
    value is new, also from a process whose counter is at the same count."""
    path = tmp_path / "wake" / "queued"
    wake.touch(path)  # made, with its directory
    watch = wake.FileWatch(path, threading.Event())
    inode = path.stat().st_ino
    for _ in range(3):
        before = path.stat()
        wake.touch(path)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # as a coarse clock shows it
        assert path.stat().st_ino == inode
        assert watch.changed(0.0), "a write with the same modification time was missed"
    seen = watch.seen
    assert not watch.changed(0.0) and watch.seen == seen
    # A forked child (seen by its pid) takes a token of its own before its first value.
    token = wake._token()
    monkeypatch.setattr(wake, "_token_pid", -1)
    assert wake._token() != token


def test_a_failing_wake_file_only_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    wake.touch(blocked / "wake" / "queued")  # parent is a file: OSError, logged, not raised
    assert "they will poll" in caplog.text


# -- PostgreSQL ------------------------------------------------------------------------------


@pytest.fixture
def pg_engine(committed_db: tuple[str, sessionmaker[Session]], backend: str) -> Iterator[Engine]:
    if backend != "postgresql":
        pytest.skip("PostgreSQL only")
    engine = make_engine(committed_db[0])
    yield engine
    engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_notify_is_delivered_on_commit_only(pg_engine: Engine, tmp_path: Path) -> None:
    settings = wake_settings(tmp_path, str(pg_engine.url))
    stop = threading.Event()
    listener = wake.PostgresListener(wake.libpq_conninfo(pg_engine), stop, 0.05, 0.2)
    try:
        assert listener.listening.wait(10)
        listener.wait(5)  # the wake-up every (re)connection gives
        factory = make_session_factory(pg_engine)
        with factory() as session:
            session.begin()
            wake.announce(session, settings)
            session.rollback()
        # The listener's event says whether a notification came, whatever the machine's speed.
        assert not listener.woken.wait(0.5)  # rolled back: nothing delivered
        with factory.begin() as session:
            wake.announce(session, settings)
        assert listener.woken.wait(HANG_GUARD), "the commit's notification was missed"
    finally:
        stop.set()
        listener.close()
    assert not listener.listening.is_set()


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_postgres_worker_is_woken_by_a_request(
    pg_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = wake_settings(tmp_path, str(pg_engine.url))
    listener = ListenerWatch(monkeypatch)
    with Service(settings, make_session_factory(pg_engine)) as service:
        # The listener connected and its first wake-up spent: only a NOTIFY wakes it now.
        assert listener.ready.wait(HANG_GUARD), "the worker's listener never connected"
        for _ in range(2):
            idle_with_no_connection(pg_engine)
            service.release_finishes_without_a_poll()


@needs_cluster
def test_the_listener_reconnects_after_an_outage(
    cluster: PrivatePostgres,  # noqa: F811
    pg_url: str,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = wake_settings(tmp_path, pg_url)
    engine = make_engine(pg_url)
    listener = ListenerWatch(monkeypatch)
    with Service(settings, make_session_factory(engine)) as service:
        assert listener.ready.wait(HANG_GUARD), "the worker's listener never connected"
        service.release_finishes_without_a_poll()
        cluster.stop()
        wait_for(lambda: "not listening for queued releases" in caplog.text, what="the outage")
        time.sleep(0.5)
        assert service.thread.is_alive()
        cluster.start()
        wait_for(lambda: "listening for queued releases again" in caplog.text, what="reconnect")
        idle_with_no_connection(engine)
        service.release_finishes_without_a_poll()
    engine.dispose()


def test_an_append_wakes_a_worker_for_the_next_epoch(tmp_path: Path, sqlite_url: str) -> None:
    """A continual release waiting for its next batch is woken by the append, not a poll."""
    settings = wake_settings(tmp_path, sqlite_url)
    with Service(settings, make_session_factory(make_engine(sqlite_url))) as service:
        response = service.request(
            mechanism="continual_gauss", params={"clip_norm": 1.0, "horizon": 3}
        )
        assert response.status_code == 202, response.text
        url = f"/v1/releases/{response.json()['id']}"

        def epochs_done() -> int:
            return int(
                service.client.get(url, headers=bearer(service.analyst)).json()["epochs_done"]
            )

        wait_for(lambda: epochs_done() == 1, timeout=SLOW_POLL / 3, what="the first epoch")
        batch = np.random.default_rng(2).normal(size=(40, 5)) * 0.2
        appended = service.client.post(
            f"/v1/datasets/{service.dataset}/rows",
            headers=bearer(service.owner),
            files={"file": ("b.npy", npy_bytes(batch), "application/octet-stream")},
        )
        assert appended.status_code in (200, 201), appended.text
        wait_for(lambda: epochs_done() == 2, timeout=SLOW_POLL / 3, what="a woken worker")


def test_a_finished_release_is_announced_on_commit_only(tmp_path: Path, sqlite_url: str) -> None:
    """The hints long polls wait on (service/waiters.py): the finished file and this process's
    listeners hear of a stored outcome when its transaction commits, never on a rollback."""
    settings = wake_settings(tmp_path, sqlite_url)
    factory = make_session_factory(make_engine(sqlite_url))
    heard: list[uuid.UUID] = []
    wake.add_local_listener(heard.extend)
    try:
        watch = wake.FileWatch(wake.finished_file(settings), threading.Event())
        release_id = uuid.uuid4()
        with factory() as session:
            session.begin()
            wake.announce_finished(session, settings, release_id)
            session.rollback()
        assert heard == [] and watch._signature() == watch.seen
        with factory.begin() as session:
            wake.announce_finished(session, settings, release_id)
        assert heard == [release_id]
        assert watch._signature() != watch.seen
    finally:
        wake.remove_local_listener(heard.extend)


def test_an_outcome_stored_while_nobody_waits_wakes_no_later_long_poll(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's finished file (service/waiters.py): an outcome stored while no request waited
    was for an earlier request, so it does not wake the next long poll for a read that finds
    nothing new (it did: one wasted read per release in bench/bench_release_cpu.py); an
    outcome stored once that long poll is registered still wakes it at once."""
    import asyncio

    from service import waiters

    monkeypatch.setattr(waiters, "RECHECK_SECONDS", 0.05)  # the watch idles within 0.05 s
    settings = wake_settings(tmp_path, sqlite_url)
    engine = make_engine(sqlite_url)
    hub = waiters.ReleaseWaiters(engine, settings)
    finished = wake.finished_file(settings)

    async def scenario() -> tuple[bool, float]:
        with hub.waiting(None):
            await asyncio.sleep(0.1)  # the watch thread started and looked at the file
        await asyncio.sleep(0.3)  # nobody waits: the watch thread idles
        wake.touch(finished)  # an outcome stored while nobody waits
        with hub.waiting(None) as waiter:
            assert waiter is not None
            started = time.monotonic()
            await waiter.wait(0.5)
            spurious = time.monotonic() - started < 0.45
            asyncio.get_running_loop().call_later(0.05, wake.touch, finished)
            started = time.monotonic()
            await waiter.wait(5)
            return spurious, time.monotonic() - started

    try:
        spurious, woken_after = asyncio.run(scenario())
    finally:
        hub.close()
        engine.dispose()
    assert not spurious
    assert woken_after < 2.0  # the later store woke it (at 0.05 s plus a 20 ms look)
