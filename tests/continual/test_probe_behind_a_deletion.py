"""A release requested after an owner deleted a dataset under a pending epoch must not tell
whether a worker was still on that epoch.

The owner appends a batch (the continual release's epoch is pending), then deletes the dataset.
A worker that claimed the epoch before the deletion runs it to its end and then stores the
release's end in the same claim (:func:`service.continual.next_input`); one that had not
claimed it claims the release to store its end (milliseconds). Either is a job in the workers'
order ahead of a release requested after the deletion. The probe's term left out every release
whose dataset was deleted (:func:`service.padding_epochs._pending`), so a cheap probe showed at
its ``visible_at`` if the worker had ended the epoch at once and a step later if it was still
on it: anyone read the epoch's real end, and through it whether the jobs ahead of it (any
dataset's) had ended.

Three worlds differ only in what the worker really did: it ran the epoch at once and then the
end after the deletion; it had not claimed the epoch and stored the end at once after the
deletion; or it claimed the epoch before the deletion and is still running it when the probe is
requested, ending it within the epoch's padding. The probe must show at the same step (its
``visible_at``: ``j`` = 0) in all, and its ``visible_at`` must be the same public moment: the
latest of the epoch's next public moment and the end's due moment, plus its own padding.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

from service.config import Settings
from service.db.models import Dataset, Release, utcnow
from service.padding import late_schedule, next_late_step
from service.padding_epochs import end_due
from tests.continual.conftest import Worlds, epoch_rated
from tests.continual.test_probe_behind_an_epoch import PAD, PROBE, RUN


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return epoch_rated(settings, PAD)


def test_a_probe_after_a_deletion_shows_the_same_whatever_the_worker_does(
    make_key: Any, worlds: Worlds, settings: Settings
) -> None:
    rng = np.random.default_rng(11)
    probed = worlds.dataset(make_key("owner"), rng, 200)
    shown: dict[str, int] = {}
    after: dict[str, timedelta] = {}
    for world in ("ran", "unclaimed", "running"):
        mine, release = worlds.start(rng, horizon=3)
        epoch = worlds.deleted_world(settings, rng, world, mine, release)
        with worlds.session_factory() as session:
            row = session.get(Release, release)
            dataset = session.get(Dataset, uuid.UUID(mine))
            assert row is not None and dataset is not None
            assert dataset.deleted_at is not None and row.visible_at is not None
            # What the worker really stored (so the worlds really differ).
            expected = (
                ("running", 1) if world == "running" else ("failed", 2 if world == "ran" else 1)
            )
            assert (row.status, row.epochs_done) == expected
            # The end's due moment, the worker's formula (service.continual._end_visible_at:
            # the epoch pending at the deletion ahead of it counted).
            due = end_due(session, settings, row, dataset.deleted_at)
            requested = row.created_at

        # The busy world's epoch ends three quarters of the way to its next public moment.
        created, probe_visible, step, shown[world] = worlds.probe_behind(
            probed, PROBE, epoch, world == "running", RUN
        )
        end_step = next_late_step(requested, due, created)
        after[world] = probe_visible - max(step, end_step)
    assert shown == {"ran": 0, "unclaimed": 0, "running": 0}, shown
    for world, moment in after.items():
        assert abs(moment - timedelta(seconds=PAD)) <= timedelta(microseconds=2), (world, moment)


def test_an_epoch_behind_a_deletion_shows_the_same_whatever_the_worker_does(
    make_key: Any, worlds: Worlds, settings: Settings
) -> None:
    """The same worlds, and behind them another release's epoch on a small batch appended
    after the deletion (its own padding about the floor): the worker runs it after the
    deleted release's epoch and end, so its padding must count them (:class:`service.
    padding_epochs._Chain`), or it shows late when the worker was still on that epoch."""
    rng = np.random.default_rng(13)
    other_owner = make_key("owner")
    shown: dict[str, int] = {}
    for world in ("ran", "unclaimed", "running"):
        mine, release = worlds.start(rng, horizon=3)
        theirs = worlds.dataset(other_owner, rng, 40)
        behind = worlds.continual(theirs, 3)
        assert worlds.worker.run_pending() == 1  # its epoch 1
        worlds.backdate(timedelta(minutes=10), behind)
        start, visible = worlds.deleted_world(settings, rng, world, mine, release)
        worlds.append(theirs, rng, 3, owner=other_owner)
        appended = utcnow()
        behind_start, behind_visible = worlds.schedule(settings, behind)
        # The busy world's epoch ends three quarters of the way to its next public moment;
        # the epoch behind runs after it (and the end), else at once.
        step = next_late_step(start, visible, appended)
        ended = (appended + (step - appended) * 0.75 if world == "running" else appended) + RUN
        shown[world] = late_schedule(behind_start, behind_visible, ended)[1]
        if world != "running":
            assert worlds.worker.run_pending() == 1  # the epoch behind: no queue of the next world
    assert shown == {"ran": 0, "unclaimed": 0, "running": 0}, shown
