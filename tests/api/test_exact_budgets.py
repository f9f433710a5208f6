"""Budgets are exact: one 80-digit decimal context, nothing stored that the ledger would round,
and no sequence of accepted requests ever leaves a remaining budget below zero."""

from __future__ import annotations

from decimal import Decimal, localcontext

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api_schemas.common import BUDGET_CONTEXT, BUDGET_PLACES
from service.db.types import ExactDecimal as ExactColumn
from service.ledger import BudgetState, Charge
from tests.api.test_datasets import stored_files
from tests.conftest import bearer, npy_bytes

JUST_UNDER_ONE = "0." + "9" * 30  # storable exactly: 30 places
DATA = np.random.default_rng(7).normal(size=(40, 4)) * 0.1


def upload(client, key, epsilon_budget, delta_budget="0.5"):
    return client.post(
        "/v1/datasets",
        headers=bearer(key),
        files={"file": ("x.npy", npy_bytes(DATA), "application/octet-stream")},
        data={
            "name": "d",
            "epsilon_budget": epsilon_budget,
            "delta_budget": delta_budget,
            "row_norm_bound": "1",
            # 0.5 on 40 rows: far above 1/n, on purpose (these tests are about exactness).
            "allow_large_delta": "true",
        },
    )


def release(client, key, dataset_id, epsilon, delta="1e-9"):
    return client.post(
        f"/v1/datasets/{dataset_id}/releases",
        headers=bearer(key),
        json={"mechanism": "analyze_gauss", "k": 1, "epsilon": epsilon, "delta": delta},
    )


def budget(client, key, dataset_id):
    return client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(key)).json()


def test_the_context_holds_every_stored_value():
    # NUMERIC(38, 30) on PostgreSQL: the context must hold its widest value and their sums.
    assert (ExactColumn.precision, ExactColumn.scale) == (38, BUDGET_PLACES)
    widest = Decimal("9" * 8 + "." + "9" * 30)
    doubled = BUDGET_CONTEXT.add(widest, widest)
    assert doubled == Decimal("1" + "9" * 8 + "." + "9" * 29 + "8")
    assert BUDGET_CONTEXT.subtract(doubled, widest) == widest


def test_a_budget_just_under_one_does_not_afford_one_in_any_ambient_context():
    state = BudgetState(Decimal(JUST_UNDER_ONE), Decimal(0), Decimal(0), Decimal(0))
    with localcontext() as ambient:
        ambient.prec = 28  # Python's default; the ledger must not depend on it
        assert state.epsilon_remaining == Decimal(JUST_UNDER_ONE)
        assert not state.affords(Charge(Decimal(1), Decimal(0)))


def test_a_budget_just_under_one_refuses_a_release_of_one(client, keys):
    created = upload(client, keys.owner, JUST_UNDER_ONE)
    assert created.status_code == 201, created.text
    dataset_id = created.json()["id"]
    assert created.json()["budget"]["epsilon_remaining"] == JUST_UNDER_ONE
    refused = release(client, keys.analyst, dataset_id, "1")
    assert refused.status_code == 409, refused.text
    assert refused.json()["epsilon_remaining"] == JUST_UNDER_ONE
    assert release(client, keys.analyst, dataset_id, JUST_UNDER_ONE).status_code == 202
    after = budget(client, keys.owner, dataset_id)
    assert after["epsilon_remaining"] == "0"
    assert after["epsilon_spent"] == JUST_UNDER_ONE


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("epsilon_budget", "0." + "9" * 31),
        ("epsilon_budget", "1e-31"),
        ("delta_budget", "0." + "0" * 30 + "1"),
        ("delta_budget", "1.5e-31"),
    ],
)
def test_uploads_refuse_budgets_the_ledger_would_round(client, keys, settings, field, value):
    fields = {"epsilon_budget": "1", "delta_budget": "0.5", field: value}
    response = upload(client, keys.owner, **fields)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(f"{field}:")
    assert "30 decimal places" in response.json()["detail"]
    assert stored_files(settings) == []


def test_trailing_zeros_beyond_thirty_places_are_exact_and_accepted(client, keys):
    created = upload(client, keys.owner, "1." + "0" * 40, "0." + "5" + "0" * 40)
    assert created.status_code == 201, created.text
    assert created.json()["budget"]["epsilon_total"] == "1"
    assert created.json()["budget"]["delta_total"] == "0.5"


def test_releases_refuse_costs_the_ledger_would_round(client, keys):
    dataset_id = upload(client, keys.owner, "10").json()["id"]
    response = release(client, keys.analyst, dataset_id, "0." + "0" * 30 + "1")
    assert response.status_code == 422
    assert response.json()["detail"].startswith("epsilon:")


# Amounts with up to 30 places, of every magnitude the ledger accepts.
def _amounts(max_integer_digits: int) -> st.SearchStrategy[Decimal]:
    return st.builds(
        lambda units, places: Decimal(units).scaleb(-places),
        st.integers(1, 10 ** (max_integer_digits + 6)),
        st.integers(0, BUDGET_PLACES),
    ).filter(lambda value: value.adjusted() < max_integer_digits)


ONE_ULP = Decimal(1).scaleb(-BUDGET_PLACES)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    total=_amounts(3),
    steps=st.lists(
        st.one_of(
            _amounts(3),
            st.sampled_from(["remaining", "remaining+ulp", "remaining-ulp"]),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_no_sequence_of_accepted_releases_overspends(client, keys, total, steps):
    created = upload(client, keys.owner, format(total, "f"))
    assert created.status_code == 201, created.text
    dataset_id = created.json()["id"]
    remaining = total
    for step in steps:
        if step == "remaining":
            cost = remaining
        elif step == "remaining+ulp":
            cost = BUDGET_CONTEXT.add(remaining, ONE_ULP)
        elif step == "remaining-ulp":
            cost = BUDGET_CONTEXT.subtract(remaining, ONE_ULP)
        else:
            cost = step
        if cost <= 0 or cost > 1000:
            continue
        response = release(client, keys.analyst, dataset_id, format(cost, "f"))
        assert response.status_code in (202, 409, 422), response.text
        if response.status_code == 202:
            assert cost <= remaining
            remaining = BUDGET_CONTEXT.subtract(remaining, cost)
        elif response.status_code == 409:
            assert cost > remaining
        state = budget(client, keys.owner, dataset_id)
        assert Decimal(state["epsilon_remaining"]) == remaining >= 0
        assert BUDGET_CONTEXT.add(
            Decimal(state["epsilon_spent"]), Decimal(state["epsilon_remaining"])
        ) == Decimal(state["epsilon_total"])
