"""Concurrent release requests can never overspend (real commits, separate connections)."""

from __future__ import annotations

import threading
from collections import Counter
from decimal import Decimal

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import select

from service import auth
from service.app import create_app
from service.db.models import LedgerEntry
from tests.conftest import bearer, npy_bytes


def test_twenty_simultaneous_requests_against_a_budget_for_five(committed_db, settings):
    _, factory = committed_db
    app = create_app(settings, session_factory=factory)
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
        _, analyst = auth.create_key(session, "analyst", "a", None)
    with TestClient(app) as client:
        dataset = client.post(
            "/v1/datasets",
            headers=bearer(owner),
            files={"file": ("x.npy", npy_bytes(np.eye(4)), "application/octet-stream")},
            data={
                "name": "d",
                "epsilon_budget": "0.5",
                "delta_budget": "1e-5",
                "row_norm_bound": "1",
            },
        ).json()

    barrier = threading.Barrier(20)
    statuses: list[int] = []
    lock = threading.Lock()

    def request() -> None:
        with TestClient(app) as own_client:
            barrier.wait()
            response = own_client.post(
                f"/v1/datasets/{dataset['id']}/releases",
                headers=bearer(analyst),
                json={"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"},
            )
        with lock:
            statuses.append(response.status_code)

    threads = [threading.Thread(target=request) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert Counter(statuses) == {202: 5, 409: 15}
    with factory() as session:
        charges = list(session.scalars(select(LedgerEntry.epsilon)))
    assert len(charges) == 5 and sum(charges) == Decimal("0.5")


def test_simultaneous_retries_with_one_idempotency_key_make_one_release(committed_db, settings):
    _, factory = committed_db
    app = create_app(settings, session_factory=factory)
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
        _, analyst = auth.create_key(session, "analyst", "a", None)
    with TestClient(app) as client:
        dataset = client.post(
            "/v1/datasets",
            headers=bearer(owner),
            files={"file": ("x.npy", npy_bytes(np.eye(4)), "application/octet-stream")},
            data={
                "name": "d",
                "epsilon_budget": "1",
                "delta_budget": "1e-5",
                "row_norm_bound": "1",
            },
        ).json()
    barrier = threading.Barrier(8)
    responses: list[tuple[int, str]] = []
    lock = threading.Lock()

    def retry() -> None:
        with TestClient(app) as own_client:
            barrier.wait()
            response = own_client.post(
                f"/v1/datasets/{dataset['id']}/releases",
                headers={**bearer(analyst), "Idempotency-Key": "same-request"},
                json={"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"},
            )
        with lock:
            responses.append((response.status_code, response.json().get("id", "")))

    threads = [threading.Thread(target=retry) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {status for status, _ in responses} == {202}
    assert len({release_id for _, release_id in responses}) == 1
    with factory() as session:
        assert list(session.scalars(select(LedgerEntry.epsilon))) == [Decimal("0.1")]
