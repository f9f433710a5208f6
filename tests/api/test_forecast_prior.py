"""A dry run's ``forecast_from`` inside a public prior (issue 32 items 2 and 4): an earlier
analyze_gauss release inside the same prior forecasts a request inside it (both describe the
rows projected onto the prior's span); across different priors, or a prior and none, the
released figures describe other rows, and the refusal says so (it said the forecast was "made
for analyze_gauss" when the mechanism was analyze_gauss)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import bearer, release_and_wait

pytestmark = pytest.mark.release_seed(3)

D, M = 8, 4


def rows(n: int = 3_000, seed: int = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    data = rng.normal(size=(n, D)) * np.linspace(2.0, 0.2, D)
    return data / np.maximum(1.0, np.linalg.norm(data, axis=1, keepdims=True))


def prior(columns: tuple[int, ...]) -> list[list[float]]:
    return np.eye(D)[:, list(columns)].tolist()


FIRST, OTHER = prior((0, 1, 2, 3)), prior((0, 1, 2, 4))
BODY = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.5", "delta": "1e-7"}


@pytest.fixture
def dataset_id(client, keys, upload_dataset):
    made = upload_dataset(
        client, keys.owner, rows(), epsilon_budget="3", delta_budget="1e-5", row_norm_bound=1.0
    )
    return made["id"]


def earlier(client, keys, dataset_id, run_worker, basis):
    params = {} if basis is None else {"prior_basis": basis}
    done = release_and_wait(client, keys.analyst, dataset_id, run_worker, **BODY, params=params)
    assert done["status"] == "succeeded", done
    return done["id"]


def dry_run(client, keys, dataset_id, release_id, basis):
    params = {} if basis is None else {"prior_basis": basis}
    return client.post(
        f"/v1/datasets/{dataset_id}/releases",
        params={"dry_run": "true", "forecast_from": release_id},
        headers=bearer(keys.analyst),
        json={**BODY, "params": params},
    )


def test_a_forecast_inside_the_same_prior_is_made(client, keys, dataset_id, run_worker):
    release_id = earlier(client, keys, dataset_id, run_worker, FIRST)
    response = dry_run(client, keys, dataset_id, release_id, FIRST)
    assert response.status_code == 200, response.text
    scales = response.json()["scales"]
    low = scales["forecast_from_release_captured_share_low"]
    high = scales["forecast_from_release_captured_share_high"]
    assert 0.0 <= low <= high <= 1.0
    assert scales["prior_dimension"] == M


@pytest.mark.parametrize(
    ("then", "now"), [(FIRST, OTHER), (FIRST, None), (None, FIRST)], ids=["other", "none", "new"]
)
def test_a_forecast_across_priors_is_refused_saying_why(
    client, keys, dataset_id, run_worker, then, now
):
    release_id = earlier(client, keys, dataset_id, run_worker, then)
    response = dry_run(client, keys, dataset_id, release_id, now)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("forecast_from: ") and "prior" in detail, detail
    assert "made for analyze_gauss" not in detail


def test_the_forecast_inside_a_prior_says_what_its_shares_are_of(
    client, keys, dataset_id, run_worker
):
    release_id = earlier(client, keys, dataset_id, run_worker, FIRST)
    meaning = dry_run(client, keys, dataset_id, release_id, FIRST).json()["meaning"]
    assert any("projected onto its span" in line for line in meaning), meaning
