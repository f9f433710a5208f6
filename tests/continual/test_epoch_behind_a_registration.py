"""A continual epoch whose point comes after a pending registration by reference must be padded
for it.

The workers take a registration (or batch) by reference in the releases' order, its request's
moment (:func:`service.claims.registration_ahead`), so an epoch whose point (its batch's
commit) comes after the registration's request waits behind the registration's read. The
epoch's queue term counted the one-shot jobs and the epochs ahead, never a registration: the
epoch showed at its ``visible_at`` if the read had ended and a step ``j`` later if the worker
was still reading, so its analysts and owner read when another owner's registration (and the
jobs ahead of it) really ended. Now :class:`service.padding_epochs._Chain` adds, at the
epoch's point, the wait until the registration's next public moment there
(:func:`service.padding_queue.registration_seconds`: its ``visible_at``, else the next step of
its late schedule; what is shown, not what the worker did).

The two worlds differ only in what the worker really does with that registration, already late
at the batch's commit (it ended at once, or it is still reading and ends within the step its
owner sees); the epoch must show at the same step of its schedule (0) in both.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db.models import Dataset, utcnow
from service.padding import late_schedule
from service.registration_visibility import shown_at
from tests.continual.conftest import SHARED_PAD, Worlds
from tests.reference import helpers

PAD = SHARED_PAD  # the floor the shared folder's settings set (conftest)
#: The epoch's own run, once the worker is free.
RUN = timedelta(milliseconds=50)


def test_an_epoch_behind_a_registration_shows_the_same_whatever_the_worker_does(
    worlds: Worlds,
    make_key: Any,
    settings: Settings,
    root: Path,
    session_factory: sessionmaker[Session],
) -> None:
    rng = np.random.default_rng(5)
    other = make_key("owner")
    shown: dict[str, int] = {}
    for number, world in enumerate(("ended", "reading")):
        mine, release = worlds.start(rng, horizon=3)
        names = helpers.seeded_parquet(root / world, number, 200, 3)
        posted = helpers.post_data(worlds.client, other, "registration", root / world, names, None)
        assert posted.status_code == 202, posted.text
        pending = uuid.UUID(posted.json()["id"])
        with session_factory.begin() as session:
            row = session.get(Dataset, pending)
            assert row is not None and row.registration_visible_at is not None
            # Requested 2.05 paddings ago: past its visible_at and first late step, shown
            # registering until its next step (4 paddings after its request).
            padding = row.registration_visible_at - row.created_at
            now = utcnow()
            row.created_at = now - padding * 2.05
            row.registration_visible_at = row.created_at + padding
            step = row.created_at + padding * 4
            if world == "ended":
                row.registration_shown_at = shown_at(
                    row.created_at, row.registration_visible_at, now
                )
                assert row.registration_shown_at == step
                row.registration_status, row.registration_reason = "failed", "uri: refused"
            else:
                row.registration_lease_owner = "the one worker"
                row.registration_lease_expires_at = now + timedelta(hours=1)
        # The busy world's read ends within the step its owner sees.
        read_ends = now + (step - now) * 0.75
        # Epoch 2's batch: its point comes after the registration's request.
        worlds.append(mine, rng, 30)
        start, visible = worlds.schedule(settings, release)
        assert start < read_ends < step
        # The one worker runs the epoch at once, or after the read.
        ended = (start if world == "ended" else read_ends) + RUN
        shown[world] = late_schedule(start, visible, ended)[1]
        with session_factory.begin() as session:
            row = session.get(Dataset, pending)
            assert row is not None
            hour = timedelta(hours=1)
            row.created_at -= hour
            row.registration_visible_at = row.created_at + padding
            row.registration_shown_at = row.registration_visible_at
            row.registration_status, row.registration_lease_owner = "failed", None
        worlds.worker.run_pending()  # the world's epoch, out of the next world's way
    assert shown["ended"] == shown["reading"] == 0, shown
