"""Continual releases over a dataset by reference (issue 35, item 3): each epoch's leaf, the
batch's clipped Gram, is a pass of the reference engine, in process or on a Dask LocalCluster,
with the tree, its noise and the charge of an upload's release; on both databases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service import continual
from service.config import Settings
from service.mechanisms.linalg import subspace_distance
from service.reference import Reference, batch_of
from service.reference.integrity import Piece
from service.reference.objects import Location
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import Keys, bearer, fetch_release, post_release
from tests.factories import near_subspace
from tests.reference import helpers
from tests.reference.conftest import s3fs_for, write_parquet

BUDGET = helpers.CONTINUAL_BUDGET
KEY = helpers.RELEASE_KEY


@pytest.fixture
def settings(settings: Settings, s3_endpoint: str, bucket: str) -> Settings:
    return helpers.lake_settings(settings, s3_endpoint, bucket)


@pytest.fixture
def rows() -> np.ndarray[Any, Any]:
    data, _ = near_subspace(np.random.default_rng(12), 2000, 5, 2, noise=0.02)
    return data


@pytest.fixture
def columns(rows: np.ndarray[Any, Any], s3_endpoint: str, bucket: str) -> list[str]:
    fs = s3fs_for(s3_endpoint)
    write_parquet(fs, f"{bucket}/lake/a.parquet", rows[:1200], 400)
    return write_parquet(fs, f"{bucket}/lake/b.parquet", rows[1200:], 400)


def _registered(client: TestClient, keys: Keys, bucket: str, columns: list[str]) -> Any:
    response = helpers.register(client, keys.owner, f"s3://{bucket}/lake/", columns, BUDGET)
    assert response.json()["registration_status"] == "ready", response.text
    return response.json()


def _continual(
    client: TestClient, keys: Keys, dataset_id: str, worker: Worker, horizon: int
) -> dict[str, Any]:
    release_id = post_release(
        client, keys.analyst, dataset_id, mechanism="continual_gauss", k=2, epsilon="1",
        delta="1e-5", params={"horizon": horizon},
    )  # fmt: skip
    worker.run_pending()
    body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.owner)).json()
    return dict(body)


def test_a_continual_release_by_reference_runs_its_epochs_on_the_engine(
    client: TestClient,
    keys: Keys,
    upload_dataset: Callable[..., dict[str, Any]],
    rows: np.ndarray[Any, Any],
    columns: list[str],
    bucket: str,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    settings: Settings,
    dask_scheduler: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same release key on the upload of the same rows, on the reference in process and on
    the reference on Dask: epoch 1 is the same subspace, bit for bit between the two engine
    runs; a horizon of 2 leaves the release waiting for its next batch after epoch 1."""
    monkeypatch.setattr(continual, "new_release_key", lambda: KEY)
    referenced = _registered(client, keys, bucket, columns)
    uploaded = upload_dataset(client, keys.owner, rows, **BUDGET)
    here = Worker(session_factory, store, settings)
    there = Worker(
        session_factory, store, settings.model_copy(update={"dask_scheduler": dask_scheduler})
    )
    results = [
        _continual(client, keys, uploaded["id"], here, 1),
        _continual(client, keys, referenced["id"], here, 1),
        _continual(client, keys, referenced["id"], there, 1),
    ]
    assert [r["status"] for r in results] == ["succeeded"] * 3, results
    assert [r["epochs_done"] for r in results] == [1, 1, 1]
    assert [r["epochs"][0]["n_rows_read"] for r in results] == [2000] * 3
    upload, in_process, on_dask = (r["result"] for r in results)
    assert in_process == on_dask  # the same tasks added in the same order: the same bits
    distance = subspace_distance(np.array(upload["basis"]), np.array(in_process["basis"]))
    assert distance < 1e-9
    assert upload["extras"]["noise_sigma"] == in_process["extras"]["noise_sigma"]
    # Charged once, like an upload's continual release.
    assert {r["refunded"] for r in results} == {False}
    waiting = _continual(client, keys, referenced["id"], there, 2)
    assert (waiting["status"], waiting["epochs_done"]) == ("running", 1)
    assert here.run_pending() == 0  # no batch to read: waiting, nothing run


def test_a_changed_object_fails_the_first_epoch_charged(
    client: TestClient,
    keys: Keys,
    columns: list[str],
    rows: np.ndarray[Any, Any],
    bucket: str,
    s3_endpoint: str,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    settings: Settings,
) -> None:
    referenced = _registered(client, keys, bucket, columns)
    write_parquet(s3fs_for(s3_endpoint), f"{bucket}/lake/b.parquet", rows[1200:] * 0.5, 400)
    release_id = post_release(
        client, keys.analyst, referenced["id"], mechanism="continual_gauss", k=2, epsilon="1",
        delta="1e-5", params={"horizon": 2},
    )  # fmt: skip
    Worker(session_factory, store, settings).run_pending()
    body = fetch_release(client, keys.owner, release_id)
    assert body["status"] == "failed" and body["refunded"] is False, body
    # The reason names no object (the worker's log does): docs/security.md.
    assert "changed since registration" in body["reason"] and body["epochs_done"] == 0
    assert "b.parquet" not in body["reason"] and bucket not in body["reason"]


def test_a_batch_is_whole_row_groups() -> None:
    pieces = [Piece("a", g, 100 * g, 100) for g in range(4)]
    reference = Reference("s3://x/", Location("s3"), ["c"], [{"path": "a"}], pieces)
    assert batch_of(reference, 100, 200).pieces == pieces[1:3]
    assert batch_of(reference, 100, 200).objects == reference.objects  # all checked unchanged
    assert batch_of(reference, 0, 400).shape == (400, 1)
    for offset, n in ((50, 100), (100, 150), (0, 450)):
        with pytest.raises(ValueError, match="whole row groups"):
            batch_of(reference, offset, n)
