"""Fixtures of the client tests: clients of each role on the real ASGI app, and an in-process
worker that runs where the client would have slept."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

import dpss_client.client as client_module
from dpss_client.client import Client

MakeKey = Callable[[str], str]


@pytest.fixture
def connect(client: TestClient) -> Callable[[str], Client]:
    return lambda key: Client(str(client.base_url), key, http=client)


@pytest.fixture
def owner(make_key: MakeKey, connect: Callable[[str], Client]) -> Client:
    return connect(make_key("owner"))


@pytest.fixture
def analyst(make_key: MakeKey, connect: Callable[[str], Client]) -> Client:
    return connect(make_key("analyst"))


@pytest.fixture
def worker_sleep(monkeypatch: pytest.MonkeyPatch, run_worker: Callable[[], int]) -> None:
    """Make the client's waits (``ReleaseHandle.wait``, ``--wait``) run the in-process worker
    where they would have slept."""
    monkeypatch.setattr(client_module, "_sleep", lambda _seconds: run_worker())
