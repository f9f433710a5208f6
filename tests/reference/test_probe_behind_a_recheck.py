"""A release requested while an epoch's re-check (:mod:`service.reference_recheck`) is due
must not tell whether the re-check has run.

The re-check runs on a thread of its own beside the worker's job loop
(:meth:`service.worker.Worker.run_forever`), never in the claim order: no job waits behind it.
Its only trace in a probe's padding is through what it stores, the verdict and its public
moment ``reference_shown_at``, and the probe's term (:func:`service.padding_epochs.
epoch_seconds`) reads that only once it is shown (:func:`service.padding_epochs.unverified`):
an epoch counts as pending until its verdict shows, whether the re-check ran or not.

Two worlds at one moment, between the epoch's due moment and its verdict's: the re-check has
not run (world B), or it ran at once (world A). The probe's queue term is the same in both, and
in world B the worker runs the probe at once, the re-check still pending: the job loop does not
wait for it. On both databases.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import select

from service.db.models import DatasetBatch, ReleaseEpoch, utcnow
from service.padding_epochs import epoch_seconds, request_queue_seconds
from service.padding_queue import padding_model
from service.reference_recheck import recheck_due
from tests.conftest import bearer
from tests.reference import test_reference_change_race as base
from tests.reference.test_reference_change_race import (
    GRACE,
    PADDING,
    RELEASE,
    Race,
    continual_release,
    later,
)

# The race's fixtures (its padding, roots and rows, the denied opens, the fixtures in one).
settings = base.settings
rows = base.rows
permission_denied = base.permission_denied
race = base.race


def _checks(race: Race, release_id: str) -> list[str | None]:
    with race.factory() as session:
        return list(
            session.scalars(
                select(ReleaseEpoch.reference_check)
                .where(ReleaseEpoch.release_id == uuid.UUID(release_id))
                .order_by(ReleaseEpoch.epoch)
            ).all()
        )


def _terms(race: Race, now: object) -> tuple[float, float]:
    """The pending epochs' term and a release's whole queue term at ``now``."""
    with race.factory() as session:
        assert isinstance(now, type(utcnow()))
        model = padding_model(session, race.settings, now)
        return (
            epoch_seconds(session, race.settings, now),
            request_queue_seconds(session, race.settings, model, now),
        )


def test_a_probe_shows_the_same_whether_an_epochs_recheck_ran(race: Race) -> None:
    # Epochs 1 and 2 stored, each waiting for its re-check; the release waits for batch 3.
    dataset_id, release_id = race.released("kept", batch=True, release=continual_release(3))
    assert _checks(race, release_id) == ["pending", "pending"]
    with race.factory.begin() as session:
        # The batches in commit order (register() dates the appended one back a padding).
        first = session.get(DatasetBatch, (uuid.UUID(dataset_id), 0))
        second = session.get(DatasetBatch, (uuid.UUID(dataset_id), 1))
        assert first is not None and second is not None
        first.created_at = min(first.created_at, second.created_at - timedelta(seconds=1))
    # Past epoch 1's due moment (its visible_at), before its verdict's (a grace later).
    later(race.factory, dataset_id, PADDING + GRACE / 3)
    now = utcnow()

    # World B: the re-check thread has not got to it. The probe is claimed and run at once.
    waiting = _terms(race, now)
    probe = race.client.post(
        f"/v1/datasets/{dataset_id}/releases", headers=bearer(race.keys.analyst), json=RELEASE
    )
    assert probe.status_code == 202, probe.text
    assert race.worker.run_pending() == 1
    assert _checks(race, release_id) == ["pending", "pending"]  # the job loop ran no re-check

    # World A: the re-check ran at once; its verdict shows a grace after the epoch's due moment.
    assert recheck_due(race.factory, race.settings, utcnow()) == 1
    assert _checks(race, release_id) == ["unchanged", "pending"]
    with race.factory() as session:
        epoch = session.get(ReleaseEpoch, (uuid.UUID(release_id), 1))
        assert epoch is not None and epoch.reference_shown_at is not None
        assert epoch.reference_shown_at > now
    ran = _terms(race, now)

    assert waiting[0] > 0  # the pending epochs count
    assert ran == waiting, (ran, waiting)
