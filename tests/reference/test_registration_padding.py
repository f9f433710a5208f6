"""A registration (or a batch) by reference ends for its owner at a public moment
(:mod:`service.registration_visibility`), not when the shared queue reached it.

Workers take a registration only when no release waits, so before this the moment the owner
saw ``registration_status`` (or ``batch_status``) change followed the end of other datasets'
releases, whose run time may depend on their rows: a 0.15 s longer release moved the change by
0.17 s on average (Kolmogorov-Smirnov distance 0.63 on SQLite, 0.75 on PostgreSQL, against
0.68 for chance at 8 + 8 runs). Here two worlds differ only in whether another dataset's
release is still running (so the one worker has not reached the registration) when the owner
looks: everything the owner and an analyst are shown must be the same, byte for byte.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db.models import Dataset, utcnow
from tests.conftest import Keys, bearer
from tests.reference.conftest import Registrations, padded

#: A small padding, so that the test waits little for the registrations to show.
PAD = 1.5
RELEASE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}


@pytest.fixture
def settings(settings: Settings, root: Path) -> Settings:
    return padded(settings, root, PAD)


def seen(client: TestClient, keys: Keys, dataset_id: str) -> str:
    """What the owner and an analyst are shown of the dataset, less what differs by world by
    construction (its id, request time and URI): its metadata, the owner's list, an analyst's
    read and a dry run's answer."""
    owner = client.get(f"/v1/datasets/{dataset_id}", headers=bearer(keys.owner)).json()
    listed = [
        d
        for d in client.get("/v1/datasets", headers=bearer(keys.owner)).json()["items"]
        if d["id"] == dataset_id
    ]
    analyst = client.get(f"/v1/datasets/{dataset_id}", headers=bearer(keys.analyst))
    dry = client.post(
        f"/v1/datasets/{dataset_id}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=RELEASE,
    )
    bodies = [owner, *listed, *([analyst.json()] if analyst.status_code == 200 else [])]
    for body in bodies:
        # The record (its URI, so its digest) names each world's own directory.
        for name in ("id", "created_at", "reference", "reference_sha256"):
            body.pop(name, None)
    return json.dumps([*bodies, analyst.status_code, dry.status_code, dry.json().get("error")])


def wait_shown(factory: sessionmaker[Session], ids: list[str]) -> None:
    """Sleep until every one of the datasets' registration and batch show (at most a few
    paddings: the late schedule's step)."""
    with factory() as session:
        moments: list[datetime | None] = []
        for dataset_id in ids:
            row = session.get(Dataset, uuid.UUID(dataset_id))
            assert row is not None
            # (getattr: the columns are this fix's; before it, nothing was waited for.)
            moments += [
                getattr(row, name, None) for name in ("registration_shown_at", "batch_shown_at")
            ]
    latest = max((m for m in moments if m is not None), default=None)
    delay = 0.0 if latest is None else (latest - utcnow()).total_seconds()
    if delay > 0:
        time.sleep(delay + 0.05)


@pytest.mark.parametrize("kind", ["registration", "batch"])
def test_what_an_owner_sees_of_a_registration_does_not_follow_another_datasets_release(
    kind: str, registrations: Registrations
) -> None:
    client, keys, worker = registrations.client, registrations.keys, registrations.worker
    root, session_factory = registrations.root, registrations.session_factory
    other = registrations.other(300, 3)
    ready: dict[str, str] = {}
    seeds = {"fast": 1, "slow": 2}  # distinct objects (a copy of a covered one is refused)
    if kind == "batch":
        ready = registrations.registered_first(keys.owner, seeds, (200, 3))
        wait_shown(session_factory, list(ready.values()))
    early: dict[str, str] = {}
    ids: dict[str, str] = {}
    for world in ("fast", "slow"):
        # Another owner's dataset's release is queued first: a worker takes it before any
        # registration, and its run time may depend on that dataset's rows.
        release = client.post(
            f"/v1/datasets/{other['id']}/releases", headers=bearer(keys.analyst), json=RELEASE
        )
        assert release.status_code == 202, release.text
        posted = registrations.post(
            keys.owner, kind, root / world / "b1", 10 + seeds[world], ready.get(world), (200, 3)
        )
        ids[world] = posted.id
        if world == "fast":
            # The release ended quickly: the one worker went on to the registration.
            assert worker.run_pending() == 1
        # In the slow world the release is still running: nothing else has run yet.
        early[world] = seen(client, keys, ids[world])
    assert early["fast"] == early["slow"], (early["fast"], early["slow"])
    status = "batch_status" if kind == "batch" else "registration_status"
    assert json.loads(early["fast"])[0][status] == "registering"
    assert worker.run_pending() == 1  # the slow world's release, then its registration
    while worker.run_registration():
        pass
    wait_shown(session_factory, list(ids.values()))
    late = {world: seen(client, keys, ids[world]) for world in ids}
    assert late["fast"] == late["slow"], (late["fast"], late["slow"])
    shown = json.loads(late["fast"])[0]
    assert shown["registration_status"] == "ready"
    assert shown["n_rows"] == (400 if kind == "batch" else 200), shown
    if kind == "batch":
        assert shown["batch_status"] is None and shown["n_batches"] == 2
