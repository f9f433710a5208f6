"""Faults the fault scripts do not name, on real commits and separate connections
(``committed_db``), PostgreSQL and SQLite: an Idempotency-Key reused with different bodies
concurrently, the run process killed (SIGKILL, as the OOM killer does) again and again, and a
permanent database error at the store (a schema the code does not match) that the worker must
not mistake for an outage. Each ends with one release and one charge, nothing left leased."""

from __future__ import annotations

import logging
import os
import signal
import threading
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from service import auth
from service.app import create_app
from service.db.models import Dataset, LedgerEntry, Release
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import bearer, npy_bytes
from tests.test_concurrency import simultaneously


def test_one_key_raced_with_different_bodies_makes_one_release_and_one_charge(
    committed_db, settings
):
    """Eight requests with one Idempotency-Key at once, different bodies on two datasets: one
    body wins; every other answer is 409 ``idempotency_conflict`` (or, for the winner's own
    body, the same release), never a 500 or a 503, and one charge in all."""
    _, factory = committed_db
    app = create_app(settings, session_factory=factory)
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
        _, analyst = auth.create_key(session, "analyst", "a", None)
    data = np.random.default_rng(3).normal(size=(80, 5)) * 0.2
    with TestClient(app) as client:
        datasets = [
            client.post(
                "/v1/datasets",
                headers=bearer(owner),
                files={"file": ("x.npy", npy_bytes(data), "application/octet-stream")},
                data={
                    "name": f"d{i}",
                    "epsilon_budget": "1",
                    "delta_budget": "1e-5",
                    "row_norm_bound": "1",
                },
            ).json()["id"]
            for i in range(2)
        ]
    turn = iter(range(8))

    def send(client: TestClient) -> tuple[int, dict[str, Any]]:
        i = next(turn)
        r = client.post(
            f"/v1/datasets/{datasets[i % 2]}/releases",
            headers={**bearer(analyst), "Idempotency-Key": "raced"},
            json={"mechanism": "analyze_gauss", "k": 2 + i % 3, "epsilon": "0.1", "delta": "1e-6"},
        )
        return r.status_code, r.json()

    answers = simultaneously(app, 8, send)
    assert set(Counter(s for s, _ in answers)) <= {202, 409}, answers
    assert len({a["id"] for s, a in answers if s == 202}) == 1, answers
    assert all(a["error"] == "idempotency_conflict" for s, a in answers if s == 409)
    with factory() as session:
        assert session.scalar(select(func.count()).select_from(LedgerEntry)) == 1
        assert session.scalar(select(func.count()).select_from(Release)) == 1


def _kill_runs(monkeypatch, tmp_path, times: int) -> Path:
    """``analyze_gauss``'s run SIGKILLs its own process (as the OOM killer would) the first
    ``times`` times; the count lives in a file, since each run is a fresh process."""
    from service.mechanisms import analyze_gauss

    count = tmp_path / "kills"
    count.write_text("0")
    original = analyze_gauss.gauss_release

    def dying(*args: Any, **kwargs: Any) -> Any:
        done = int(count.read_text())
        if done < times:
            count.write_text(str(done + 1))
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    monkeypatch.setattr(analyze_gauss, "gauss_release", dying)
    return count


def _queued(committed_db, settings) -> tuple[Any, uuid.UUID]:
    _, factory = committed_db
    app = create_app(settings, session_factory=factory)
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
        _, analyst = auth.create_key(session, "analyst", "a", None)
    data = np.random.default_rng(4).normal(size=(80, 5)) * 0.2
    with TestClient(app) as client:
        dataset = client.post(
            "/v1/datasets",
            headers=bearer(owner),
            files={"file": ("x.npy", npy_bytes(data), "application/octet-stream")},
            data={
                "name": "d",
                "epsilon_budget": "1",
                "delta_budget": "1e-5",
                "row_norm_bound": "1",
            },
        ).json()["id"]
        r = client.post(
            f"/v1/datasets/{dataset}/releases",
            headers=bearer(analyst),
            json={"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-6"},
        )
        assert r.status_code == 202, r.text
    return factory, uuid.UUID(r.json()["id"])


@pytest.mark.parametrize(("kills", "status", "attempts"), [(2, "succeeded", 3), (3, "failed", 3)])
def test_the_run_process_killed_again_and_again(
    committed_db, settings, monkeypatch, tmp_path, kills, status, attempts
):
    count = _kill_runs(monkeypatch, tmp_path, kills)
    factory, release_id = _queued(committed_db, settings)
    store = DatasetStore(settings.datasets_dir)
    worker = Worker(factory, store, settings, worker_id="killed", isolate=True)
    try:
        worker.run_pending()
        worker.run_pending()
    finally:
        worker.close()
    assert int(count.read_text()) == kills
    with factory() as session:
        release = session.get(Release, release_id)
        assert release is not None
        assert (release.status, release.attempts, release.refunded) == (status, attempts, False)
        assert session.scalars(select(LedgerEntry.kind)).all() == ["charge"]
        assert release.lease_expires_at is None


def test_a_schema_fault_at_the_store_is_not_waited_out_as_an_outage(committed_db, settings, caplog):
    """The table the store writes is missing (code upgraded, ``dpss migrate`` not run): on
    SQLite that is an ``OperationalError`` ("no such table"), as a locked file is, but no wait
    cures it. Before, the worker retried it as an outage forever ("database unavailable"): the
    job stayed ``running`` and the worker served nothing else. Now it is a fault like
    PostgreSQL's ``UndefinedTable``: logged as a bug, the attempt unstored, and the job is
    abandoned after its attempts (charged: it read the data), as on PostgreSQL."""
    caplog.set_level(logging.WARNING, logger="dpss.worker")
    factory, release_id = _queued(committed_db, settings)
    engine = factory.kw["bind"]
    with engine.begin() as connection:
        connection.execute(text("ALTER TABLE release_bases RENAME TO release_bases_away"))
    worker = Worker(factory, DatasetStore(settings.datasets_dir), settings, worker_id="schema")
    ran = threading.Thread(target=worker.run_pending, daemon=True)
    try:
        ran.start()
        ran.join(timeout=60)
        stuck = ran.is_alive()
        worker.stop.set()
        ran.join(timeout=30)
    finally:
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE release_bases_away RENAME TO release_bases"))
        worker.close()
    assert not stuck, "the worker waited out a schema fault as if the database were away"
    assert "database unavailable" not in caplog.text
    assert f"BUG: release {release_id}: finish" in caplog.text
    with factory() as session:
        release = session.get(Release, release_id)
        assert release is not None
        assert (release.status, release.attempts, release.refunded) == ("failed", 3, False)
        assert release.lease_expires_at is None
        assert session.scalars(select(LedgerEntry.kind)).all() == ["charge"]


class _FailAtCommit:
    """The upload's registering transaction fails at its commit, ``after`` it succeeded (as
    when the connection drops during COMMIT's acknowledgement) or before (the commit refused):
    the driver's transient error either way, so the client is answered 503."""

    def __init__(self, factory: Any, after: bool) -> None:
        self.factory, self.hook = factory, "after_commit" if after else "before_commit"
        event.listen(factory, "after_flush", self._note)
        event.listen(factory, self.hook, self._fail)

    @staticmethod
    def _note(session: Session, _context: Any) -> None:
        if any(isinstance(row, Dataset) for row in session.new):
            session.info["dpss_test_dataset"] = True

    @staticmethod
    def _fail(session: Session) -> None:
        # A savepoint's release (the upload's idempotency guard) is reported as a commit too:
        # the probe is of the transaction's own COMMIT.
        if session.in_nested_transaction():
            return
        if session.info.pop("dpss_test_dataset", False):
            import psycopg

            raise OperationalError(
                "COMMIT", None, psycopg.OperationalError("server closed the connection")
            )

    def remove(self) -> None:
        event.remove(self.factory, "after_flush", self._note)
        event.remove(self.factory, self.hook, self._fail)


@pytest.mark.parametrize("after", [True, False], ids=["after-commit", "before-commit"])
def test_an_upload_failing_at_its_commit_keeps_its_file_exactly_when_it_committed(
    committed_db, settings, after
):
    """Before, any failure of the registering unit of work removed the stored file, also one
    raised after the commit succeeded: the owner was answered 503, yet the dataset was in their
    list, without its rows (every release on it failed, refunded). Now the file is removed
    only when no dataset names it; a refused commit still leaves no file."""
    _, factory = committed_db
    app = create_app(settings, session_factory=factory)
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
    store = DatasetStore(settings.datasets_dir)
    data = np.random.default_rng(5).normal(size=(40, 4)) * 0.2
    failing = _FailAtCommit(factory, after)
    try:
        with TestClient(app) as client:
            r = client.post(
                "/v1/datasets",
                headers=bearer(owner),
                files={"file": ("x.npy", npy_bytes(data), "application/octet-stream")},
                data={"name": "d", "epsilon_budget": "1", "delta_budget": "1e-5"},
            )
    finally:
        failing.remove()
    assert r.status_code == 503, r.text
    with factory() as session:
        rows = session.execute(select(Dataset.file_name, Dataset.n_rows, Dataset.n_cols)).all()
    if after:
        assert len(rows) == 1, "the commit succeeded: the dataset exists"
        ((file_name, n_rows, n_cols),) = rows
        assert store.fault(file_name, n_rows, n_cols) is None, "a dataset without its file"
        assert store.stored_files() == [file_name]
    else:
        assert rows == []
        assert store.stored_files() == []


@pytest.mark.parametrize("skewed", ["taker ahead", "holder behind"])
def test_a_worker_with_a_skewed_clock_does_not_take_over_a_live_lease(
    committed_db, settings, monkeypatch, skewed
):
    """Leases are set and checked on the database's clock. Before, each worker used its own:
    one whose clock ran an hour ahead found a lease of a minute, taken a moment ago, expired
    and took the running job over (a second run, the first worker's outcome discarded); one
    whose clock ran an hour behind renewed its lease into the past, and any other worker took
    the job from it."""
    import service.worker

    settings = settings.model_copy(update={"worker_lease_seconds": 60})
    factory, release_id = _queued(committed_db, settings)
    store = DatasetStore(settings.datasets_dir)
    holder = Worker(factory, store, settings, worker_id="holder")
    taker = Worker(factory, store, settings, worker_id="taker")
    real = service.worker.utcnow
    hour = timedelta(hours=1)
    try:
        job = holder.claim()
        assert job is not None and job.release_id == release_id
        if skewed == "holder behind":
            monkeypatch.setattr(service.worker, "utcnow", lambda: real() - hour)
            assert holder.heartbeat(job)
            monkeypatch.setattr(service.worker, "utcnow", real)
        else:
            monkeypatch.setattr(service.worker, "utcnow", lambda: real() + hour)
        assert taker.claim() is None, "a live lease was taken over"
        monkeypatch.setattr(service.worker, "utcnow", real)
        assert holder.heartbeat(job), "the holder lost its lease"
    finally:
        holder.close()
        taker.close()
    with factory() as session:
        release = session.get(Release, release_id)
        assert release is not None
        assert (release.lease_owner, release.attempts) == ("holder", 1)
        assert release.lease_expires_at is not None
        left = release.lease_expires_at - real()
        assert timedelta(seconds=50) < left <= timedelta(seconds=61), left
