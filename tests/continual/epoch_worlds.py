"""Shared helpers of the two-worlds tests of epochs behind other jobs (moving a world into
the past: :meth:`tests.continual.conftest.Worlds.backdate` with ``batches``)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db.models import Dataset, DatasetBatch, Release
from service.padding_epochs import epoch_padding


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
