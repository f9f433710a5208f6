"""A deletion removes the dataset's file before its transaction commits (so no raw rows stay on
disk if the commit fails). A job that opened the file in between found it gone while the
dataset's row still read "not deleted", and was refunded: the one case left in which a refund
told that the job ran after the deletion, that is when the job ahead of it in the shared queue
ended (tests/api/test_deletion_race.py has the rest). The worker now takes the dataset's row
lock before deciding a refund, so it waits for the deletion and refunds nothing.

Real commits and separate connections (``committed_db``): the rolled-back test transaction
shares one connection, whose sessions see each other's uncommitted writes.
"""

from __future__ import annotations

import threading
import uuid

from fastapi.testclient import TestClient
from sqlalchemy import select

from service.db.models import Dataset, LedgerEntry, Release, utcnow
from service.worker import Worker
from tests.conftest import bearer
from tests.test_concurrency import RELEASE, service_with_dataset


def test_a_job_that_finds_the_file_gone_while_the_deletion_commits_is_not_refunded(
    committed_db, settings, store
):
    app, factory, analyst, releases_url = service_with_dataset(committed_db, settings, "1")
    with TestClient(app) as client:
        answer = client.post(releases_url, headers=bearer(analyst), json=RELEASE)
    assert answer.status_code == 202, answer.text
    release_id = uuid.UUID(answer.json()["id"])
    dataset_id = uuid.UUID(releases_url.split("/")[3])
    worker = Worker(factory, store, settings, worker_id="race")
    ran: list[int] = []
    job = threading.Thread(target=lambda: ran.append(worker.run_pending()))
    with factory() as deleting:
        dataset = deleting.get(Dataset, dataset_id)
        assert dataset is not None and dataset.file_name is not None
        file_name = dataset.file_name
        dataset.deleted_at, dataset.file_name = utcnow(), None
        deleting.flush()
        store.purge(file_name)
        job.start()
        # PostgreSQL: the job claims the release, finds the file gone and waits on the
        # dataset's row; SQLite: it waits for the write lock. The deletion commits first.
        job.join(timeout=2.0)
        deleting.commit()
    job.join(timeout=120)
    assert ran == [1]
    with factory() as session:
        release = session.get(Release, release_id)
        assert release is not None
        assert (release.status, release.refunded) == ("failed", False)
        kinds = session.scalars(
            select(LedgerEntry.kind).where(LedgerEntry.dataset_id == dataset_id)
        ).all()
        assert list(kinds) == ["charge"]
