"""An epoch's term must not depend on when a release stamped before its point commits.

A release's ``created_at`` is stamped inside its creating transaction, before that commits.
The worker computes an epoch's padding when it claims the epoch, at a moment that follows how
long the jobs before it ran (private): a release stamped before the epoch's point whose
transaction was slow (it committed after the point) was missing from the term computed before
its commit and counted by one computed after, so the epoch's ``visible_at`` told when the
worker reached the claim. Stamps and commits are now in one order
(:mod:`service.commit_order`): a term computed after its point waits for every transaction
that stamped by then.

Two worlds on real commits (separate connections): another dataset's one-shot release is
stamped, then its transaction stalls; the owner appends the continual release's batch (the
epoch's point, after the stamp); the release's transaction commits. The worker's term for
the epoch is computed while that transaction is still open (it commits half a second later)
or after it committed; it must be the same. On PostgreSQL the append commits while the
release's transaction is open (stamped before the point, committed after it); on SQLite the
release's transaction holds the write lock from before its stamp, so the append waits for
its commit: the world cannot arise there (checked too).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service import releases
from service.config import Settings
from service.db.models import DatasetBatch, Release, utcnow
from tests.conftest import Keys, bearer
from tests.continual.conftest import D, Worlds, rated

PAD = 2.0
#: The stalled release: gap_perturbation at an operator's rate (public) that models its run at
#: seconds, so the epoch's queue term moves by that much when it is counted.
SLOW = {"mechanism": "gap_perturbation", "k": 1, "epsilon": "0.1", "delta": "1e-7"}
#: How long the release's transaction stays open in the world computed before its commit.
HOLD = 0.5


@pytest.fixture
def session_factory(committed_db: tuple[str, sessionmaker[Session]]) -> sessionmaker[Session]:
    """Real commits on one engine (a connection per transaction): the creating transaction and
    the worker's term run at once."""
    return committed_db[1]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return rated(settings, PAD, {"gap_perturbation": 750.0})


def test_an_epoch_term_is_the_same_whether_computed_before_or_after_a_late_commit(
    client: TestClient,
    keys: Keys,
    upload_dataset: Any,
    worlds: Worlds,
    settings: Settings,
    session_factory: sessionmaker[Session],
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(11)
    target = upload_dataset(
        client, keys.owner, rng.normal(size=(300, D)) / 4, row_norm_bound=1.0,
        epsilon_budget="100",
    )  # fmt: skip
    real = releases._padding
    stamped = threading.Event()
    go = threading.Event()

    def stalled(session: Session, settings: Settings, mechanism: str, *args: Any) -> Any:
        padding = real(session, settings, mechanism, *args)
        if mechanism == SLOW["mechanism"]:
            stamped.set()  # created_at is stamped; the transaction stays open until go
            go.wait(timeout=HOLD if backend == "sqlite" else 30)
        return padding

    monkeypatch.setattr(releases, "_padding", stalled)
    paddings: dict[str, timedelta] = {}
    for world in ("before the commit", "after the commit"):
        stamped.clear()
        go.clear()
        mine, release = worlds.start(rng, horizon=3)
        answers: list[Any] = []

        def request(answers: list[Any] = answers) -> None:
            with TestClient(client.app) as own:
                answers.append(
                    own.post(
                        f"/v1/datasets/{target['id']}/releases",
                        headers=bearer(keys.analyst),
                        json=SLOW,
                    )
                )

        creator = threading.Thread(target=request)
        creator.start()
        assert stamped.wait(timeout=30)
        worlds.append(mine, rng, 30)  # the epoch's point
        released: list[datetime] = []

        def release_later(released: list[datetime] = released) -> None:
            time.sleep(HOLD)
            released.append(utcnow())
            go.set()

        if world == "before the commit":
            timer = threading.Thread(target=release_later)
            timer.start()
            start, visible = worlds.schedule(settings, release)
            timer.join()
        else:
            released.append(utcnow())
            go.set()
            creator.join()
            start, visible = worlds.schedule(settings, release)
        creator.join()
        assert len(answers) == 1 and answers[0].status_code == 202, answers
        paddings[world] = visible - start
        with session_factory() as session:
            created = session.scalars(
                select(Release.created_at).where(Release.mechanism == SLOW["mechanism"])
                .order_by(Release.created_at.desc()).limit(1)
            ).one()  # fmt: skip
            point = session.scalars(
                select(DatasetBatch.created_at).where(DatasetBatch.seq == 1)
                .order_by(DatasetBatch.created_at.desc()).limit(1)
            ).one()  # fmt: skip
        assert created < point  # stamped before the point
        if backend == "postgresql":
            # ... and committed after it: not before go was set.
            assert point < released[0], (point, released)
        worlds.worker.run_pending()  # the release and the epoch: out of the next world's way
    assert paddings["before the commit"] == paddings["after the commit"], paddings
    # Counted in both: the epoch's padding covers the stalled release's modelled seconds.
    assert paddings["after the commit"] > timedelta(seconds=PAD + 1), paddings
