"""Release jobs: claiming, leases, a killed worker's job completing once, refunds, which
faults are ``failed`` and which a charged ``no_result``, commits whose answer was lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import timedelta
from pathlib import Path

import numpy as np
import psutil
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from sqlalchemy.exc import OperationalError

from service import auth
from service.app import create_app
from service.config import Settings
from service.db.models import AuditEvent, LedgerEntry, Release, utcnow
from service.jobs import NO_MECHANISM_REASON, NO_RELEASE_REASON, REFUSED_AT_RUN_REASON
from service.mechanisms.base import InvalidParameter
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import bearer, install_log_config, npy_bytes
from tests.test_worker_outages import queue_release as queue_one_release


def queue_release(client, keys, upload_dataset, rng, **body):
    data = rng.normal(size=(60, 5)) * 0.2
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)
    payload = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.2", "delta": "1e-6", **body}
    response = client.post(
        f"/v1/datasets/{dataset['id']}/releases", headers=bearer(keys.analyst), json=payload
    )
    assert response.status_code == 202
    return dataset, response.json()


def count(session_factory, model, *where):
    with session_factory() as session:
        return session.scalar(select(func.count()).select_from(model).where(*where))


def test_expired_lease_is_reclaimed_and_the_result_stored_once(
    client, keys, upload_dataset, rng, session_factory, store, settings
):
    _, release = queue_release(client, keys, upload_dataset, rng)
    first = Worker(session_factory, store, settings, worker_id="first")
    second = Worker(session_factory, store, settings, worker_id="second")
    job = first.claim()
    assert job is not None and second.claim() is None  # leased: not claimable
    # The first worker "dies": it stops heartbeating and its lease runs out.
    with session_factory.begin() as session:
        session.execute(update(Release).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    retry = second.claim()
    assert retry is not None and retry.release_id == job.release_id and retry.attempt == 2
    assert second.process(retry) == "succeeded"
    # The first worker wakes up with an output: it no longer holds the lease, so it is dropped.
    outcome = first.execute(job)
    assert first.finish(job, outcome) == "lost"
    # Attempts are shown to no analyst or owner (a retry can follow a data-dependent crash).
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.owner)).json()
    assert body["status"] == "succeeded" and body["attempts"] is None
    with session_factory() as session:
        assert session.get(Release, uuid.UUID(release["id"])).attempts == 2
    assert count(session_factory, LedgerEntry) == 1
    assert count(session_factory, AuditEvent, AuditEvent.event_type == "release_succeeded") == 1


def test_a_job_that_keeps_killing_workers_fails_without_refund(
    client, keys, upload_dataset, rng, session_factory, store, settings
):
    _, release = queue_release(client, keys, upload_dataset, rng)
    for attempt in range(settings.worker_max_attempts):
        assert Worker(session_factory, store, settings, worker_id=f"w{attempt}").claim() is not None
        with session_factory.begin() as session:
            session.execute(
                update(Release).values(lease_expires_at=utcnow() - timedelta(seconds=1))
            )
    assert Worker(session_factory, store, settings).claim() is None
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.analyst)).json()
    assert body["status"] == "failed" and "repeatedly" in body["reason"]
    assert body["refunded"] is False


def test_a_release_of_a_deleted_dataset_fails_and_stays_charged(
    client, keys, upload_dataset, rng, run_worker
):
    """Never read, but not refunded: whether it ran before the deletion would tell when a worker
    claimed it (tests/api/test_deletion_race.py); nothing more can be charged to the dataset."""
    dataset, release = queue_release(client, keys, upload_dataset, rng)
    assert (
        client.delete(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner)).status_code
        == 204
    )
    run_worker()
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.analyst)).json()
    assert body["status"] == "failed" and body["refunded"] is False
    assert "deleted" in body["reason"]


def test_a_retry_after_an_attempt_that_may_have_read_is_not_refunded(
    client, keys, upload_dataset, rng, session_factory, store, settings
):
    """A refund needs proof that the job never read the data. A first attempt that claimed the
    job and died (its lease ran out) may have read rows; if the dataset is deleted before the
    retry, the retry's failure is decided before any row of *its* own is read, yet the job as a
    whole may have read them: charged, not refunded (before: refunded)."""
    dataset, release = queue_release(client, keys, upload_dataset, rng)
    assert Worker(session_factory, store, settings, worker_id="first").claim() is not None
    with session_factory.begin() as session:
        session.execute(update(Release).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    deleted = client.delete(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner))
    assert deleted.status_code == 204
    retry = Worker(session_factory, store, settings, worker_id="second")
    job = retry.claim()
    assert job is not None and job.attempt == 2
    assert retry.process(job) == "failed"
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.owner)).json()
    assert body["status"] == "failed" and "deleted" in body["reason"]
    assert body["refunded"] is False
    assert count(session_factory, LedgerEntry, LedgerEntry.kind == "refund") == 0


def test_a_mechanism_crash_is_a_charged_no_result_and_leaks_nothing(
    client, keys, upload_dataset, rng, run_worker, monkeypatch, caplog
):
    """A data-dependent exception must not reach the status field: ``failed`` would tell a
    row apart. It is logged as a bug (type and place only) and stored as the fixed no_result."""
    from service.mechanisms import analyze_gauss

    def crash(*_args, **_kwargs):
        raise ValueError("bad row [0.123456, 0.654321]")

    monkeypatch.setattr(analyze_gauss, "gauss_release", crash)
    dataset, release = queue_release(client, keys, upload_dataset, rng)
    run_worker()
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.analyst)).json()
    assert body["status"] == "no_result" and body["refunded"] is False
    assert body["reason"] == NO_RELEASE_REASON
    assert "0.123456" not in caplog.text
    assert "BUG" in caplog.text and "ValueError at " in caplog.text
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.analyst)).json()
    assert budget["epsilon_spent"] == "0.2"


@pytest.mark.parametrize("error", [MemoryError(), FloatingPointError("x"), np.linalg.LinAlgError()])
def test_every_unexpected_exception_from_run_is_the_same_no_result(
    client, keys, upload_dataset, rng, run_worker, monkeypatch, error
):
    from service.mechanisms import analyze_gauss

    def crash(*_args, **_kwargs):
        raise error

    monkeypatch.setattr(analyze_gauss, "gauss_release", crash)
    _, release = queue_release(client, keys, upload_dataset, rng)
    run_worker()
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.analyst)).json()
    assert (body["status"], body["reason"]) == ("no_result", NO_RELEASE_REASON)


def test_a_refusal_missed_at_prepare_is_failed_and_charged(
    client, keys, upload_dataset, rng, run_worker, monkeypatch
):
    from service.mechanisms import analyze_gauss

    def refuse(*_args, **_kwargs):
        raise InvalidParameter("k", "too large for this dataset")

    monkeypatch.setattr(analyze_gauss, "gauss_release", refuse)
    _, release = queue_release(client, keys, upload_dataset, rng)
    run_worker()
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.analyst)).json()
    assert (body["status"], body["reason"]) == ("failed", REFUSED_AT_RUN_REASON)
    assert body["refunded"] is False


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"params": {"no_such_param": 1}}, REFUSED_AT_RUN_REASON),
        ({"mechanism": "retired_mechanism"}, NO_MECHANISM_REASON),
    ],
)
def test_data_independent_faults_before_the_run_are_failed_and_refunded(
    client, keys, upload_dataset, rng, run_worker, session_factory, change, reason
):
    """Decided before any row is read, on public facts: the data was never read, so the
    charge is given back (DESIGN's refund rule; the budget is as before the request)."""
    dataset, release = queue_release(client, keys, upload_dataset, rng)
    with session_factory.begin() as session:
        session.execute(update(Release).values(**change))
    run_worker()
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.owner)).json()
    assert (body["status"], body["reason"], body["refunded"]) == ("failed", reason, True)
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner))
    assert budget.json()["epsilon_spent"] == "0"


def test_a_dataset_file_gone_between_claim_and_open_is_refunded(
    client, keys, upload_dataset, rng, worker, store
):
    _, release = queue_release(client, keys, upload_dataset, rng)
    job = worker.claim()
    assert job is not None and job.file_name is not None
    store.purge(job.file_name)
    outcome = worker.execute(job)
    assert (outcome.status, outcome.refund) == ("failed", True)
    assert worker.finish(job, outcome) == "failed"
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.analyst)).json()
    assert body["refunded"] is True


class LostAnswer:
    """Makes the first ``Worker._store`` commit and then fail as if the connection dropped
    before the commit's answer arrived."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = Worker._store

        def store_then_fail(worker, job, *result):
            self.calls += 1
            status = original(worker, job, *result)
            if self.calls == 1:
                raise OperationalError("COMMIT", {}, ConnectionError("connection closed"))
            return status

        monkeypatch.setattr(Worker, "_store", store_then_fail)


@pytest.mark.parametrize("deleted", [False, True], ids=["succeeded", "deleted"])
def test_a_finish_whose_commit_answer_was_lost_is_stored_once(
    client, keys, upload_dataset, rng, session_factory, store, settings, monkeypatch, deleted
):
    settings.worker_db_retry_initial_seconds = 0.01
    dataset, release = queue_release(client, keys, upload_dataset, rng)
    if deleted:
        assert (
            client.delete(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner)).status_code
            == 204
        )
    lost = LostAnswer(monkeypatch)
    worker = Worker(session_factory, store, settings, worker_id="w")
    assert worker.run_pending() == 1
    assert lost.calls == 2
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.analyst)).json()
    assert body["status"] == ("failed" if deleted else "succeeded")
    # A release ending after its dataset's deletion is not refunded (test_deletion_race.py).
    with session_factory() as session:
        assert sorted(session.scalars(select(LedgerEntry.kind))) == ["charge"]
    finished = AuditEvent.event_type.in_(["release_succeeded", "release_failed"])
    assert count(session_factory, AuditEvent, finished) == 1


def test_a_claim_whose_commit_answer_was_lost_is_taken_again_by_its_worker(
    client, keys, upload_dataset, rng, session_factory, store, settings
):
    queue_release(client, keys, upload_dataset, rng)
    worker = Worker(session_factory, store, settings, worker_id="w")
    orphan = worker.claim()  # committed; suppose the worker never heard back
    assert orphan is not None
    assert Worker(session_factory, store, settings, worker_id="other").claim() is None
    again = worker.claim()
    assert again is not None and again.release_id == orphan.release_id and again.attempt == 2
    assert worker.process(again) == "succeeded"


def test_heartbeat_extends_the_lease_only_for_its_owner(
    client, keys, upload_dataset, rng, session_factory, store, settings
):
    queue_release(client, keys, upload_dataset, rng)
    owner = Worker(session_factory, store, settings, worker_id="owner")
    job = owner.claim()
    assert job is not None
    assert owner.heartbeat(job) is True
    assert Worker(session_factory, store, settings, worker_id="intruder").heartbeat(job) is False


def _wait_for(predicate, timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def test_a_worker_process_killed_mid_job_leaves_it_to_complete_once(
    committed_db, settings, tmp_path
):
    url, factory = committed_db
    settings.max_upload_mb = 100
    settings.worker_lease_seconds = 2
    # The killed worker's run blocks (tests/blocking_worker.py): the kill lands mid-job on any
    # machine, and the data can be small.
    wide = np.random.default_rng(3).normal(size=(60, 6)) / 10
    release_id, _ = queue_one_release(settings, factory, wide, epsilon="0.5")

    def status() -> tuple[str, str | None]:
        with factory() as session:
            row = session.execute(
                select(Release.status, Release.lease_owner).where(Release.id == release_id)
            ).one()
            return row[0], row[1]

    env = {
        **os.environ,
        "DPSS_DATABASE_URL": url,
        "DPSS_DATA_DIR": str(settings.data_dir),
        "DPSS_WORKER_LEASE_SECONDS": "2",
        "DPSS_WORKER_HEARTBEAT_SECONDS": "0.5",
        "DPSS_WORKER_POLL_SECONDS": "0.05",
        # Its analyze_gauss never ends: a calibration at start (issue 30) would block on it.
        "DPSS_WORKER_CALIBRATE_SECONDS": "0",
    }
    root = Path(__file__).resolve().parents[1]
    process = subprocess.Popen([sys.executable, "-m", "tests.blocking_worker"], env=env, cwd=root)
    try:
        assert _wait_for(lambda: status()[0] == "running", timeout=60), (
            "worker never claimed the job"
        )
        killed_owner = status()[1]
        # The run itself happens in a child of the worker: it must not outlive the worker.
        assert _wait_for(lambda: psutil.Process(process.pid).children(), timeout=30)
        runs = psutil.Process(process.pid).children()
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        assert _wait_for(lambda: not any(run.is_running() for run in runs), timeout=30), (
            "the run outlived its killed worker"
        )
    finally:
        if process.poll() is None:
            process.kill()
    assert status() == ("running", killed_owner)
    store = DatasetStore(settings.datasets_dir)
    replacement = Worker(factory, store, settings, worker_id="replacement")
    with factory() as session:
        expires = session.execute(select(Release.lease_expires_at)).scalar_one()
    if expires is not None and utcnow() < expires - timedelta(seconds=0.5):
        # The dead worker's lease has not run out yet (on a loaded machine it may have by now).
        assert replacement.claim() is None
    assert _wait_for(lambda: replacement.run_pending() == 1, timeout=30, interval=0.2)
    with factory() as session:
        row = session.execute(select(Release)).scalar_one()
        assert (row.status, row.attempts, row.lease_owner) == ("succeeded", 2, "replacement")
        assert session.scalar(select(func.count()).select_from(LedgerEntry)) == 1
        succeeded = (
            select(func.count())
            .select_from(AuditEvent)
            .where(AuditEvent.event_type == "release_succeeded")
        )
        assert session.scalar(succeeded) == 1


def _seed_committed(factory, settings):
    """Keys, a dataset and one queued release in a committed database; returns the release id."""
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
        _, analyst = auth.create_key(session, "analyst", "a", None)
    data = np.random.default_rng(4).normal(size=(60, 5)) * 0.2
    with TestClient(create_app(settings, session_factory=factory)) as client:
        dataset = client.post(
            "/v1/datasets",
            headers=bearer(owner),
            files={"file": ("x.npy", npy_bytes(data), "application/octet-stream")},
            data={"name": "d", "epsilon_budget": "1", "delta_budget": "1e-5"},
        ).json()
        release = client.post(
            f"/v1/datasets/{dataset['id']}/releases",
            headers=bearer(analyst),
            json={"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.2", "delta": "1e-6",
                  "params": {"clip_norm": 1.0}},
        )  # fmt: skip
        assert release.status_code == 202, release.text
    return uuid.UUID(release.json()["id"])


def _gil_holding_sum(seconds: float) -> int:
    """How many terms make ``sum(range(n))`` (one C call: it never yields the interpreter
    lock) last about ``seconds`` here (only sizes the work; nothing is asserted on time)."""
    start = time.perf_counter()
    sum(range(10**6))
    per_term = (time.perf_counter() - start) / 10**6
    return int(seconds / max(per_term, 1e-10))


def test_an_isolated_run_holding_the_interpreter_lock_does_not_starve_the_heartbeat(
    committed_db, settings, monkeypatch, tmp_path
):
    """SciPy's LAPACK wrappers hold the interpreter lock for a whole call: run in the worker's
    own process, a long call stopped the heartbeat thread and the lease expired under a live
    job (which then ran again, and was finally abandoned as failed).

    Speed-independent: the run writes when its lock-holding call began and ended (the
    monotonic clock is the machine's, shared by the processes), and the heartbeats must fall
    inside that window. Starved, none could: the count, not a gap, is asserted."""
    from service.mechanisms import analyze_gauss

    _, factory = committed_db
    settings.worker_heartbeat_seconds = 0.05
    settings.worker_lease_seconds = 60
    release_id = _seed_committed(factory, settings)
    terms = _gil_holding_sum(1.0)
    original = analyze_gauss.gauss_release
    window = tmp_path / "window"

    def hold_the_lock(*args, **kwargs):
        began = time.monotonic()
        sum(range(terms))
        window.write_text(f"{began} {time.monotonic()}")
        return original(*args, **kwargs)

    monkeypatch.setattr(analyze_gauss, "gauss_release", hold_the_lock)
    beats: list[float] = []
    real_heartbeat = Worker.heartbeat

    def timed_heartbeat(self, job):
        beats.append(time.monotonic())
        return real_heartbeat(self, job)

    monkeypatch.setattr(Worker, "heartbeat", timed_heartbeat)
    store = DatasetStore(settings.datasets_dir)
    worker = Worker(factory, store, settings, worker_id="isolated", isolate=True)
    job = worker.claim()
    assert job is not None and job.release_id == release_id
    assert worker.process(job) == "succeeded"
    began, ended = map(float, window.read_text().split())
    during = [beat for beat in beats if began < beat < ended]
    # At least 3 beats while the lock was held: the heartbeat kept running through the call.
    assert len(during) >= 3, f"{len(during)} of {len(beats)} beats in {ended - began:.2f} s"
    with factory() as session:
        assert session.get(Release, release_id).attempts == 1


def test_an_isolated_run_that_kills_its_process_leaves_the_worker_and_the_job(
    committed_db, settings, monkeypatch
):
    from service.mechanisms import analyze_gauss

    _, factory = committed_db
    release_id = _seed_committed(factory, settings)
    monkeypatch.setattr(analyze_gauss, "gauss_release", lambda *_a, **_k: os._exit(9))
    store = DatasetStore(settings.datasets_dir)
    worker = Worker(factory, store, settings, worker_id="isolated", isolate=True)
    job = worker.claim()
    assert job is not None
    assert worker.process(job) == "unstored"
    # Nothing stored: the job is still this worker's, and counts as an attempt when retried.
    retry = worker.claim()
    assert retry is not None and (retry.release_id, retry.attempt) == (release_id, 2)
    monkeypatch.undo()
    assert worker.process(retry) == "succeeded"
    with factory() as session:
        assert session.scalar(select(func.count()).select_from(LedgerEntry)) == 1


SECRET_IN_MESSAGE = "271828.18284-row-value"


@pytest.fixture
def json_logging_to_stderr():
    """A function installing the service's logging configuration (as ``dpss worker`` does) on
    the test's stderr (call it in the test: capture replaces stderr per phase); restored after."""
    import logging
    import logging.config
    import threading
    import warnings

    from service.logs import log_config, log_what_python_prints

    root = logging.getLogger()
    saved = (root.level, list(root.handlers), sys.excepthook, threading.excepthook)
    saved_warnings = (warnings.showwarning, logging.raiseExceptions)

    def install():
        install_log_config(log_config("INFO"))
        log_what_python_prints()

    yield install
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    sys.excepthook, threading.excepthook = saved[2], saved[3]
    warnings.showwarning, logging.raiseExceptions = saved_warnings


def test_installing_the_log_config_leaves_the_streams_of_other_owners_open(tmp_path):
    # absl's handler closes its stream on close(); under pytest that stream can be the capture
    # file, which dictConfig's clean-up closed for every later test of the same xdist worker.
    import logging

    from service.logs import log_config

    class ClosesItsStream(logging.StreamHandler):
        def close(self) -> None:
            super().close()
            self.stream.close()

    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    with open(tmp_path / "owned-elsewhere.log", "w") as stream:
        handler = ClosesItsStream(stream)
        try:
            install_log_config(log_config("INFO"))
            assert not stream.closed
            handler.emit(logging.makeLogRecord({"msg": "still writable"}))
        finally:
            root.setLevel(saved[0])
            root.handlers[:] = saved[1]
    assert (tmp_path / "owned-elsewhere.log").read_text().strip() == "still writable"


def _json_lines(text: str) -> list[dict]:
    import json

    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_an_exception_in_the_forked_run_is_logged_as_json_type_and_location_only(
    committed_db, settings, monkeypatch, capfd, json_logging_to_stderr
):
    # An exception that escapes execute (here: the dataset file cannot be opened) used to reach
    # multiprocessing, which printed "Process ForkProcess-1:" and the raw traceback, message
    # included, around the JSON log.
    _, factory = committed_db
    release_id = _seed_committed(factory, settings)

    def unreadable(*_args, **_kwargs):
        raise ValueError(f"not a dataset file: {SECRET_IN_MESSAGE}")

    monkeypatch.setattr(DatasetStore, "open", unreadable)
    json_logging_to_stderr()
    worker = Worker(factory, DatasetStore(settings.datasets_dir), settings, isolate=True)
    job = worker.claim()
    assert job is not None and job.release_id == release_id
    capfd.readouterr()
    assert worker.process(job) == "unstored"  # left to its lease, as a run that died
    out, err = capfd.readouterr()
    assert SECRET_IN_MESSAGE not in out + err
    assert "Traceback" not in out + err
    lines = _json_lines(err)  # every line is JSON
    child = next(line for line in lines if "the run's process failed" in line["message"])
    assert child["level"] == "ERROR" and child["logger"] == "dpss.worker"
    assert "ValueError at test_worker.py:" in child["message"]
    assert any("ended without an outcome (exit code 1)" in line["message"] for line in lines)


def test_uncaught_exceptions_and_warnings_are_logged_as_type_and_location(tmp_path):
    # In a fresh interpreter configured as `dpss worker` configures one: in the test process,
    # another test's background threads (a session's Dask LocalCluster enters and leaves
    # warnings.catch_warnings in its event loop) can put warnings.showwarning back between the
    # configuration and the warning, which CI once saw as a warning never logged.
    script = tmp_path / "uncaught_in_a_worker.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import logging.config, sys, threading, warnings
            from service.logs import log_config, log_what_python_prints

            logging.config.dictConfig(log_config("INFO"))
            log_what_python_prints()

            def fail():
                raise KeyError({SECRET_IN_MESSAGE!r})

            thread = threading.Thread(target=fail)
            thread.start()
            thread.join()
            try:
                fail()
            except KeyError:
                sys.excepthook(*sys.exc_info())
            warnings.warn("Ill-conditioned matrix (rcond={SECRET_IN_MESSAGE})", RuntimeWarning, 1)
            """
        )
    )
    root = Path(__file__).resolve().parents[1]
    python_path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, err[-2000:]
    assert SECRET_IN_MESSAGE not in out + err and "Traceback" not in out + err
    messages = [line["message"] for line in _json_lines(err)]
    assert sum("KeyError at uncaught_in_a_worker.py:" in m for m in messages) == 2
    assert any(m.startswith("RuntimeWarning at uncaught_in_a_worker.py:") for m in messages)


def test_a_continual_epochs_forked_run_logs_its_exception_the_same_way(
    capfd, json_logging_to_stderr
):
    from service.isolation import run_forked

    json_logging_to_stderr()

    def epoch():
        raise ArithmeticError(SECRET_IN_MESSAGE)

    assert run_forked("a continual epoch", epoch, Settings()) is None
    out, err = capfd.readouterr()
    assert SECRET_IN_MESSAGE not in out + err and "Traceback" not in out + err
    messages = [line["message"] for line in _json_lines(err)]
    assert any(
        "a continual epoch: the run's process failed: ArithmeticError at test_worker.py:" in m
        for m in messages
    )


def test_a_release_claimed_then_its_dataset_deleted_fails_once_and_leaves_nothing(
    client, keys, upload_dataset, rng, session_factory, store, settings, caplog
):
    """Deleted between the claim (the job running, attempt 1) and the open of its rows: the
    job read nothing and ends ``failed``, charged (no refund after a deletion: whether the job
    ran first would tell when it was claimed, tests/api/test_deletion_race.py), the rows are
    gone from the store and no log line names the store's files."""
    dataset, release = queue_release(client, keys, upload_dataset, rng)
    worker = Worker(session_factory, store, settings, worker_id="running")
    job = worker.claim()
    assert job is not None and job.attempt == 1
    assert (
        client.delete(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner)).status_code
        == 204
    )
    assert [p for p in store.root.rglob("*.npy")] == []
    with caplog.at_level("DEBUG"):
        assert worker.process(job) == "failed"
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.owner)).json()
    assert body["status"] == "failed" and body["refunded"] is False
    assert count(session_factory, LedgerEntry, LedgerEntry.kind == "refund") == 0
    assert str(store.root) not in caplog.text
    assert worker.claim() is None
