"""Budgets too small for a zCDP filter (an outside audit of issue 31, "budgets near their
limits"): with both epsilon and delta_conversion small (1e-6 and 1e-14), no Renyi order the
conversion searches (up to 1 + 1e6) certifies a positive rho, and deriving the budget raised
ArithmeticError: a hybrid or zcdp upload of (1e-6, 1e-12), and a hybrid or zcdp grant of
epsilon 1e-6 at delta 1e-12, answered 500. The zCDP budget is now 0 there (sound at any
delta; it admits no step with a cost): a hybrid dataset or grant keeps its other filters and
runs; a zcdp dataset or grant, which would run nothing, is refused with 422 naming the
epsilon. (A tiny epsilon alone is not this case: at delta 1e-5 a rho of about 3.4e-11 converts
to (0, 5e-6), since a tiny rho is a tiny total variation distance.)"""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from service import accounting, audit
from tests.conftest import bearer, npy_bytes

TINY = {"epsilon_budget": "0.000001", "delta_budget": "1e-12"}


def upload(client, key, accounting_name: str, **budget: str):
    rows = np.random.default_rng(0).normal(size=(200, 3)) * 0.1
    return client.post(
        "/v1/datasets",
        headers=bearer(key),
        files={"file": ("d.npy", npy_bytes(rows), "application/octet-stream")},
        data={"name": "tiny", "accounting": accounting_name, "row_norm_bound": "1", **budget},
    )


def test_the_zcdp_budget_of_a_tiny_epsilon_is_zero_not_an_error():
    assert accounting.rho_budget(Decimal("0.000001"), Decimal("1e-14")) == 0
    assert accounting.rho_budget(Decimal("1e-9"), Decimal("1e-7")) == 0
    # Where a positive rho exists it is unchanged (and certified).
    assert accounting.rho_budget(Decimal("0.001"), Decimal("1e-14")) > 0


def test_a_tiny_hybrid_budget_is_accepted_and_spent_by_its_other_filters(
    client, keys, run_worker, session_factory
):
    made = upload(client, keys.owner, "hybrid", **TINY)
    assert made.status_code == 201, made.text
    budget = made.json()["budget"]
    assert budget["rho_total"] == "0" and Decimal(budget["mu_total"]) > 0
    dataset_id = made.json()["id"]
    body = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.000001"}
    releases = f"/v1/datasets/{dataset_id}/releases"
    dry = client.post(f"{releases}?dry_run=true", headers=bearer(keys.analyst), json=body)
    assert dry.status_code == 200 and dry.json()["affordable"], dry.text
    assert client.post(releases, headers=bearer(keys.analyst), json=body).status_code == 202
    assert run_worker() == 1
    again = client.post(releases, headers=bearer(keys.analyst), json=body)
    assert again.status_code == 409, again.text
    shown = client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(keys.owner)).json()
    assert again.json()["epsilon_remaining"] == shown["epsilon_remaining"]
    assert Decimal(shown["epsilon_spent"]) <= Decimal(shown["epsilon_total"])
    with session_factory() as session:  # the audit's replay derives the same zero rho
        assert audit.verify(session).problems == []


def test_a_tiny_zcdp_budget_is_refused_naming_its_epsilon(client, keys):
    refused = upload(client, keys.owner, "zcdp", **TINY)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"].startswith("epsilon_budget:")
    listed = client.get("/v1/datasets", headers=bearer(keys.owner)).json()
    assert listed["items"] == []


@pytest.mark.parametrize("accounting_name", ["hybrid", "zcdp"])
def test_a_tiny_grant_in_epsilon(client, keys, accounting_name):
    made = upload(client, keys.owner, accounting_name, epsilon_budget="1", delta_budget="1e-5")
    assert made.status_code == 201, made.text
    grants = f"/v1/datasets/{made.json()['id']}/grants"
    granted = client.post(
        grants, headers=bearer(keys.owner), json={"epsilon": "0.000001", "delta": "1e-12"}
    )
    if accounting_name == "hybrid":
        assert granted.status_code == 201, granted.text
        assert granted.json()["rho_total"] == "0"
    else:
        assert granted.status_code == 422, granted.text
        assert granted.json()["detail"].startswith("epsilon:")
        assert client.get(grants, headers=bearer(keys.owner)).json()["items"] == []
