from __future__ import annotations

from tests.conftest import bearer
from tests.factories import near_subspace


def test_release_round_trip(client, keys, upload_dataset, run_worker, rng):
    data, _ = near_subspace(rng, 500, 8, 2)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)
    response = client.post(
        f"/v1/datasets/{dataset['id']}/releases",
        headers=bearer(keys.analyst),
        json={"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.5", "delta": "1e-6"},
    )
    assert response.status_code == 202, response.text
    assert run_worker() == 1
    release = client.get(
        f"/v1/releases/{response.json()['id']}", headers=bearer(keys.analyst)
    ).json()
    assert release["status"] == "succeeded"
    assert len(release["result"]["basis"]) == 8
