"""Issue 31, item 5 through the API: the upload's answer and the dry run recommend the
accounting that fits the planned mechanisms (no sound default fits every plan: see
docs/benchmarks.md, 'Which accounting can be the default')."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.conftest import bearer, npy_bytes


@pytest.fixture
def data() -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(2_000, 8))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_the_upload_recommends_for_the_planned_mechanisms(client, keys, upload_dataset, data):
    form = {"epsilon_budget": "1", "delta_budget": "1e-6", "accounting": "zcdp"}
    gaussian = upload_dataset(client, keys.owner, data, planned_mechanisms="analyze_gauss", **form)
    assert gaussian["recommended_accounting"] == "gaussian"
    assert "PLD" in gaussian["recommendation_reason"]
    assert gaussian["budget"]["accounting"] == "zcdp"  # advice only: the dataset keeps its own
    mixed = upload_dataset(
        client, keys.owner, data, planned_mechanisms="analyze_gauss,friendly_aggregate", **form
    )
    assert mixed["recommended_accounting"] == "zcdp"
    silent = upload_dataset(client, keys.owner, data, **form)
    # issue 31, item 5: with no plan the general recommendation is the default, hybrid
    assert silent["recommended_accounting"] == "hybrid"
    assert "planned_mechanisms" in silent["recommendation_reason"]


def test_an_unknown_planned_mechanism_is_refused_naming_the_field(client, keys, data):
    response = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files={"file": ("data.npy", npy_bytes(data), "application/octet-stream")},
        data={
            "name": "x",
            "epsilon_budget": "1",
            "delta_budget": "1e-6",
            "planned_mechanisms": "analyze_gauss,pca",
        },
    )
    assert response.status_code == 422, response.text
    assert "planned_mechanisms" in response.text and "pca" in response.text


def dry(client: Any, key: str, dataset: dict[str, Any], **body: Any) -> dict[str, Any]:
    response = client.post(
        f"/v1/datasets/{dataset['id']}/releases?dry_run=true", headers=bearer(key), json=body
    )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_the_dry_run_recommends_for_the_request(client, keys, upload_dataset, data):
    dataset = upload_dataset(
        client, keys.owner, data, epsilon_budget="1", delta_budget="1e-6", accounting="zcdp"
    )
    gauss = dry(
        client,
        keys.analyst,
        dataset,
        mechanism="analyze_gauss",
        k=2,
        epsilon="0.1",
        delta="1e-6",
        params={"clip_norm": 1.0},
    )
    # One purely Gaussian request is no plan of purely Gaussian releases: gaussian would refuse
    # every other mechanism for 0.8% less noise, so the dry run keeps the default (it said
    # gaussian, while its field's description said hybrid in general).
    assert gauss["recommended_accounting"] == "hybrid", gauss["recommendation_reason"]
    assert "planned_mechanisms" in gauss["recommendation_reason"]
    # pure steps: the whole epsilon in one release -> basic; three releases of 0.3 fit -> zcdp
    whole = dry(
        client, keys.analyst, dataset, mechanism="exact_gapmax", k=2, epsilon="1", delta="1e-6"
    )
    assert whole["recommended_accounting"] == "basic", whole["recommendation_reason"]
    third = dry(
        client, keys.analyst, dataset, mechanism="exact_gapmax", k=2, epsilon="0.3", delta="1e-6"
    )
    assert third["recommended_accounting"] == "zcdp", third["recommendation_reason"]


def test_an_upload_too_small_for_hybrid_is_not_told_hybrid_admits_every_mechanism(
    client, keys, upload_dataset, data
):
    # An audit: at delta_budget 1e-30 every share of hybrid's delta rounds to 0 at the ledger's
    # 30 places (mu_total, rho_total 0), so no Gaussian or approximate release can ever run;
    # the upload's answer still recommended hybrid because it "admits every mechanism".
    form = {"epsilon_budget": "1", "delta_budget": "1e-30", "row_norm_bound": "1"}
    tiny = upload_dataset(client, keys.owner, data, accounting="hybrid", **form)
    assert tiny["budget"]["accounting"] == "hybrid" and tiny["budget"]["mu_total"] == "0"
    assert tiny["recommended_accounting"] == "basic", tiny["recommendation_reason"]
    reason = tiny["recommendation_reason"]
    assert "0.000000000000000000000000000001 is too small for hybrid" in reason
    assert "admits every mechanism" not in reason
    # Advice for the next upload, whatever this one's accounting: not hybrid at this delta.
    plain = upload_dataset(client, keys.owner, data, accounting="basic", **form)
    assert plain["recommended_accounting"] == "basic"
    # A budget hybrid can use keeps the general advice.
    usable = upload_dataset(
        client, keys.owner, data, accounting="hybrid", epsilon_budget="1", delta_budget="1e-6"
    )
    assert usable["recommended_accounting"] == "hybrid"


def test_the_dry_run_of_pca_by_auto_recommends_the_default_accounting(
    client, keys, upload_dataset, data
):
    # An audit of PrivatePCA's default (auto with center "private", all of whose declared steps
    # are Gaussian here: analyze_gauss with a private clip quantile and centring probe): the
    # dry run recommended basic, "auto takes pure or approximate steps and at most 2 releases
    # of this epsilon fit", beside releases_remaining 4 on the default hybrid, which admits
    # each such release at the same noise and more of them.
    dataset = upload_dataset(
        client, keys.owner, data, epsilon_budget="1", delta_budget="1e-6", row_norm_bound="1"
    )
    pca = dry(
        client,
        keys.analyst,
        dataset,
        mechanism="auto",
        k=2,
        epsilon="0.5",
        params={"center": "private"},
    )
    assert pca["scales"]["auto_choice"] == "analyze_gauss" and pca["mu"] is not None
    assert pca["recommended_accounting"] == "hybrid", pca["recommendation_reason"]
    assert pca["recommendation_reason"].startswith("auto is purely Gaussian")
    # auto with a structure test (a pure step) keeps the rule for pure or approximate steps.
    mixed = dry(client, keys.analyst, dataset, mechanism="auto", k=2, epsilon="0.5")
    if mixed["scales"]["structure_test"]:
        assert mixed["mu"] is None
        assert mixed["recommended_accounting"] in {"basic", "zcdp"}
