"""A continual epoch must not tell, by showing on time or at a late step, whether the epochs
a worker runs before it really ended.

A worker takes waiting continual work in the order of its point (the batch's commit, not before
the release's request): an epoch runs after every epoch of an earlier point not finished yet,
its own release's epoch before and other releases' (on any dataset; on its own dataset the
releases requested before it). Its padding (fixed by the worker when it claims the epoch:
:func:`service.padding_epochs.epoch_padding`) counted the one-shot jobs ahead only, so with a
large batch's epoch ahead (padded long), the epoch showed at its ``visible_at`` if that one had
ended at once and a step later if the worker was still on it: its late step ``j`` said when
the epochs ahead (and through them the jobs ahead of those) really ended.

The worlds differ only in what the worker really does: the epoch ahead ended at once (the real
worker runs it before the probe's batch is appended), or the worker is still on it and ends it
just before its next public moment (99 % of the way), then runs the probe's epoch for 90 % of
its own modelled time. The probe epoch must show at the same step (``j = 0``) in both, and its
``visible_at`` must be the same public moment (the ahead epoch's next one plus its own
padding). No sleeping: the moments are computed, from the worker's own formula, and checked
against what the real worker stored.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db.models import DatasetBatch, Release, ReleaseEpoch, utcnow
from service.padding import PaddingModel, late_schedule, next_late_step
from service.worker import Worker
from tests.api.test_append_rows import append
from tests.conftest import Keys, npy_bytes, post_release
from tests.continual.conftest import Worlds, epoch_rated
from tests.continual.epoch_worlds import batch_commit, schedule

PAD = 1.0
D = 3
#: The ahead epoch's batch (modelled at 15 s at the rate below) and the probe's (at the floor).
LARGE = 90
SMALL = 3


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # As in test_probe_behind_an_epoch: an epoch on a 30-row batch modelled at 5 s.
    return epoch_rated(settings, PAD)


def _continual(client: TestClient, key: str, dataset_id: str, horizon: int) -> uuid.UUID:
    body = {"mechanism": "continual_gauss", "k": 1, "epsilon": "1", "delta": "1e-6"}
    return uuid.UUID(post_release(client, key, dataset_id, params={"horizon": horizon}, **body))


def _rows(rng: np.random.Generator, n: int) -> bytes:
    return npy_bytes(rng.normal(size=(n, D)) / 4)


@pytest.mark.parametrize("case", ["own release", "other dataset", "same dataset", "late"])
def test_an_epoch_behind_other_epochs_shows_the_same_whatever_the_worker_does(
    case: str, make_key: Any, worlds: Worlds, settings: Settings
) -> None:
    client, keys, worker = worlds.client, worlds.keys, worlds.worker
    session_factory = worlds.session_factory
    rng = np.random.default_rng(11)
    other_owner = make_key("owner")
    shown: dict[str, int] = {}
    after_ahead: dict[str, timedelta] = {}
    for world in ("ended", "running"):
        worlds.backdate(timedelta(hours=1), batches=True)
        mine = worlds.dataset(keys.owner, rng, 40)
        probe_dataset = uuid.UUID(mine)
        if case == "other dataset" or case == "late":
            theirs = worlds.dataset(other_owner, rng, 40)
            ahead = worlds.continual(theirs, 3)
            ahead_dataset, ahead_epoch = uuid.UUID(theirs), 2
        if case == "same dataset":
            # Requested before the probe's release: its epoch on the same batch goes first.
            ahead = worlds.continual(mine, 3)
            ahead_dataset, ahead_epoch = probe_dataset, 2
        probe = worlds.continual(mine, 4)
        if case == "own release":
            ahead, ahead_dataset, ahead_epoch = probe, probe_dataset, 2
        worker.run_pending()  # every epoch 1
        worlds.backdate(timedelta(minutes=10), batches=True)
        # The ahead epoch: a large batch.
        added = append(client, other_owner if ahead_dataset != probe_dataset else keys.owner,
                       str(ahead_dataset), _rows(rng, LARGE))  # fmt: skip
        assert added.status_code == 201, added.text
        if case == "late":
            # Appended 2.05 of its paddings ago: past its visible_at and first late step.
            start, visible = schedule(session_factory, settings, ahead, ahead_epoch)
            with session_factory.begin() as session:
                batch = session.get(DatasetBatch, (ahead_dataset, 1))
                assert batch is not None
                batch.created_at = utcnow() - (visible - start) * 2.05
        if world == "ended":
            worker.run_pending()  # at once (the same dataset: the probe's epoch too)
        if case == "same dataset":
            probe_epoch = 2
        else:
            worlds.append(mine, rng, SMALL)
            probe_epoch = 3 if case == "own release" else 2
        # The busy world's worker gets to them now: the ahead epoch, then the probe's.
        worker.run_pending()
        with session_factory() as session:
            for release, epoch in ((ahead, ahead_epoch), (probe, probe_epoch)):
                stored = session.get(Release, release)
                assert stored is not None and stored.epochs_done >= epoch, (release, epoch)
            stored_epoch = session.get(ReleaseEpoch, (probe, probe_epoch))
            assert stored_epoch is not None
            due = stored_epoch.due_at
        start, visible = schedule(session_factory, settings, probe, probe_epoch)
        assert due == visible  # what the worker's claim computed
        ahead_start, ahead_visible = schedule(session_factory, settings, ahead, ahead_epoch)
        acted: datetime = batch_commit(session_factory, probe_dataset, probe_epoch - 1)
        ahead_next = next_late_step(ahead_start, ahead_visible, acted)
        assert ahead_next > acted + timedelta(seconds=5)  # the large batch: a long wait
        assert (ahead_visible < acted) == (case == "late")
        own = PaddingModel.from_settings(settings).padding(
            "continual_gauss", LARGE if case == "same dataset" else SMALL, D, 1, {"horizon": 4}
        )
        began = acted if world == "ended" else acted + (ahead_next - acted) * 0.99
        ended = began + own * 0.9
        shown[world] = late_schedule(start, visible, ended)[1]
        after_ahead[world] = visible - ahead_next
    assert shown == {"ended": 0, "running": 0}, shown
    for world, moment in after_ahead.items():
        assert abs(moment - own) <= timedelta(microseconds=2), (world, moment, own)


@pytest.mark.parametrize("between", ["another release's batch", "a one-shot release"])
def test_a_worker_never_runs_an_epoch_before_a_job_that_came_before_it(
    between: str,
    client: TestClient,
    keys: Keys,
    make_key: Any,
    upload_dataset: Any,
    worker: Worker,
    session_factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batches of a release appended at t1 and t3, and between them (t2) another release's
    batch or a one-shot request: the worker runs the epoch of t1, the job of t2, then the
    epoch of t3. It went on with the release's epoch of t3 in the same claim, so the job of t2
    waited behind an epoch whose batch came after it, which its padding (fixed at t2) could
    not count: whether it showed on time said whether the epoch of t1 had ended."""
    from service import continual, oneshot

    order: list[tuple[str, int]] = []
    stored = continual.on_epoch_stored
    monkeypatch.setattr(
        continual,
        "on_epoch_stored",
        lambda job, epoch: (order.append((str(job.release_id), epoch)), stored(job, epoch)),
    )
    real = oneshot.execute

    def execute(job: Any, *args: Any, **kwargs: Any) -> Any:
        order.append((str(job.release_id), 0))
        return real(job, *args, **kwargs)

    monkeypatch.setattr(oneshot, "execute", execute)
    rng = np.random.default_rng(13)
    mine = upload_dataset(client, keys.owner, rng.normal(size=(40, D)) / 4, row_norm_bound=1)
    other_owner = make_key("owner")
    theirs = upload_dataset(client, other_owner, rng.normal(size=(200, D)) / 4, row_norm_bound=1)
    release = _continual(client, keys.analyst, mine["id"], 4)
    other = _continual(client, keys.analyst, theirs["id"], 4)
    worker.run_pending()  # every epoch 1
    order.clear()
    assert append(client, keys.owner, mine["id"], _rows(rng, SMALL)).status_code == 201
    if between == "a one-shot release":
        body = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}
        middle = post_release(client, keys.analyst, theirs["id"], **body)
        expected = [(str(release), 2), (middle, 0), (str(release), 3)]
    else:
        added = append(client, other_owner, theirs["id"], _rows(rng, SMALL))
        assert added.status_code == 201
        expected = [(str(release), 2), (str(other), 2), (str(release), 3)]
    assert append(client, keys.owner, mine["id"], _rows(rng, SMALL)).status_code == 201
    worker.run_pending()
    assert order == expected
