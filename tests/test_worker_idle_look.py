"""The worker's idle look (:meth:`service.worker.Worker.idle_look`): the transaction that stores a
job's end asks whether anything else is claimable, and the loops skip the empty claim and the
empty registration look when it says no. It must never say no while a claim would find a job
(a job left to the next poll), and the loops must still run every job queued behind it."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from service import registration
from service.db.models import Dataset, Release, utcnow
from service.worker import Worker
from tests.test_worker import queue_release


def _look(worker: Worker, session_factory: Any, release_id: uuid.UUID) -> bool:
    with session_factory() as session:
        params = {"now": utcnow(), "worker_id": worker.worker_id, "release_id": release_id}
        return bool(session.execute(worker.idle_look(), params).scalar_one())


def _claimable(worker: Worker) -> bool:
    """Whether the worker's own claims would find something (each claim rolled back)."""
    job = worker.claim()
    found = job is not None or registration.claim(worker) is not None
    return found


@pytest.mark.parametrize(
    "state",
    [
        "nothing else",
        "queued",
        "expired lease",
        "leased to another worker",
        "leased to this worker",
        "finished",
        "registering dataset",
        "registering, leased to another worker",
    ],
)
def test_the_idle_look_finds_what_the_claims_would_find(
    client, keys, upload_dataset, rng, session_factory, store, settings, state
):
    worker = Worker(session_factory, store, settings, worker_id="me")
    done = uuid.uuid4()  # the release whose end is being stored: never counted
    expected = state in {"queued", "expired lease", "leased to this worker", "registering dataset"}
    if state != "nothing else" and not state.startswith("registering"):
        dataset, release = queue_release(client, keys, upload_dataset, rng)
        now = utcnow()
        values: dict[str, Any] = {
            "queued": {},
            "expired lease": dict(
                status="running", lease_owner="gone", lease_expires_at=now - timedelta(seconds=1)
            ),
            "leased to another worker": dict(
                status="running", lease_owner="other", lease_expires_at=now + timedelta(hours=1)
            ),
            "leased to this worker": dict(
                status="running", lease_owner="me", lease_expires_at=now + timedelta(hours=1)
            ),
            "finished": dict(status="succeeded"),
        }[state]
        if values:
            with session_factory.begin() as session:
                session.execute(
                    update(Release).where(Release.id == uuid.UUID(release["id"])).values(**values)
                )
    elif state.startswith("registering"):
        dataset = upload_dataset(client, keys.owner, rng.normal(size=(10, 3)) * 0.1)
        lease = (
            dict(
                registration_lease_owner="other",
                registration_lease_expires_at=utcnow() + timedelta(hours=1),
            )
            if "another" in state
            else {}
        )
        with session_factory.begin() as session:
            session.execute(
                update(Dataset)
                .where(Dataset.id == uuid.UUID(dataset["id"]))
                .values(registration_status=registration.REGISTERING, **lease)
            )
    assert _look(worker, session_factory, done) is expected
    # The look agrees with the claims themselves (a registration claimed here is not run).
    assert _claimable(worker) is expected


def test_the_release_being_stored_is_not_counted(
    client, keys, upload_dataset, rng, session_factory, store, settings
):
    """The job whose end the transaction stores is still ``running`` under this worker's lease
    until that transaction commits: the look leaves it out by id."""
    queue_release(client, keys, upload_dataset, rng)
    worker = Worker(session_factory, store, settings, worker_id="me")
    job = worker.claim()
    assert job is not None
    assert _look(worker, session_factory, job.release_id) is False
    assert _look(worker, session_factory, uuid.uuid4()) is True  # it is claimable by its owner


class _Counting(Worker):
    """A worker counting its claims and registration looks."""

    claims = 0
    registrations = 0

    def claim(self) -> Any:
        self.claims += 1
        return super().claim()

    def run_registration(self) -> bool:
        self.registrations += 1
        return super().run_registration()


def test_after_the_last_job_the_loop_skips_the_empty_claim_and_registration_look(
    client, keys, upload_dataset, rng, session_factory, store, settings
):
    queue_release(client, keys, upload_dataset, rng)
    worker = _Counting(session_factory, store, settings)
    assert worker.run_pending() == 1
    # One claim (the job's); the store's look found nothing: no empty claim, no empty look.
    assert (worker.claims, worker.registrations) == (1, 0)
    # Nothing queued at all: the loop looks as before (a claim and a registration look).
    assert worker.run_pending() == 0
    assert (worker.claims, worker.registrations) == (2, 1)


def test_jobs_queued_behind_the_one_stored_all_run(
    client, keys, upload_dataset, rng, session_factory, store, settings
):
    releases = [queue_release(client, keys, upload_dataset, rng)[1] for _ in range(3)]
    worker = _Counting(session_factory, store, settings)
    assert worker.run_pending() == 3
    # Each store saw the next job (claimed at once); the last one's look found nothing.
    assert (worker.claims, worker.registrations) == (3, 0)
    with session_factory() as session:
        statuses = {
            session.get(Release, uuid.UUID(release["id"])).status  # type: ignore[union-attr]
            for release in releases
        }
    assert statuses == {"succeeded"}


def test_a_job_that_ends_unstored_leaves_the_loop_looking(
    client, keys, upload_dataset, rng, session_factory, store, settings
):
    """Only a committed store's answer counts: a job whose outcome was not stored (here its
    lease lost to another worker) is followed by the usual claim and registration look."""
    queue_release(client, keys, upload_dataset, rng)
    worker = _Counting(session_factory, store, settings, worker_id="me")
    job = worker.claim()
    assert job is not None
    worker._idle_after_store = True  # left over from an earlier job: must not be reused
    with session_factory.begin() as session:
        session.execute(update(Release).values(lease_owner="other"))
    assert worker.process(job) == "lost"
    assert worker._nothing_after_job() is False
