"""A continual release's epoch (or end) must not tell when another dataset's job ended.

An epoch of a continual release runs when its batch is appended, on the workers' one queue:
behind the one-shot jobs already there, on any dataset. Its ``visible_at`` was its batch's
commit time plus one epoch's padding, with no term for that queue (the one-shot releases and
registrations got theirs: ``tests/reference/test_probe_behind_a_long_job.py``). So the owner
who appends a batch behind another dataset's long release (padded by its model to seconds),
and any analyst of the continual release, saw the epoch at its ``visible_at`` if that release
had really ended quickly, or a step of the late schedule later if not: whether it had ended,
long before its own ``visible_at`` (its run time may depend on one of its rows). The same for
a continual release ended by its dataset's deletion: its end was due the deletion plus the
release's padding. Both are now padded after the modelled queue at the moment of the act (the
batch's commit, the deletion), and a waiting continual job with new work is taken in the
order of that moment among the queued ones (a job requested after it no longer goes first).
In two worlds that differ only in whether the long release really ran milliseconds or most of
its modelled time, the analyst and the owner see the same at the same moments.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service import oneshot
from service.config import Settings
from service.db.models import Dataset, DatasetBatch, Release, ReleaseEpoch, utcnow
from service.worker import Worker
from tests.conftest import Keys, bearer
from tests.continual.conftest import D, Worlds, rated

PAD = 2.0
#: The long job: gap_perturbation at an operator's rate (public) that models its run at about
#: 6 s; it really runs in milliseconds, or (the slow world) SLOW seconds. The model's length is
#: the slack a worker has to end the long job and the epoch before the epoch's ``visible_at``
#: (beyond it the epoch is late in either world, and that a late step shows is the schedule
#: working, not a leak): 3 s of it was used up at a load of 21 on 2 cores.
LONG = {"mechanism": "gap_perturbation", "k": 1, "epsilon": "0.1", "delta": "1e-7"}
SLOW = PAD + 0.2


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return rated(settings, PAD, {"gap_perturbation": 750.0})


def _view(client: TestClient, key: str, release_id: str) -> tuple[Any, ...]:
    shown = client.get(f"/v1/releases/{release_id}", headers=bearer(key)).json()
    epochs = client.get(f"/v1/releases/{release_id}/epochs", headers=bearer(key)).json()
    return (
        shown["status"],
        shown["epochs_done"],
        shown["reason"],
        [e["epoch"] for e in epochs["items"]],
    )


@contextlib.contextmanager
def _clock_at(moment: datetime) -> Iterator[None]:
    """The service's clock (every ``utcnow`` imported from :mod:`service.db.models`) reads
    ``moment`` inside: a reading of several requests is one moment's, however long the
    requests take (4 of them took 6.5 s at a load of 21, and straddled the moment the news
    showed). Only used once ``moment`` has passed and the worker has stopped, so it is what
    anyone reading then saw."""
    assert utcnow() >= moment
    patched = [
        module
        for name, module in list(sys.modules.items())
        if name.split(".")[0] == "service" and getattr(module, "utcnow", None) is utcnow
    ]
    for module in patched:
        module.utcnow = lambda: moment  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in patched:
            module.utcnow = utcnow  # type: ignore[attr-defined]


@pytest.mark.parametrize("act", ["append", "delete", "append, then a later job"])
def test_a_continual_release_behind_a_long_job_shows_the_same_whether_it_ended(
    act: str,
    client: TestClient,
    keys: Keys,
    make_key: Any,
    upload_dataset: Any,
    worker: Worker,
    worlds: Worlds,
    session_factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(3)
    target = upload_dataset(
        client, make_key("owner"), rng.normal(size=(300, D)) / 4, row_norm_bound=1.0,
        epsilon_budget="100",
    )  # fmt: skip
    real = oneshot.execute
    slow = {"on": False}

    def execute(job: Any, *args: Any, **kwargs: Any) -> Any:
        if slow["on"] and job.mechanism == LONG["mechanism"]:
            time.sleep(SLOW)  # the run time that depends on the target's rows
        return real(job, *args, **kwargs)

    monkeypatch.setattr(oneshot, "execute", execute)

    def request_long() -> None:
        long = client.post(
            f"/v1/datasets/{target['id']}/releases", headers=bearer(keys.analyst), json=LONG
        )
        assert long.status_code == 202, long.text

    seen: dict[str, list[tuple[Any, ...]]] = {}
    offsets: list[float] = []
    for world in ("fast", "slow"):
        slow["on"] = world == "slow"
        # The other world's releases are long past their visible_at: no queue of theirs.
        # Requested long ago: the release and epoch 1 are visible; what follows is padded from
        # the act alone.
        mine, release = worlds.start(rng, horizon=3)
        if act != "append, then a later job":
            request_long()
        if act == "delete":
            gone = client.delete(f"/v1/datasets/{mine}", headers=bearer(keys.owner))
            assert gone.status_code == 204, gone.text
        else:
            worlds.append(mine, rng, 30)
        if act == "append, then a later job":
            request_long()  # after the batch: it must not go first
        worker.run_pending()  # the long job and the epoch (or the end), in the worker's order
        with session_factory() as session:
            stored = session.get(Release, release)
            assert stored is not None
            if act == "delete":
                # The act's public moment: the deletion (stored), not when its answer came.
                dataset = session.get(Dataset, uuid.UUID(mine))
                assert dataset is not None and dataset.deleted_at is not None
                acted_at = dataset.deleted_at
                assert stored.outcome_visible_at is not None and stored.finished_at is not None
                due, ended = stored.outcome_visible_at, stored.finished_at
            else:
                batch = session.scalars(
                    select(DatasetBatch)
                    .where(DatasetBatch.dataset_id == uuid.UUID(mine))
                    .order_by(DatasetBatch.seq.desc())
                ).first()
                assert batch is not None
                acted_at = batch.created_at  # the batch's commit
                epoch = session.get(ReleaseEpoch, (release, 2))
                assert epoch is not None
                due, ended = epoch.visible_at, epoch.created_at
        if world == "fast":
            # Read between the former visible_at (the act plus the epoch's floor) and the news
            # (its middle, whatever the worker took), and after the news is due.
            # With no job ahead (a later job) the news is due at the former visible_at: both
            # readings are after it, as before.
            news = (due - acted_at).total_seconds()
            assert news >= PAD, news
            offsets = [(PAD + news) / 2 if news > PAD else PAD + 0.3, news + 0.3]
        # The padding hides a run within its model only: the slack the model gives (LONG) must
        # have been enough in both worlds, else the comparison below says nothing.
        assert ended <= acted_at + timedelta(seconds=offsets[-1] - 0.3), (world, ended, due)
        views = []
        for offset in offsets:
            moment = acted_at + timedelta(seconds=offset)
            time.sleep(max(0.0, (moment - utcnow()).total_seconds()))
            with _clock_at(moment):
                views.append(
                    (
                        _view(client, keys.analyst, str(release)),
                        _view(client, keys.owner, str(release)),
                    )
                )
        seen[world] = views
        # The news did come in the fast world by its last reading, and not by the first, so
        # the test could fail.
        if news > PAD:
            assert world == "slow" or views[0][0] == ("running", 1, None, [1]), views
        assert world == "slow" or views[-1][0] != ("running", 1, None, [1]), views
    assert seen["fast"] == seen["slow"], seen
