"""Concurrent release requests can never overspend (real commits, separate connections)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import select

from service import auth
from service.app import create_app
from service.db.models import LedgerEntry
from tests.conftest import bearer, npy_bytes


def simultaneously(app: Any, count: int, call: Callable[[TestClient], Any]) -> list[Any]:
    """Run ``call`` from ``count`` threads at once, each with its own client (connection)."""
    barrier = threading.Barrier(count)
    results: list[Any] = []
    lock = threading.Lock()

    def run() -> None:
        with TestClient(app) as own_client:
            barrier.wait()
            result = call(own_client)
        with lock:
            results.append(result)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def service_with_dataset(committed_db, settings, epsilon_budget: str):
    """An app on the committed database, an analyst key and a dataset with that budget."""
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
                "epsilon_budget": epsilon_budget,
                "delta_budget": "1e-5",
                "row_norm_bound": "1",
            },
        ).json()
    return app, factory, analyst, f"/v1/datasets/{dataset['id']}/releases"


RELEASE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}


def test_twenty_simultaneous_requests_against_a_budget_for_five(committed_db, settings):
    app, factory, analyst, path = service_with_dataset(committed_db, settings, "0.5")
    statuses = simultaneously(
        app, 20, lambda client: client.post(path, headers=bearer(analyst), json=RELEASE).status_code
    )
    assert Counter(statuses) == {202: 5, 409: 15}
    with factory() as session:
        charges = list(session.scalars(select(LedgerEntry.epsilon)))
    assert len(charges) == 5 and sum(charges) == Decimal("0.5")


def test_simultaneous_retries_with_one_idempotency_key_make_one_release(committed_db, settings):
    app, factory, analyst, path = service_with_dataset(committed_db, settings, "1")
    headers = {**bearer(analyst), "Idempotency-Key": "same-request"}

    def retry(client: TestClient) -> tuple[int, str]:
        response = client.post(path, headers=headers, json=RELEASE)
        return response.status_code, response.json().get("id", "")

    responses = simultaneously(app, 8, retry)
    assert {status for status, _ in responses} == {202}
    assert len({release_id for _, release_id in responses}) == 1
    with factory() as session:
        assert list(session.scalars(select(LedgerEntry.epsilon))) == [Decimal("0.1")]
