"""A release requested while two or more epochs of one continual release are pending must not
tell whether the worker is still on a later one.

Batches appended back to back leave several epochs of a release pending; a worker takes each
before any one-shot job requested after its batch (:func:`service.claims.waiting_first`), so a
probe requested meanwhile waits behind all of them. Its padding counted only the first epoch
not shown (:func:`service.padding_epochs.epoch_seconds`): the later ones' moments followed the
shown moment of the one before, not public until it showed. With a later batch larger than the
first (its epoch padded longer), the probe showed at its ``visible_at`` if the epochs had ended
and a step later if the worker was still on the last one, within that epoch's own padding.

The worlds differ only in what the worker really does: every pending epoch ended at once, or
all but the last ended at once and the worker is still on the last when the probe is
requested, ending it three quarters of the way to its next public moment. The probe must show
at the same step of its schedule in both (at its ``visible_at``), and its ``visible_at`` must be
the last epoch's next public moment plus the probe's own padding. No sleeping: the moments are
computed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service import continual
from service.config import Settings
from service.db.models import DatasetBatch, Release, ReleaseEpoch, utcnow
from service.padding_epochs import epoch_padding, in_order
from tests.continual.conftest import Worlds, epoch_rated
from tests.continual.test_probe_behind_an_epoch import PAD, PROBE, RUN, _continual_waiting_for


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # As in test_probe_behind_an_epoch: an epoch on a 30-row batch modelled at 5 s, far above
    # the probe's padding (the floor).
    return epoch_rated(settings, PAD)


@pytest.mark.parametrize("sizes", [(30, 90), (30, 60, 120)], ids=["two", "three"])
def test_a_probe_behind_several_epochs_shows_the_same_whatever_the_worker_does(
    sizes: tuple[int, ...], make_key: Any, worlds: Worlds, settings: Settings
) -> None:
    worker, session_factory = worlds.worker, worlds.session_factory
    rng = np.random.default_rng(7)
    probed = worlds.dataset(make_key("owner"), rng, 200)
    last = len(sizes) + 1
    shown: dict[str, int] = {}
    after_step: dict[str, timedelta] = {}
    for world in ("ended", "running"):
        mine, release = worlds.start(rng, horizon=last + 1)
        # Back to back: epochs 2 .. last pending. A worker runs a release's pending epochs in
        # one job, so the ones before the last run (at once, in both worlds) before the last
        # batch commits; then the worker ends the last at once, or is still on it.
        for size in sizes[:-1]:
            worlds.append(mine, rng, size)
        assert worker.run_pending() == 1
        worlds.append(mine, rng, sizes[-1])
        if world == "ended":
            assert worker.run_pending() == 1
        with session_factory.begin() as session:
            row = session.get(Release, release)
            assert row is not None
            # What the worker really stored (so the worlds really differ).
            assert row.epochs_done == (last if world == "ended" else last - 1)
            if world == "running":
                worlds.hold_lease(session, release)
            stored = session.scalars(
                select(ReleaseEpoch.visible_at)
                .where(ReleaseEpoch.release_id == release)
                .order_by(ReleaseEpoch.epoch)
            ).all()
            assert list(stored) == sorted(stored)  # shown in order
        start, visible = worlds.schedule(settings, release, last)
        first_start, first_visible = worlds.schedule(settings, release, 2)
        # The later batch's epoch is padded longer: it is the one that matters.
        assert visible - start > first_visible - first_start
        assert visible > first_visible > utcnow()

        _, probe_visible, step, shown[world] = worlds.probe_behind(
            probed, PROBE, (start, visible), world == "running", RUN
        )
        assert step == visible
        after_step[world] = probe_visible - step
    assert shown == {"ended": 0, "running": 0}, shown
    for world, moment in after_step.items():
        assert abs(moment - timedelta(seconds=PAD)) <= timedelta(microseconds=2), (world, moment)


def test_an_epoch_follows_the_due_moment_before_it_and_still_shows_in_order(
    settings: Settings, session_factory: sessionmaker[Session]
) -> None:
    """Epoch 1 shown late (at a step an hour after its formula moment): epoch 2's moment
    follows epoch 1's ``due_at`` (public before epoch 1 shows), not its late step; what epoch 2
    brings (the epoch, or the release's end) still shows no earlier than epoch 1."""
    now = utcnow()
    with session_factory() as session:
        release, dataset = _continual_waiting_for(session, now)
        first = session.get(ReleaseEpoch, (release.id, 1))
        assert first is not None
        first.due_at, first.visible_at = first.visible_at, now + timedelta(hours=1)
        session.flush()
        visible, padding = epoch_padding(session, settings, release, dataset, 2)
        batch = session.get(DatasetBatch, (dataset.id, 1))
        assert batch is not None
        assert visible == batch.created_at + padding  # not epoch 1's late step
        assert in_order(session, release.id, 2, visible) == first.visible_at
        assert in_order(session, release.id, 1, visible) == visible
        # The release's end without epoch 2 (refused at run) shows with epoch 1 too.
        assert continual._end_visible_at(session, settings, release) == first.visible_at
        session.rollback()
