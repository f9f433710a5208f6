"""Shared setup of the two-worlds tests of epochs behind other jobs (new helpers; the older
tests' ``_backdate_all`` does the same for releases and epochs, without the batches)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db.models import Dataset, DatasetBatch, Release, ReleaseEpoch
from service.padding_epochs import epoch_padding


def backdate(session_factory: sessionmaker[Session], by: timedelta) -> None:
    """Every release, epoch and batch so far ``by`` into the past, every outcome shown: the
    other world's jobs are no queue of this world's."""
    with session_factory.begin() as session:
        for row in session.scalars(select(Release)).all():
            row.created_at -= by
            if row.visible_at is not None:
                row.visible_at -= by
            if row.outcome_visible_at is not None:
                row.outcome_visible_at -= by
            elif row.status in ("queued", "running") and row.mechanism != "continual_gauss":
                row.status, row.reason, row.outcome_visible_at = "failed", "x", row.visible_at
        for epoch in session.scalars(select(ReleaseEpoch)).all():
            epoch.visible_at -= by
            if epoch.due_at is not None:
                epoch.due_at -= by
        for batch in session.scalars(select(DatasetBatch)).all():
            batch.created_at -= by


def schedule(
    session_factory: sessionmaker[Session], settings: Settings, release_id: uuid.UUID, epoch: int
) -> tuple[datetime, datetime]:
    """Epoch ``epoch``'s schedule ``(visible_at - padding, visible_at)`` as the worker's claim
    computes it (:func:`service.padding_epochs.epoch_padding`)."""
    with session_factory() as session:
        release = session.get(Release, release_id)
        assert release is not None
        dataset = session.get(Dataset, release.dataset_id)
        assert dataset is not None
        visible, padding = epoch_padding(session, settings, release, dataset, epoch)
        return visible - padding, visible


def batch_commit(
    session_factory: sessionmaker[Session], dataset_id: uuid.UUID, seq: int
) -> datetime:
    """When batch ``seq`` of the dataset was committed (an owner's act, public)."""
    with session_factory() as session:
        batch = session.get(DatasetBatch, (dataset_id, seq))
        assert batch is not None
        return batch.created_at
