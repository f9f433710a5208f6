"""Continual releases with real commits and processes: a worker SIGKILLed between epochs is
resumed without redrawing any node and without a second charge; appends while epochs compute."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service import auth
from service.app import create_app
from service.db.models import Dataset, LedgerEntry, Release, ReleaseEpoch, ReleaseState
from service.mechanisms.continual_gauss import ContinualState
from service.store import DatasetStore
from service.worker import Worker
from tests.api.test_append_rows import append
from tests.conftest import bearer, npy_bytes, post_release

D = 5
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def service(committed_db, settings):
    _, factory = committed_db
    app = create_app(settings, session_factory=factory)
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
        _, analyst = auth.create_key(session, "analyst", "a", None)
    with TestClient(app) as client:
        yield client, factory, owner, analyst


def _dataset(client, owner, rows: np.ndarray) -> str:
    response = client.post(
        "/v1/datasets",
        headers=bearer(owner),
        files={"file": ("x.npy", npy_bytes(rows), "application/octet-stream")},
        data={"name": "s", "epsilon_budget": "2", "delta_budget": "1e-5", "row_norm_bound": "3"},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _state(factory, release_id) -> tuple[int, bytes, dict[int, str | None]]:
    with factory() as session:
        release = session.get(Release, release_id)
        epochs = session.execute(
            select(ReleaseEpoch.epoch, ReleaseEpoch.basis_sha256).where(
                ReleaseEpoch.release_id == release_id
            )
        ).all()
        state = session.get(ReleaseState, release_id)
        return release.epochs_done, state.state if state else None, dict(epochs)


@pytest.mark.parametrize(("estimator", "mode"), [("tree", "between"), ("honaker", "in_flight")])
def test_a_worker_killed_between_epochs_resumes_without_redrawing_or_recharging(
    service, settings, rng, tmp_path, estimator, mode
):
    """``between``: killed right after storing epoch 2. ``in_flight``: killed after computing
    epoch 3 but before storing it. Either way the heir continues the same tree: the nodes
    stored with epoch 2 are reused bit for bit, and epoch 3's new node gets the noise the dead
    worker drew (the release's CSPRNG is keyed per release and epoch), so the state after
    epoch 3 is exactly the one the dead worker computed."""
    client, factory, owner, analyst = service
    dataset_id = _dataset(client, owner, rng.normal(size=(30, D)))
    for _ in range(2):
        assert append(client, owner, dataset_id, npy_bytes(rng.normal(size=(20, D)))).is_success
    release_id = post_release(
        client, analyst, dataset_id, mechanism="continual_gauss", k=2, epsilon="1",
        delta="1e-6", params={"horizon": 8, "estimator": estimator},
    )  # fmt: skip
    dump = tmp_path / "in_flight_state"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DPSS_DATABASE_URL": settings.database_url,
        "DPSS_DATA_DIR": str(settings.data_dir),
        "DPSS_WORKER_LEASE_SECONDS": "1",
        "DPSS_TEST_KILL_AT": "2" if mode == "between" else "3",
        "DPSS_TEST_KILL_MODE": mode,
        "DPSS_TEST_DUMP": str(dump),
    }
    killed = subprocess.run(
        [sys.executable, "-m", "tests.continual.kill_worker"], env=env, cwd=ROOT, timeout=120
    )
    assert killed.returncode == -signal.SIGKILL
    rid = uuid.UUID(release_id)
    done, state_2, epochs_2 = _state(factory, rid)
    # Killed holding the lease, after epoch 2, with batch 2 (epoch 3) not stored.
    assert done == 2 and sorted(epochs_2) == [1, 2]
    with factory() as session:
        assert session.get(Release, rid).lease_owner == "doomed"
    time.sleep(1.2)  # the dead worker's lease expires
    store = DatasetStore(settings.datasets_dir)
    Worker(factory, store, settings, worker_id="heir").run_pending()
    done, state_3, epochs_3 = _state(factory, rid)
    assert done == 3
    assert {e: epochs_3[e] for e in (1, 2)} == epochs_2  # earlier epochs untouched
    before, after = ContinualState.from_bytes(state_2), ContinualState.from_bytes(state_3)
    # Leaf 3 closes only the level-0 node: the level-1 node (leaves 1-2), drawn when epoch 2
    # closed it and stored with the state, is reused bit for bit, not drawn again.
    assert before.closed[0] is None and after.closed[0] is not None
    assert before.closed[1] is not None and after.closed[1] is not None
    assert before.closed[1].tobytes() == after.closed[1].tobytes()
    if mode == "in_flight":
        assert state_3 == dump.read_bytes()  # the dead worker's draw, not a new one
    with factory() as session:
        entries = session.execute(select(LedgerEntry.kind)).scalars().all()
        assert entries == ["charge"]
        assert session.get(Release, rid).attempts == 0  # waiting again, for batch 3


def test_appends_while_epochs_compute(service, settings, rng):
    """Batches of distinct sizes arrive from two threads while a worker computes epochs: every
    batch becomes exactly one epoch, in sequence order, reading exactly its rows."""
    client, factory, owner, analyst = service
    dataset_id = _dataset(client, owner, rng.normal(size=(10, D)))
    release_id = post_release(
        client, analyst, dataset_id, mechanism="continual_gauss", k=1, epsilon="1",
        delta="1e-6", params={"horizon": 16},
    )  # fmt: skip
    batches = {size: rng.normal(size=(size, D)) for size in range(2, 14)}
    store = DatasetStore(settings.datasets_dir)
    worker = Worker(factory, store, settings, worker_id="busy")
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            if worker.run_pending() == 0:
                time.sleep(0.01)

    def feed(sizes: list[int]) -> None:
        with TestClient(client.app) as own:
            for size in sizes:
                response = append(own, owner, dataset_id, npy_bytes(batches[size]))
                assert response.status_code == 201, response.text

    runner = threading.Thread(target=work)
    runner.start()
    feeders = [
        threading.Thread(target=feed, args=(sizes,))
        for sizes in ([2, 4, 6, 8, 10, 12], [3, 5, 7, 9, 11, 13])
    ]
    for thread in feeders:
        thread.start()
    for thread in feeders:
        thread.join()
    rid = uuid.UUID(release_id)
    deadline = time.monotonic() + 120
    while _state(factory, rid)[0] < 13 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    runner.join()
    with factory() as session:
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert (dataset.n_batches, dataset.n_rows) == (13, 10 + sum(batches))
        epochs = session.execute(
            select(ReleaseEpoch.epoch, ReleaseEpoch.batch_seq, ReleaseEpoch.n_rows_read)
            .where(ReleaseEpoch.release_id == rid)
            .order_by(ReleaseEpoch.epoch)
        ).all()
        assert [(e, s) for e, s, _ in epochs] == [(t, t - 1) for t in range(1, 14)]
        sizes = [n for _, _, n in epochs]
        assert sizes[0] == 10 and sorted(sizes[1:]) == sorted(batches)
        assert session.get(Release, rid).epochs_done == 13
        assert session.execute(select(LedgerEntry.kind)).scalars().all() == ["charge"]
        # The file holds the batches in sequence order, each whole.
        rows = store.open(dataset.file_name, dataset.n_rows)
    offset = 10
    for size in sizes[1:]:
        np.testing.assert_array_equal(rows[offset : offset + size], batches[size])
        offset += size
