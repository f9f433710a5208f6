"""A dry run reads public facts only: two datasets that differ in every row but agree in every
public fact (shape, declared bound, budget, unit) get byte-identical previews from every
one-shot mechanism, with and without a public prior, and the same refusals. Nothing in a
preview can then depend on a row beyond its stated cost, which is zero."""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms.registry import MECHANISMS
from tests.conftest import bearer

N, D = 300, 6


def unit_rows(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(1.0, np.linalg.norm(rows, axis=1))[:, None]


@pytest.fixture
def twins(client, keys, upload_dataset):
    rng = np.random.default_rng(11)
    spread = unit_rows(rng.normal(size=(N, D)))
    # The other: every row along one direction, far from the first's spectrum.
    line = unit_rows(np.outer(rng.normal(size=N) * 4, np.eye(D)[0]) + 1e-3)
    return [
        upload_dataset(
            client,
            keys.owner,
            rows,
            name="twin",
            epsilon_budget="10",
            delta_budget="1e-4",
            row_norm_bound=1.0,
        )["id"]
        for rows in (spread, line)
    ]


def dry_run(client, key, dataset_id, body):
    answer = client.post(
        f"/v1/datasets/{dataset_id}/releases",
        params={"dry_run": "true"},
        headers=bearer(key),
        json=body,
    )
    text = answer.text.replace(dataset_id, "<dataset>")
    return answer.status_code, text


ONE_SHOT = sorted(name for name, mechanism in MECHANISMS.items() if not mechanism.continual)


@pytest.mark.parametrize("prior", [False, True], ids=["plain", "prior"])
@pytest.mark.parametrize("mechanism", ONE_SHOT)
def test_twin_datasets_get_identical_previews(client, keys, twins, mechanism, prior):
    body = {"mechanism": mechanism, "k": 2, "epsilon": "1", "delta": "1e-6"}
    if prior:
        basis, _ = np.linalg.qr(np.random.default_rng(3).normal(size=(D, 4)))
        body["params"] = {"prior_basis": basis.tolist()}
    first, second = (dry_run(client, keys.analyst, twin, body) for twin in twins)
    # The aggregators refuse this few rows (422, the same to both): a refusal is a preview too.
    assert first[0] == (422 if mechanism.endswith("_aggregate") else 200), first
    assert first == second
    # Also an unaffordable one (the refusal figures) and a refused one.
    big = {**body, "epsilon": "50"}
    assert dry_run(client, keys.analyst, twins[0], big) == dry_run(
        client, keys.analyst, twins[1], big
    )
    bad = {**body, "k": D + 1}
    assert dry_run(client, keys.analyst, twins[0], bad) == dry_run(
        client, keys.analyst, twins[1], bad
    )
