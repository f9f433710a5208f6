"""Fixtures of the API tests that need real commits: the app on a committed database with its
keys, one dataset, and a worker to run now (in this thread or another, as it would run in
another process)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service import auth
from service.app import create_app
from service.config import Settings
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import Keys, bearer, npy_bytes, release_and_wait
from tests.factories import near_subspace

BODY = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-7"}


#: A padding floor no test outlives: every outcome stays behind its ``visible_at``.
PADDING_HOUR = 3600.0


@pytest.fixture
def padded_settings(settings: Settings) -> Settings:
    """The test settings with an hour's padding (``visible_at`` an hour after the request)."""
    return settings.model_copy(
        update={"release_padding_floor_seconds": PADDING_HOUR, "release_padding_multiplier": 1.0}
    )


@pytest.fixture
def padded_client(
    padded_settings: Settings, session_factory: sessionmaker[Session]
) -> Iterator[TestClient]:
    """The app with :func:`padded_settings`, on the test's session (rolled back)."""
    app = create_app(padded_settings, session_factory=session_factory)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


class Service:
    """The app on a committed database, its keys, one dataset, and a worker to run now."""

    def __init__(
        self, factory: sessionmaker[Session], settings: Settings, client: TestClient
    ) -> None:
        self.factory = factory
        self.settings = settings
        self.client = client
        self.keys: dict[str, str] = {}
        with factory.begin() as session:
            for role in ("owner", "analyst"):
                _, self.keys[role] = auth.create_key(session, role, role, actor_key_id=None)
        data, _ = near_subspace(np.random.default_rng(3), 200, 6, 2)
        response = client.post(
            "/v1/datasets",
            headers=bearer(self.keys["owner"]),
            files={"file": ("data.npy", npy_bytes(data), "application/octet-stream")},
            data={"name": "t", "epsilon_budget": "10", "delta_budget": "1e-3",
                  "row_norm_bound": "1"},
        )  # fmt: skip
        assert response.status_code == 201, response.text
        self.dataset = response.json()["id"]
        store = DatasetStore(settings.datasets_dir)
        self.worker = Worker(factory, store, settings, worker_id="long-poll-worker")

    def request(self, body: dict[str, Any] | None = None) -> str:
        made = self.client.post(
            f"/v1/datasets/{self.dataset}/releases",
            headers=bearer(self.keys["analyst"]),
            json=body or BODY,
        )
        assert made.status_code == 202, made.text
        return str(made.json()["id"])

    def run_later(self, seconds: float) -> threading.Thread:
        def run() -> None:
            time.sleep(seconds)
            self.worker.run_pending()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def get(self, release: str, role: str = "analyst", **params: Any) -> httpx.Response:
        return self.client.get(
            f"/v1/releases/{release}", headers=bearer(self.keys[role]), params=params
        )


@pytest.fixture
def make_service(
    committed_db: tuple[str, sessionmaker[Session]], settings: Settings
) -> Iterator[Callable[..., Service]]:
    clients: list[TestClient] = []

    def make(**overrides: Any) -> Service:
        _, factory = committed_db
        configured = settings.model_copy(update=overrides)
        client = TestClient(create_app(configured, session_factory=factory))
        client.__enter__()
        clients.append(client)
        return Service(factory, configured, client)

    yield make
    for client in clients:
        client.__exit__(None, None, None)


#: The centred (private centre) analyze_gauss release the explained-variance tests request
#: (``test_hidden_share_http``, ``test_whole_space_split_http``); each adds ``k`` and ``epsilon``.
CENTRED_BODY: dict[str, Any] = {
    "mechanism": "analyze_gauss",
    "delta": "1e-7",
    "params": {"center": "private"},
}


@pytest.fixture
def isotropic_dataset(
    client: TestClient, keys: Keys, upload_dataset: Callable[..., dict[str, Any]]
) -> Callable[[int], dict[str, Any]]:
    """``isotropic_dataset(d)``: the owner uploads 200 isotropic unit rows (seed 7) of ``d``
    columns (budget epsilon 1, delta 1e-5; row norm bound 1), on which no direction stands
    out of the noise at a small epsilon; the dataset's JSON."""

    def upload(d: int) -> dict[str, Any]:
        rows = np.random.default_rng(7).standard_normal((200, d))
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        return upload_dataset(
            client, keys.owner, rows, epsilon_budget="1.0", delta_budget="1e-5", row_norm_bound=1.0
        )

    return upload


@pytest.fixture
def centred_release(
    client: TestClient, keys: Keys, run_worker: Callable[[], int]
) -> Callable[..., Any]:
    """``centred_release(dataset_id, k=..., epsilon=...)``: the analyst's :data:`CENTRED_BODY`
    release on the dataset, run by the worker; the finished release."""

    def release(dataset_id: str, **body: Any) -> Any:
        return release_and_wait(
            client, keys.analyst, dataset_id, run_worker, **{**CENTRED_BODY, **body}
        )

    return release
