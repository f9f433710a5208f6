"""The chain's pending lists made in Python from one read (:class:`service.padding_epoch_facts.
Facts`) give the very figures the pending list's statement, read again at each point, gave
(``tests/continual/chain_reference.py``, the old chain kept as the slow reference): the pending
epochs' term at many moments, each pending epoch's claim (:func:`epoch_padding`) and each end's
due moment after a deletion (:func:`end_due`), compared with ``==`` (the same floats and
datetimes, not approximately).

Each seed builds its own state through the API and the worker (several datasets, continual
releases of horizons 2-4 on them, some epochs run, batches appended, datasets deleted), then
disturbs what is stored at random, as a loaded machine or an operator's clock would: epochs shown
late (a later ``visible_at``), due moments that differ from the chain's, re-checks pending,
shown ``unchanged`` or ``changed`` at moments around the ones asked, releases' ends shown,
batches committed earlier, batches by reference pending (kept ones too); one-shot jobs in the
queue at some of the moments. Such states need not be ones the service makes; the two chains
must agree on them all the same (the rule, not only its usual case)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service import padding_epochs
from service.config import Settings
from service.db.models import (
    BatchMoments,
    Dataset,
    DatasetBatch,
    Release,
    ReleaseEpoch,
    utcnow,
)
from service.worker import Worker
from tests.api.test_append_rows import append
from tests.conftest import bearer, npy_bytes, post_release
from tests.continual import chain_reference
from tests.continual.conftest import D, epoch_rated


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return epoch_rated(settings, 1.0)


def _build(
    rng: np.random.Generator,
    client: TestClient,
    make_key: Any,
    upload_dataset: Any,
    worker: Worker,
) -> None:
    owner, analyst = make_key("owner"), make_key("analyst")
    datasets = [
        upload_dataset(client, owner, rng.normal(size=(30, D)) / 4, row_norm_bound=1)["id"]
        for _ in range(int(rng.integers(2, 5)))
    ]
    for dataset in datasets:
        for _ in range(int(rng.integers(1, 3))):
            post_release(
                client,
                analyst,
                dataset,
                mechanism="continual_gauss",
                k=1,
                epsilon="0.05",
                delta="1e-7",
                params={"horizon": int(rng.integers(2, 5))},
            )
    for _ in range(int(rng.integers(0, 4))):
        worker.run_pending()
    # One-shot jobs in the queue at some of the moments asked (the chain's queue term).
    for _ in range(int(rng.integers(0, 3))):
        dataset = datasets[int(rng.integers(len(datasets)))]
        post_release(
            client, analyst, dataset, mechanism="analyze_gauss", k=1, epsilon="0.05", delta="1e-7"
        )
    for _ in range(int(rng.integers(1, 4))):
        for dataset in datasets:
            if rng.random() < 0.7:
                rows = npy_bytes(rng.normal(size=(int(rng.integers(10, 40)), D)) / 4)
                assert append(client, owner, dataset, rows).status_code == 201
        if rng.random() < 0.5:
            worker.run_pending()
    for dataset in datasets:
        if rng.random() < 0.3:
            gone = client.delete(f"/v1/datasets/{dataset}", headers=bearer(owner))
            assert gone.is_success, gone.text
    if rng.random() < 0.5:
        worker.run_pending()


def _disturb(rng: np.random.Generator, session: Session, now: datetime) -> None:
    def moment() -> datetime:
        return now + timedelta(seconds=float(rng.uniform(-30.0, 30.0)))

    for epoch in session.scalars(select(ReleaseEpoch)).all():
        draw = rng.random()
        if draw < 0.2:
            epoch.visible_at += timedelta(seconds=float(rng.uniform(0.0, 40.0)))
        elif draw < 0.4 and epoch.due_at is not None:
            epoch.due_at += timedelta(seconds=float(rng.uniform(-5.0, 120.0)))
        elif draw < 0.45:
            epoch.due_at = None
        check = rng.random()
        if check < 0.5:
            epoch.reference_check = str(rng.choice(["pending", "unchanged", "changed", "changed"]))
            epoch.reference_shown_at = None if rng.random() < 0.2 else moment()
    for release in session.scalars(select(Release)).all():
        if rng.random() < 0.15:
            release.outcome_visible_at = moment()
    for batch in session.scalars(select(DatasetBatch)).all():
        if rng.random() < 0.2:
            batch.created_at -= timedelta(seconds=float(rng.uniform(0.0, 20.0)))
    datasets = session.scalars(select(Dataset).order_by(Dataset.created_at, Dataset.id)).all()
    # One kept batch pending across the moments asked around now, in every disturbed state.
    session.add(
        BatchMoments(
            dataset_id=datasets[0].id,
            requested_at=now - timedelta(seconds=5),
            visible_at=now - timedelta(seconds=2),
            shown_at=now + timedelta(seconds=20),
        )
    )
    for dataset in datasets:
        if dataset.deleted_at is not None and rng.random() < 0.5:
            dataset.deleted_at = moment()
        # Batches by reference pending around the moments asked: the dataset's latest, and
        # ones its next batch replaced (kept in batch_moments, migration 0027), which the
        # queue term at a point counts as well (both chains read it: registration_seconds).
        if rng.random() < 0.3:
            requested = moment()
            dataset.batch_requested_at = requested
            dataset.batch_visible_at = requested + timedelta(seconds=float(rng.uniform(1, 10)))
            dataset.batch_shown_at = None if rng.random() < 0.3 else moment()
        if rng.random() < 0.3:
            requested = moment()
            session.add(
                BatchMoments(
                    dataset_id=dataset.id,
                    requested_at=requested,
                    visible_at=requested + timedelta(seconds=float(rng.uniform(1, 10))),
                    shown_at=requested + timedelta(seconds=float(rng.uniform(1, 40))),
                )
            )


def _figures(module: Any, session: Session, settings: Settings, moments: list[datetime]) -> Any:
    seconds = [module.epoch_seconds(session, settings, at) for at in moments]
    claims: dict[tuple[uuid.UUID, int], Any] = {}
    dues: dict[uuid.UUID, datetime] = {}
    for release in session.scalars(select(Release).order_by(Release.id)).all():
        if release.mechanism != "continual_gauss":
            continue
        dataset = session.get(Dataset, release.dataset_id)
        assert dataset is not None
        batches = session.scalars(
            select(DatasetBatch.seq).where(DatasetBatch.dataset_id == dataset.id)
        ).all()
        for seq in sorted(batches):
            if seq + 1 <= release.params["horizon"]:
                claims[(release.id, seq + 1)] = module.epoch_padding(
                    session, settings, release, dataset, seq + 1
                )
        if dataset.deleted_at is not None and release.visible_at is not None:
            dues[release.id] = module.end_due(session, settings, release, dataset.deleted_at)
    return seconds, claims, dues


@pytest.mark.parametrize("seed", range(8))
def test_the_chain_from_one_read_gives_the_figures_of_the_pending_list_read_at_each_point(
    seed: int,
    client: TestClient,
    make_key: Any,
    upload_dataset: Any,
    worker: Worker,
    settings: Settings,
    session_factory: sessionmaker[Session],
) -> None:
    rng = np.random.default_rng(1000 + seed)
    _build(rng, client, make_key, upload_dataset, worker)
    now = utcnow()
    if seed % 2:  # the stored state as the service made it, or disturbed
        with session_factory.begin() as session:
            _disturb(rng, session, now)
    moments = [now + timedelta(seconds=float(s)) for s in rng.uniform(-40.0, 60.0, size=12)]
    with session_factory() as session:
        moments += [b for b in session.scalars(select(DatasetBatch.created_at)).all()]
        moments += [d for d in session.scalars(select(Dataset.deleted_at)).all() if d]
        moments += [e for e in session.scalars(select(ReleaseEpoch.visible_at)).all()]
        new = _figures(padding_epochs, session, settings, moments)
    with session_factory() as session:
        old = _figures(chain_reference, session, settings, moments)
    assert new[0] == old[0]
    assert new[1] == old[1]
    assert new[2] == old[2]
    # The state really has epochs pending (the comparison could fail).
    assert any(seconds > 0.0 for seconds in new[0])
    assert new[1]
