"""The set-up the continual tests that compare worlds share.

Those tests (``test_probe_behind_an_epoch``, ``test_probe_behind_two_epochs``,
``test_epoch_behind_a_long_job``, ``test_epoch_behind_other_epochs``,
``test_probe_behind_a_deletion``) run two or three worlds one after another on one database,
each a continual release on a dataset of its own; what one world left must be no queue of the
next (:meth:`Worlds.backdate`), and each world starts the same way (:meth:`Worlds.start`).

The two whose worlds hold another owner's data by reference (``test_epoch_behind_a_registration``,
``test_epoch_behind_an_earlier_batch``) ask for the shared folder :func:`root`; :func:`settings`
then allows it and sets the padding floor :data:`SHARED_PAD`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service import continual
from service.config import Settings
from service.db.models import Dataset, DatasetBatch, Release, ReleaseEpoch, utcnow
from service.padding import late_schedule, next_late_step
from service.padding_epochs import epoch_padding
from service.worker import Worker
from tests.api.test_append_rows import append
from tests.conftest import Keys, bearer, npy_bytes, post_release

#: Columns of every world's data.
D = 3

#: The release padding's floor (seconds) of the tests that ask for the shared folder.
SHARED_PAD = 1.0


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The shared folder the worlds' data by reference is written under (empty)."""
    path = tmp_path / "shared"
    path.mkdir()
    return path


@pytest.fixture
def settings(settings: Settings, request: pytest.FixtureRequest) -> Settings:
    """``settings`` as they are, but for a test that asks for the shared folder :func:`root`:
    then it is the one reference root and the padding floor is :data:`SHARED_PAD`. A module's
    own ``settings`` fixture builds on these."""
    if "root" not in request.fixturenames:
        return settings
    root: Path = request.getfixturevalue("root")
    return settings.model_copy(
        update={"reference_roots": str(root), "release_padding_floor_seconds": SHARED_PAD}
    )


def rated(settings: Settings, floor: float, rates: dict[str, float], **update: Any) -> Settings:
    """``settings`` with the padding model uncalibrated: operator's ``rates`` (public), the
    ``floor`` and any further ``update``."""
    return settings.model_copy(
        update={
            "release_padding_floor_seconds": floor,
            "release_padding_calibrated": False,
            "release_padding_rates": rates,
            **update,
        }
    )


def epoch_rated(settings: Settings, floor: float) -> Settings:
    """``settings`` with an operator's rate (public) that models an epoch on a 30-row batch at
    5 s: far above a cheap probe's padding (``floor``), so an epoch still running within its
    own padding would make the probe late."""
    return rated(settings, floor, {"continual_gauss": 150.0}, release_padding_multiplier=1.0)


@dataclass
class Worlds:
    """One test's worlds: its client, keys, worker and database."""

    client: TestClient
    keys: Keys
    upload_dataset: Any
    worker: Worker
    session_factory: sessionmaker[Session]

    def backdate(
        self, by: timedelta, release: uuid.UUID | None = None, batches: bool = False
    ) -> None:
        """Move releases (every one, or ``release`` and its epochs) ``by`` into the past, their
        outcome's and epochs' moments too, and with ``batches`` every batch's commit (the
        other world's epochs then point to the past as well): a job requested after a batch is
        padded for the batch's epoch (:func:`service.padding_epochs.epoch_seconds`), and an
        outcome not shown yet when the next world begins would count in that world's queue (a
        public term of its own). A one-shot release never run (a probe: these tests compute,
        not run, it) is ended at its ``visible_at``, so that no worker of a later world takes it."""
        with self.session_factory.begin() as session:
            for row in session.scalars(select(Release)).all():
                if release is not None and row.id != release:
                    continue
                row.created_at -= by
                if row.visible_at is not None:
                    row.visible_at -= by
                # A job that ended late (a loaded machine) is shown at a later step: left where
                # it was, it would still count in the next world's padding.
                if row.outcome_visible_at is not None:
                    row.outcome_visible_at -= by
                elif not continual.is_continual(row.mechanism):
                    row.status, row.reason, row.outcome_visible_at = "failed", "x", row.visible_at
            for epoch in session.scalars(select(ReleaseEpoch)).all():
                if release is None or epoch.release_id == release:
                    epoch.visible_at -= by
                    if epoch.due_at is not None:  # the formula moment the next epoch follows
                        epoch.due_at -= by
            if batches:
                for batch in session.scalars(select(DatasetBatch)).all():
                    batch.created_at -= by

    def start(self, rng: np.random.Generator, horizon: int) -> tuple[str, uuid.UUID]:
        """A new world: the others' releases long past (an hour), then a continual release of
        ``horizon`` epochs on a new 40-row dataset, epoch 1 run and, like the release, moved
        ten minutes back (shown): what follows is padded from the world's next act alone.
        Returns the dataset's and the release's ids."""
        self.backdate(timedelta(hours=1))
        mine = self.dataset(self.keys.owner, rng, 40)
        release = self.continual(mine, horizon)
        assert self.worker.run_pending() == 1  # epoch 1
        self.backdate(timedelta(minutes=10), release)
        return mine, release

    def dataset(self, owner: str, rng: np.random.Generator, rows: int) -> str:
        """``owner`` uploads a dataset of ``rows`` rows (row norms bounded by 1); its id."""
        uploaded = self.upload_dataset(
            self.client, owner, rng.normal(size=(rows, D)) / 4, row_norm_bound=1.0
        )
        return str(uploaded["id"])

    def continual(self, dataset_id: str, horizon: int) -> uuid.UUID:
        """The analyst requests a continual release (continual_gauss, k 1, epsilon 1, delta
        1e-6) of ``horizon`` epochs on the dataset."""
        return uuid.UUID(
            post_release(
                self.client,
                self.keys.analyst,
                dataset_id,
                mechanism="continual_gauss",
                k=1,
                epsilon="1",
                delta="1e-6",
                params={"horizon": horizon},
            )
        )

    def append(
        self, dataset_id: str, rng: np.random.Generator, rows: int, owner: str | None = None
    ) -> None:
        """The owner (``owner``, else the keys' owner) appends a batch of ``rows`` rows
        (asserts 201)."""
        added = append(
            self.client,
            owner or self.keys.owner,
            dataset_id,
            npy_bytes(rng.normal(size=(rows, D)) / 4),
        )
        assert added.status_code == 201, added.text

    def delete(self, dataset_id: str) -> None:
        """The owner deletes the dataset (asserts 204)."""
        deleted = self.client.delete(f"/v1/datasets/{dataset_id}", headers=bearer(self.keys.owner))
        assert deleted.status_code == 204, deleted.text

    def deleted_world(
        self,
        settings: Settings,
        rng: np.random.Generator,
        world: str,
        mine: str,
        release: uuid.UUID,
        *,
        rows: int = 30,
        end: bool = True,
    ) -> tuple[datetime, datetime]:
        """The owner appends a batch of ``rows`` rows to ``mine`` (the release's epoch is
        pending), then deletes the dataset. Before the deletion the worker ran the epoch at
        once (``world`` "ran" or "ended": asserted), or claimed it and is still on it
        ("running": leased), or did neither (any other); with ``end`` it then stores the
        release's end at once (but when "running"). Returns the epoch's schedule
        (:meth:`schedule`, before the deletion)."""
        self.append(mine, rng, rows)
        start, visible = self.schedule(settings, release)
        if world in ("ran", "ended"):
            assert self.worker.run_pending() == 1  # the epoch, at once
        elif world == "running":
            with self.session_factory.begin() as session:
                self.hold_lease(session, release)
        self.delete(mine)
        if end and world != "running":
            self.worker.run_pending()  # the end, at once
        return start, visible

    def hold_lease(self, session: Session, release_id: uuid.UUID) -> None:
        """The world whose worker is still on the release's pending epoch: leased for an hour."""
        row = session.get(Release, release_id)
        assert row is not None
        row.lease_owner = "the one worker"
        row.lease_expires_at = utcnow() + timedelta(hours=1)

    def probe(self, dataset_id: str, body: dict[str, Any]) -> tuple[datetime, datetime]:
        """The analyst requests a one-shot release (asserts 202); its stored ``(created_at,
        visible_at)``."""
        probe = self.client.post(
            f"/v1/datasets/{dataset_id}/releases", headers=bearer(self.keys.analyst), json=body
        )
        assert probe.status_code == 202, probe.text
        with self.session_factory() as session:
            row = session.get(Release, uuid.UUID(probe.json()["id"]))
            assert row is not None and row.visible_at is not None
            return row.created_at, row.visible_at

    def probe_behind(
        self,
        dataset_id: str,
        body: dict[str, Any],
        epoch: tuple[datetime, datetime],
        busy: bool,
        run: timedelta,
    ) -> tuple[datetime, datetime, datetime, int]:
        """The analyst's probe (:meth:`probe`) behind an epoch of schedule ``epoch`` (``(start,
        visible)``): its ``created_at``, its ``visible_at``, the epoch's next public moment
        after the request (its step), and the step of the probe's late schedule it shows at
        when the one worker runs it for ``run`` at once, or (``busy``) after the epoch, which
        ends three quarters of the way from the request to the epoch's step."""
        created, probe_visible = self.probe(dataset_id, body)
        step = next_late_step(*epoch, created)
        epoch_ends = created + (step - created) * 0.75
        ended = (epoch_ends if busy else created) + run
        return created, probe_visible, step, late_schedule(created, probe_visible, ended)[1]

    def schedule(
        self, settings: Settings, release_id: uuid.UUID, epoch: int | None = None
    ) -> tuple[datetime, datetime]:
        """Epoch ``epoch``'s schedule ``(visible_at - padding, visible_at)`` as the worker's
        claim computes it (its epochs before stored); the pending one's without ``epoch``."""
        with self.session_factory() as session:
            release = session.get(Release, release_id)
            assert release is not None
            dataset = session.get(Dataset, release.dataset_id)
            assert dataset is not None
            if epoch is None:
                visible, padding = continual.pending_padding(session, settings, release, dataset)
            else:
                visible, padding = epoch_padding(session, settings, release, dataset, epoch)
            return visible - padding, visible


@pytest.fixture
def worlds(
    client: TestClient,
    keys: Keys,
    upload_dataset: Any,
    worker: Worker,
    session_factory: sessionmaker[Session],
) -> Worlds:
    return Worlds(client, keys, upload_dataset, worker, session_factory)
