"""A continual release's end after its dataset's deletion must not tell its own analysts
whether the epoch claimed before the deletion had ended.

The owner appends a batch (the release's epoch is pending), then deletes the dataset. The end's
due moment followed the deletion and the release's own padding only (plus the one-shot queue at
the deletion), counting no epoch ahead of it: a worker that had claimed the epoch before the
deletion and ran it past that moment stored the end late, and the end showed a late step. The
release's analysts read from it whether the epoch (and the jobs ahead of it) had really ended.

Two worlds differ only in what the worker really did: it ran the epoch at once, then stored the
end at once after the deletion; or it was still on the epoch until just before the epoch's next
public moment, and stored the end then. The end's observables (status, reason, its
``outcome_visible_at`` relative to the epoch's public moment, and its step of the late schedule)
must be the same.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest

from service import continual
from service.config import Settings
from service.db.models import Release
from service.padding import late_schedule, next_late_step
from tests.continual.conftest import Worlds, epoch_rated

PAD = 1.0


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return epoch_rated(settings, PAD)


def test_an_end_after_a_deletion_shows_the_same_whatever_the_worker_does(
    worlds: Worlds, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, session_factory = worlds.worker, worlds.session_factory
    rng = np.random.default_rng(17)
    seen: dict[str, tuple[Any, ...]] = {}
    moments: dict[str, tuple[datetime, datetime, datetime]] = {}
    for world in ("ended", "busy"):
        mine, release = worlds.start(rng, horizon=3)
        # A batch larger than the dataset's first one: the epoch's padding exceeds the
        # release's own, so the busy worker runs past the end's former due moment.
        start, visible = worlds.deleted_world(
            settings, rng, world, mine, release, rows=90, end=False
        )
        # The busy worker ends the epoch (and stores the end) just before the epoch's next
        # public moment after the deletion; the other stores the end at once.
        with session_factory() as session:
            row = session.get(Release, release)
            assert row is not None
            ended: datetime = (
                next_late_step(start, visible, row.created_at) - timedelta(milliseconds=5)
                if world == "busy"
                else continual.utcnow()
            )
        if world == "busy":
            monkeypatch.setattr(continual, "utcnow", lambda at=ended: at)
        worker.run_pending()
        monkeypatch.undo()
        with session_factory() as session:
            row = session.get(Release, release)
            assert row is not None and row.outcome_visible_at is not None
            seen[world] = (row.status, row.reason, row.outcome_visible_at - visible)
            moments[world] = (row.created_at, visible, ended)
    assert seen["ended"][:2] == seen["busy"][:2] == ("failed", seen["ended"][1]), seen
    assert abs(seen["ended"][2] - seen["busy"][2]) <= timedelta(microseconds=2), seen
    # The step of its late schedule each end shows at, from the due moment the ended world
    # shows (on time there): the same (0) in both.
    steps = {
        world: late_schedule(created, shown + seen["ended"][2], ended)[1]
        for world, (created, shown, ended) in moments.items()
    }
    assert steps == {"ended": 0, "busy": 0}, (steps, seen)
