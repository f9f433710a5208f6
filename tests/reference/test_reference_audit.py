"""``dpss audit verify`` and a dataset by reference's record: the objects, row groups and chunk
digests a budget is bound to (``datasets.reference``) must be those its ``dataset_referenced``
and ``dataset_batch_referenced`` events recorded. Someone who can write the database (the
tamper-evidence threat model, docs/security.md) could otherwise list a row group twice (its
rows counted twice in every release: a person's row moves the Gram twice as far as the budget
assumes), point the dataset at another dataset's objects (releases charged to one budget read
other people's rows), or rewrite the digests to accept other bytes of a changed object, and
``verify`` said intact. Both databases.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service import audit, registration
from service.config import Settings
from service.db.models import Dataset, DatasetReferenceObject
from service.worker import Worker
from tests.conftest import Keys, bearer, fetch_release, post_release
from tests.reference import helpers
from tests.reference.test_integrity import plain_parquet

BUDGET = helpers.FILE_BUDGET


@pytest.fixture
def root(tmp_path: Path, settings: Settings) -> Path:
    path = tmp_path / "shared"
    for name in ("set", "week-2", "other"):
        (path / name).mkdir(parents=True)
    settings.reference_roots = str(path)
    return path


def _datasets(client: TestClient, keys: Keys, root: Path) -> tuple[str, str]:
    """Two datasets by reference, the first with a second batch."""
    rows = np.random.default_rng(4).normal(size=(600, 3)) / 4
    names = plain_parquet(root / "set" / "a.parquet", rows[:200])
    plain_parquet(root / "week-2" / "b.parquet", rows[200:400])
    plain_parquet(root / "other" / "c.parquet", rows[400:])
    first = helpers.register(client, keys.owner, str(root / "set"), names, BUDGET).json()
    second = helpers.register(client, keys.owner, str(root / "other"), names, BUDGET).json()
    posted = client.post(
        f"/v1/dataset-references/{first['id']}/batches",
        headers=bearer(keys.owner),
        json={"uri": str(root / "week-2")},
    )
    assert posted.status_code == 202, posted.text
    helpers.run_registrations(client)
    body = client.get(f"/v1/datasets/{first['id']}", headers=bearer(keys.owner)).json()
    assert (body["n_rows"], body["n_batches"]) == (400, 2), body
    return first["id"], second["id"]


def _reference(session_factory: sessionmaker[Session], dataset_id: str) -> Any:
    with session_factory() as session:
        found = session.get(Dataset, uuid.UUID(dataset_id))
        assert found is not None and found.reference is not None
        return copy.deepcopy(found.reference)


def _store(session_factory: sessionmaker[Session], dataset_id: str, raw: Any) -> None:
    with session_factory.begin() as session:
        session.execute(
            update(Dataset).where(Dataset.id == uuid.UUID(dataset_id)).values(reference=raw)
        )


def _problems(session_factory: sessionmaker[Session]) -> list[str]:
    with session_factory() as session:
        return audit.verify(session).problems


def twice(raw: Any, other: Any) -> Any:
    """A row group listed twice (its rows renumbered after the last): read twice per pass."""
    last = raw["pieces"][-1]
    again = [*raw["pieces"][0]]
    again[2] = last[2] + last[3]
    raw["pieces"].append(again)
    return raw


def another_datasets(raw: Any, other: Any) -> Any:
    """The other dataset's objects and row groups (the same shape): its people, this budget."""
    return {**raw, "objects": other["objects"], "pieces": other["pieces"]}


def digest_rewritten(raw: Any, other: Any) -> Any:
    """A chunk digest replaced (to accept other bytes written in its place)."""
    raw["pieces"][0][4][0][2] = "0" * 64
    return raw


def object_dropped(raw: Any, other: Any) -> Any:
    """The second batch's object and its row groups removed (so no release checks it)."""
    kept = raw["objects"][0]["path"]
    return {
        **raw,
        "objects": raw["objects"][:1],
        "pieces": [p for p in raw["pieces"] if p[0] == kept],
    }


@pytest.mark.parametrize("edit", [twice, another_datasets, digest_rewritten, object_dropped])
def test_verify_finds_a_dataset_by_reference_whose_record_was_edited(
    edit: Callable[[Any, Any], Any],
    client: TestClient,
    keys: Keys,
    root: Path,
    worker: Worker,
    session_factory: sessionmaker[Session],
) -> None:
    first, second = _datasets(client, keys, root)
    release_id = post_release(
        client, keys.analyst, first, mechanism="analyze_gauss", k=1, epsilon="1", delta="1e-5"
    )
    assert worker.run_pending() == 1
    assert fetch_release(client, keys.owner, release_id)["status"] == "succeeded"
    assert _problems(session_factory) == []
    _store(
        session_factory,
        first,
        edit(_reference(session_factory, first), _reference(session_factory, second)),
    )
    problems = _problems(session_factory)
    assert any(f"datasets {first}" in p and "reference" in p for p in problems), problems
    assert not any(second in p for p in problems), problems


def test_a_reference_recorded_before_its_digest_is_checked_by_its_objects(
    client: TestClient,
    keys: Keys,
    root: Path,
    session_factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Events written before they carried the record's digest: the objects (identities and
    footer digests, which fix every row group's place and count) are compared with theirs."""
    monkeypatch.setattr(registration, "REFERENCE_DIGEST_FIELD", None)
    first, second = _datasets(client, keys, root)
    assert _problems(session_factory) == []
    _store(
        session_factory,
        first,
        another_datasets(_reference(session_factory, first), _reference(session_factory, second)),
    )
    problems = _problems(session_factory)
    assert any(f"datasets {first}" in p and "reference" in p for p in problems), problems


def test_verify_finds_a_dataset_by_reference_whose_row_count_was_edited(
    client: TestClient, keys: Keys, root: Path, session_factory: sessionmaker[Session]
) -> None:
    """``n_rows`` is the prefix of the row groups a release reads (its sensitivity's ``n``):
    it must be the count the last event recorded."""
    first, _ = _datasets(client, keys, root)
    with session_factory.begin() as session:
        session.execute(update(Dataset).where(Dataset.id == uuid.UUID(first)).values(n_rows=200))
    problems = _problems(session_factory)
    assert any(f"datasets {first}: n_rows" in p for p in problems), problems


def test_verify_finds_a_cover_row_removed_or_left_behind(
    client: TestClient, keys: Keys, root: Path, session_factory: sessionmaker[Session]
) -> None:
    """``dataset_reference_objects`` is what refuses a second dataset on the same objects (a
    second budget on their rows): a row removed must show, and so must one left for a deleted
    dataset (it refuses others' registrations)."""
    first, second = _datasets(client, keys, root)
    deleted = client.delete(f"/v1/datasets/{second}", headers=bearer(keys.owner))
    assert deleted.status_code == 204
    assert _problems(session_factory) == []
    with session_factory.begin() as session:
        rows = (
            session.query(DatasetReferenceObject)
            .filter_by(dataset_id=uuid.UUID(first))
            .filter(DatasetReferenceObject.object_key.startswith("file://"))
            .all()
        )
        assert len(rows) == 2
        session.delete(rows[1])
        session.add(
            DatasetReferenceObject(
                dataset_id=uuid.UUID(second),
                object_key="file:///elsewhere.parquet",
                key_sha256="1" * 64,
                content_sha256="2" * 64,
            )
        )
    problems = _problems(session_factory)
    assert any(f"datasets {first}: dataset_reference_objects" in p for p in problems), problems
    assert any(p.startswith(f"dataset_reference_objects of {second}") for p in problems), problems
