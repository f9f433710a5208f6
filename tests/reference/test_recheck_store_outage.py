"""An outside dependability audit: the object store is away (moto's server stopped) when a
release's re-check is due (``service.reference_recheck``).

Before, an unreachable store read as ``changed``: a release whose job succeeded on unchanged
objects was shown ``failed`` (charged, no result) for good, because of an outage of the
operator's store. Now the re-check stays ``pending`` and is tried again; once the store is back
it reads the objects (``unchanged``: shown as the job ended, at a later step of the public late
schedule), and a store away for longer than ``STORE_WAIT`` past the due moment reads
``changed`` (nothing waits forever). Whether the store answers does not depend on when the
release's job ran, so this shows nothing of the queue."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service import reference_recheck
from service.config import Settings
from service.db.models import Dataset, LedgerEntry, Release, utcnow
from service.worker import Worker
from tests.conftest import Keys, bearer, post_release
from tests.reference import helpers
from tests.reference.conftest import s3fs_for, write_parquet

#: Unique per test run (moto keeps its buckets in the process, across servers).
BUCKET = f"dpss-outage-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def own_store(s3_endpoint: str) -> Iterator[Any]:
    """A moto server of this test's own (the session's stays up), stoppable and restartable
    on the same port (moto keeps its buckets in the process)."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])

    class Store:
        endpoint = f"http://127.0.0.1:{port}"
        server: Any = None

        def start(self) -> None:
            self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            self.server.start()

        def stop(self) -> None:
            self.server.stop()
            self.server = None

    store = Store()
    store.start()
    yield store
    if store.server is not None:
        store.stop()


@pytest.fixture
def settings(settings: Settings, own_store: Any) -> Settings:
    global BUCKET
    BUCKET = f"dpss-outage-{uuid.uuid4().hex[:8]}"
    fs = s3fs_for(own_store.endpoint)
    fs.mkdir(BUCKET)
    rows = np.random.default_rng(3).normal(size=(400, 3)) / 4
    write_parquet(fs, f"{BUCKET}/lake/a.parquet", rows, 200)
    return helpers.lake_settings(settings, own_store.endpoint, BUCKET).model_copy(
        update={"release_padding_floor_seconds": 3600.0, "release_padding_multiplier": 1.0}
    )


def _registered(client: TestClient, keys: Keys, factory: sessionmaker[Session]) -> str:
    """The dataset's id once a worker registered it (its padding hides ``ready`` from the
    owner for the hour: read in the database)."""
    posted = client.post(
        "/v1/dataset-references",
        headers=bearer(keys.owner),
        json={**helpers.FILE_BUDGET, "uri": f"s3://{BUCKET}/lake", "columns": ["c0", "c1", "c2"]},
    )
    assert posted.status_code == 202, posted.text
    assert helpers.run_registrations(client) == 1
    with factory.begin() as session:
        dataset = session.get(Dataset, uuid.UUID(posted.json()["id"]))
        assert dataset is not None and dataset.reference is not None
        assert dataset.registration_status == "ready"
        # Its end shown now (as if the hour had passed), so that releases may be requested.
        past = utcnow() - timedelta(seconds=1)
        dataset.registration_visible_at = dataset.registration_shown_at = past
    return str(dataset.id)


def _due_now(factory: sessionmaker[Session], release_id: str) -> None:
    """The release as if its padding (one hour) had passed: its re-check is due."""
    with factory.begin() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None and release.visible_at is not None
        shift = release.visible_at - release.created_at + timedelta(seconds=5)
        release.created_at -= shift
        release.visible_at -= shift
        if release.outcome_visible_at is not None:
            release.outcome_visible_at -= shift


def _state(factory: sessionmaker[Session], release_id: str) -> tuple[str, str | None, bool]:
    with factory() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        refunds = session.query(LedgerEntry).filter_by(release_id=release.id, kind="refund")
        return release.status, release.reference_check, refunds.count() > 0


def test_a_store_outage_at_the_recheck_is_waited_out(
    client: TestClient,
    keys: Keys,
    settings: Settings,
    session_factory: sessionmaker[Session],
    store: Any,
    own_store: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dataset = _registered(client, keys, session_factory)
    worker = Worker(session_factory, store, settings)
    first = post_release(client, keys.analyst, dataset, **helpers.FILE_RELEASE)
    second = post_release(client, keys.analyst, dataset, **helpers.FILE_RELEASE)
    assert worker.run_pending() == 2
    for release_id in (first, second):
        assert _state(session_factory, release_id) == ("succeeded", "pending", False)
        _due_now(session_factory, release_id)
    own_store.stop()
    assert reference_recheck.recheck_due(session_factory, settings) == 0
    assert _state(session_factory, first) == ("succeeded", "pending", False)
    assert _state(session_factory, second) == ("succeeded", "pending", False)
    own_store.start()
    assert reference_recheck.recheck_due(session_factory, settings) == 2
    assert _state(session_factory, first) == ("succeeded", "unchanged", False)
    assert _state(session_factory, second) == ("succeeded", "unchanged", False)


def test_a_store_away_past_the_wait_reads_changed(
    client: TestClient,
    keys: Keys,
    settings: Settings,
    session_factory: sessionmaker[Session],
    store: Any,
    own_store: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dataset = _registered(client, keys, session_factory)
    worker = Worker(session_factory, store, settings)
    release_id = post_release(client, keys.analyst, dataset, **helpers.FILE_RELEASE)
    assert worker.run_pending() == 1
    _due_now(session_factory, release_id)
    own_store.stop()
    monkeypatch.setattr(reference_recheck, "STORE_WAIT", timedelta(seconds=1))
    assert reference_recheck.recheck_due(session_factory, settings) == 1
    # Charged as every changed verdict is: no refund.
    assert _state(session_factory, release_id) == ("succeeded", "changed", False)
