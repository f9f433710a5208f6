"""A continual epoch whose point came while a batch by reference was pending must be padded for
that batch however late its chain is computed.

An epoch's queue term counts the registrations and batches by reference pending at its point
(:func:`service.padding_queue.registration_seconds`, read by :class:`service.padding_epochs.
_Chain`): the workers take them in the releases' order, so the epoch waits behind their read.
A batch's moments (its request, ``visible_at``, ``shown_at``) lived on its dataset's row, and
that dataset's next batch (requested once the batch shows) overwrote them: a chain computed
after that request (a worker claiming the epoch late) no longer counted the batch, and the
epoch's ``visible_at`` then followed whether a worker had reached its claim before another
owner's next request, which depends on how long the jobs ahead of it really ran. Each batch's
moments are now kept (migration 0027, :class:`service.db.models.BatchMoments`).

The two worlds differ only in that the other owner's next batch is requested before the worker
computes the epoch's padding (a worker busy until then) or not; the epoch's padding must be
the same in both.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db.models import Dataset, DatasetBatch
from tests.continual.conftest import SHARED_PAD, Worlds
from tests.reference import helpers

PAD = SHARED_PAD  # the floor the shared folder's settings set (conftest)
HOUR = timedelta(hours=1)


def _registered(
    worlds: Worlds, key: str, root: Path, world: str, number: int
) -> tuple[uuid.UUID, list[str]]:
    """Another owner's dataset by reference, registered and shown an hour ago; its id and
    columns."""
    names = helpers.seeded_parquet(root / world / "first", number, 200, 3)
    posted = helpers.post_data(
        worlds.client, key, "registration", root / world / "first", names, None
    )
    assert posted.status_code == 202, posted.text
    assert helpers.run_registrations(worlds.client) == 1
    other = uuid.UUID(posted.json()["id"])
    with worlds.session_factory.begin() as session:
        row = session.get(Dataset, other)
        assert row is not None and row.registration_status == "ready"
        assert row.registration_visible_at is not None
        row.created_at -= HOUR
        row.registration_visible_at -= HOUR
        row.registration_shown_at = row.registration_visible_at
    return other, names


def test_an_epoch_behind_an_earlier_batch_is_padded_the_same_after_the_next_batch(
    worlds: Worlds,
    make_key: Any,
    settings: Settings,
    root: Path,
    session_factory: sessionmaker[Session],
) -> None:
    rng = np.random.default_rng(7)
    key = make_key("owner")
    paddings: dict[str, timedelta] = {}
    waits: dict[str, timedelta] = {}
    for number, world in enumerate(("claimed before", "claimed after")):
        mine, release = worlds.start(rng, horizon=3)
        other, names = _registered(worlds, key, root, world, number)
        # Epoch 2's batch, committed five minutes ago (after the release's request): its point.
        worlds.append(mine, rng, 30)
        with session_factory.begin() as session:
            batch = session.scalars(
                select(DatasetBatch).where(
                    DatasetBatch.dataset_id == uuid.UUID(mine), DatasetBatch.seq == 1
                )
            ).one()
            batch.created_at -= timedelta(minutes=5)
            point: datetime = batch.created_at
            # The other dataset's batch: requested 2.05 paddings before the point, late there,
            # shown at the next step of its late schedule (4 paddings after its request), long
            # past now; refused (its objects are not the point).
            row = session.get(Dataset, other)
            assert row is not None
            requested = point - timedelta(seconds=PAD * 2.05)
            row.batch_requested_at = requested
            row.batch_visible_at = requested + timedelta(seconds=PAD)
            row.batch_shown_at = requested + timedelta(seconds=PAD * 4)
            row.batch_status, row.batch_reason = "failed", "uri: refused"
            waits[world] = row.batch_shown_at - point
        if world == "claimed after":
            # The other owner's next batch, requested (as anyone may) once the first showed,
            # before a worker busy until now reaches the epoch's claim.
            more = root / world / "second"
            helpers.seeded_parquet(more, 100 + number, 50, 3)
            posted = helpers.post_data(worlds.client, key, "batch", more, names, str(other))
            assert posted.status_code == 202, posted.text
        start, visible = worlds.schedule(settings, release)
        paddings[world] = visible - start
        # The world's epoch run, and the other dataset's batches an hour back: out of the next
        # world's way.
        worlds.worker.run_pending()
        with session_factory.begin() as session:
            row = session.get(Dataset, other)
            assert row is not None and row.batch_requested_at is not None
            row.batch_status, row.batch_reason = "failed", "uri: refused"
            for name in ("batch_requested_at", "batch_visible_at", "batch_shown_at"):
                moment = getattr(row, name)
                if moment is not None:
                    setattr(row, name, moment - HOUR)
    assert paddings["claimed before"] == paddings["claimed after"], paddings
    # Padded for the first batch (its next public moment after the point) in both worlds.
    assert all(paddings[world] >= waits[world] for world in paddings), (paddings, waits)
