"""A release requested while a registration by reference is pending must not tell whether
the one worker is busy with it.

A worker takes a registration (or a batch) by reference only when no release waits, and then
reads its objects for as long as they take: a release requested meanwhile waits behind that
read. The registration's own end is hidden until its public moment (its ``visible_at``, else a
step of its late schedule: :mod:`service.registration_visibility`), but the probe's padding
counted late *releases* only (:func:`service.padding_queue.late_seconds`), never a
registration. So a cheap probe showed at its ``visible_at`` if the registration's read had
ended (or had not been claimed: a release ahead of it was still running) and a step later if
the worker was still reading: anyone read the registration's real end, and through it whether
the release ahead of it had ended, long before either showed.

The two worlds differ only in what the worker really does with a pending registration (it
ended at once, or it is still reading and ends before the moment its owner sees it end: its
``visible_at`` on a calibrated machine, whose cheap probe is padded far less than a
registration; or, once it is late, within the same step of its late schedule). What the worker
then stores for the probe follows the worker's own rule (:func:`service.padding.late_schedule`
from the probe's real end, which comes after the read in the busy world); the probe must show
at the same step of its schedule in both (at its ``visible_at``).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from service import calibration
from service.config import Settings
from service.db.models import Dataset, Release, utcnow
from service.padding import OVERHEAD, READ, late_schedule
from service.registration_visibility import shown_at
from tests.conftest import bearer
from tests.reference.conftest import Registrations, padded

PAD = 1.0
PROBE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}
#: The probe's own run, after the worker is free.
RUN = timedelta(milliseconds=10)


@pytest.fixture
def settings(settings: Settings, root: Path) -> Settings:
    return padded(settings, root, PAD, release_padding_calibrated=True)


def _set_world(
    session_factory: sessionmaker[Session],
    dataset_id: uuid.UUID,
    kind: str,
    world: str,
    late: bool,
) -> tuple[datetime, datetime]:
    """With ``late``, the registration (or batch) requested 2.05 paddings ago: past its
    ``visible_at`` and its first late step, shown ``registering`` until its next step (4
    paddings after its request); else just requested, shown ``registering`` until its
    ``visible_at``. ``world`` "ended": the worker ended it at once (stored with that moment,
    as :func:`service.registration._end` does); "reading": still leased to the one worker.
    That moment and when the busy world's read really ends (before it)."""
    scale = 2.05 if late else 0.0
    with session_factory.begin() as session:
        row = session.get(Dataset, dataset_id)
        assert row is not None
        now = utcnow()
        if kind == "registration":
            assert row.registration_visible_at is not None
            padding = row.registration_visible_at - row.created_at
            row.created_at = now - padding * scale
            row.registration_visible_at = row.created_at + padding
            requested, visible = row.created_at, row.registration_visible_at
        else:
            assert row.batch_visible_at is not None and row.batch_requested_at is not None
            padding = row.batch_visible_at - row.batch_requested_at
            row.batch_requested_at = now - padding * scale
            row.batch_visible_at = row.batch_requested_at + padding
            requested, visible = row.batch_requested_at, row.batch_visible_at
        step = requested + padding * (4 if late else 1)
        if world == "ended":
            moment = shown_at(requested, visible, now)
            assert moment == step
            if kind == "registration":
                row.registration_shown_at = moment
                row.registration_status, row.registration_reason = "failed", "uri: refused"
            else:
                row.batch_shown_at = moment
                row.batch_status, row.batch_reason = "failed", "uri: refused"
            row.registration_lease_owner = None
        else:
            row.registration_lease_owner = "the one worker"
            row.registration_lease_expires_at = now + timedelta(hours=1)
        return step, now + (step - now) * 0.75


def _forget(
    session_factory: sessionmaker[Session], dataset_id: uuid.UUID, probe: uuid.UUID
) -> None:
    """The world's registration and probe long shown, so that the next world starts afresh."""
    with session_factory.begin() as session:
        release = session.get(Release, probe)
        assert release is not None and release.visible_at is not None
        hour = timedelta(hours=1)
        release.created_at, release.visible_at = (
            release.created_at - hour,
            release.visible_at - hour,
        )
        release.status, release.reason, release.outcome_visible_at = (
            "failed",
            "x",
            release.visible_at,
        )
        row = session.get(Dataset, dataset_id)
        assert row is not None
        past = utcnow() - timedelta(hours=1)
        row.registration_shown_at = row.batch_shown_at = past
        row.registration_status, row.batch_status = "failed", None
        row.registration_lease_owner = None


@pytest.mark.parametrize("late", [True, False], ids=["late", "on time"])
@pytest.mark.parametrize("kind", ["registration", "batch"])
def test_a_probe_behind_a_registration_shows_the_same_whatever_the_worker_does(
    kind: str,
    late: bool,
    registrations: Registrations,
) -> None:
    client, keys = registrations.client, registrations.keys
    root, session_factory = registrations.root, registrations.session_factory
    mine = registrations.upload_dataset(
        client, keys.owner, np.random.default_rng(0).normal(size=(200, 3)) / 4, row_norm_bound=1
    )
    other = registrations.make_key("owner")
    if not late:
        # A calibrated machine: a cheap probe's padding (0.25 s + 2 x its 50 ms overhead +
        # its run) is far below a registration's (the release floor: nothing of the objects
        # is known before the read), so a registration within its own padding, still read
        # when the probe is requested, made the probe late.
        with session_factory.begin() as session:
            calibration.store(
                session,
                "a calibrated worker",
                {("analyze_gauss", 3): 1e9, (OVERHEAD, 0): 1 / 0.05, (READ, 0): 1e9},
            )
    #: The step of its schedule the probe shows at (0: at its visible_at).
    shown: dict[str, int] = {}
    for number, world in enumerate(("ended", "reading")):
        ready = None
        if kind == "batch":
            ready = registrations.registered(other, world, 2 * number)
            with session_factory.begin() as session:
                row = session.get(Dataset, uuid.UUID(ready))
                assert row is not None and row.registration_status == "ready"
                row.registration_shown_at = utcnow() - timedelta(hours=1)  # long shown
        posted = registrations.post(other, kind, root / world / "b1", 2 * number + 1, ready)
        pending = uuid.UUID(posted.id)
        step, read_ends = _set_world(session_factory, pending, kind, world, late)

        probe = client.post(
            f"/v1/datasets/{mine['id']}/releases", headers=bearer(keys.analyst), json=PROBE
        )
        assert probe.status_code == 202, probe.text
        probe_id = uuid.UUID(probe.json()["id"])
        with session_factory() as session:
            row = session.get(Release, probe_id)
            assert row is not None and row.visible_at is not None
            created, visible = row.created_at, row.visible_at
        # The busy world's read ends within the step its owner sees, after the probe's request.
        assert created < read_ends < step
        # The one worker runs the probe at once, or after the read.
        ended = (created if world == "ended" else read_ends) + RUN
        # (The step, not the moment: the two worlds' requests are milliseconds apart from
        # their registration's step, so their paddings are.)
        shown[world] = late_schedule(created, visible, ended)[1]
        _forget(session_factory, pending, probe_id)
    assert shown["ended"] == shown["reading"] == 0, shown
