"""``audit.verify`` reconciles grants and grant charges with the events: clean on an untampered
database with grants (charges, a refund, a revocation), and each tampering is named."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from service import audit, auth
from service.db.models import Grant, LedgerEntry
from service.jobs import REFUSED_AT_RUN_REASON, Outcome
from service.oneshot import OneShot
from tests.conftest import bearer, post_release

GAUSS = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.25", "delta": "1e-6"}


@dataclass
class Granted:
    owner: str
    dataset: str
    personal: str
    everyone: str
    charged: str
    revoked_charge: str


def _key(factory: sessionmaker[Session], role: str) -> tuple[uuid.UUID, str]:
    with factory.begin() as session:
        key, secret = auth.create_key(session, role, role, actor_key_id=None)  # type: ignore[arg-type]
        return key.id, secret


@pytest.fixture
def granted(
    client: TestClient,
    session_factory: sessionmaker[Session],
    upload_dataset: Callable[..., dict[str, Any]],
    run_worker: Callable[[], int],
    monkeypatch: pytest.MonkeyPatch,
) -> Granted:
    _, owner = _key(session_factory, "owner")
    alice_id, alice = _key(session_factory, "analyst")
    _, bob = _key(session_factory, "analyst")
    rng = np.random.default_rng(3)
    data = rng.normal(size=(30, 3)) * 0.1
    dataset = upload_dataset(client, owner, data, row_norm_bound=1.0)["id"]
    emptied = upload_dataset(client, owner, data, row_norm_bound=1.0)["id"]
    path = f"/v1/datasets/{dataset}/grants"
    body = {"analyst_key_id": str(alice_id), "epsilon": "1", "delta": "1e-5"}
    personal = client.post(path, headers=bearer(owner), json=body).json()["id"]
    everyone = client.post(
        path, headers=bearer(owner), json={"epsilon": "1", "delta": "1e-5"}
    ).json()["id"]
    charged = post_release(client, alice, dataset, **GAUSS)
    revoked_charge = post_release(client, bob, dataset, **GAUSS)
    assert run_worker() == 2
    revoked = client.delete(f"{path}/{everyone}", headers=bearer(owner))
    assert revoked.status_code == 200
    # A refunded release on a grant: the refund goes back to the grant.
    emptied_grant = client.post(
        f"/v1/datasets/{emptied}/grants",
        headers=bearer(owner),
        json={"analyst_key_id": str(alice_id), "epsilon": "0.25", "delta": "1e-6"},
    ).json()
    # A failure decided before any row is read (not a deletion: a release ending after one is
    # never refunded, tests/api/test_deletion_race.py).
    refused = Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
    with monkeypatch.context() as patch:
        patch.setattr(OneShot, "run", lambda *_: refused)
        post_release(client, alice, emptied, **GAUSS)
        assert run_worker() == 1
    assert client.delete(f"/v1/datasets/{emptied}", headers=bearer(owner)).status_code == 204
    with session_factory() as session:
        refund = session.scalars(select(LedgerEntry).where(LedgerEntry.kind == "refund")).one()
    assert refund.grant_id == uuid.UUID(emptied_grant["id"])
    return Granted(owner, dataset, personal, everyone, charged, revoked_charge)


def verify(factory: sessionmaker[Session]) -> audit.VerifyReport:
    with factory() as session:
        return audit.verify(session)


def test_grants_charges_refunds_and_revocations_verify_clean(granted, session_factory):
    report = verify(session_factory)
    assert report.ok, report.problems


def _edit_grant_amount(session: Session, g: Granted) -> Any:
    return session.execute(
        update(Grant).where(Grant.id == uuid.UUID(g.personal)).values(epsilon=Decimal(1000))
    )


def _delete_grant_charge(session: Session, g: Granted) -> Any:
    return session.execute(
        delete(LedgerEntry).where(LedgerEntry.release_id == uuid.UUID(g.charged))
    )


def _unlink_grant_charge(session: Session, g: Granted) -> Any:
    return session.execute(
        update(LedgerEntry)
        .where(LedgerEntry.release_id == uuid.UUID(g.charged))
        .values(grant_id=None)
    )


def _unrevoke(session: Session, g: Granted) -> Any:
    return session.execute(
        update(Grant).where(Grant.id == uuid.UUID(g.everyone)).values(revoked_at=None)
    )


def _delete_grant(session: Session, g: Granted) -> Any:
    session.execute(delete(LedgerEntry).where(LedgerEntry.grant_id == uuid.UUID(g.everyone)))
    return session.execute(delete(Grant).where(Grant.id == uuid.UUID(g.everyone)))


TAMPERINGS: dict[str, tuple[Callable[[Session, Granted], Any], Callable[[Granted], str]]] = {
    "edited grant amount": (
        _edit_grant_amount,
        lambda g: f"grants {g.personal}: epsilon differs from grant_created event",
    ),
    "deleted grant charge": (
        _delete_grant_charge,
        lambda g: f"ledger_entries: the charge for release {g.charged}",
    ),
    "grant charge moved to the dataset alone": (
        _unlink_grant_charge,
        lambda g: "grant_id differs from release_requested event",
    ),
    "revocation undone": (
        _unrevoke,
        lambda g: f"grants {g.everyone}: revoked_at disagrees with the grant_revoked events",
    ),
    "grant row deleted": (
        _delete_grant,
        lambda g: f"grants {g.everyone}: the row is missing",
    ),
}


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_tampering_with_grants_is_reported(name, granted, session_factory):
    tamper, expected = TAMPERINGS[name]
    with session_factory.begin() as session:
        tamper(session, granted)
    report = verify(session_factory)
    assert not report.ok
    assert any(expected(granted) in problem for problem in report.problems), report.problems
