"""A refused registration must not tell when another registration really ended.

A registration (or a batch) by reference ends for everyone but admins and auditors at a public
moment (:mod:`service.registration_visibility`), because a worker reaches it only when the
releases ahead of it (on any dataset) have ended. The 409 a registration of an *overlapping*
URI gets named, before this, the real state: "overlaps a registration still in progress" while
the worker had not reached it, "already covered by another live dataset" once it had (and 202
once it had really failed). So an owner who registered a small file and then asked, again and
again, to register the same path read the moment the queue ahead drained, that is when other
datasets' releases ended, whatever the padding. Here two worlds differ only in whether another
dataset's release has ended (so the one worker went on to the registration): the overlapping
requests must be answered the same, byte for byte, until the registration shows.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.db.models import Dataset
from tests.conftest import bearer
from tests.reference import helpers
from tests.reference.conftest import Registrations, padded

#: Long enough that the whole probe runs before the registration shows.
PAD = 30.0
RELEASE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}


@pytest.fixture
def settings(settings: Settings, root: Path) -> Settings:
    return padded(settings, root, PAD)


def probe(client: TestClient, key: str, root: Path, world: str, names: list[str]) -> list[Any]:
    """Overlapping registrations (the same directory, the object in it, its parent) and what
    they are answered, with the world's name taken out of the text."""
    answers: list[Any] = []
    for uri in (root / world / "b1", root / world / "b1" / "a.parquet", root / world):
        answer = client.post(
            "/v1/dataset-references",
            headers=bearer(key),
            json={**helpers.FILE_BUDGET, "uri": str(uri), "columns": names},
        )
        body = answer.text.replace(f"/{world}", "/WORLD")
        answers.append((answer.status_code, body if answer.status_code != 202 else None))
    return answers


@pytest.mark.parametrize("kind", ["registration", "batch"])
def test_an_overlapping_registration_is_answered_from_what_is_shown(
    kind: str, registrations: Registrations
) -> None:
    client, keys, worker = registrations.client, registrations.keys, registrations.worker
    root, session_factory = registrations.root, registrations.session_factory
    other = registrations.other(100, 2)
    prober = registrations.make_key("owner")
    ready: dict[str, str] = {}
    seeds = {"fast": 1, "slow": 2}
    if kind == "batch":
        ready = registrations.registered_first(keys.owner, seeds, (50, 2))
        # Shown at once for the set-up (the padding is the point of the probe below only).
        with session_factory.begin() as session:
            for dataset_id in ready.values():
                row = session.get(Dataset, uuid.UUID(dataset_id))
                assert row is not None and row.registration_status == "ready"
                row.registration_shown_at = row.created_at
    early: dict[str, list[Any]] = {}
    for world in ("fast", "slow"):
        release = client.post(
            f"/v1/datasets/{other['id']}/releases", headers=bearer(keys.analyst), json=RELEASE
        )
        assert release.status_code == 202, release.text
        posted = registrations.post(
            keys.owner, kind, root / world / "b1", 10 + seeds[world], ready.get(world), (50, 2)
        )
        if world == "fast":
            # The release ended quickly: the one worker went on to the registration.
            assert worker.run_pending() == 1
        early[world] = probe(client, prober, root, world, posted.names)
    assert early["fast"] == early["slow"], (early["fast"], early["slow"])
    # Before the registration shows, each overlapping URI is refused (never a 202 that would
    # end the other registration, or this one, failed).
    assert all(code == 409 for code, _ in early["fast"]), early["fast"]
