"""The chain's queue reads keep the one-shot rows in the statement (``queue_parts(...,
only_one_shot=True)``) rather than fetch every pending continual release and drop it in
Python: the same figures. Compared on one database state with a few continual releases pending
(each with an epoch on a batch of its own) and a one-shot job ahead: the pending epochs' term
and the last epoch's claim, with the chain reading the queue either way."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service import padding_epochs
from service.config import Settings
from service.db.models import Dataset, Release, utcnow
from service.padding_queue import padding_model, queue_parts
from service.worker import Worker
from tests.api.test_append_rows import append
from tests.conftest import npy_bytes, post_release
from tests.continual.conftest import D, epoch_rated


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return epoch_rated(settings, 1.0)


def test_the_chain_reads_the_same_queue_with_the_one_shot_rows_only(
    client: TestClient,
    make_key: Any,
    upload_dataset: Any,
    worker: Worker,
    settings: Settings,
    session_factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(5)
    owner, analyst = make_key("owner"), make_key("analyst")
    datasets = [
        upload_dataset(client, owner, rng.normal(size=(40, D)) / 4, row_norm_bound=1)["id"]
        for _ in range(3)
    ]
    releases = [
        uuid.UUID(
            post_release(
                client,
                analyst,
                dataset,
                mechanism="continual_gauss",
                k=1,
                epsilon="0.1",
                delta="1e-7",
                params={"horizon": 3},
            )
        )
        for dataset in datasets
    ]
    while worker.run_pending():
        pass  # every epoch 1
    for dataset in datasets:
        added = append(client, owner, dataset, npy_bytes(rng.normal(size=(20, D)) / 4))
        assert added.status_code == 201, added.text
    # A one-shot job ahead (requested, never run): a row both reads keep.
    post_release(
        client, analyst, datasets[0], mechanism="analyze_gauss", k=1, epsilon="0.1", delta="1e-7"
    )
    now = utcnow()

    def figures(session: Session) -> tuple[Any, ...]:
        last = session.get(Release, releases[-1])
        assert last is not None
        dataset = session.get(Dataset, last.dataset_id)
        assert dataset is not None
        return (
            padding_epochs.epoch_seconds(session, settings, now),
            padding_epochs.epoch_padding(session, settings, last, dataset, 2),
        )

    with session_factory() as session:
        model = padding_model(session, settings, now)
        for at in (now - timedelta(minutes=20), now, now + timedelta(seconds=30)):
            kept = queue_parts(session, model, at, registrations=False, only_one_shot=True)
            assert kept == queue_parts(session, model, at, registrations=False), at
        new = figures(session)

    def every_row(*args: Any, **kwargs: Any) -> tuple[float, float]:
        kwargs.pop("only_one_shot", None)
        return queue_parts(*args, **kwargs)

    monkeypatch.setattr(padding_epochs, "queue_parts", every_row)
    with session_factory() as session:
        old = figures(session)
    assert new == old
    assert new[0] > 0.0  # the epochs really pending
