"""Issue 16: a dry run warns, from public facts, when the requested mechanism is dominated
(smooth_sensitivity with delta > 0, gap_perturbation), naming the better mechanism and the docs
section; the mechanism listing says when those two are dominated. Through the ASGI app."""

from __future__ import annotations

import pytest

from api_schemas.releases import ReleasePreview
from tests.conftest import bearer
from tests.factories import near_subspace


@pytest.fixture
def dataset(client, keys, upload_dataset, rng):
    data, _ = near_subspace(rng, 2_000, 60, 2)
    return upload_dataset(
        client, keys.owner, data, epsilon_budget="1.0", delta_budget="1e-5", row_norm_bound=1.0
    )


def preview(client, key, dataset_id, **body):
    payload = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.5", "delta": "1e-7", **body}
    response = client.post(
        f"/v1/datasets/{dataset_id}/releases",
        params={"dry_run": "true"},
        headers=bearer(key),
        json=payload,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    ReleasePreview.model_validate(body)  # the schema describes what is sent
    return body


def test_smooth_sensitivity_with_delta_warns_and_names_analyze_gauss(client, keys, dataset):
    body = preview(client, keys.analyst, dataset["id"], mechanism="smooth_sensitivity")
    (warning,) = body["warnings"]
    assert warning["code"] == "dominated_mechanism"
    assert warning["better_mechanism"] == "analyze_gauss"
    assert warning["docs"].startswith("docs/mechanisms.md#smooth_sensitivity")
    assert "9x" in warning["message"] and "d = 60" in warning["message"]
    # the pure variant is the only pure-DP mechanism: no warning
    pure = preview(client, keys.analyst, dataset["id"], mechanism="smooth_sensitivity", delta="0")
    assert pure["warnings"] == []


@pytest.mark.parametrize(
    ("accounting", "params"), [("hybrid", {}), ("zcdp", {}), ("basic", {"noise": "cauchy"})]
)
def test_the_warning_names_the_cauchy_variant_where_it_runs(
    client, keys, upload_dataset, rng, accounting, params
):
    # On a hybrid (the service's default) or zcdp dataset smooth_sensitivity runs its Cauchy
    # variant by default (the Gaussian one has no zCDP profile); on basic a request may ask for
    # it. The warning says what runs, and why (it named zcdp alone, not the default).
    data, _ = near_subspace(rng, 2_000, 60, 2)
    uploaded = upload_dataset(
        client,
        keys.owner,
        data,
        epsilon_budget="1.0",
        delta_budget="1e-5",
        row_norm_bound=1.0,
        accounting=accounting,
    )
    body = preview(
        client, keys.analyst, uploaded["id"], mechanism="smooth_sensitivity", params=params
    )
    (warning,) = body["warnings"]
    assert warning["code"] == "dominated_mechanism"
    assert warning["better_mechanism"] == "analyze_gauss"
    assert "Cauchy variant" in warning["message"]
    assert "(its Gaussian variant)" not in warning["message"]
    assert "d = 60" in warning["message"]
    if not params:  # the default variant here: the message says on which accountings
        assert (
            "the default under the hybrid accounting, the service's default, and under zcdp"
            in (warning["message"])
        )
    # explicitly the Gaussian variant on basic: the Gaussian message
    if accounting == "basic":
        gaussian = preview(
            client,
            keys.analyst,
            uploaded["id"],
            mechanism="smooth_sensitivity",
            params={"noise": "gaussian"},
        )
        assert "(its Gaussian variant)" in gaussian["warnings"][0]["message"]


def test_gap_perturbation_warns(client, keys, dataset):
    body = preview(client, keys.analyst, dataset["id"], mechanism="gap_perturbation")
    (warning,) = body["warnings"]
    assert warning["better_mechanism"] == "analyze_gauss"
    assert warning["docs"].startswith("docs/mechanisms.md#gap_perturbation")
    assert "3x" in warning["message"]


@pytest.mark.parametrize(
    ("mechanism", "params"),
    [("analyze_gauss", {}), ("spectrum", {}), ("auto", {})],
)
def test_other_mechanisms_carry_no_warning(client, keys, dataset, mechanism, params):
    body = preview(client, keys.analyst, dataset["id"], mechanism=mechanism, params=params)
    assert body["warnings"] == []


@pytest.mark.parametrize("mechanism", ["friendly_aggregate", "histogram_aggregate"])
def test_data_dependent_aggregators_carry_no_warning(client, keys, upload_dataset, rng, mechanism):
    data, _ = near_subspace(rng, 6_000, 10, 2)
    uploaded = upload_dataset(
        client, keys.owner, data, epsilon_budget="3.0", delta_budget="1e-5", row_norm_bound=1.0
    )
    body = preview(client, keys.analyst, uploaded["id"], mechanism=mechanism, epsilon="2")
    assert body["warnings"] == []


def test_listing_says_when_the_two_are_dominated(client, keys):
    items = client.get("/v1/mechanisms", headers=bearer(keys.analyst)).json()["items"]
    summary = {item["name"]: item["summary"] for item in items}
    assert "Dominated when delta > 0" in summary["smooth_sensitivity"]
    assert "section smooth_sensitivity" in summary["smooth_sensitivity"]
    assert "Dominated everywhere" in summary["gap_perturbation"]
    assert "section gap_perturbation" in summary["gap_perturbation"]
    for name in ("friendly_aggregate", "histogram_aggregate", "exact_gapmax", "analyze_gauss"):
        assert "Dominated" not in summary[name]
