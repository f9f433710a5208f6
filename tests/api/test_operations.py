"""The read-only views for the dashboard and operators: whoami, workers, the queue, a dataset's
ledger, an analyst's grants and the audit chain's verification, each for the roles it serves
and refused (403/404) to the others."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service import audit
from service.app import create_app
from service.config import Settings
from service.db.models import AuditEvent, WorkerHeartbeat, utcnow
from service.worker import Worker
from tests.conftest import Keys, bearer, post_release

RELEASE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}


def get(client: TestClient, key: str, path: str) -> Any:
    return client.get(path, headers=bearer(key))


def key_id(client: TestClient, key: str) -> str:
    return str(get(client, key, "/v1/whoami").json()["id"])


@pytest.fixture
def dataset(client: TestClient, keys: Keys, upload_dataset: Callable[..., dict[str, Any]]) -> str:
    data = upload_dataset(
        client, keys.owner, np.eye(4), epsilon_budget="1", delta_budget="1e-5", row_norm_bound="1"
    )
    return str(data["id"])


def test_whoami_names_the_key_for_every_role(client: TestClient, keys: Keys) -> None:
    for role in ("admin", "owner", "analyst", "auditor"):
        body = get(client, getattr(keys, role), "/v1/whoami").json()
        assert body["role"] == role and body["name"] == "test" and body["id"]
    assert client.get("/v1/whoami").status_code == 401


def test_the_ledger_sums_to_the_budget_for_its_owner_only(
    client: TestClient,
    keys: Keys,
    dataset: str,
    run_worker: Callable[[], int],
    make_key: Callable[[str], str],
) -> None:
    analyst_id = key_id(client, keys.analyst)
    grants = f"/v1/datasets/{dataset}/grants"
    grant = client.post(
        grants,
        headers=bearer(keys.owner),
        json={"analyst_key_id": analyst_id, "epsilon": "0.5"} | {"delta": "1e-6"},
    ).json()
    post_release(client, keys.analyst, dataset, **RELEASE)
    post_release(client, keys.analyst, dataset, **{**RELEASE, "epsilon": "0.25"})
    assert run_worker() == 2
    ledger = get(client, keys.owner, f"/v1/datasets/{dataset}/ledger?limit=1")
    assert ledger.status_code == 200
    first = ledger.json()
    assert first["total"] == 2 and len(first["items"]) == 1 and first["next"]
    rest = get(client, keys.owner, f"/v1/datasets/{dataset}/ledger?cursor={first['next']}").json()
    entries = first["items"] + rest["items"]
    assert [e["kind"] for e in entries] == ["charge", "charge"]
    assert {e["grant_id"] for e in entries} == {grant["id"]}
    assert entries[0]["id"] < entries[1]["id"]
    budget = get(client, keys.owner, f"/v1/datasets/{dataset}/budget").json()
    assert sum(Decimal(e["epsilon"]) for e in entries) == Decimal(budget["epsilon_spent"])
    assert Decimal(budget["epsilon_spent"]) == Decimal("0.35")
    for role in ("analyst", "auditor", "admin"):
        assert get(client, getattr(keys, role), f"/v1/datasets/{dataset}/ledger").status_code == 403
    other_owner = make_key("owner")
    assert get(client, other_owner, f"/v1/datasets/{dataset}/ledger").status_code == 404
    assert get(client, keys.owner, f"/v1/datasets/{dataset}/ledger?cursor=x").status_code == 422


def test_an_analyst_sees_the_grant_that_applies_to_them(
    client: TestClient, keys: Keys, dataset: str, make_key: Callable[[str], str]
) -> None:
    grants = f"/v1/datasets/{dataset}/grants"
    everyone = client.post(
        grants, headers=bearer(keys.owner), json={"epsilon": "0.2"} | {"delta": "0"}
    ).json()
    other = make_key("analyst")
    assert [g["id"] for g in get(client, other, "/v1/grants").json()["items"]] == [everyone["id"]]
    mine = client.post(
        grants,
        headers=bearer(keys.owner),
        json={"analyst_key_id": key_id(client, keys.analyst), "epsilon": "0.3", "delta": "0"},
    ).json()
    listed = get(client, keys.analyst, "/v1/grants").json()
    assert listed["total"] == 1 and listed["items"][0]["id"] == mine["id"]
    assert listed["items"][0]["epsilon_remaining"] == "0.3"
    # Still only the all-analysts grant for everyone else.
    assert [g["id"] for g in get(client, other, "/v1/grants").json()["items"]] == [everyone["id"]]
    client.delete(f"{grants}/{mine['id']}", headers=bearer(keys.owner))
    assert [g["id"] for g in get(client, keys.analyst, "/v1/grants").json()["items"]] == [
        everyone["id"]
    ]
    for role in ("owner", "auditor", "admin"):
        assert get(client, getattr(keys, role), "/v1/grants").status_code == 403


def test_workers_alive_and_dead_for_admins_only(
    client: TestClient,
    keys: Keys,
    session_factory: sessionmaker[Session],
    worker: Worker,
    settings: Settings,
) -> None:
    worker.note_alive()
    worker.note_alive()  # a renewal, not a second row
    with session_factory.begin() as session:
        stale = utcnow() - timedelta(seconds=settings.worker_lease_seconds + 5)
        session.add(WorkerHeartbeat(worker_id="gone:1:x", started_at=stale, last_seen_at=stale))
        ancient = utcnow() - timedelta(days=2)
        session.add(WorkerHeartbeat(worker_id="old:1:x", started_at=ancient, last_seen_at=ancient))
    worker.note_alive()  # forgets workers silent for a day
    body = get(client, keys.admin, "/v1/workers").json()
    assert body["total"] == 2 and body["alive"] == 1
    by_id = {w["worker_id"]: w for w in body["items"]}
    assert by_id["test-worker"]["alive"] and not by_id["gone:1:x"]["alive"]
    for role in ("owner", "analyst", "auditor"):
        assert get(client, getattr(keys, role), "/v1/workers").status_code == 403


def test_the_queue_for_admins_only(
    client: TestClient, keys: Keys, dataset: str, run_worker: Callable[[], int]
) -> None:
    empty = get(client, keys.admin, "/v1/queue").json()
    assert empty == {
        "queued": 0,
        "running": 0,
        "oldest_queued_at": None,
        "oldest_queued_age_seconds": None,
        "items": [],
        "late": {},  # issue 30: late releases by mechanism
    }
    release_id = post_release(client, keys.analyst, dataset, **RELEASE)
    body = get(client, keys.admin, "/v1/queue").json()
    assert body["queued"] == 1 and body["oldest_queued_age_seconds"] >= 0
    assert [(j["release_id"], j["status"], j["mechanism"]) for j in body["items"]] == [
        (release_id, "queued", "analyze_gauss")
    ]
    assert "params" not in body["items"][0] and "epsilon" not in body["items"][0]
    for role in ("owner", "analyst", "auditor"):
        assert get(client, getattr(keys, role), "/v1/queue").status_code == 403
    run_worker()
    assert get(client, keys.admin, "/v1/queue").json()["queued"] == 0


def test_verification_ok_then_broken_for_auditors_and_admins(
    client: TestClient, keys: Keys, dataset: str, session_factory: sessionmaker[Session]
) -> None:
    for role in ("auditor", "admin"):
        body = get(client, getattr(keys, role), "/v1/audit/verification").json()
        assert body["ok"] is True and body["problems"] == [] and body["anchor"] is None
        assert body["anchor_found"] is None and body["checked"] >= 5
    with session_factory() as session:
        head = audit.verify(session).head
    assert body["head"] == head.token()
    for role in ("owner", "analyst"):
        assert get(client, getattr(keys, role), "/v1/audit/verification").status_code == 403
    with session_factory.begin() as session:
        session.execute(
            update(AuditEvent).where(AuditEvent.seq == 2).values(details={"forged": True})
        )
    broken = get(client, keys.auditor, "/v1/audit/verification").json()
    assert broken["ok"] is False
    assert "event 2: content does not match its hash" in broken["problems"]


def test_verification_reports_the_anchor(
    settings: Settings, session_factory: sessionmaker[Session], keys: Keys
) -> None:
    with session_factory() as session:
        event = session.execute(select(AuditEvent).order_by(AuditEvent.seq)).scalars().first()
        assert event is not None
        anchor = f"{event.seq}:{event.hash}"
    for token, found in ((anchor, True), (f"{event.seq}:{'f' * 64}", False)):
        app = create_app(settings.model_copy(update={"audit_anchor": token}), session_factory)
        with TestClient(app) as client:
            body = get(client, keys.auditor, "/v1/audit/verification").json()
        assert body["anchor"] == token and body["anchor_found"] is found
        assert body["ok"] is found


def test_verification_reads_a_snapshot_and_leaves_the_pool_writable(
    committed_db: tuple[str, sessionmaker[Session]], settings: Settings
) -> None:
    """On the app's own engine (PostgreSQL: REPEATABLE READ, READ ONLY for the check), with one
    pooled connection: a write after the check still works, so the connection went back to the
    pool as it was."""
    url, _ = committed_db
    own = settings.model_copy(
        update={
            "database_url": url,
            "admin_api_key": SecretStr("verify-admin"),
            "db_pool_size": 1,
            "db_max_overflow": 0,
        }
    )
    with TestClient(create_app(own)) as client:
        first = get(client, "verify-admin", "/v1/audit/verification").json()["checked"]
        for step in range(2):
            body = get(client, "verify-admin", "/v1/audit/verification").json()
            assert body["ok"] is True and body["checked"] == first + step
            made = client.post(
                "/v1/keys", headers=bearer("verify-admin"), json={"role": "auditor", "name": "a"}
            )
            assert made.status_code == 201, made.text
        last = get(client, made.json()["key"], "/v1/audit/verification").json()
        assert last["ok"] is True and last["checked"] == first + 2
