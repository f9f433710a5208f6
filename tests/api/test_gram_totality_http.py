"""Issues 11 and 12 through HTTP for the Gram mechanisms (analyze_gauss, gap_perturbation,
smooth_sensitivity, spectrum): a valid upload with a row near 1e200 releases normally, and a
clip norm whose square over- or underflows is refused with 422 before anything is charged."""

from __future__ import annotations

import pytest

from tests.conftest import bearer, release_and_wait
from tests.mechanisms.synthetic import near_subspace

pytestmark = pytest.mark.release_seed(500)

GRAM_MECHANISMS = [
    "analyze_gauss",
    "gap_perturbation",
    "smooth_sensitivity",
    "spectrum",
    "spatial_sign",
]


def test_a_row_near_1e200_does_not_change_the_outcome(client, keys, upload_dataset, run_worker):
    data, _ = near_subspace(2000, 6, 2, seed=51)
    data[17] = [1e200, -2e200, 3e199, 0.0, 1e-300, 5e199]
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)
    for mechanism in GRAM_MECHANISMS:
        result = release_and_wait(
            client,
            keys.analyst,
            dataset["id"],
            run_worker,
            mechanism=mechanism,
            k=2,
            epsilon="1",
            delta="1e-6",
        )
        assert result["status"] in {"succeeded", "no_result"}, (mechanism, result)


@pytest.mark.parametrize("mechanism", GRAM_MECHANISMS)
def test_clip_norms_whose_square_overflows_or_underflows_are_refused_uncharged(
    client, keys, upload_dataset, mechanism
):
    data, _ = near_subspace(50, 4, 2, seed=52)
    declared = upload_dataset(client, keys.owner, data, row_norm_bound=1e200)
    plain = upload_dataset(client, keys.owner, data)
    requests = [
        (declared["id"], {}),  # the owner's declared bound: C^2 = 1e400
        (plain["id"], {"clip_norm": 1e-200}),  # C^2 = 1e-400
        (plain["id"], {"clip_norm": 1e160}),  # C^2 fits, n C^2 and the noise scale do not
    ]
    for dataset_id, params in requests:
        response = client.post(
            f"/v1/datasets/{dataset_id}/releases",
            headers=bearer(keys.analyst),
            json={
                "mechanism": mechanism,
                "k": 2,
                "epsilon": "1",
                "delta": "1e-6",
                "params": params,
            },
        )
        assert response.status_code == 422, response.text
        assert "clip_norm" in response.text
        budget = client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(keys.analyst))
        assert budget.json()["epsilon_spent"] == "0"
    # Far from the boundary (1e100: C^2 = 1e200) the release is accepted.
    accepted = client.post(
        f"/v1/datasets/{plain['id']}/releases",
        headers=bearer(keys.analyst),
        json={
            "mechanism": mechanism,
            "k": 2,
            "epsilon": "1",
            "delta": "1e-6",
            "params": {"clip_norm": 1e100},
        },
    )
    assert accepted.status_code == 202, accepted.text
