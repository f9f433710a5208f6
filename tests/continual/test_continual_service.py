"""Continual releases through the API and an in-process worker: charged once, one epoch per
batch up to the horizon, epochs listed and audited, the state never shown."""

from __future__ import annotations

import hashlib
import uuid

import numpy as np
from sqlalchemy import func, select

from service import audit
from service.db.models import AuditEvent, LedgerEntry, Release, ReleaseEpoch, ReleaseState
from tests.api.test_append_rows import append
from tests.conftest import bearer, npy_bytes, post_release

D = 6


def start(client, keys, upload_dataset, rng, horizon=4, **params):
    dataset = upload_dataset(client, keys.owner, rng.normal(size=(40, D)), row_norm_bound=3)
    release_id = post_release(
        client, keys.analyst, dataset["id"], mechanism="continual_gauss", k=2,
        epsilon="1", delta="1e-6", params={"horizon": horizon, **params},
    )  # fmt: skip
    return dataset, release_id


def grow(client, keys, dataset_id, rng, rows=30):
    response = append(client, keys.owner, dataset_id, npy_bytes(rng.normal(size=(rows, D))))
    assert response.status_code == 201, response.text
    return response.json()["seq"]


def test_one_charge_one_epoch_per_batch_until_the_horizon(
    client, keys, upload_dataset, rng, run_worker, session_factory
):
    dataset, release_id = start(client, keys, upload_dataset, rng)
    grow(client, keys, dataset["id"], rng)  # present at creation: processed at once
    assert run_worker() == 1
    body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()
    assert body["status"] == "running" and body["epochs_done"] == 2
    assert [e["batch_seq"] for e in body["epochs"]] == [0, 1]
    assert [e["n_rows_read"] for e in body["epochs"]] == [40, 30]
    latest = body["latest_epoch"]
    assert latest["epoch"] == 2 and latest["created_at"] is None  # no timing for analysts
    basis = np.asarray(latest["basis"])
    assert basis.shape == (D, 2)
    np.testing.assert_allclose(basis.T @ basis, np.eye(2), atol=1e-9)
    assert latest["basis_sha256"] == hashlib.sha256(basis.astype("<f8").tobytes()).hexdigest()
    assert "state" not in str(body).lower()
    assert run_worker() == 0  # nothing to do: waiting
    grow(client, keys, dataset["id"], rng)
    grow(client, keys, dataset["id"], rng)
    grow(client, keys, dataset["id"], rng)  # beyond the horizon of 4: never read
    assert run_worker() == 1
    body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()
    assert body["status"] == "succeeded" and body["epochs_done"] == 4
    assert body["result"]["basis_sha256"] == body["latest_epoch"]["basis_sha256"]
    assert run_worker() == 0
    page = client.get(
        f"/v1/releases/{release_id}/epochs?limit=3", headers=bearer(keys.owner)
    ).json()
    assert (page["total"], [e["epoch"] for e in page["items"]]) == (4, [1, 2, 3])
    assert page["items"][0]["created_at"] is None  # nor owners: it tells the queue's state
    rest = client.get(
        f"/v1/releases/{release_id}/epochs?cursor={page['next']}", headers=bearer(keys.owner)
    ).json()
    assert [e["epoch"] for e in rest["items"]] == [4] and rest["next"] is None
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)).json()
    assert budget["epsilon_spent"] == "1"
    with session_factory() as session:
        charges = session.execute(select(func.count()).select_from(LedgerEntry)).scalar_one()
        assert charges == 1
        events = session.execute(
            select(AuditEvent.details).where(AuditEvent.event_type == "release_epoch")
        ).scalars()
        hashes = [e["basis_sha256"] for e in events]
        stored = session.execute(
            select(ReleaseEpoch.basis_sha256).order_by(ReleaseEpoch.epoch)
        ).scalars()
        assert hashes == list(stored) and len(hashes) == 4
        assert audit.verify(session).ok


def test_a_deleted_dataset_ends_a_waiting_release_without_refund(
    client, keys, upload_dataset, rng, run_worker
):
    dataset, release_id = start(client, keys, upload_dataset, rng)
    assert run_worker() == 1
    client.delete(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner))
    assert run_worker() == 1
    body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.owner)).json()
    assert body["status"] == "failed" and "deleted" in body["reason"]
    assert body["refunded"] is False and body["epochs_done"] == 1


def _unparsable(session_factory, release_id):
    """The stored params no longer parse (a refusal missed at prepare, as after an upgrade)."""
    with session_factory.begin() as session:
        release = session.get(Release, uuid.UUID(release_id))
        release.params = {**release.params, "no_such_param": 1}


def test_params_refused_before_the_first_epoch_fail_it_refunded(
    client, keys, upload_dataset, rng, run_worker, session_factory
):
    """Decided before any row is read (public facts): refunded, as for a one-shot release."""
    dataset, release_id = start(client, keys, upload_dataset, rng)
    _unparsable(session_factory, release_id)
    assert run_worker() == 1
    body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.owner)).json()
    assert (body["status"], body["refunded"], body["epochs_done"]) == ("failed", True, 0)
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner))
    assert budget.json()["epsilon_spent"] == "0"
    # Its end shows at the first epoch's public moment (fixed from the batch's commit), not at
    # the moment a worker claimed it, which would tell when the job before it ended.
    with session_factory() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release.outcome_visible_at is not None
        assert release.outcome_visible_at >= release.visible_at


def test_params_refused_after_an_epoch_fail_it_charged(
    client, keys, upload_dataset, rng, run_worker, session_factory
):
    dataset, release_id = start(client, keys, upload_dataset, rng)
    assert run_worker() == 1
    grow(client, keys, dataset["id"], rng)
    _unparsable(session_factory, release_id)
    assert run_worker() == 1
    body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.owner)).json()
    assert (body["status"], body["refunded"], body["epochs_done"]) == ("failed", False, 1)


def test_the_state_is_kept_with_the_release_and_never_shown(
    client, keys, upload_dataset, rng, run_worker, session_factory
):
    _, release_id = start(client, keys, upload_dataset, rng)
    run_worker()
    with session_factory() as session:
        state = session.execute(select(ReleaseState.state)).scalar_one()
    assert state is not None and len(state) > 8 * D * D
    for key in (keys.analyst, keys.owner, keys.auditor):
        response = client.get(f"/v1/releases/{release_id}", headers=bearer(key))
        assert state.hex()[:32] not in response.text


def test_audit_verify_notices_a_tampered_or_missing_epoch(
    client, keys, upload_dataset, rng, run_worker, session_factory
):
    """The negative control of the epochs' audit trail: a changed epoch hash or a removed epoch
    row fails ``verify``."""
    dataset, _ = start(client, keys, upload_dataset, rng)
    grow(client, keys, dataset["id"], rng)
    run_worker()
    with session_factory() as session:
        assert audit.verify(session).ok
        first = session.execute(select(ReleaseEpoch).where(ReleaseEpoch.epoch == 1)).scalar_one()
        first.basis_sha256 = "0" * 64
        session.flush()
        problems = audit.verify(session).problems
        assert any("epoch 1: basis_sha256 differs" in p for p in problems), problems
        session.delete(first)
        session.flush()
        problems = audit.verify(session).problems
        assert any("epoch 1: missing" in p for p in problems), problems
        assert any("epochs_done differs" in p for p in problems), problems
        session.rollback()


def test_analysts_see_each_epoch_only_after_its_padding(
    client, keys, upload_dataset, rng, run_worker, session_factory
):
    """An epoch is an outcome: an analyst sees it (and the release's end) only from its
    visible_at on, its batch's commit time plus a padding from public facts; so does the
    owner (service.visibility). Epochs become visible in order."""
    from datetime import timedelta

    from sqlalchemy import update

    from service.db.models import utcnow

    dataset, release_id = start(client, keys, upload_dataset, rng, horizon=2)
    grow(client, keys, dataset["id"], rng)
    assert run_worker() == 1
    with session_factory.begin() as session:
        # Epoch 2 padded into the future, as a slow padding model would.
        session.execute(
            update(ReleaseEpoch)
            .where(ReleaseEpoch.epoch == 2)
            .values(visible_at=utcnow() + timedelta(hours=1))
        )
    analyst = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()
    assert analyst["status"] == "running" and analyst["result"] is None
    assert analyst["epochs_done"] == 1 and analyst["latest_epoch"]["epoch"] == 1
    page = client.get(f"/v1/releases/{release_id}/epochs", headers=bearer(keys.analyst)).json()
    assert [e["epoch"] for e in page["items"]] == [1] and page["total"] == 1
    owner = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.owner)).json()
    assert owner == analyst
    with session_factory() as session:
        stored = session.get(Release, uuid.UUID(release_id))
        assert stored is not None and (stored.status, stored.epochs_done) == ("succeeded", 2)
    # The history shows it, and filters it, as the single read does.
    listed = client.get("/v1/releases", headers=bearer(keys.analyst)).json()["items"]
    assert [(r["status"], r["epochs_done"]) for r in listed] == [("running", 1)]
    assert listed[0]["latest_epoch"]["basis"] is None  # no bases in lists by default
    for status, count in (("running", 1), ("succeeded", 0)):
        page = client.get(f"/v1/releases?status={status}", headers=bearer(keys.analyst)).json()
        assert page["total"] == count, status
    mine = client.get("/v1/releases?status=succeeded", headers=bearer(keys.owner)).json()
    assert mine["total"] == 0


def test_epoch_visibility_never_goes_backwards():
    from datetime import UTC, datetime, timedelta

    from service.continual import epoch_visible_at

    t0 = datetime(2026, 11, 25, tzinfo=UTC)
    late = epoch_visible_at(t0, t0, timedelta(seconds=60))
    # A small batch right after a big one: not before the previous epoch.
    assert epoch_visible_at(t0, t0 + timedelta(seconds=1), timedelta(seconds=5), late) == late
    assert epoch_visible_at(t0 + timedelta(hours=1), t0, timedelta(seconds=5)) == t0 + timedelta(
        hours=1
    )


def test_a_stopping_worker_hands_the_release_back_between_epochs(
    client, keys, upload_dataset, rng, worker, session_factory, monkeypatch
):
    """A stop request (SIGTERM) ends the worker after the epoch it is storing; the release's
    lease is given up at once, so another worker continues without waiting for it to expire."""
    from service import continual

    dataset, release_id = start(client, keys, upload_dataset, rng)
    grow(client, keys, dataset["id"], rng)
    monkeypatch.setattr(continual, "on_epoch_stored", lambda job, epoch: worker.stop.set())
    job = worker.claim()
    assert job is not None and worker.process(job) == "unstored"
    with session_factory() as session:
        release = session.execute(select(Release)).scalar_one()
        assert (release.epochs_done, release.lease_owner) == (1, None)
    monkeypatch.undo()
    from service.worker import Worker

    heir = Worker(session_factory, worker.store, worker.settings, worker_id="heir")
    assert heir.run_pending() == 1
    body = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.owner)).json()
    assert body["epochs_done"] == 2
