"""Issue 4, done-when for exact_gapmax through HTTP: 400 points exactly in a 2-dim subspace of
R^10 give back that subspace at eps = 1, delta = 1e-6; 400 points in general position give
no_result, charged; too few rows, or a ``tol`` (membership is exact since issue 11), is a 422
that charges nothing."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import bearer, release_and_wait

BUDGET = {"k": 2, "epsilon": "1", "delta": "1e-6"}


# Reproducible CI; recovery is certain for every seed here (n = 400 >= 116, Lemma 3.5).
pytestmark = pytest.mark.release_seed(400)


def test_exact_subspace_is_recovered(client, keys, upload_dataset, run_worker):
    rng = np.random.default_rng(41)
    spanning = rng.integers(-5, 6, size=(2, 10)).astype(np.float64)
    basis = np.linalg.qr(spanning.T)[0]
    # Integer combinations: exactly in the subspace as doubles (membership is exact).
    data = rng.integers(-(2**20), 2**20, size=(400, 2)).astype(np.float64) @ spanning
    dataset = upload_dataset(client, keys.owner, data)
    result = release_and_wait(
        client, keys.analyst, dataset["id"], run_worker, mechanism="exact_gapmax", **BUDGET
    )
    assert result["status"] == "succeeded", result
    released = np.array(result["result"]["basis"])
    assert released.shape == (10, 2)
    assert np.linalg.norm(released @ released.T - basis @ basis.T, 2) < 1e-12
    assert result["result"]["extras"]["sample_rows"] == 400


def test_general_position_is_no_result_and_charged(client, keys, upload_dataset, run_worker):
    data = np.random.default_rng(42).standard_normal((400, 10))
    dataset = upload_dataset(client, keys.owner, data)
    result = release_and_wait(
        client, keys.analyst, dataset["id"], run_worker, mechanism="exact_gapmax", **BUDGET
    )
    assert result["status"] == "no_result", result
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.analyst))
    assert budget.json()["epsilon_spent"] == "1"
    assert budget.json()["delta_spent"] == "0.000001"


def test_too_few_rows_is_refused_before_charging(client, keys, upload_dataset):
    data = np.random.default_rng(43).standard_normal((100, 10))
    dataset = upload_dataset(client, keys.owner, data)
    response = client.post(
        f"/v1/datasets/{dataset['id']}/releases",
        headers=bearer(keys.analyst),
        json={"mechanism": "exact_gapmax", **BUDGET},
    )
    assert response.status_code == 422, response.text
    assert "short by 16" in response.text
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.analyst))
    assert budget.json()["epsilon_spent"] == "0"


def test_tol_is_refused_with_a_clear_message(client, keys, upload_dataset):
    data = np.random.default_rng(44).standard_normal((400, 10))
    dataset = upload_dataset(client, keys.owner, data)
    response = client.post(
        f"/v1/datasets/{dataset['id']}/releases",
        headers=bearer(keys.analyst),
        json={"mechanism": "exact_gapmax", **BUDGET, "params": {"tol": 1e-9}},
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("params.tol: unknown field; valid fields: ")
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.analyst))
    assert budget.json()["epsilon_spent"] == "0"
