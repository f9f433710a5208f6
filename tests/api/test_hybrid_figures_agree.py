"""On the default accounting (``hybrid``), charged to the dataset or to a grant, the figures of
every place a budget appears agree after each release of a real sequence: the dry run's
remaining figures are GET .../budget's (or the grant's), its ``releases_remaining`` is how many
real requests are then admitted, and the 409 that ends the sequence states the same remaining
figures."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import bearer

pytestmark = pytest.mark.release_seed(21)

FIGURES = ("epsilon_remaining", "delta_remaining", "rho_remaining", "mu_remaining")
BODIES = {
    "gaussian": {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.5"},
    "approximate": {"mechanism": "friendly_aggregate", "k": 2, "epsilon": "0.3", "delta": "1e-8"},
    "pure": {"mechanism": "smooth_sensitivity", "k": 2, "epsilon": "0.3"},
    "in_mu": {"mechanism": "analyze_gauss", "k": 2, "mu": "0.1"},
}


def near_subspace(n: int = 30_000, d: int = 8, k: int = 2) -> np.ndarray:
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(rng.normal(size=(d, k)))
    rows = rng.normal(size=(n, k)) @ basis.T + 1e-6 * rng.normal(size=(n, d))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.mark.parametrize("granted", [False, True], ids=["dataset", "grant"])
@pytest.mark.parametrize("kind", sorted(BODIES))
def test_the_dry_run_the_budget_and_the_409_agree_through_a_sequence(
    client, keys, upload_dataset, kind, granted
):
    body = BODIES[kind]
    dataset_id = upload_dataset(
        client, keys.owner, near_subspace(), accounting="hybrid", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1.0,
    )["id"]  # fmt: skip
    if granted:
        made = client.post(
            f"/v1/datasets/{dataset_id}/grants",
            headers=bearer(keys.owner),
            json={"epsilon": "0.7", "delta": "4e-6"},
        )
        assert made.status_code == 201, made.text

    def stated() -> dict:
        if granted:
            path = f"/v1/datasets/{dataset_id}/grants"
            return client.get(path, headers=bearer(keys.owner)).json()["items"][0]
        return client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(keys.owner)).json()

    releases = f"/v1/datasets/{dataset_id}/releases"
    predicted = None
    admitted = 0
    while admitted < 40:
        dry = client.post(f"{releases}?dry_run=true", headers=bearer(keys.analyst), json=body)
        assert dry.status_code == 200, dry.text
        shown, budget = dry.json(), stated()
        assert shown["budget"] == ("grant" if granted else "dataset")
        for name in FIGURES:
            assert shown[name] == budget[name], (name, admitted)
        if predicted is None:
            predicted = shown["releases_remaining"]
        else:
            assert shown["releases_remaining"] == predicted - admitted
        real = client.post(releases, headers=bearer(keys.analyst), json=body)
        if real.status_code != 202:
            break
        admitted += 1
    assert real.status_code == 409, real.text
    assert admitted == predicted >= 1
    refusal, budget = real.json(), stated()
    assert refusal["budget"] == ("grant" if granted else "dataset")
    for name in (*FIGURES, "delta_reserved_for_conversion"):
        assert refusal[name] == budget[name], name
