"""Property: no sequence of accepted requests makes a grant's or the dataset's remaining budget
negative, and each answer is the one an exact model of both budgets predicts."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session, sessionmaker

from api_schemas.common import BUDGET_CONTEXT
from service import auth
from tests.api.test_exact_budgets import budget, release, upload
from tests.conftest import bearer


def _amount() -> st.SearchStrategy[Decimal]:
    # Up to 6 places, so sums land exactly on a budget often.
    return st.builds(
        lambda units, places: Decimal(units).scaleb(-places),
        st.integers(1, 3000),
        st.integers(1, 6),
    )


def _key(factory: sessionmaker[Session], role: str) -> tuple[str, str]:
    with factory.begin() as session:
        key, secret = auth.create_key(session, role, role, actor_key_id=None)  # type: ignore[arg-type]
        return str(key.id), secret


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    total=_amount(),
    alice_share=_amount(),
    everyone_share=_amount(),
    steps=st.lists(
        st.one_of(st.tuples(st.sampled_from([0, 1]), _amount()), st.just("revoke")),
        min_size=1,
        max_size=8,
    ),
)
def test_no_sequence_of_accepted_requests_overspends_a_grant_or_the_dataset(
    client, session_factory, total, alice_share, everyone_share, steps
):
    _, owner = _key(session_factory, "owner")
    alice_id, alice = _key(session_factory, "analyst")
    _, bob = _key(session_factory, "analyst")
    dataset_id = upload(client, owner, format(total, "f")).json()["id"]
    grants_path = f"/v1/datasets/{dataset_id}/grants"
    shares = {}
    for key_id, share in ((alice_id, alice_share), (None, everyone_share)):
        body = {"analyst_key_id": key_id, "epsilon": format(share, "f"), "delta": "0.001"}
        response = client.post(grants_path, headers=bearer(owner), json=body)
        if share > total:
            assert response.status_code == 422
            continue
        assert response.status_code == 201, response.text
        shares[key_id] = [response.json()["id"], share]
    dataset_left = total
    alice_revoked = False
    for step in steps:
        if step == "revoke":
            if alice_id in shares and not alice_revoked:
                grant_id = shares[alice_id][0]
                response = client.delete(f"{grants_path}/{grant_id}", headers=bearer(owner))
                assert response.status_code == 200
                alice_revoked = True
            continue
        who, cost = step
        if who == 0 and alice_revoked:
            # Revoked: no further charges, and no fallback to the all-analysts grant.
            response = release(client, alice, dataset_id, format(cost, "f"))
            assert response.status_code == 403 and response.json()["error"] == "grant_revoked"
            continue
        key_id = alice_id if who == 0 and alice_id in shares else None
        grant = shares.get(key_id)
        response = release(client, (alice, bob)[who], dataset_id, format(cost, "f"))
        grant_short = grant is not None and cost > grant[1]
        if grant_short:
            assert response.status_code == 409
            assert response.json()["budget"] == "grant"
            assert Decimal(response.json()["epsilon_remaining"]) == grant[1]
        elif cost > dataset_left:
            assert response.status_code == 409
            assert response.json()["budget"] == "dataset"
        else:
            assert response.status_code == 202, response.text
            dataset_left = BUDGET_CONTEXT.subtract(dataset_left, cost)
            if grant is not None:
                grant[1] = BUDGET_CONTEXT.subtract(grant[1], cost)
        assert Decimal(budget(client, owner, dataset_id)["epsilon_remaining"]) == dataset_left >= 0
        for item in client.get(grants_path, headers=bearer(owner)).json()["items"]:
            assert Decimal(item["epsilon_remaining"]) >= 0
            assert Decimal(item["epsilon_spent"]) <= Decimal(item["epsilon_total"])
    for key_id, (grant_id, left) in shares.items():
        (item,) = [
            g
            for g in client.get(grants_path, headers=bearer(owner)).json()["items"]
            if g["id"] == grant_id
        ]
        revoked = key_id is not None and alice_revoked
        assert Decimal(item["epsilon_remaining"]) == (0 if revoked else left)
