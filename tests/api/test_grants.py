"""Grants: an owner's share of a dataset's budget, charged together with the dataset's."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service import audit, auth
from service.app import create_app
from service.config import Settings
from service.db.models import AuditEvent, Grant, LedgerEntry
from tests.conftest import bearer

RELEASE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}


def new_key(factory: sessionmaker[Session], role: str) -> tuple[str, str]:
    """``(key id, secret)`` of a new key."""
    with factory.begin() as session:
        key, secret = auth.create_key(session, role, role, actor_key_id=None)  # type: ignore[arg-type]
        return str(key.id), secret


@pytest.fixture
def world(
    client: TestClient,
    session_factory: sessionmaker[Session],
    upload_dataset: Callable[..., dict[str, Any]],
) -> dict[str, Any]:
    _, owner = new_key(session_factory, "owner")
    alice_id, alice = new_key(session_factory, "analyst")
    bob_id, bob = new_key(session_factory, "analyst")
    dataset = upload_dataset(
        client, owner, np.eye(4), epsilon_budget="1", delta_budget="1e-5", row_norm_bound="1"
    )
    return {
        "owner": owner,
        "alice": alice,
        "alice_id": alice_id,
        "bob": bob,
        "bob_id": bob_id,
        "dataset": dataset["id"],
        "grants": f"/v1/datasets/{dataset['id']}/grants",
        "releases": f"/v1/datasets/{dataset['id']}/releases",
    }


def grant(client: TestClient, w: dict[str, Any], **body: Any) -> dict[str, Any]:
    response = client.post(w["grants"], headers=bearer(w["owner"]), json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def release(client: TestClient, key: str, w: dict[str, Any], **body: Any) -> Any:
    return client.post(w["releases"], headers=bearer(key), json={**RELEASE, **body})


def budget(client: TestClient, w: dict[str, Any]) -> Any:
    return client.get(f"/v1/datasets/{w['dataset']}/budget", headers=bearer(w["owner"])).json()


def test_a_release_is_charged_to_the_grant_and_the_dataset(client, world):
    created = grant(client, world, analyst_key_id=world["alice_id"], epsilon="0.25", delta="1e-6")
    assert created["epsilon_remaining"] == "0.25" and created["revoked_at"] is None
    assert release(client, world["alice"], world).status_code == 202
    assert release(client, world["alice"], world).status_code == 202
    refused = release(client, world["alice"], world)
    assert refused.status_code == 409
    body = refused.json()
    assert body["error"] == "budget_exceeded" and body["budget"] == "grant"
    assert body["grant_id"] == created["id"]
    assert body["epsilon_remaining"] == "0.05" and body["delta_remaining"] == "0.0000008"
    (listed,) = client.get(world["grants"], headers=bearer(world["owner"])).json()["items"]
    assert listed["epsilon_spent"] == "0.2" and listed["epsilon_remaining"] == "0.05"
    assert listed["delta_spent"] == "0.0000002"
    # The dataset was charged the same two releases, and nothing for the refusal.
    assert budget(client, world)["epsilon_spent"] == "0.2"
    # Bob has no grant: by default he spends the dataset's budget directly.
    assert release(client, world["bob"], world).status_code == 202
    assert budget(client, world)["epsilon_spent"] == "0.3"


def test_the_dataset_budget_still_binds_a_larger_sum_of_grants(client, world):
    grant(client, world, analyst_key_id=world["alice_id"], epsilon="1", delta="1e-5")
    grant(client, world, analyst_key_id=world["bob_id"], epsilon="1", delta="1e-5")
    assert release(client, world["alice"], world, epsilon="0.7").status_code == 202
    refused = release(client, world["bob"], world, epsilon="0.7")
    assert refused.status_code == 409
    assert refused.json()["budget"] == "dataset"
    assert refused.json()["grant_id"] is None
    assert refused.json()["epsilon_remaining"] == "0.3"
    assert release(client, world["bob"], world, epsilon="0.3").status_code == 202


def test_personal_grant_first_then_the_all_analysts_grant(client, world, session_factory):
    everyone = grant(client, world, epsilon="0.5", delta="1e-6")
    personal = grant(client, world, analyst_key_id=world["alice_id"], epsilon="0.1", delta="1e-6")
    assert release(client, world["alice"], world).status_code == 202
    # Alice's personal grant is used up; she does not fall back to the all-analysts grant.
    refused = release(client, world["alice"], world)
    assert refused.status_code == 409 and refused.json()["grant_id"] == personal["id"]
    assert release(client, world["bob"], world).status_code == 202
    with session_factory() as session:
        charged = dict(session.execute(select(LedgerEntry.grant_id, LedgerEntry.epsilon)).all())
    assert charged == {
        uuid.UUID(personal["id"]): Decimal("0.1"),
        uuid.UUID(everyone["id"]): Decimal("0.1"),
    }


def test_revocation_stops_charges_and_keeps_what_was_spent(client, world, session_factory):
    created = grant(client, world, epsilon="0.5", delta="1e-6")
    assert release(client, world["bob"], world).status_code == 202
    revoked = client.delete(f"{world['grants']}/{created['id']}", headers=bearer(world["owner"]))
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None
    assert revoked.json()["epsilon_spent"] == "0.1"
    assert revoked.json()["epsilon_remaining"] == "0"
    # Revoking again changes nothing and records nothing.
    again = client.delete(f"{world['grants']}/{created['id']}", headers=bearer(world["owner"]))
    assert again.status_code == 200 and again.json()["revoked_at"] == revoked.json()["revoked_at"]
    # "No further charges" holds: Bob does not fall back to the dataset's budget (he did).
    refused = release(client, world["bob"], world)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"] == "grant_revoked"
    assert refused.json()["grant_id"] == created["id"]
    assert created["id"] in refused.json()["detail"]
    with session_factory() as session:
        entries = session.execute(select(LedgerEntry.grant_id).order_by(LedgerEntry.id)).all()
        events = list(session.scalars(select(AuditEvent.event_type).order_by(AuditEvent.seq)))
        report = audit.verify(session)
    assert [row[0] for row in entries] == [uuid.UUID(created["id"])]
    assert events.count("grant_created") == 1 and events.count("grant_revoked") == 1
    assert report.ok, report.problems


def test_grants_required_refuses_an_analyst_without_one(settings, session_factory, world):
    strict = Settings(**{**settings.model_dump(), "grants_required": True})
    with TestClient(create_app(strict, session_factory=session_factory)) as client:
        refused = release(client, world["bob"], world)
        assert refused.status_code == 403 and refused.json()["error"] == "grant_required"
        grant(client, world, analyst_key_id=world["bob_id"], epsilon="0.5", delta="1e-6")
        assert release(client, world["bob"], world).status_code == 202
        assert release(client, world["alice"], world).status_code == 403
        assert budget(client, world)["epsilon_spent"] == "0.1"


def test_release_requested_records_the_grant(client, world, session_factory):
    created = grant(client, world, analyst_key_id=world["alice_id"], epsilon="0.1", delta="1e-6")
    assert release(client, world["alice"], world).status_code == 202
    assert release(client, world["alice"], world).status_code == 409
    with session_factory() as session:
        details = [
            event.details
            for event in session.scalars(
                select(AuditEvent).where(AuditEvent.event_type == "release_requested")
            )
        ]
        created_event = session.scalars(
            select(AuditEvent).where(AuditEvent.event_type == "grant_created")
        ).one()
    assert all(item["grant_id"] == created["id"] for item in details)
    assert created_event.details == {
        "grant_id": created["id"],
        "analyst_key_id": world["alice_id"],
        "epsilon": "0.1",
        "delta": "0.000001",
    }
    assert len(details) == 1


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"epsilon": "2", "delta": "1e-6"}, 422, "epsilon"),
        ({"epsilon": "0.5", "delta": "1e-4"}, 422, "delta"),
        ({"epsilon": "0", "delta": "1e-6"}, 422, "epsilon"),
        ({"epsilon": "0.5", "delta": "1e-6", "extra": 1}, 422, "extra"),
        ({"epsilon": "0.5", "delta": "1e-6", "analyst_key_id": str(uuid.uuid4())}, 422, None),
    ],
)
def test_bad_grants_are_refused_and_change_nothing(
    client, world, session_factory, body, status, field
):
    response = client.post(world["grants"], headers=bearer(world["owner"]), json=body)
    assert response.status_code == status, response.text
    if field is not None:
        assert field in response.json()["detail"]
    with session_factory() as session:
        assert session.scalars(select(Grant)).all() == []


def test_only_the_owner_manages_grants(client, world, session_factory, upload_dataset):
    _, other_owner = new_key(session_factory, "owner")
    body = {"epsilon": "0.5", "delta": "1e-6"}
    assert (
        client.post(world["grants"], headers=bearer(world["alice"]), json=body).status_code == 403
    )
    assert client.post(world["grants"], headers=bearer(other_owner), json=body).status_code == 404
    assert client.get(world["grants"], headers=bearer(other_owner)).status_code == 404
    created = grant(client, world, **body)
    stranger = client.delete(f"{world['grants']}/{created['id']}", headers=bearer(other_owner))
    assert stranger.status_code == 404


def test_a_second_active_grant_for_the_same_key_is_a_conflict(client, world):
    first = grant(client, world, analyst_key_id=world["alice_id"], epsilon="0.5", delta="1e-6")
    body = {"analyst_key_id": world["alice_id"], "epsilon": "0.2", "delta": "1e-6"}
    second = client.post(world["grants"], headers=bearer(world["owner"]), json=body)
    assert second.status_code == 409 and first["id"] in second.json()["detail"]
    client.delete(f"{world['grants']}/{first['id']}", headers=bearer(world["owner"]))
    assert (
        client.post(world["grants"], headers=bearer(world["owner"]), json=body).status_code == 201
    )
    listed = client.get(world["grants"], headers=bearer(world["owner"])).json()
    assert listed["total"] == 2


def test_a_deleted_dataset_grants_nothing_but_lists_its_grants(client, world):
    grant(client, world, epsilon="0.5", delta="1e-6")
    deleted = client.delete(f"/v1/datasets/{world['dataset']}", headers=bearer(world["owner"]))
    assert deleted.status_code == 204
    body = {"epsilon": "0.5", "delta": "1e-6", "analyst_key_id": world["alice_id"]}
    refused = client.post(world["grants"], headers=bearer(world["owner"]), json=body)
    assert refused.status_code == 409 and refused.json()["error"] == "dataset_deleted"
    assert client.get(world["grants"], headers=bearer(world["owner"])).json()["total"] == 1


def test_a_dry_run_reports_the_grant_a_release_would_be_charged_to(client, world):
    created = grant(client, world, analyst_key_id=world["alice_id"], epsilon="0.15", delta="1e-6")

    def preview(key: str) -> Any:
        response = client.post(
            f"{world['releases']}?dry_run=true", headers=bearer(key), json=RELEASE
        )
        assert response.status_code == 200, response.text
        return response.json()

    first = preview(world["alice"])
    assert first["affordable"] is True and first["budget"] == "grant"
    assert first["grant_id"] == created["id"] and first["epsilon_remaining"] == "0.15"
    assert release(client, world["alice"], world).status_code == 202
    # 0.05 left on the grant: the preview says what the real request would hear (409, grant).
    short = preview(world["alice"])
    assert short["affordable"] is False and short["budget"] == "grant"
    assert short["epsilon_remaining"] == "0.05"
    assert release(client, world["alice"], world).status_code == 409
    # Bob has no grant: his preview is of the dataset's budget.
    bobs = preview(world["bob"])
    assert bobs["budget"] == "dataset" and bobs["grant_id"] is None and bobs["affordable"]


def test_a_revoked_personal_grant_does_not_fall_back_until_a_new_grant(
    client, world, session_factory
):
    personal = grant(client, world, analyst_key_id=world["alice_id"], epsilon="0.5", delta="1e-6")
    grant(client, world, epsilon="0.5", delta="1e-6")  # every analyst
    path = f"{world['grants']}/{personal['id']}"
    assert client.delete(path, headers=bearer(world["owner"])).status_code == 200
    # Neither the all-analysts grant nor the dataset's budget: refused, also as a dry run.
    for dry_run in (False, True):
        refused = client.post(
            world["releases"] + ("?dry_run=true" if dry_run else ""),
            headers=bearer(world["alice"]),
            json=RELEASE,
        )
        assert refused.status_code == 403, refused.text
        assert refused.json()["grant_id"] == personal["id"]
    assert budget(client, world)["epsilon_spent"] == "0"
    # Bob never had a personal grant: the all-analysts grant still applies to him.
    assert release(client, world["bob"], world).status_code == 202
    # A new personal grant restores Alice, charged to it.
    renewed = grant(client, world, analyst_key_id=world["alice_id"], epsilon="0.2", delta="1e-6")
    assert release(client, world["alice"], world).status_code == 202
    with session_factory() as session:
        charged = session.scalars(select(LedgerEntry.grant_id).order_by(LedgerEntry.id)).all()
    assert charged[-1] == uuid.UUID(renewed["id"])


@pytest.mark.parametrize(
    ("grant_epsilon", "first_epsilon", "refused_by"),
    [
        ("0.3", "0.75", "dataset"),  # the grant affords 0.3, the dataset (0.25 left) does not
        ("0.1", "0.8", "grant"),  # both are short: the real request names the grant (first)
    ],
)
def test_a_dry_run_names_the_budget_the_real_refusal_names(
    client, world, grant_epsilon, first_epsilon, refused_by
):
    """The dry run's ``budget`` is the one the real 409 names: before, a request both budgets
    refused previewed as the dataset's while its 409 named the grant, and one only the dataset
    refused previewed as the grant's (with the grant's larger remaining figures)."""
    grant(client, world, analyst_key_id=world["alice_id"], epsilon=grant_epsilon, delta="1e-6")
    assert release(client, world["bob"], world, epsilon=first_epsilon).status_code == 202
    body = {**RELEASE, "epsilon": "0.3"}
    shown = client.post(
        f"{world['releases']}?dry_run=true", headers=bearer(world["alice"]), json=body
    ).json()
    refused = client.post(world["releases"], headers=bearer(world["alice"]), json=body)
    assert refused.status_code == 409, refused.text
    assert shown["affordable"] is False
    assert refused.json()["budget"] == refused_by
    assert shown["budget"] == refused_by
    assert shown["epsilon_remaining"] == refused.json()["epsilon_remaining"]


def test_a_basic_grant_given_only_epsilon_gets_the_datasets_delta(client, world):
    # Every other accounting defaults a grant's delta to the dataset's delta_total (and
    # `dpss grants create --help` says so); basic alone refused `--epsilon 0.2` with
    # "delta: required".
    made = grant(client, world, analyst_key_id=world["alice_id"], epsilon="0.2")
    assert (made["epsilon_total"], made["delta_total"]) == ("0.2", "0.00001"), made
    missing = client.post(world["grants"], headers=bearer(world["owner"]), json={"delta": "1e-6"})
    assert missing.status_code == 422 and missing.json()["detail"].startswith(
        "epsilon: required"
    ), missing.text


def test_a_grant_above_the_budget_states_the_figure_it_was_checked_against(
    client, world, upload_dataset
):
    """An outside audit: on a hybrid dataset (the default) a grant above the budget was
    refused "must not exceed the dataset's epsilon_total (1)" while the same dataset's budget
    says epsilon_total 0.9979 (stated at delta_total): the refusal named a figure the service
    states otherwise. The check is against the epsilon_budget uploaded, and it says so, as
    every figure in a message, in plain notation."""
    rows = np.random.default_rng(0).normal(size=(200, 4)) * 0.1
    dataset = upload_dataset(
        client, world["owner"], rows, epsilon_budget="1", delta_budget="1e-6", accounting="hybrid"
    )
    path = f"/v1/datasets/{dataset['id']}"
    stated = client.get(f"{path}/budget", headers=bearer(world["owner"])).json()["epsilon_total"]
    assert Decimal(stated) < 1  # hybrid states its total at delta_total, below the declared 1
    body = {"epsilon": "1.5"}
    response = client.post(f"{path}/grants", headers=bearer(world["owner"]), json=body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    expected = "epsilon: must not exceed the epsilon_budget the dataset was uploaded with (1)"
    assert detail == expected, detail
    # In the JSON's plain notation on both databases (PostgreSQL's NUMERIC(.., 30) kept
    # thirty trailing zeros: "(1.000000000000000000000000000000)").
    body = {"epsilon": "0.5", "delta": "0.00001"}
    response = client.post(f"{path}/grants", headers=bearer(world["owner"]), json=body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail == "delta: must not exceed the dataset's delta_total (0.000001)", detail
