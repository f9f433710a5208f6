"""``dpss audit verify`` reconciles a dataset's privacy unit with its ``dataset_created`` event.

Which unit a release bounds is decided by ``datasets.privacy_unit_column`` (``service.jobs``:
``person_level``). A database writer who cleared it on a person-level dataset made every later
release run per row (a person with r rows protected at about r epsilon, while budgets, grants
and events still stated person-level spend), and verify said intact; setting it on a row-level
dataset states a protection no release gives."""

from __future__ import annotations

import uuid

import numpy as np
from sqlalchemy import update

from service import audit
from service.db.models import Dataset
from tests.api.test_privacy_unit_http import csv_bytes, people, upload
from tests.conftest import bearer, npy_bytes


def verify(session_factory):
    with session_factory() as session:
        return audit.verify(session)


def _person_dataset(client, keys):
    ids, rows = people(30, [1, 3], 4, seed=5)
    response = upload(
        client,
        keys.owner,
        "visits.csv",
        csv_bytes(ids, rows, id_at=1),
        privacy_unit_column="patient",
        row_norm_bound="1",
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _row_dataset(client, keys):
    rows = np.random.default_rng(6).normal(size=(40, 4)) * 0.1
    response = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files={"file": ("rows.npy", npy_bytes(rows))},
        data={"name": "rows", "epsilon_budget": "1", "delta_budget": "1e-6", "row_norm_bound": "1"},
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_a_person_level_dataset_turned_row_level_fails_verify(client, keys, session_factory):
    person = _person_dataset(client, keys)
    row = _row_dataset(client, keys)
    assert verify(session_factory).ok
    with session_factory.begin() as session:
        session.execute(
            update(Dataset).where(Dataset.id == uuid.UUID(person)).values(privacy_unit_column=None)
        )
    problems = verify(session_factory).problems
    assert any(f"datasets {person}: privacy_unit differs" in p for p in problems), problems
    assert not any(f"datasets {row}" in p for p in problems), problems


def test_a_row_level_dataset_turned_person_level_fails_verify(client, keys, session_factory):
    row = _row_dataset(client, keys)
    with session_factory.begin() as session:
        stated = update(Dataset).where(Dataset.id == uuid.UUID(row))
        session.execute(stated.values(privacy_unit_column="column 0"))
    problems = verify(session_factory).problems
    assert any(f"datasets {row}: privacy_unit differs" in p for p in problems), problems
