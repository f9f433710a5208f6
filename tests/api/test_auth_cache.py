"""Reads reuse a recent verification of their key (one statement fewer); writes never do, and a
revoked key stops working for reads at once in the revoking process and within
DPSS_AUTH_CACHE_SECONDS everywhere else. Expiry is driven by a patched clock, not by waiting."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update

from service import auth
from service.app import create_app
from service.auth import Principal, VerifiedKeys, hash_secret
from service.db.models import ApiKey, utcnow
from tests.api.test_read_cost import counted
from tests.conftest import bearer

DATA = np.random.default_rng(5).normal(size=(20, 3)) * 0.1


@pytest.fixture
def engine(engines: dict[str, Engine], backend: str) -> Engine:
    return engines[backend]


def _key_lookups(statements: list[tuple[str, int]]) -> int:
    return sum("FROM api_keys" in sql for sql, _ in statements)


def test_a_read_reuses_the_verification_a_write_does_not(
    client: TestClient, engine: Engine, keys: Any, upload_dataset: Any
) -> None:
    dataset = upload_dataset(client, keys.owner, DATA)
    path = f"/v1/datasets/{dataset['id']}/budget"
    with counted(engine) as first:
        assert client.get(path, headers=bearer(keys.analyst)).status_code == 200
    with counted(engine) as second:
        assert client.get(path, headers=bearer(keys.analyst)).status_code == 200
    assert (_key_lookups(first), _key_lookups(second)) == (1, 0)
    assert len(second) == len(first) - 1
    with counted(engine) as write:
        client.post(
            f"/v1/datasets/{dataset['id']}/releases",
            headers=bearer(keys.analyst),
            json={"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-8"},
        )
    assert _key_lookups(write) >= 1


def test_revocation_elsewhere_stops_reads_within_the_ttl_and_writes_at_once(
    client: TestClient,
    keys: Any,
    upload_dataset: Any,
    session_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dataset = upload_dataset(client, keys.owner, DATA)
    path = f"/v1/datasets/{dataset['id']}/budget"
    headers = bearer(keys.analyst)
    now = [1000.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: now[0])
    assert client.get(path, headers=headers).status_code == 200
    # Another process (another API worker, `dpss keys revoke`) revokes the key in the database.
    with session_factory.begin() as session:
        session.execute(
            update(ApiKey)
            .where(ApiKey.key_hash == hash_secret(keys.analyst))
            .values(revoked_at=utcnow())
        )
    release = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-8"}
    write = client.post(f"/v1/datasets/{dataset['id']}/releases", headers=headers, json=release)
    assert write.status_code == 401  # a write checks the key in its own transaction
    ttl = client.app.state.settings.auth_cache_seconds  # type: ignore[attr-defined]
    assert ttl > 0
    now[0] += ttl * 0.5
    assert client.get(path, headers=headers).status_code == 200  # within the documented bound
    now[0] += ttl * 0.5
    assert client.get(path, headers=headers).status_code == 401  # and not a moment longer


def test_revocation_through_this_process_stops_reads_at_once(
    client: TestClient, keys: Any, upload_dataset: Any
) -> None:
    created = client.post(
        "/v1/keys", headers=bearer(keys.admin), json={"role": "owner", "name": "o"}
    ).json()
    assert client.get("/v1/datasets", headers=bearer(created["key"])).status_code == 200
    revoked = client.delete(f"/v1/keys/{created['id']}", headers=bearer(keys.admin))
    assert revoked.status_code == 204
    assert client.get("/v1/datasets", headers=bearer(created["key"])).status_code == 401


def test_zero_ttl_checks_every_request(settings: Any, session_factory: Any, keys: Any) -> None:
    app = create_app(
        settings.model_copy(update={"auth_cache_seconds": 0}), session_factory=session_factory
    )
    with TestClient(app) as client:
        assert client.get("/v1/datasets", headers=bearer(keys.owner)).status_code == 200
    assert app.state.database.verified_keys.get(hash_secret(keys.owner)) is None


def test_the_cache_is_bounded_and_never_holds_unknown_keys(client: TestClient, keys: Any) -> None:
    for _ in range(5):
        assert client.get("/v1/datasets", headers=bearer(auth.generate_secret())).status_code == 401
    verified = client.app.state.database.verified_keys  # type: ignore[attr-defined]
    assert len(verified._entries) == 0
    small = VerifiedKeys(ttl_seconds=60, max_entries=3)
    principals = [Principal(uuid.uuid4(), "analyst", str(i)) for i in range(5)]
    for i, principal in enumerate(principals):
        small.put(f"d{i}", principal)
    assert [small.get(f"d{i}") for i in range(5)] == [None, None, *principals[2:]]


def test_a_write_checks_its_key_once_when_the_key_was_verified_recently(
    client: TestClient, engine: Engine, keys: Any, upload_dataset: Any
) -> None:
    """The gate before a write's body is read answers from the recent verification; the
    write's own transaction still looks the key up (the revocation test above: at once)."""
    dataset = upload_dataset(client, keys.owner, DATA)
    headers = bearer(keys.analyst)
    assert client.get(f"/v1/datasets/{dataset['id']}/budget", headers=headers).status_code == 200
    release = {
        "mechanism": "analyze_gauss",
        "k": 1,
        "epsilon": "0.1",
        "delta": "1e-8",
        "params": {"clip_norm": 1.0},
    }
    with counted(engine) as write:
        answer = client.post(
            f"/v1/datasets/{dataset['id']}/releases", headers=headers, json=release
        )
    assert answer.status_code == 202, answer.text
    assert _key_lookups(write) == 1
