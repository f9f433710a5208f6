"""Issue 3, done-when for gap_perturbation through HTTP: success near a 3-dim subspace of R^20
at n = 20,000; no_result on isotropic data, charged."""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms.linalg import subspace_distance
from tests.conftest import bearer, release_and_wait
from tests.mechanisms.synthetic import isotropic, near_subspace

SEED = 100


# Reproducible CI: each release gets a seeded generator instead of the OS-keyed ChaCha (the
# thresholds below hold for almost every seed; see the comments).
pytestmark = pytest.mark.release_seed(SEED)


REQUEST = {"mechanism": "gap_perturbation", "k": 3, "epsilon": "1", "delta": "1e-6"}


def test_succeeds_with_small_error_near_a_subspace(client, keys, upload_dataset, run_worker):
    data, basis = near_subspace(20_000, 20, 3, seed=21)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)
    result = release_and_wait(client, keys.analyst, dataset["id"], run_worker, **REQUEST)
    assert result["status"] == "succeeded", result
    released = np.array(result["result"]["basis"])
    assert released.shape == (20, 3)
    # A faithful implementation gives ~0.012 here.
    assert subspace_distance(released, basis) < 0.05
    # only the usefulness check (issue 24 item 5): every direction stands out, no warning
    assert result["result"]["extras"] == {"components_above_noise": 3}


def test_isotropic_data_ends_in_no_result_and_is_charged(client, keys, upload_dataset, run_worker):
    dataset = upload_dataset(client, keys.owner, isotropic(20_000, 20, seed=22), row_norm_bound=1.0)
    result = release_and_wait(client, keys.analyst, dataset["id"], run_worker, **REQUEST)
    assert result["status"] == "no_result"
    assert result["reason"] == "eigengap too small for this budget"
    assert result["result"] is None or result["result"].get("basis") is None
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.analyst))
    assert budget.json()["epsilon_spent"] == "1"
    assert budget.json()["delta_spent"] == "0.000001"
