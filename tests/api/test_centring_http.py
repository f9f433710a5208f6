"""analyze_gauss centring over HTTP: the params record, the preview's split, refusals, extras."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.mechanisms.composition import gaussian_total_mu
from service.mechanisms.spectrum import noise_std as spectrum_noise_std
from tests.conftest import bearer, release_and_wait
from tests.factories import near_subspace

BODY = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.5", "delta": "1e-7"}


@pytest.fixture
def dataset(client, keys, upload_dataset, rng):
    data, _ = near_subspace(rng, 200, 6, 2)
    data = 0.5 * data + 0.4 / np.sqrt(6)
    return upload_dataset(
        client, keys.owner, data, epsilon_budget="1.0", delta_budget="1e-5", row_norm_bound=1.0
    )


def post(client, key, dataset_id, dry_run, **body):
    return client.post(
        f"/v1/datasets/{dataset_id}/releases",
        params={"dry_run": "true"} if dry_run else None,
        headers=bearer(key),
        json={**BODY, **body},
    )


def test_preview_of_a_private_centre_states_the_split(client, keys, dataset):
    response = post(
        client,
        keys.analyst,
        dataset["id"],
        True,
        params={"center": "private", "center_share": 0.25, "clip_quantile": None},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    # Opted out of the default clip quantile: recorded, so the worker runs the same split.
    assert body["params"] == {
        "clip_norm": 1.0,
        "center": "private",
        "center_share": 0.25,
        "clip_quantile": "none",
    }
    scales = body["scales"]
    assert scales["center"] == "private"
    # GDP shares of the request's mu: 0.25 for the mean, 0.1 for the explained variance.
    mu = gaussian_total_mu(0.5, 1e-7, 0.0, 0.0)
    assert scales["center_sigma"] == pytest.approx(2.0 / 200 / (math.sqrt(0.25) * mu))
    assert scales["sigma"] == pytest.approx(math.sqrt(2.0) / (math.sqrt(0.65) * mu))


def test_a_private_centre_release_returns_centre_eigenvalues_and_trace(
    client, keys, dataset, run_worker
):
    body = release_and_wait(
        client,
        keys.analyst,
        dataset["id"],
        run_worker,
        **BODY,
        params={"center": "private", "clip_quantile": "none"},
    )
    assert body["status"] == "succeeded"
    extras = body["result"]["extras"]
    assert len(extras["center"]) == 6 and len(extras["eigenvalues"]) == 2
    # The noisy trace of H + E: released as drawn, so it may be negative at n = 200 (its noise
    # has standard deviation sqrt(d) sigma, about the size of the trace here).
    assert isinstance(extras["trace"], float) and math.isfinite(extras["trace"])
    ratios = extras["explained_variance_ratio"]
    low, high = extras["explained_variance_ratio_interval"]
    if extras["explained_variance_hidden_by_noise"]:
        # n = 200: the noise hides the share, so no point is stated (issue 32 item 4).
        assert ratios is None and extras["explained_sum_of_squares"] is None
        assert 0 <= low <= high <= 1
    else:
        assert len(ratios) == 2 and min(ratios) >= 0 and 0 <= low <= sum(ratios) <= high <= 1
    # Charged exactly the request, not more for the extra stage.
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)).json()
    assert budget["epsilon_remaining"] == "0.5"


def test_a_default_private_centre_gets_and_records_the_best_settings(
    client, keys, dataset, run_worker
):
    # Issue 32, item 1: nothing but center "private" gets the default clip quantile and the
    # centring choice; the dry run says so and what the other setting would give; the stored
    # release records them.
    preview = post(client, keys.analyst, dataset["id"], True, params={"center": "private"})
    assert preview.status_code == 200, preview.text
    recorded = {
        "clip_norm": 1.0,
        "center": "private",
        "center_share": 0.2,
        "center_route": "auto",
        "clip_quantile": 0.3,
    }
    assert preview.json()["params"] == recorded
    scales = preview.json()["scales"]
    assert scales["clip_quantile_source"] == "default"
    assert scales["alternative"] == "clip_quantile none"
    assert 0 < scales["alternative_sigma"] < scales["sigma"]
    assert any("Chosen by default" in line for line in preview.json()["meaning"])
    body = release_and_wait(
        client, keys.analyst, dataset["id"], run_worker, **BODY, params={"center": "private"}
    )
    assert body["status"] == "succeeded" and body["params"] == recorded
    assert body["result"]["extras"]["centring"] in ("mean", "pairs", "none")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"center": [0.1, 0.2]}, "params.center"),
        ({"center": [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]}, "params.center"),
        ({"center": "mean"}, "params.center"),
        ({"center": "private", "center_share": 1.0}, "params.center_share"),
        ({"center": "private", "clip_quantile": "median"}, "params.clip_quantile"),
        ({"center": "private", "clip_quantile": 0}, "params.clip_quantile"),
    ],
)
def test_bad_centres_are_422_and_charge_nothing(client, keys, dataset, params, field):
    response = post(client, keys.analyst, dataset["id"], False, params=params)
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"]
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)).json()
    assert budget["epsilon_remaining"] == "1"


@pytest.mark.parametrize(
    ("center", "detail"),
    [
        (
            "mean",
            "params.center: Input should be 'none' or 'private'; or: Input should be a valid list",
        ),
        (
            [0.1, "x", 0.0, 0.0, 0.0, 0.0],
            "params.center: Input should be 'none' or 'private'; or: item 1: Input should be a "
            "valid number",
        ),
    ],
)
def test_a_bad_centre_is_named_as_the_field_with_every_accepted_form(
    client, keys, dataset, center, detail
):
    # pydantic locates a union's errors under a tag per alternative
    # (center.literal['none','private'], center.list[float]); the client sees the field.
    response = post(client, keys.analyst, dataset["id"], True, params={"center": center})
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == detail


def test_spectrum_centres_the_same_way(client, keys, dataset, run_worker):
    body = {**BODY, "mechanism": "spectrum", "k": 3, "params": {"center": "private"}}
    preview = post(client, keys.analyst, dataset["id"], True, **body)
    assert preview.status_code == 200, preview.text
    assert preview.json()["scales"]["center"] == "private"
    # 200 rows at eps 0.5: the private mean's rank-one term would exceed the eigenvalues'
    # noise, so they are read from paired rows, scaled by (n - 1)/m (issue 30, item 15).
    assert preview.json()["scales"]["center_route"] == "pairs"
    assert preview.json()["scales"]["noise_std"] == pytest.approx(
        spectrum_noise_std(1.0, (1 - 0.2) * 0.5, (1 - 0.2) * 1e-7) * 199 / 100
    )
    done = release_and_wait(client, keys.analyst, dataset["id"], run_worker, **body)
    assert done["status"] == "succeeded"
    assert len(done["result"]["extras"]["center"]) == 6
    assert done["result"]["extras"]["center_route"] == "pairs"
    assert done["result"]["extras"]["noise_std"] == preview.json()["scales"]["noise_std"]
