"""Totality through the whole service on the combinations the mechanism-level property
(tests/mechanisms/test_totality.py) does not reach: a person-level dataset with a public prior
under each registered mechanism, a continual release whose later batch is extreme, and a private
centre with a clip quantile on extreme rows; on the product's default (hybrid) accounting.

Every request ends ``succeeded`` or ``no_result`` (a continual one ``running`` between batches),
or is refused with a 422 that names its field and charges nothing (decided from public facts):
never ``failed``. The rows mix scales per column (1e-300 beside 1.7e308 / 4), repeat one huge
row, hold rows of zeros and subnormals, and one column is constant.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms.registry import MECHANISMS
from tests.api.test_append_rows import append
from tests.conftest import bearer, fetch_release, npy_bytes

N, D = 700, 4
#: Mechanisms that take the prior on a person-level dataset need no more than these params.
PARAMS = {"continual_gauss": {"horizon": 2}}


@pytest.fixture
def settings(settings):
    return settings.model_copy(update={"default_accounting": "hybrid"})


def extreme_rows(seed: int, n: int = N) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((n, D)) * np.array([1e-300, 1e300, -1.7e308 / 4, 1.0])
    rows[:, 3] = 7.0  # a constant column
    rows[5 : n // 3] = rows[4]  # one huge row repeated
    rows[n // 3 : n // 3 + 50] = 0.0
    rows[-40:] = 5e-324
    assert np.all(np.isfinite(rows))
    return rows


def person_csv(rows: np.ndarray, first_person: int = 0) -> bytes:
    lines = ["pid," + ",".join(f"f{j}" for j in range(rows.shape[1]))]
    for i, row in enumerate(rows):
        lines.append(f"p{first_person + i // 3}," + ",".join(repr(float(v)) for v in row))
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def people(client, keys):
    response = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files={"file": ("people.csv", person_csv(extreme_rows(1)), "text/csv")},
        data={"name": "extreme people", "epsilon_budget": "1000", "delta_budget": "0.5",
              "allow_large_delta": "true", "row_norm_bound": "1", "privacy_unit_column": "pid"},
    )  # fmt: skip
    assert response.status_code == 201, response.text
    assert response.json()["budget"]["accounting"] == "hybrid"
    return response.json()["id"]


def spent(client, keys, dataset_id):
    budget = client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(keys.owner)).json()
    return budget["epsilon_spent"]


def request(client, keys, dataset_id, mechanism, **params):
    body = {
        "mechanism": mechanism,
        "k": 2,
        "epsilon": "1" if mechanism == "smooth_sensitivity" else "5",
        "delta": "1e-5",
        "params": {**PARAMS.get(mechanism, {}), **params},
    }
    before = spent(client, keys, dataset_id)
    response = client.post(
        f"/v1/datasets/{dataset_id}/releases", headers=bearer(keys.analyst), json=body
    )
    if response.status_code == 422:
        detail = response.json()["detail"]
        assert detail.split(":")[0] in {"privacy_unit_column", "params.prior_basis"}, detail
        assert spent(client, keys, dataset_id) == before
        return None
    assert response.status_code == 202, response.text
    return response.json()["id"]


def test_person_level_with_a_prior_is_total_under_every_mechanism(client, keys, people, run_worker):
    prior = np.linalg.qr(np.random.default_rng(2).normal(size=(D, 3)))[0]
    outcomes = {}
    for mechanism in sorted(MECHANISMS):
        release_id = request(client, keys, people, mechanism, prior_basis=prior.tolist())
        if release_id is None:
            outcomes[mechanism] = "refused"
            continue
        assert run_worker() == 1
        shown = fetch_release(client, keys.owner, release_id)
        assert shown["status"] in {"succeeded", "no_result"}, (mechanism, shown)
        outcomes[mechanism] = shown["status"]
    # The per-person paths ran, not only refusals.
    ran = {mechanism for mechanism, outcome in outcomes.items() if outcome != "refused"}
    assert {"analyze_gauss", "auto", "spectrum"} <= ran


@pytest.mark.parametrize("person", [False, True], ids=["rows", "people"])
def test_a_continual_release_stays_total_when_a_later_batch_is_extreme(
    client, keys, upload_dataset, run_worker, person
):
    ordinary = np.random.default_rng(3).normal(size=(N, D)) / 4
    if person:
        made = client.post(
            "/v1/datasets",
            headers=bearer(keys.owner),
            files={"file": ("people.csv", person_csv(ordinary), "text/csv")},
            data={"name": "people", "epsilon_budget": "100", "delta_budget": "0.5",
                  "allow_large_delta": "true", "row_norm_bound": "1", "privacy_unit_column": "pid"},
        )  # fmt: skip
        assert made.status_code == 201, made.text
        dataset_id = made.json()["id"]
    else:
        dataset_id = upload_dataset(
            client, keys.owner, ordinary, row_norm_bound="1", epsilon_budget="100",
            delta_budget="0.5", allow_large_delta="true",
        )["id"]  # fmt: skip
    release_id = request(client, keys, dataset_id, "continual_gauss")
    assert run_worker() == 1
    assert fetch_release(client, keys.owner, release_id)["status"] == "running"
    batch = extreme_rows(4, n=300)
    if person:
        grown = append(
            client, keys.owner, dataset_id, person_csv(batch, first_person=10_000),
            filename="batch.csv", privacy_unit_column="pid",
        )  # fmt: skip
    else:
        grown = append(client, keys.owner, dataset_id, npy_bytes(batch))
    assert grown.status_code == 201, grown.text
    assert run_worker() == 1
    shown = fetch_release(client, keys.owner, release_id)
    assert shown["status"] in {"succeeded", "no_result"}, shown
    assert shown["epochs_done"] == 2


@pytest.mark.parametrize("mechanism", ["analyze_gauss", "auto", "spectrum"])
def test_a_private_centre_and_clip_quantile_on_extreme_people_are_total(
    client, keys, people, run_worker, mechanism
):
    params = {"center": "private"}
    if mechanism == "analyze_gauss":
        params["clip_quantile"] = 0.5
    release_id = request(client, keys, people, mechanism, **params)
    assert release_id is not None
    assert run_worker() == 1
    shown = fetch_release(client, keys.owner, release_id)
    assert shown["status"] in {"succeeded", "no_result"}, shown
