"""Grants under concurrency, as for the dataset budget (tests/test_concurrency.py): real commits
and separate connections (``committed_db``), on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from decimal import Decimal
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import select

from service import auth
from service.app import create_app
from service.db.models import LedgerEntry
from tests.conftest import bearer, npy_bytes
from tests.test_concurrency import RELEASE, simultaneously


def service(committed_db: Any, settings: Any, epsilon_budget: str, analysts: int) -> Any:
    """An app, an owner's dataset with that budget, and ``analysts`` analyst keys (id, secret)."""
    _, factory = committed_db
    app = create_app(settings, session_factory=factory)
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
        keys = [auth.create_key(session, "analyst", f"a{i}", None) for i in range(analysts)]
        analyst_keys = [(str(key.id), secret) for key, secret in keys]
    with TestClient(app) as client:
        dataset = client.post(
            "/v1/datasets",
            headers=bearer(owner),
            files={"file": ("x.npy", npy_bytes(np.eye(4)), "application/octet-stream")},
            data={
                "name": "d",
                "epsilon_budget": epsilon_budget,
                "delta_budget": "1e-5",
                "row_norm_bound": "1",
            },
        ).json()
    return app, factory, owner, analyst_keys, f"/v1/datasets/{dataset['id']}"


def grant(app: Any, owner: str, dataset_path: str, **body: Any) -> str:
    with TestClient(app) as client:
        response = client.post(f"{dataset_path}/grants", headers=bearer(owner), json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def test_thirty_simultaneous_requests_against_a_grant_for_five(committed_db, settings):
    app, factory, owner, analysts, dataset_path = service(committed_db, settings, "2", 1)
    ((analyst_id, analyst),) = analysts
    grant_id = grant(
        app, owner, dataset_path, analyst_key_id=analyst_id, epsilon="0.5", delta="1e-5"
    )
    responses = simultaneously(
        app,
        30,
        lambda client: client.post(
            f"{dataset_path}/releases", headers=bearer(analyst), json=RELEASE
        ),
    )
    assert Counter(r.status_code for r in responses) == {202: 5, 409: 25}
    refusals = {
        (r.json()["budget"], r.json()["grant_id"]) for r in responses if r.status_code == 409
    }
    assert refusals == {("grant", grant_id)}
    with factory() as session:
        entries = session.execute(select(LedgerEntry.epsilon, LedgerEntry.grant_id)).all()
    assert len(entries) == 5 and {str(grant) for _, grant in entries} == {grant_id}
    assert sum(epsilon for epsilon, _ in entries) == Decimal("0.5")


def test_grants_above_the_dataset_budget_never_overspend_it(committed_db, settings):
    """Two grants of 0.4 on a dataset of 0.5: the dataset binds at five releases in all."""
    app, factory, owner, analysts, dataset_path = service(committed_db, settings, "0.5", 2)
    for analyst_id, _ in analysts:
        grant(app, owner, dataset_path, analyst_key_id=analyst_id, epsilon="0.4", delta="1e-5")
    secrets = itertools.cycle([secret for _, secret in analysts])
    lock = threading.Lock()

    def post(client: TestClient) -> Any:
        with lock:
            secret = next(secrets)
        return client.post(f"{dataset_path}/releases", headers=bearer(secret), json=RELEASE)

    responses = simultaneously(app, 30, post)
    assert Counter(r.status_code for r in responses) == {202: 5, 409: 25}
    with factory() as session:
        entries = session.execute(select(LedgerEntry.epsilon, LedgerEntry.grant_id)).all()
    per_grant = Counter(grant_id for _, grant_id in entries)
    assert sum(epsilon for epsilon, _ in entries) == Decimal("0.5")
    assert max(per_grant.values()) <= 4 and sum(per_grant.values()) == 5
