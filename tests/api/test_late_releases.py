"""Issue 30 item 2: a job that ends after its ``visible_at`` shows its outcome only at the next
step of its public schedule (``created_at + padding * 2^j``), on every analyst route: the release,
its long poll, the history and its status filter, the budget's refund; until then it is
``running``, whatever its real state. Lateness is counted for the operator."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from service import oneshot
from service.db.models import DatasetBatch, LedgerEntry, Release, ReleaseEpoch, utcnow
from service.jobs import REFUSED_AT_RUN_REASON, Outcome
from service.worker import Worker
from tests.conftest import bearer, fetch_release, post_release
from tests.factories import near_subspace

BODY = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-7"}


@pytest.fixture
def dataset(padded_client, keys, upload_dataset, rng):
    data, _ = near_subspace(rng, 120, 5, 2)
    return upload_dataset(padded_client, keys.owner, data, row_norm_bound=1.0)


def shift(session_factory, release_id, by: timedelta) -> None:
    """Every moment of the release ``by`` earlier: as if that much time had passed."""
    with session_factory.begin() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        for name in ("created_at", "visible_at", "outcome_visible_at", "finished_at"):
            if getattr(release, name) is not None:
                setattr(release, name, getattr(release, name) - by)
        for entry in session.execute(
            select(LedgerEntry).where(LedgerEntry.release_id == release.id)
        ).scalars():
            entry.created_at -= by


def padding_passed(session_factory, release_id) -> None:
    """The release was requested 90 minutes ago with its hour of padding: it is now 30 minutes
    past its visible_at, and its job has not run yet."""
    with session_factory.begin() as session:
        session.execute(
            update(Release)
            .where(Release.id == uuid.UUID(release_id))
            .values(
                created_at=utcnow() - timedelta(minutes=90),
                visible_at=utcnow() - timedelta(minutes=30),
            )
        )


def listed(client, key, status) -> int:
    answer = client.get("/v1/releases", headers=bearer(key), params={"status": status})
    assert answer.status_code == 200, answer.text
    return int(answer.json()["total"])


def test_a_late_outcome_shows_at_the_next_step_of_its_schedule_on_every_route(
    padded_client, keys, dataset, run_worker, session_factory
):
    release_id = post_release(padded_client, keys.analyst, dataset["id"], **BODY)
    padding_passed(session_factory, release_id)
    assert run_worker() == 1  # ends now, 30 minutes late
    with session_factory() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None and release.outcome_visible_at is not None
        # The first doubling of the padding at or after the real end: created_at + 2 h.
        assert release.outcome_visible_at == release.created_at + 2 * (
            release.visible_at - release.created_at
        )
    # The analyst and the owner see a fixed "running", on every route.
    seen = fetch_release(padded_client, keys.analyst, release_id)
    assert (seen["status"], seen["result"], seen["reason"]) == ("running", None, None)
    assert fetch_release(padded_client, keys.owner, release_id) == seen
    assert listed(padded_client, keys.analyst, "running") == 1
    assert listed(padded_client, keys.analyst, "succeeded") == 0
    [item] = padded_client.get("/v1/releases", headers=bearer(keys.analyst)).json()["items"]
    assert item["status"] == "running" and item["result"] is None
    # A long poll is not answered at the real end: it sleeps to the next step (or its bound).
    started = time.monotonic()
    waited = padded_client.get(
        f"/v1/releases/{release_id}", headers=bearer(keys.analyst), params={"wait": 0.5}
    )
    assert waited.json()["status"] == "running" and time.monotonic() - started >= 0.5
    # 31 minutes later, past the step: shown everywhere.
    shift(session_factory, release_id, timedelta(minutes=31))
    seen = fetch_release(padded_client, keys.analyst, release_id)
    assert seen["status"] == "succeeded" and len(seen["result"]["basis"]) == 5
    assert listed(padded_client, keys.analyst, "succeeded") == 1
    assert listed(padded_client, keys.analyst, "running") == 0


def test_an_unfinished_release_past_its_visible_at_shows_running_not_its_real_state(
    padded_client, keys, dataset, worker, session_factory
):
    # Queued or claimed: the claim's moment would tell when the job before it ended.
    waiting = post_release(padded_client, keys.analyst, dataset["id"], **BODY)
    claimed = post_release(padded_client, keys.analyst, dataset["id"], **BODY)
    padding_passed(session_factory, waiting)
    padding_passed(session_factory, claimed)
    with session_factory.begin() as session:
        session.execute(
            update(Release).where(Release.id == uuid.UUID(claimed)).values(status="running")
        )
    for release_id in (waiting, claimed):
        assert fetch_release(padded_client, keys.analyst, release_id)["status"] == "running"
    assert listed(padded_client, keys.analyst, "queued") == 0
    assert listed(padded_client, keys.analyst, "running") == 2
    # The owner too (it stays queued in the store).
    assert fetch_release(padded_client, keys.owner, waiting)["status"] == "running"
    with session_factory() as session:
        assert session.get(Release, uuid.UUID(waiting)).status == "queued"


def test_a_late_refund_takes_effect_at_the_step_not_at_the_real_end(
    padded_client, keys, dataset, run_worker, session_factory, monkeypatch
):
    release_id = post_release(padded_client, keys.analyst, dataset["id"], **BODY)
    padding_passed(session_factory, release_id)
    # A failure decided before any row is read (not a deletion: a release ending after its
    # dataset's deletion is never refunded, tests/api/test_deletion_race.py).
    monkeypatch.setattr(
        oneshot,
        "execute",
        lambda *args, **kwargs: Outcome.failed(REFUSED_AT_RUN_REASON, refund=True),
    )
    before = utcnow()
    run_worker()  # failed, refunded: nothing was read
    with session_factory() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None and release.status == "failed" and release.refunded
        refund = session.execute(
            select(LedgerEntry).where(
                LedgerEntry.release_id == release.id, LedgerEntry.kind == "refund"
            )
        ).scalar_one()
        assert refund.created_at == release.outcome_visible_at > before + timedelta(minutes=29)
    seen = fetch_release(padded_client, keys.analyst, release_id)
    assert (seen["status"], seen["refunded"]) == ("running", False)


def test_lateness_is_counted_for_the_operator(
    padded_client, keys, dataset, run_worker, session_factory
):
    late = post_release(padded_client, keys.analyst, dataset["id"], **BODY)
    post_release(padded_client, keys.analyst, dataset["id"], **BODY)  # on time
    padding_passed(session_factory, late)
    assert run_worker() == 2
    queue = padded_client.get("/v1/queue", headers=bearer(keys.admin))
    assert queue.status_code == 200 and queue.json()["late"] == {"analyze_gauss": 1}
    metrics = padded_client.get("/metrics", headers=bearer(keys.admin)).text
    assert 'dpss_release_late_total{mechanism="analyze_gauss"} 1.0' in metrics
    # Analysts have neither.
    assert padded_client.get("/v1/queue", headers=bearer(keys.analyst)).status_code == 403


def test_a_late_continual_epoch_shows_at_the_next_step_of_its_schedule(
    padded_client, padded_settings, keys, upload_dataset, rng, session_factory, store
):
    dataset = upload_dataset(padded_client, keys.owner, rng.normal(size=(40, 5)), row_norm_bound=3)
    release_id = post_release(
        padded_client, keys.analyst, dataset["id"], mechanism="continual_gauss", k=2,
        epsilon="1", delta="1e-6", params={"horizon": 2},
    )  # fmt: skip
    # Its first batch committed 90 minutes ago, the epoch padded_client an hour: 30 minutes late.
    ago = timedelta(minutes=90)
    with session_factory.begin() as session:
        for batch in session.execute(
            select(DatasetBatch).where(DatasetBatch.dataset_id == uuid.UUID(dataset["id"]))
        ).scalars():
            batch.created_at -= ago
    padding_passed(session_factory, release_id)
    before = utcnow()
    assert Worker(session_factory, store, padded_settings, worker_id="w").run_pending() == 1
    with session_factory() as session:
        [epoch] = session.execute(select(ReleaseEpoch)).scalars().all()
        # Fixed before it ran: created_at of the batch + 1 h (30 minutes ago); late, so the
        # next step: + 2 h.
        assert epoch.visible_at >= before + timedelta(minutes=29)
    seen = fetch_release(padded_client, keys.analyst, release_id)
    assert seen["epochs_done"] == 0 and seen["latest_epoch"] is None
    epochs = padded_client.get(f"/v1/releases/{release_id}/epochs", headers=bearer(keys.analyst))
    assert epochs.json()["total"] == 0
