"""A release requested after a batch is appended must not tell whether the batch's epoch ran.

When an owner appends a batch, the continual release on it has a pending epoch, and a worker
takes it before any one-shot job requested after the batch (:func:`service.claims.
waiting_first`): a release requested meanwhile waits behind the whole epoch. The epoch's own
outcome is hidden until its public moment (its ``visible_at``, else a step of its late
schedule: :func:`service.continual.store_epoch`), but the probe's padding counted one-shot
jobs and registrations only (:func:`service.padding_queue.queue_seconds`), never an epoch. So a
cheap probe showed at its ``visible_at`` if the epoch had ended (or had not begun: a job ahead
of it still ran) and a step later if the worker was still on it: anyone read the epoch's real
end, and through it whether the jobs ahead of it had ended, long before either showed.

The three worlds differ only in what the worker really does with the pending epoch: it ended at
once (the real worker runs it before the probe is requested), it ended the release at once (a
refusal at run: the release's end, not shown yet, is stored), or it is still running when the
probe is requested and ends before the epoch's next public moment (its ``visible_at``, or once
it is late, within the same step of its late schedule). What the worker then stores for the
probe follows the worker's own rule (:func:`service.padding.late_schedule` from the probe's real
end, which comes after the epoch in the busy world), and the epoch's schedule is the worker's
own (:func:`service.continual.pending_padding`); the probe must show at the same step of its
schedule in all (at its ``visible_at``), and its ``visible_at`` must be the same public moment
(the epoch's next one plus the probe's own padding). No sleeping: the moments are computed.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from service import continual
from service.config import Settings
from service.db.models import Dataset, DatasetBatch, Release, ReleaseEpoch, utcnow
from service.jobs import REFUSED_AT_RUN_REASON, Outcome
from service.padding import next_late_step
from service.padding_epochs import epoch_padding, epoch_seconds
from tests.continual.conftest import D, Worlds, epoch_rated

PAD = 1.0
PROBE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}
#: The probe's own run, after the worker is free.
RUN = timedelta(milliseconds=10)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return epoch_rated(settings, PAD)


@pytest.mark.parametrize("late", [True, False], ids=["late", "on time"])
def test_a_probe_behind_an_epoch_shows_the_same_whatever_the_worker_does(
    late: bool,
    make_key: Any,
    worlds: Worlds,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker, session_factory = worlds.worker, worlds.session_factory
    real = continual.compute_epoch
    failing = {"on": False}

    def compute_epoch(*args: Any, **kwargs: Any) -> continual.EpochOutput:
        # The third world: the epoch ran at once and ended the release (refused at run).
        if failing["on"]:
            return continual.EpochOutput(None, Outcome.failed(REFUSED_AT_RUN_REASON))
        return real(*args, **kwargs)

    monkeypatch.setattr(continual, "compute_epoch", compute_epoch)
    rng = np.random.default_rng(5)
    probed = worlds.dataset(make_key("owner"), rng, 200)
    #: The step of its schedule the probe shows at (0: at its visible_at).
    shown: dict[str, int] = {}
    #: The probe's visible_at after the epoch's next public moment (its public padding).
    after_step: dict[str, timedelta] = {}
    for world in ("ended", "failed", "running"):
        mine, release = worlds.start(rng, horizon=3)
        worlds.append(mine, rng, 30)
        if late:
            # The batch appended 2.05 of its epoch's paddings ago: past its visible_at and its
            # first late step, not shown until its next step.
            start, visible = worlds.schedule(settings, release)
            with session_factory.begin() as session:
                batch = session.get(DatasetBatch, (uuid.UUID(mine), 1))
                assert batch is not None
                batch.created_at = utcnow() - (visible - start) * 2.05
        start, visible = worlds.schedule(settings, release)
        assert (visible < utcnow()) == late
        if world in ("ended", "failed"):
            failing["on"] = world == "failed"
            assert worker.run_pending() == 1  # the epoch, at once (late: shown at its step)
            failing["on"] = False
            with session_factory() as session:
                row = session.get(Release, release)
                assert row is not None
                # What the worker really stored (so the worlds really differ).
                assert (row.status, row.epochs_done) == (
                    ("failed", 1) if world == "failed" else ("running", 2)
                )
        else:
            with session_factory.begin() as session:
                row = session.get(Release, release)
                assert row is not None and row.epochs_done == 1
                worlds.hold_lease(session, release)

        # The epoch's next public moment after the probe's request: the busy world's epoch
        # ends within it (three quarters of the way), after the probe's request. The one
        # worker runs the probe at once, or after the epoch. (The step, not the moment: the
        # two worlds' requests are milliseconds apart from their epoch's step, so their
        # paddings are.)
        _, probe_visible, step, shown[world] = worlds.probe_behind(
            probed, PROBE, (start, visible), world == "running", RUN
        )
        assert step == (start + (visible - start) * 4 if late else visible)
        after_step[world] = probe_visible - step
    assert shown == {"ended": 0, "failed": 0, "running": 0}, shown
    # The probe's visible_at is the epoch's next public moment plus its own padding, in both
    # worlds alike (not the moment of the request, which differs by milliseconds; to the
    # microsecond a timedelta of float seconds rounds to).
    for world, moment in after_step.items():
        assert abs(moment - timedelta(seconds=PAD)) <= timedelta(microseconds=2), (world, moment)


def _continual_waiting_for(
    session: Session, now: datetime, *, reference: bool = False
) -> tuple[Release, Dataset]:
    """A continual release, requested an hour ago with epoch 1 shown, whose dataset had batch
    1 committed a second ago: epoch 2 is pending."""
    dataset = Dataset(
        name="waiting",
        n_rows=300,
        n_cols=D,
        epsilon_total=Decimal(10),
        delta_total=Decimal("1e-3"),
        file_name="waiting.npy",
        n_batches=2,
        created_at=now - timedelta(hours=2),
        reference={"root": "x"} if reference else None,
    )
    session.add(dataset)
    session.flush()
    session.add_all(
        [
            DatasetBatch(dataset_id=dataset.id, seq=0, n_rows=200, row_offset=0,
                         created_at=now - timedelta(hours=2)),
            DatasetBatch(dataset_id=dataset.id, seq=1, n_rows=100, row_offset=200,
                         created_at=now - timedelta(seconds=1)),
        ]
    )  # fmt: skip
    release = Release(
        dataset_id=dataset.id,
        mechanism="continual_gauss",
        k=1,
        epsilon=Decimal(1),
        delta=Decimal("1e-6"),
        params={"horizon": 3},
        request_hash="x",
        status="running",
        epochs_done=1,
        created_at=now - timedelta(hours=1),
        visible_at=now - timedelta(minutes=59),
    )
    session.add(release)
    session.flush()
    session.add(
        ReleaseEpoch(release_id=release.id, epoch=1, batch_seq=0, n_rows_read=200,
                     visible_at=now - timedelta(minutes=59),
                     reference_check="unchanged" if reference else None,
                     reference_shown_at=now - timedelta(minutes=50) if reference else None)
    )  # fmt: skip
    session.flush()
    return release, dataset


@pytest.mark.parametrize("stored", ["nothing", "the epoch", "the release's end"])
def test_the_term_reads_what_is_shown_not_what_is_stored(
    stored: str, settings: Settings, session_factory: sessionmaker[Session]
) -> None:
    """At a moment before the pending epoch's ``visible_at``, whatever the worker stored
    (nothing yet, the epoch, or the release's end on it), the term is the wait until the
    epoch's ``visible_at`` as the worker's claim computes it."""
    now = utcnow()
    with session_factory() as session:
        release, dataset = _continual_waiting_for(session, now)
        visible, padding = epoch_padding(session, settings, release, dataset, 2)
        assert visible > now  # (5 s: the operator's rate above)
        if stored == "the epoch":
            session.add(ReleaseEpoch(release_id=release.id, epoch=2, batch_seq=1,
                                     n_rows_read=100, visible_at=visible))  # fmt: skip
            release.epochs_done = 2
        elif stored == "the release's end":
            release.status, release.reason, release.outcome_visible_at = "failed", "x", visible
        session.flush()
        wait = epoch_seconds(session, settings, now)
        assert wait == pytest.approx((visible - now).total_seconds(), abs=1e-6)
        # Past the epoch's visible_at, the epoch (or the end) shows: nothing is pending then
        # (or, with nothing stored, the epoch is late: its next step).
        later = visible + timedelta(microseconds=1)
        after = epoch_seconds(session, settings, later)
        if stored == "nothing":
            step = next_late_step(visible - padding, visible, later)
            assert after == pytest.approx((step - later).total_seconds(), abs=1e-6)
        else:
            assert after == 0.0
        session.rollback()


def test_an_epoch_shown_failed_for_a_changed_object_is_not_pending(
    settings: Settings, session_factory: sessionmaker[Session]
) -> None:
    """On a dataset by reference an epoch past its ``visible_at`` counts until its re-check's
    verdict shows (analysts do not see it before); once a ``changed`` verdict shows, the
    release is shown ``failed`` there (service.visibility) and nothing of it is pending."""
    now = utcnow()
    with session_factory() as session:
        release, dataset = _continual_waiting_for(session, now, reference=True)
        visible, padding = epoch_padding(session, settings, release, dataset, 2)
        session.add(ReleaseEpoch(release_id=release.id, epoch=2, batch_seq=1, n_rows_read=100,
                                 visible_at=visible, reference_check="pending"))  # fmt: skip
        release.epochs_done = 2
        session.flush()
        later = visible + timedelta(microseconds=1)
        step = next_late_step(visible - padding, visible, later)
        # Stored and past its visible_at, but not shown: still pending, to its next step.
        assert epoch_seconds(session, settings, later) == pytest.approx(
            (step - later).total_seconds(), abs=1e-6
        )
        epoch = session.get(ReleaseEpoch, (release.id, 2))
        assert epoch is not None
        epoch.reference_check, epoch.reference_shown_at = "changed", later
        session.flush()
        assert epoch_seconds(session, settings, later) == 0.0
        session.rollback()
