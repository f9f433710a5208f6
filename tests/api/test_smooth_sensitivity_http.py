"""Issue 3, done-when for smooth_sensitivity through HTTP: the Gaussian variant at n = 20,000
and the pure Cauchy variant at n = 200,000 (median over a few releases), near a 3-dim subspace
of R^20 at epsilon = 1."""

from __future__ import annotations

import numpy as np
import pytest

from service.config import Settings
from service.mechanisms.linalg import subspace_distance
from tests.conftest import bearer, fetch_release, post_release
from tests.mechanisms.synthetic import near_subspace

SEED = 200


# Reproducible CI: each release gets a seeded generator instead of the OS-keyed ChaCha (the
# thresholds below hold for almost every seed; see the comments).
pytestmark = pytest.mark.release_seed(SEED)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # 200,000 x 20 float64 is 32 MB; the shared fixture caps uploads at 5 MB.
    return settings.model_copy(update={"max_upload_mb": 64})


def test_gaussian_variant_succeeds_with_small_error(client, keys, upload_dataset, run_worker):
    data, basis = near_subspace(20_000, 20, 3, seed=31)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)
    release_id = post_release(
        client,
        keys.analyst,
        dataset["id"],
        mechanism="smooth_sensitivity",
        k=3,
        epsilon="1",
        delta="1e-6",
    )
    assert run_worker() == 1
    result = fetch_release(client, keys.analyst, release_id)
    assert result["status"] == "succeeded", result
    # the variant and the usefulness check (issue 24 item 5): no raw noisy double
    assert result["result"]["extras"] == {"variant": "gaussian", "components_above_noise": 3}
    # A faithful implementation gives ~0.04 here.
    assert subspace_distance(np.array(result["result"]["basis"]), basis) < 0.08


# What this checks does not depend on the database (the ledger paths run on both elsewhere):
# one backend halves its time.
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_pure_cauchy_variant_median_error_is_small_and_charged_pure(
    client, keys, upload_dataset, run_worker
):
    data, basis = near_subspace(200_000, 20, 3, seed=32)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0, epsilon_budget="7")
    ids = [
        post_release(
            client,
            keys.analyst,
            dataset["id"],
            mechanism="smooth_sensitivity",
            k=3,
            epsilon="1",
            delta="0",
        )
        for _ in range(7)
    ]
    assert run_worker() == 7
    errors = []
    for release_id in ids:
        result = fetch_release(client, keys.analyst, release_id)
        assert result["status"] == "succeeded", result
        extras = result["result"]["extras"]
        assert extras["variant"] == "cauchy"
        assert set(extras) <= {"variant", "components_above_noise", "warning", "warning_code"}
        assert result["delta"] == "0"
        errors.append(subspace_distance(np.array(result["result"]["basis"]), basis))
    # Heavy tails: over 2000 simulated releases the quartiles were 0.045, 0.079, 0.17 and 10%
    # exceeded 0.39; a median of 7 above 0.4 has probability ~0.2%.
    assert float(np.median(errors)) < 0.4
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.analyst))
    assert budget.json()["epsilon_spent"] == "7"
    assert budget.json()["delta_spent"] == "0"


def test_gaussian_epsilon_above_one_is_refused_before_charging(client, keys, upload_dataset):
    data, _ = near_subspace(500, 6, 2, seed=33)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)
    for epsilon, expected in [("1.0000001", 422), ("40", 422), ("1", 202)]:
        response = client.post(
            f"/v1/datasets/{dataset['id']}/releases",
            headers=bearer(keys.analyst),
            json={"mechanism": "smooth_sensitivity", "k": 2, "epsilon": epsilon, "delta": "1e-6"},
        )
        assert response.status_code == expected, response.text
        if expected == 422:
            assert "epsilon" in response.text
            budget = client.get(
                f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.analyst)
            ).json()
            assert budget["epsilon_spent"] == "0"
