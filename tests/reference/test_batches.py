"""Batches appended to a dataset by reference (issue 35, item 3): registered by a worker as the
dataset was before they count, invisible to releases until then; a waiting continual release
then releases its next epoch from the batch, as from a stored append of the same rows; one-shot
releases read every batch registered at their request, every object checked unchanged. On the
moto S3 endpoint and the Dask LocalCluster, on both databases."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from dpss_client import Client, RegistrationFailed
from dpss_client import handles as handles_module
from service import continual, oneshot, registration
from service.config import Settings
from service.db.models import (
    AuditEvent,
    Dataset,
    DatasetBatch,
    DatasetReferenceObject,
    LedgerEntry,
    utcnow,
)
from service.mechanisms.linalg import subspace_distance
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import Keys, bearer, fetch_release, npy_bytes, post_release
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
    data, _ = near_subspace(np.random.default_rng(12), 2800, 5, 2, noise=0.02)
    return data


@pytest.fixture
def columns(rows: np.ndarray[Any, Any], s3_endpoint: str, bucket: str) -> list[str]:
    """The dataset's objects (rows 0-1999); the batch's (rows 2000-2799) are written by the
    tests, under the same prefix, as an owner adds files to a lake."""
    fs = s3fs_for(s3_endpoint)
    write_parquet(fs, f"{bucket}/lake/a.parquet", rows[:1200], 400)
    return write_parquet(fs, f"{bucket}/lake/b.parquet", rows[1200:2000], 400)


@dataclass
class Lake:
    """One test's lake: its client and keys, the rows (the dataset's 0-1999, the batch's
    2000-2799), the dataset's columns, the bucket and its endpoint."""

    client: TestClient
    keys: Keys
    rows: np.ndarray[Any, Any]
    columns: list[str]
    bucket: str
    s3_endpoint: str

    def registered(self) -> Any:
        """The owner registers the lake's prefix (asserts ``ready``); the dataset's body."""
        response = helpers.register(
            self.client, self.keys.owner, f"s3://{self.bucket}/lake/", self.columns, BUDGET
        )
        assert response.json()["registration_status"] == "ready", response.text
        return response.json()

    def write_batch(self, scale: float = 1.0) -> str:
        """The batch's object (rows 2000-2799, times ``scale``) written; its URI."""
        write_parquet(
            s3fs_for(self.s3_endpoint),
            f"{self.bucket}/lake/c.parquet",
            self.rows[2000:] * scale,
            400,
        )
        return f"s3://{self.bucket}/lake/c.parquet"

    def append(self, dataset_id: str, by: str | None = None, **body: Any) -> Any:
        """``by`` (else the owner) requests a batch of the dataset; the response."""
        return self.client.post(
            f"/v1/dataset-references/{dataset_id}/batches",
            headers=bearer(by or self.keys.owner),
            json=body,
        )

    def batch_requested(self) -> tuple[Any, str]:
        """A registered dataset (:meth:`registered`) and its batch's object written and
        requested (asserts 202): the dataset's body and the batch's URI."""
        referenced = self.registered()
        uri = self.write_batch()
        assert self.append(referenced["id"], uri=uri).status_code == 202
        return referenced, uri

    def view(self, dataset_id: str) -> Any:
        """The dataset as its owner reads it."""
        return self.client.get(f"/v1/datasets/{dataset_id}", headers=bearer(self.keys.owner)).json()

    def one_shot(self, dataset_id: str) -> str:
        """The analyst requests a one-shot release (analyze_gauss); its id."""
        return post_release(
            self.client, self.keys.analyst, dataset_id, mechanism="analyze_gauss", k=2,
            epsilon="1", delta="1e-5",
        )  # fmt: skip


@pytest.fixture
def lake(
    client: TestClient,
    keys: Keys,
    rows: np.ndarray[Any, Any],
    columns: list[str],
    bucket: str,
    s3_endpoint: str,
) -> Lake:
    return Lake(client, keys, rows, columns, bucket, s3_endpoint)


def _continual(client: TestClient, keys: Keys, dataset_id: str, horizon: int) -> str:
    return post_release(
        client, keys.analyst, dataset_id, mechanism="continual_gauss", k=2, epsilon="1",
        delta="1e-5", params={"horizon": horizon},
    )  # fmt: skip


def _releases_only(worker: Worker) -> int:
    """Run the claimable releases, no registration."""
    count = 0
    while (job := worker.with_db_retry("claim", worker.claim)) is not None:
        worker.process(job)
        count += 1
    return count


def test_a_waiting_continual_release_advances_with_a_batch_by_reference(
    upload_dataset: Callable[..., dict[str, Any]],
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    settings: Settings,
    dask_scheduler: str,
    monkeypatch: pytest.MonkeyPatch,
    lake: Lake,
) -> None:
    """Epoch 2 from the batch by reference is epoch 2 from the same rows appended to an upload
    (the same release key: the same subspace and noise scale), and the same bits on Dask as in
    process; while the batch registers, nothing sees it."""
    client, keys, rows = lake.client, lake.keys, lake.rows
    monkeypatch.setattr(continual, "new_release_key", lambda: KEY)
    here = Worker(session_factory, store, settings)
    there = Worker(
        session_factory, store, settings.model_copy(update={"dask_scheduler": dask_scheduler})
    )
    # The upload of the same rows, grown by a stored append.
    uploaded = upload_dataset(client, keys.owner, rows[:2000], **BUDGET)
    stored_release = _continual(client, keys, uploaded["id"], 2)
    here.run_pending()
    appended = client.post(
        f"/v1/datasets/{uploaded['id']}/rows",
        headers=bearer(keys.owner),
        files={"file": ("rows.npy", npy_bytes(rows[2000:]), "application/octet-stream")},
    )
    assert appended.status_code == 201, appended.text
    here.run_pending()
    # Two continual releases on the reference (in process, on Dask), waiting after epoch 1.
    referenced = lake.registered()
    in_process = _continual(client, keys, referenced["id"], 2)
    _releases_only(here)
    on_dask = _continual(client, keys, referenced["id"], 2)
    _releases_only(there)
    for release_id in (in_process, on_dask):
        body = fetch_release(client, keys.owner, release_id)
        assert (body["status"], body["epochs_done"]) == ("running", 1), body

    uri = lake.write_batch()
    posted = lake.append(referenced["id"], uri=uri)
    assert posted.status_code == 202, posted.text
    pending = posted.json()
    assert pending["batch_status"] == "registering"
    assert (pending["n_rows"], pending["n_batches"]) == (2000, 1)  # not a batch yet
    # While it registers no release sees it: nothing to claim, and a second batch waits.
    assert _releases_only(here) == 0
    again = lake.append(referenced["id"], uri=uri)
    assert (again.status_code, again.json()["error"]) == (409, "batch_registering"), again.text
    analyst_view = client.get(f"/v1/datasets/{referenced['id']}", headers=bearer(keys.analyst))
    assert analyst_view.json()["batch_status"] is None  # the owner's only

    assert helpers.run_registrations(client) == 1
    grown = lake.view(referenced["id"])
    assert (grown["n_rows"], grown["n_batches"], grown["batch_status"]) == (2800, 2, None)
    with session_factory() as session:
        batch = session.get(DatasetBatch, (uuid.UUID(grown["id"]), 1))
        assert batch is not None and (batch.row_offset, batch.n_rows) == (2000, 800)
        events = session.execute(
            select(AuditEvent.event_type).where(AuditEvent.dataset_id == uuid.UUID(grown["id"]))
        ).scalars()
        assert {"dataset_batch_requested", "dataset_batch_referenced"} <= set(events)

    # Epoch 2 of one release on the cluster, of the other in process (each worker claims any).
    for worker in (there, here):
        job = worker.with_db_retry("claim", worker.claim)
        assert job is not None
        worker.process(job)
    assert _releases_only(here) == 0
    results = [fetch_release(client, keys.owner, r) for r in (stored_release, in_process, on_dask)]
    assert [r["status"] for r in results] == ["succeeded"] * 3, results
    assert [r["epochs_done"] for r in results] == [2, 2, 2]
    assert [[e["n_rows_read"] for e in r["epochs"]] for r in results] == [[2000, 800]] * 3
    upload, by_reference, dask_result = (r["result"] for r in results)
    assert by_reference == dask_result  # the same key, tasks and order: the same bits
    distance = subspace_distance(np.array(upload["basis"]), np.array(by_reference["basis"]))
    assert distance < 1e-9
    assert upload["extras"]["noise_sigma"] == by_reference["extras"]["noise_sigma"]
    assert {r["refunded"] for r in results} == {False}  # one charge each, as for an upload


def test_a_one_shot_release_reads_every_batch_and_a_changed_one_fails_it(
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    lake: Lake,
) -> None:
    client, keys = lake.client, lake.keys
    worker = Worker(session_factory, store, settings)
    read: list[tuple[int, int]] = []
    opened = oneshot.reference.open_rows

    @contextlib.contextmanager
    def spy(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with opened(*args, **kwargs) as source:
            read.append(source.shape)
            yield source

    monkeypatch.setattr(oneshot.reference, "open_rows", spy)
    referenced, _ = lake.batch_requested()
    # Requested before the batch is registered: the rows present then (2000).
    before = lake.one_shot(referenced["id"])
    helpers.run_registrations(client)
    after = lake.one_shot(referenced["id"])
    continual_id = _continual(client, keys, referenced["id"], 3)
    _releases_only(worker)
    early, late = (
        fetch_release(client, keys.owner, before),
        fetch_release(client, keys.owner, after),
    )
    assert (early["status"], late["status"]) == ("succeeded", "succeeded"), (early, late)
    assert (early["n_rows_read"], late["n_rows_read"]) == (2000, 2800)
    # What the engine read: the batches present at each one-shot request, then the continual
    # release's epochs, one batch each.
    assert read == [(2000, 5), (2800, 5), (2000, 5), (800, 5)]
    body = fetch_release(client, keys.owner, continual_id)
    assert (body["status"], body["epochs_done"]) == ("running", 2), body

    # The batch's object changes: a release reading it fails, naming it, refunded.
    lake.write_batch(0.5)
    changed = lake.one_shot(referenced["id"])
    _releases_only(worker)
    failed = fetch_release(client, keys.owner, changed)
    assert failed["status"] == "failed" and failed["refunded"] is False, failed
    assert "a referenced object changed" in failed["reason"]
    assert "c.parquet" not in failed["reason"]


def test_a_changed_batch_object_fails_the_continual_epoch(
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    settings: Settings,
    lake: Lake,
) -> None:
    """Changed after registration, before epoch 2 reads it: the release ends ``failed``
    without epoch 2, charged (epoch 1 was released), its reason naming the object."""
    client, keys = lake.client, lake.keys
    worker = Worker(session_factory, store, settings)
    referenced = lake.registered()
    release_id = _continual(client, keys, referenced["id"], 2)
    _releases_only(worker)
    uri = lake.write_batch()
    assert lake.append(referenced["id"], uri=uri).status_code == 202
    helpers.run_registrations(client)
    lake.write_batch(0.5)
    _releases_only(worker)
    body = fetch_release(client, keys.owner, release_id)
    assert (body["status"], body["epochs_done"], body["refunded"]) == ("failed", 1, False), body
    assert "a referenced object changed" in body["reason"]
    assert "c.parquet" not in body["reason"]


def test_bad_batches_are_refused_naming_the_field(
    upload_dataset: Callable[..., dict[str, Any]],
    lake: Lake,
) -> None:
    client, keys, rows = lake.client, lake.keys, lake.rows
    columns, bucket, s3_endpoint = lake.columns, lake.bucket, lake.s3_endpoint
    referenced = lake.registered()
    dataset_id = referenced["id"]
    uri = lake.write_batch()

    def field(response: Any) -> tuple[int, str]:
        """The status and the field the detail names first (``field: message``)."""
        return response.status_code, str(response.json()["detail"]).split(":", 1)[0]

    assert lake.append(dataset_id, by=keys.analyst, uri=uri).status_code == 403
    assert field(lake.append(dataset_id, uri="s3://elsewhere/x.parquet")) == (
        422,
        "uri",
    )
    wrong = lake.append(dataset_id, uri=uri, columns=list(reversed(columns)))
    assert field(wrong) == (422, "columns")
    assert field(lake.append(dataset_id, uri=uri, extra=1))[0] == 422
    assert field(lake.append(dataset_id))[0] == 422
    covered = lake.append(dataset_id, uri=f"s3://{bucket}/lake/a.parquet")
    assert (covered.status_code, covered.json()["error"]) == (409, "object_registered")
    uploaded = upload_dataset(client, keys.owner, rows[:10], **BUDGET)
    assert field(lake.append(uploaded["id"], uri=uri)) == (422, "uri")
    stored_append = client.post(
        f"/v1/datasets/{dataset_id}/rows",
        headers=bearer(keys.owner),
        files={"file": ("rows.npy", npy_bytes(rows[:10]), "application/octet-stream")},
    )
    assert field(stored_append) == (422, "file")
    assert "batches" in stored_append.json()["detail"]

    # What needs a read ends the batch failed (the dataset as it was), naming the field.
    fs = s3fs_for(s3_endpoint)
    write_parquet(fs, f"{bucket}/lake/d.parquet", rows[2000:], 400, prefix="x")
    posted = lake.append(dataset_id, uri=f"s3://{bucket}/lake/d.parquet")
    assert posted.status_code == 202, posted.text
    helpers.run_registrations(client)
    body = lake.view(dataset_id)
    assert body["batch_status"] == "failed" and body["batch_reason"].startswith("columns"), body
    assert (body["n_rows"], body["n_batches"]) == (2000, 1)
    # A copy of a registered object's content is refused too (its rows would count twice).
    fs.copy(f"{bucket}/lake/b.parquet", f"{bucket}/lake/e.parquet")
    assert lake.append(dataset_id, uri=f"s3://{bucket}/lake/e.parquet").status_code == 202
    helpers.run_registrations(client)
    body = lake.view(dataset_id)
    assert body["batch_status"] == "failed" and "already covered" in body["batch_reason"], body
    # The failed batch is replaced by the next one, which registers.
    assert lake.append(dataset_id, uri=uri).status_code == 202
    helpers.run_registrations(client)
    body = lake.view(dataset_id)
    assert (body["n_rows"], body["n_batches"], body["batch_status"]) == (2800, 2, None)


def _unchanged(session_factory: sessionmaker[Session], dataset_id: str) -> tuple[Any, ...]:
    """What a refused batch request must leave as it was: the dataset's rows, batches and batch
    job, its batch rows, its audit events and its ledger."""
    key = uuid.UUID(dataset_id)
    with session_factory() as session:
        row = session.get(Dataset, key)
        assert row is not None
        return (
            row.n_rows,
            row.n_batches,
            row.batch_status,
            row.batch_request,
            session.query(DatasetBatch).filter_by(dataset_id=key).count(),
            session.query(AuditEvent).filter_by(dataset_id=key).count(),
            session.query(LedgerEntry).filter_by(dataset_id=key).count(),
        )


def test_a_batch_naming_covered_objects_is_refused_by_the_request(
    make_key: Callable[[str], str],
    session_factory: sessionmaker[Session],
    lake: Lake,
) -> None:
    """A batch's URI equal to batch 0's, a prefix of it, a prefix holding an earlier batch's
    objects (or another live dataset's), or one of those objects: 409 ``object_registered`` at
    once, naming ``uri``, the object and the batch that covers it, and nothing changes (no job,
    no batch, no event, no ledger entry). A prefix under batch 0's holding only new objects is a
    batch; a name that only begins like a covered object's is not a prefix of it."""
    client, keys, rows = lake.client, lake.keys, lake.rows
    columns, bucket, s3_endpoint = lake.columns, lake.bucket, lake.s3_endpoint
    fs = s3fs_for(s3_endpoint)
    referenced = lake.registered()
    dataset_id = referenced["id"]
    prefix = f"s3://{bucket}/lake"
    write_parquet(fs, f"{bucket}/lake/more/c.parquet", rows[2000:2400], 400)
    before = _unchanged(session_factory, dataset_id)
    for uri in (f"{prefix}/", prefix, f"{prefix}//"):  # one prefix, however spelt
        refused = lake.append(dataset_id, uri=uri)
        assert (refused.status_code, refused.json()["error"]) == (409, "object_registered")
        detail = refused.json()["detail"]
        assert detail.startswith(f"uri: {prefix} holds {prefix}/a.parquet"), detail
        assert "already covered by this dataset (batch 0)" in detail, detail
        assert _unchanged(session_factory, dataset_id) == before

    # Batch 1 under batch 0's prefix, holding new objects only, is a batch.
    assert lake.append(dataset_id, uri=f"{prefix}/more/").status_code == 202
    assert helpers.run_registrations(client) == 1
    grown = lake.view(dataset_id)
    assert (grown["n_rows"], grown["n_batches"], grown["batch_status"]) == (2400, 2, None)
    before = _unchanged(session_factory, dataset_id)
    for uri, named in [
        (f"{prefix}/more", f"{prefix}/more holds {prefix}/more/c.parquet, which is"),
        (f"{prefix}/more/c.parquet", f"{prefix}/more/c.parquet is"),
        (f"{prefix}/b.parquet", f"{prefix}/b.parquet is"),
    ]:
        refused = lake.append(dataset_id, uri=uri)
        assert (refused.status_code, refused.json()["error"]) == (409, "object_registered")
        seq = 0 if uri.endswith("b.parquet") else 1
        assert refused.json()["detail"].startswith(
            f"uri: {named} already covered by this dataset (batch {seq})"
        ), refused.text
        assert _unchanged(session_factory, dataset_id) == before

    # Another owner's dataset under the same lake: its objects are refused by name too, and
    # a registration (not a batch) of a prefix holding them is refused by its POST as well.
    write_parquet(fs, f"{bucket}/lake/other/x.parquet", rows[2400:], 200)
    helpers.registered(client, make_key("owner"), f"{prefix}/other", columns)
    before = _unchanged(session_factory, dataset_id)
    refused = lake.append(dataset_id, uri=f"{prefix}/other/")
    assert (refused.status_code, refused.json()["error"]) == (409, "object_registered")
    assert refused.json()["detail"].startswith(
        f"uri: {prefix}/other holds {prefix}/other/x.parquet, which is already covered by another "
        "live dataset"
    ), refused.text
    assert _unchanged(session_factory, dataset_id) == before
    posted = client.post(
        "/v1/dataset-references",
        headers=bearer(keys.owner),
        json={**BUDGET, "uri": f"{prefix}/", "columns": columns},
    )
    assert (posted.status_code, posted.json()["error"]) == (409, "object_registered")
    assert "another live dataset" in posted.json()["detail"], posted.text

    # A name that only begins like a covered object's is no prefix of it: the request takes
    # it, and the worker finds nothing there (an empty batch ends failed, the dataset as it
    # was).
    posted = lake.append(dataset_id, uri=f"{prefix}/b")
    assert posted.status_code == 202, posted.text
    helpers.run_registrations(client)
    body = lake.view(dataset_id)
    assert body["batch_status"] == "failed", body
    assert body["batch_reason"] == "uri: holds no .parquet objects", body
    assert (body["n_rows"], body["n_batches"]) == (2400, 2)


def test_a_dataset_with_no_room_for_a_batch_refuses_it_at_the_request(
    settings: Settings,
    session_factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
    lake: Lake,
) -> None:
    """A batch holds at least one object and 2 rows: a dataset that 2 more rows would take past
    DPSS_MAX_DATASET_BYTES (413, as a stored append past it), or at the objects' bound (422),
    refuses any batch at once, naming ``uri``, nothing kept; one with room for 2 rows but not
    for this batch's 800 still ends it ``failed`` from the worker, which knows the batch's
    size."""
    client, columns = lake.client, lake.columns
    referenced = lake.registered()
    dataset_id = referenced["id"]
    uri = lake.write_batch()
    before = _unchanged(session_factory, dataset_id)
    least = 8 * 2002 * len(columns)  # the dataset's 2000 rows and 2 more, 8 bytes a value
    settings.max_dataset_bytes = least - 1
    refused = lake.append(dataset_id, uri=uri)
    assert refused.status_code == 413, refused.text
    assert refused.json()["detail"].startswith("uri: the dataset with any batch (at least 2002 ")
    assert "DPSS_MAX_DATASET_BYTES" in refused.json()["detail"]
    assert _unchanged(session_factory, dataset_id) == before
    settings.max_dataset_bytes = least
    monkeypatch.setattr(registration.reference, "MAX_OBJECTS", 2)  # a.parquet and b.parquet
    refused = lake.append(dataset_id, uri=uri)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"].startswith("uri: the dataset covers 2 objects, the most")
    assert _unchanged(session_factory, dataset_id) == before
    monkeypatch.undo()
    assert lake.append(dataset_id, uri=uri).status_code == 202
    assert helpers.run_registrations(client) == 1
    body = lake.view(dataset_id)
    assert body["batch_status"] == "failed", body
    assert body["batch_reason"].startswith("uri: the dataset with this batch (2800 rows"), body
    assert (body["n_rows"], body["n_batches"]) == (2000, 1)


def test_the_worker_still_refuses_a_batch_whose_objects_were_covered_meanwhile(
    upload_dataset: Callable[..., dict[str, Any]],
    settings: Settings,
    session_factory: sessionmaker[Session],
    lake: Lake,
) -> None:
    """The request's check is not the only one: a batch whose object another live dataset came
    to cover after the request (two requests racing, each checked before the other committed)
    ends ``failed`` when its worker covers the objects, the dataset as it was."""
    client, keys, rows = lake.client, lake.keys, lake.rows
    columns = lake.columns
    referenced, uri = lake.batch_requested()
    other = upload_dataset(client, keys.owner, rows[:10], **BUDGET)
    (key, key_sha, content_sha), *_ = registration.reference.inspect(
        uri, columns, settings
    ).covered()
    with session_factory.begin() as session:
        session.add(
            DatasetReferenceObject(
                dataset_id=uuid.UUID(other["id"]),
                object_key=key,
                key_sha256=key_sha,
                content_sha256=content_sha,
            )
        )
    assert helpers.run_registrations(client) == 1
    body = lake.view(referenced["id"])
    assert body["batch_status"] == "failed" and "already covered" in body["batch_reason"], body
    assert (body["n_rows"], body["n_batches"]) == (2000, 1)


def test_a_batch_job_is_leased_abandoned_and_lost_as_a_registration(
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    settings: Settings,
    lake: Lake,
) -> None:
    """A dead worker's batch goes to another after its lease, whose late finish is discarded;
    after the attempts allowed the batch ends failed (the dataset as it was); a batch of a
    dataset deleted meanwhile never becomes one."""
    client, keys, rows = lake.client, lake.keys, lake.rows
    columns, bucket, s3_endpoint = lake.columns, lake.bucket, lake.s3_endpoint
    dead, other = (Worker(session_factory, store, settings) for _ in range(2))
    referenced, _ = lake.batch_requested()
    dataset_id = uuid.UUID(referenced["id"])
    job = registration.claim(dead)
    assert job is not None and job.batch and job.columns == columns
    assert registration.claim(other) is None  # leased
    with session_factory.begin() as session:
        row = session.get(Dataset, dataset_id)
        assert row is not None
        row.registration_lease_expires_at = utcnow() - timedelta(seconds=1)
    assert other.run_registration()
    assert registration.process(dead, job) == "lost"
    body = lake.view(dataset_id)
    assert (body["n_rows"], body["n_batches"], body["batch_status"]) == (2800, 2, None)

    write_parquet(s3fs_for(s3_endpoint), f"{bucket}/lake/d.parquet", rows[:300] + 1.0, 100)
    d_uri = f"s3://{bucket}/lake/d.parquet"
    assert lake.append(referenced["id"], uri=d_uri).status_code == 202
    with session_factory.begin() as session:
        row = session.get(Dataset, dataset_id)
        assert row is not None
        row.registration_attempts = settings.worker_max_attempts
    assert registration.claim(other) is None
    body = lake.view(dataset_id)
    assert body["batch_status"] == "failed" and "abandoned after" in body["batch_reason"]
    assert (body["n_rows"], body["n_batches"]) == (2800, 2)

    assert lake.append(referenced["id"], uri=d_uri).status_code == 202
    job = registration.claim(other)
    assert job is not None
    assert (
        client.delete(f"/v1/datasets/{dataset_id}", headers=bearer(keys.owner)).status_code == 204
    )
    assert registration.process(other, job) == "lost"
    with session_factory() as session:
        assert session.get(DatasetBatch, (dataset_id, 2)) is None


def test_the_client_appends_a_batch_and_waits(
    monkeypatch: pytest.MonkeyPatch,
    lake: Lake,
) -> None:
    client, keys, rows = lake.client, lake.keys, lake.rows
    bucket, s3_endpoint = lake.bucket, lake.s3_endpoint
    referenced = lake.registered()
    monkeypatch.setattr(handles_module, "_sleep", lambda _: helpers.run_registrations(client))
    owner = Client(str(client.base_url), keys.owner, http=client)
    grown = owner.append_reference_batch(referenced["id"], lake.write_batch())
    assert (grown.n_rows, grown.n_batches, grown.batch_status) == (2800, 2, None)
    write_parquet(s3fs_for(s3_endpoint), f"{bucket}/lake/d.parquet", rows[:10], 5, prefix="x")
    with pytest.raises(RegistrationFailed, match="batch: columns"):
        owner.append_reference_batch(referenced["id"], f"s3://{bucket}/lake/d.parquet")
