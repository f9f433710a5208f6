"""A continual release on a dataset by reference keeps running, hidden, in the world where an
epoch read before the owner changed an object; in the other world it ended at that epoch. The
owner then appends a batch by reference: in the first world alone a worker takes the release's
next epoch (both worlds show it ``failed`` from the first epoch's re-check on). That hidden job
takes a worker's time right after the batch's registration ends, and so can delay what follows
it in the shared queue (the owner's next registration, padded by the floor alone; anyone's job).

Before, a change keeping an object's size and mtime passed the job's identity check, and the
epoch read its batch's row groups in full (and, the batch being another object, stored the
epoch): hidden work of the batch's size in one world only. Now the identity carries the inode
change time (:mod:`service.reference.objects`), so the job ends at its identity check, before
reading a byte: its cost is a stat per object (the object count is the owner's own, public to
them) and the job's bookkeeping, whatever the data. On both databases.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from service.db.models import Dataset, DatasetBatch, Release, utcnow
from service.reference import objects
from tests.conftest import bearer
from tests.reference import helpers
from tests.reference import test_reference_change_race as base
from tests.reference.test_integrity import plain_parquet
from tests.reference.test_reference_change_race import (
    PADDING,
    Race,
    batch_rewritten,
    continual_release,
)

# The race's fixtures (its padding, roots and rows, the denied opens, the fixtures in one).
settings = base.settings
rows = base.rows
permission_denied = base.permission_denied
race = base.race


def append_batch(race: Race, dataset_id: str, name: str) -> None:
    """A third batch (a fourth object) appended by reference, registered, as if shown."""
    sign = 1 if name == "early" else -1  # one object backs one live dataset
    plain_parquet(race.root / name / "d.parquet", sign * race.rows[100:200] / 3)
    appended = race.client.post(
        f"/v1/dataset-references/{dataset_id}/batches",
        headers=bearer(race.keys.owner),
        json={"uri": str(race.root / name / "d.parquet")},
    )
    assert appended.status_code == 202, appended.text
    assert helpers.run_registrations(race.client) == 1
    with race.factory.begin() as session:
        row = session.get(Dataset, uuid.UUID(dataset_id))
        assert row is not None and row.n_batches == 3, (row.batch_status, row.batch_reason)
        assert row.batch_shown_at is not None
        row.batch_visible_at = row.batch_shown_at = utcnow() - PADDING
        batch = session.get(DatasetBatch, (row.id, 2))
        assert batch is not None


def test_the_release_left_running_reads_no_byte_after_the_change(
    race: Race, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = continual_release(3)
    worlds = {
        name: race.world(name, batch_rewritten, first, True, release)
        for name, first in (("early", False), ("late", True))
    }
    with race.factory() as session:
        stored = {n: session.get(Release, uuid.UUID(r)) for n, (_, r) in worlds.items()}
        assert {n: row.status for n, row in stored.items() if row} == {
            "early": "running",
            "late": "failed",
        }
    read: list[int] = []
    real = objects._Object.read

    def counted(self: Any, start: int, length: int) -> bytes:
        read.append(length)
        return bytes(real(self, start, length))

    monkeypatch.setattr(objects._Object, "read", counted)
    jobs = {}
    for name, (dataset_id, _) in worlds.items():
        append_batch(race, dataset_id, name)
        read.clear()
        jobs[name] = (race.worker.run_pending(), sum(read))
    # The hidden job exists in the early world only; it reads nothing of any object.
    assert jobs == {"early": (1, 0), "late": (0, 0)}
    with race.factory() as session:
        row = session.get(Release, uuid.UUID(worlds["early"][1]))
        assert row is not None and (row.status, row.epochs_done) == ("failed", 2)
