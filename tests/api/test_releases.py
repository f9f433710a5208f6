"""Release requests: ledger exactness, idempotency, refusals that charge nothing."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import func, select

from service.db.models import LedgerEntry, Release
from tests.conftest import bearer
from tests.factories import hybrid_with_filter_c_closed, near_subspace


def request(client, key, dataset_id, headers=None, **body):
    payload = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-7", **body}
    return client.post(
        f"/v1/datasets/{dataset_id}/releases",
        headers={**bearer(key), **(headers or {})},
        json=payload,
    )


@pytest.fixture
def dataset(client, keys, upload_dataset, rng):
    data, _ = near_subspace(rng, 200, 6, 2)
    return upload_dataset(
        client, keys.owner, data, epsilon_budget="1.0", delta_budget="1e-5", row_norm_bound=1.0
    )


def budget(client, key, dataset_id):
    return client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(key)).json()


def test_ten_releases_of_a_tenth_fit_a_budget_of_one_exactly(client, keys, dataset):
    for _ in range(10):
        assert request(client, keys.analyst, dataset["id"]).status_code == 202
    spent = budget(client, keys.analyst, dataset["id"])
    assert spent["epsilon_spent"] == "1"
    assert spent["epsilon_remaining"] == "0"
    eleventh = request(client, keys.analyst, dataset["id"])
    assert eleventh.status_code == 409
    body = eleventh.json()
    assert body["error"] == "budget_exceeded"
    assert body["epsilon_remaining"] == "0"
    assert body["delta_remaining"] == "0.000009"
    # The refusal says what the analyst can do next, and only what the service offers.
    assert "dry run" in body["detail"] and "budget cannot be raised" in body["detail"]
    assert budget(client, keys.analyst, dataset["id"])["epsilon_spent"] == "1"


def test_delta_is_budgeted_too(client, keys, dataset):
    assert request(client, keys.analyst, dataset["id"], delta="1e-5").status_code == 202
    refused = request(client, keys.analyst, dataset["id"], delta="1e-12")
    assert refused.status_code == 409
    assert refused.json()["delta_remaining"] == "0"


def test_idempotent_retry_returns_the_same_release_charged_once(
    client, keys, dataset, session_factory
):
    headers = {"Idempotency-Key": "abc-123"}
    first = request(client, keys.analyst, dataset["id"], headers=headers)
    second = request(client, keys.analyst, dataset["id"], headers=headers)
    assert first.status_code == second.status_code == 202
    assert first.json()["id"] == second.json()["id"]
    assert budget(client, keys.analyst, dataset["id"])["epsilon_spent"] == "0.1"
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(LedgerEntry)) == 1


def test_same_idempotency_key_with_a_different_body_is_refused(client, keys, dataset):
    headers = {"Idempotency-Key": "abc-123"}
    assert request(client, keys.analyst, dataset["id"], headers=headers).status_code == 202
    other = request(client, keys.analyst, dataset["id"], headers=headers, k=3)
    assert other.status_code == 409
    assert other.json()["error"] == "idempotency_conflict"
    assert budget(client, keys.analyst, dataset["id"])["epsilon_spent"] == "0.1"


def test_two_idempotency_key_headers_are_refused_and_charge_nothing(
    client, keys, dataset, session_factory
):
    # The first one silently won: a retry whose proxy added its own key made a second charge.
    headers = [*bearer(keys.analyst).items(), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
    body = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-6"}
    refused = client.post(f"/v1/datasets/{dataset['id']}/releases", headers=headers, json=body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"] == "header.idempotency-key: given twice; send the header once"
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(LedgerEntry)) == 0


def test_idempotency_keys_belong_to_their_analyst(client, keys, dataset, make_key):
    other_analyst = make_key("analyst")
    headers = {"Idempotency-Key": "shared"}
    first = request(client, keys.analyst, dataset["id"], headers=headers)
    second = request(client, other_analyst, dataset["id"], headers=headers)
    assert first.json()["id"] != second.json()["id"]


INVALID_REQUESTS = {
    "unknown_mechanism": ({"mechanism": "pca_please"}, "mechanism"),
    "unknown_param": ({"params": {"clip": 1}}, "params.clip"),
    "negative_clip": ({"params": {"clip_norm": -1}}, "params.clip_norm"),
    "k_zero": ({"k": 0}, "k"),
    "k_above_d": ({"k": 7}, "k"),
    "epsilon_zero": ({"epsilon": "0"}, "epsilon"),
    "epsilon_text": ({"epsilon": "a lot"}, "epsilon"),
    "delta_zero_for_gaussian": ({"delta": "0"}, "delta"),
    "delta_one": ({"delta": "1"}, "delta"),
    "too_many_places": ({"epsilon": "0." + "0" * 30 + "1"}, "epsilon"),
    "params_not_object": ({"params": [1, 2]}, "params"),
}


@pytest.mark.parametrize("case", INVALID_REQUESTS)
def test_invalid_requests_are_422_and_charge_nothing(client, keys, dataset, session_factory, case):
    body, field = INVALID_REQUESTS[case]
    response = request(client, keys.analyst, dataset["id"], **body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_input"
    assert response.json()["detail"].startswith(field)
    assert budget(client, keys.analyst, dataset["id"])["epsilon_spent"] == "0"
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Release)) == 0


def test_clip_norm_is_required_when_the_dataset_has_no_bound(client, keys, upload_dataset, rng):
    data, _ = near_subspace(rng, 50, 4, 1)
    unbounded = upload_dataset(client, keys.owner, data)
    response = request(client, keys.analyst, unbounded["id"])
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail.startswith("params.clip_norm: required")
    # An audit: the message said why, not what to send (the field, its value, who else can fix
    # it): a new user without a row_norm_bound met it on every release.
    assert '"params": {"clip_norm": ' in detail and "row_norm_bound" in detail
    assert "owner" in detail
    # Once: each surface respells the example; a second spelling in brackets read twice there.
    assert detail.count("clip_norm") == 2 and "the CLI" not in detail, detail
    accepted = request(client, keys.analyst, unbounded["id"], params={"clip_norm": 1.0})
    assert accepted.status_code == 202
    assert accepted.json()["params"] == {"clip_norm": 1.0}


def test_resolved_params_record_the_dataset_bound(client, keys, dataset):
    response = request(client, keys.analyst, dataset["id"])
    assert response.json()["params"] == {"clip_norm": 1.0}


def test_unknown_dataset_is_404_and_charges_nothing(client, keys):
    response = request(client, keys.analyst, "00000000-0000-0000-0000-000000000000")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_release_result_is_an_orthonormal_basis(client, keys, dataset, run_worker):
    release = request(client, keys.analyst, dataset["id"]).json()
    run_worker()
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.analyst)).json()
    assert body["status"] == "succeeded"
    basis = np.array(body["result"]["basis"])
    assert basis.shape == (6, 2)
    np.testing.assert_allclose(basis.T @ basis, np.eye(2), atol=1e-10)
    assert len(body["result"]["basis_sha256"]) == 64
    assert len(body["result"]["extras"]["eigenvalues"]) == 2
    assert body["attempts"] is None and body["finished_at"] is None  # analysts see no timing
    # Nor do owners: a release's start tells when the job ahead of it in the queue ended.
    owned = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.owner)).json()
    assert owned["attempts"] is None and owned["finished_at"] is None and owned == body


def test_releases_are_private_to_their_analyst_and_the_dataset_owner(
    client, keys, dataset, make_key
):
    release = request(client, keys.analyst, dataset["id"]).json()
    path = f"/v1/releases/{release['id']}"
    assert client.get(path, headers=bearer(keys.analyst)).status_code == 200
    assert client.get(path, headers=bearer(keys.owner)).status_code == 200
    assert client.get(path, headers=bearer(make_key("analyst"))).status_code == 404
    assert client.get(path, headers=bearer(make_key("owner"))).status_code == 404


def test_a_refusal_says_what_the_release_lacks(client, keys, dataset):
    for _ in range(10):
        assert request(client, keys.analyst, dataset["id"]).status_code == 202
    refused = request(client, keys.analyst, dataset["id"]).json()
    detail = refused["detail"]
    assert "remaining budget: epsilon 0 left, it needs 0.1. Ask for less" in detail, detail
    # No action the service does not offer: nothing raises a dataset's budget.
    assert "raise the budget" not in detail, detail
    assert "a dataset's budget cannot be raised" in detail, detail


def test_a_hybrid_refusal_names_each_filter_and_its_shortfall(client, keys, upload_dataset, rng):
    data, _ = near_subspace(rng, 200, 6, 2)
    dataset = upload_dataset(
        client,
        keys.owner,
        data,
        epsilon_budget="1.0",
        delta_budget="1e-5",
        row_norm_bound=1.0,
        accounting="hybrid",
    )
    statuses = [request(client, keys.analyst, dataset["id"], epsilon="0.5") for _ in range(8)]
    refused = [r.json()["detail"] for r in statuses if r.status_code == 409]
    assert refused, [r.status_code for r in statuses]
    detail = refused[0]
    # analyze_gauss has a Gaussian-DP figure: every filter may charge it, each one short of
    # it, or closed for good when releases the others admitted overspent it (B's rho and C's
    # epsilon here: A' admitted releases of 0.5 past them).
    assert "filter A (Gaussian-DP) has mu^2" in detail, detail
    assert "filter B (zCDP) is closed: the releases admitted so far" in detail, detail
    assert "filter C (basic) is closed" in detail and "of its epsilon 1 and" in detail, detail


def test_a_hybrid_refusal_says_a_filter_closed_by_the_others_is_closed(
    client, keys, upload_dataset, rng
):
    # Filter C is closed by the Gaussian releases A' admitted (they overspent its delta share,
    # 1e-7): C then refuses even a pure release (delta 0). Its reason was "0 left, it needs 0".
    dataset = hybrid_with_filter_c_closed(client, keys.owner, keys.analyst, upload_dataset, rng)
    refused = request(
        client, keys.analyst, dataset["id"], mechanism="smooth_sensitivity", epsilon="5",
        delta="0",
    )  # fmt: skip
    assert refused.status_code == 409, refused.text
    detail = refused.json()["detail"]
    assert "left, it needs 0;" not in detail + ";", detail
    assert "filter C (basic) is closed: the releases admitted so far" in detail, detail
    assert "of its delta share 0.0000001" in detail, detail
