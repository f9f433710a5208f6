"""Continual epochs under real padding (an hour), cases the other files do not name: a batch
appended right after the request is computed at once but shows no earlier than its batch's
commit plus its padding, nor before the epoch before it; a missing batch leaves the release
waiting, shown as the same answer before and after the worker looked; analysts never see an
epoch, an end or a timing before its moment (owners do)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import select

from service.db.models import DatasetBatch, Release, ReleaseEpoch, utcnow
from service.worker import Worker
from tests.api.test_append_rows import append
from tests.conftest import bearer, npy_bytes, post_release


def test_an_early_batch_does_not_bring_its_epoch_forward(
    padded_client, padded_settings, keys, upload_dataset, rng, session_factory, store
):
    dataset = upload_dataset(padded_client, keys.owner, rng.normal(size=(40, 5)), row_norm_bound=3)
    release_id = post_release(
        padded_client, keys.analyst, dataset["id"], mechanism="continual_gauss", k=2,
        epsilon="1", delta="1e-6", params={"horizon": 3},
    )  # fmt: skip
    url = f"/v1/releases/{release_id}"
    waiting_before = padded_client.get(url, headers=bearer(keys.analyst)).json()
    response = append(padded_client, keys.owner, dataset["id"], npy_bytes(rng.normal(size=(9, 5))))
    assert response.status_code == 201, response.text
    worker = Worker(session_factory, store, padded_settings, worker_id="w")
    assert worker.run_pending() == 1
    assert worker.run_pending() == 0  # batch 3 missing: waiting, nothing to do
    with session_factory() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None and release.status == "running"
        batches = {
            b.seq: b
            for b in session.execute(
                select(DatasetBatch).where(DatasetBatch.dataset_id == uuid.UUID(dataset["id"]))
            ).scalars()
        }
        epochs = session.execute(select(ReleaseEpoch).order_by(ReleaseEpoch.epoch)).scalars().all()
        assert [e.epoch for e in epochs] == [1, 2]
        assert release.visible_at is not None and release.visible_at > utcnow()
        assert epochs[0].visible_at >= release.visible_at
        # Epoch 2: its batch's commit plus the padding (an hour), never before epoch 1.
        assert epochs[1].visible_at >= batches[1].created_at + timedelta(minutes=59)
        assert epochs[1].visible_at >= epochs[0].visible_at
    for path in (url, f"{url}/epochs"):
        shown = padded_client.get(path, headers=bearer(keys.analyst))
        assert shown.status_code == 200, shown.text
        body = shown.json()
        if path == url:
            assert body["status"] == "queued" and body["epochs_done"] == 0
            assert body["latest_epoch"] is None and body["result"] is None
            assert body == waiting_before  # the same answer as before anything ran
        else:
            assert body == {"items": [], "total": 0, "next": None}
    # The owner is shown the same (service.visibility); both epochs are stored.
    assert padded_client.get(url, headers=bearer(keys.owner)).json() == waiting_before
    listed = padded_client.get("/v1/releases?status=running", headers=bearer(keys.analyst))
    assert listed.json()["total"] == 0  # shown queued, and filtered as queued
    queued = padded_client.get("/v1/releases?status=queued", headers=bearer(keys.analyst))
    assert queued.json()["total"] == 1
    with session_factory() as session:
        stored = session.get(Release, uuid.UUID(release_id))
        assert stored is not None and (stored.status, stored.epochs_done) == ("running", 2)
