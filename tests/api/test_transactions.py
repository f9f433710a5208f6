"""A success status is sent only after the request's transactions have committed.

An upload has two: the key check before the body is read, then the registration.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlalchemy.orm import Session

from service.app import create_app
from tests.conftest import bearer, npy_bytes


def test_commit_happens_before_the_response_starts(settings, session_factory, make_key):
    order: list[str] = []
    app = create_app(settings, session_factory=session_factory)

    @event.listens_for(Session, "after_commit")
    def _committed(_session: Session) -> None:
        order.append("commit")

    async def recording(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def send_and_record(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                order.append(f"response {message['status']}")
            await send(message)

        await app(scope, receive, send_and_record)

    owner = make_key("owner")
    try:
        with TestClient(recording) as client:
            order.clear()
            response = client.post(
                "/v1/datasets",
                headers=bearer(owner),
                files={"file": ("x.npy", npy_bytes(np.eye(3)), "application/octet-stream")},
                data={"name": "d", "epsilon_budget": "1", "delta_budget": "0"},
            )
    finally:
        event.remove(Session, "after_commit", _committed)
    assert response.status_code == 201
    # The file's registration, then the dataset's transaction (its idempotency savepoint
    # counts as a commit of its own): every one before the response starts.
    assert order[-1] == "response 201" and order[:-1] == ["commit"] * (len(order) - 1)
    assert 2 <= len(order) - 1 <= 3
