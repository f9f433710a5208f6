"""Where a dataset by reference's objects live (its URI, a bucket and key or a path under the
reference roots) is the owner's to know: it hands whoever reads it the location of the raw
rows. An analyst sees that a dataset is by reference and the digest of its registered record,
never the location: not in a dataset's GET or list, a failed registration's reason, a release's
GET, list or history, nor a failed release's reason. The owner still sees all of it. On both
databases."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from service.audit_events import record_digest
from service.config import Settings
from service.db.models import Dataset
from service.worker import Worker
from tests.conftest import Keys, bearer, post_release
from tests.reference import helpers


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "hidden-lake-root"
    (path / "set").mkdir(parents=True)
    return path


@pytest.fixture
def settings(settings: Settings, root: Path) -> Settings:
    return settings.model_copy(update={"reference_roots": str(root)})


def write(path: Path, n: int = 300, seed: int = 3) -> list[str]:
    rows = np.random.default_rng(seed).normal(size=(n, 3)) / 4
    names = [f"c{i}" for i in range(3)]
    pq.write_table(pa.table({name: rows[:, i] for i, name in enumerate(names)}), path)
    return names


def analyst_reads(client: TestClient, keys: Keys, dataset_id: str) -> list[str]:
    """Every read an analyst has of the dataset and its releases, as response texts."""
    headers = bearer(keys.analyst)
    texts = [
        client.get(f"/v1/datasets/{dataset_id}", headers=headers),
        client.get("/v1/datasets", headers=headers),
        client.get(f"/v1/datasets/{dataset_id}/budget", headers=headers),
        client.get("/v1/releases", headers=headers),
    ]
    for item in client.get("/v1/releases", headers=headers).json()["items"]:
        texts.append(client.get(f"/v1/releases/{item['id']}", headers=headers))
    assert [r.status_code for r in texts] == [200] * len(texts), [r.text[:200] for r in texts]
    return [response.text for response in texts]


def no_location(texts: list[str], root: Path) -> None:
    for text in texts:
        assert "hidden-lake-root" not in text, text
        assert "a.parquet" not in text, text


def test_an_analyst_never_sees_where_the_objects_are(
    client: TestClient, keys: Keys, worker: Worker, root: Path, session_factory: Any
) -> None:
    target = root / "set" / "a.parquet"
    names = write(target)
    dataset = helpers.register(client, keys.owner, str(root / "set"), names, helpers.FILE_BUDGET)
    assert dataset.json()["registration_status"] == "ready", dataset.text
    dataset_id = dataset.json()["id"]
    # The owner sees the URI they registered.
    assert dataset.json()["reference"] == str(root / "set")
    shown = client.get(f"/v1/datasets/{dataset_id}", headers=bearer(keys.analyst)).json()
    assert shown["reference"] is None
    assert shown["by_reference"] is True
    with session_factory() as session:
        stored = session.get(Dataset, uuid.UUID(dataset_id))
        assert shown["reference_sha256"] == record_digest(stored.reference)
    assert dataset.json()["reference_sha256"] == shown["reference_sha256"]
    # One release that succeeds, one that fails because the object changed.
    done = post_release(client, keys.analyst, dataset_id, **helpers.FILE_RELEASE)
    assert worker.run_pending() == 1
    write(target, seed=4)
    failed = post_release(client, keys.analyst, dataset_id, **helpers.FILE_RELEASE)
    assert worker.run_pending() == 1
    owner_view = client.get(f"/v1/releases/{failed}", headers=bearer(keys.owner)).json()
    assert owner_view["status"] == "failed", owner_view
    analyst_view = client.get(f"/v1/releases/{failed}", headers=bearer(keys.analyst)).json()
    assert analyst_view["status"] == "failed", analyst_view
    assert "changed since registration" in analyst_view["reason"]
    assert client.get(f"/v1/releases/{done}", headers=bearer(keys.analyst)).status_code == 200
    no_location(analyst_reads(client, keys, dataset_id), root)


def test_a_failed_registration_reason_is_the_owners_alone(
    client: TestClient, keys: Keys, root: Path
) -> None:
    target = root / "set" / "a.parquet"
    target.write_bytes(b"not parquet at all")
    dataset = helpers.register(client, keys.owner, str(root / "set"), ["c0"], helpers.FILE_BUDGET)
    assert dataset.json()["registration_status"] == "failed", dataset.text
    # The owner, who named the objects, is told which one was refused.
    assert "a.parquet" in dataset.json()["registration_reason"]
    dataset_id = dataset.json()["id"]
    assert dataset.json()["by_reference"] is True
    headers = bearer(keys.analyst)
    shown = client.get(f"/v1/datasets/{dataset_id}", headers=headers)
    listed = client.get("/v1/datasets", headers=headers)
    assert listed.status_code == 200 and shown.status_code in (200, 404), shown.text
    if shown.status_code == 200:
        assert shown.json()["registration_reason"] is None
    no_location([shown.text, listed.text], root)


def test_an_uploaded_dataset_is_not_by_reference(
    client: TestClient, keys: Keys, upload_dataset: Any
) -> None:
    rows = np.random.default_rng(5).normal(size=(50, 3)) / 4
    dataset = upload_dataset(client, keys.owner, rows)
    assert dataset["by_reference"] is False
    shown = client.get(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.analyst)).json()
    assert shown["by_reference"] is False
    assert shown["reference"] is None and shown["reference_sha256"] is None
