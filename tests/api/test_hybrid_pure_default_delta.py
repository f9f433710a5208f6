"""A pure release (every declared step pure, e.g. smooth_sensitivity's Cauchy variant, its
default under a filter) asked on a ``hybrid`` dataset without a delta runs at delta 0: it spends
none, and the defaulted delta (a hundredth of delta_total: all of filter C's 1% share) charged
to C closed C after one release, so the product's default admitted one pure release at epsilon
0.3 on a (1, 1e-5) dataset where ``basic`` admits three (A' charges 0.3 at pure_mu(0.3)^2 =
0.141 > its 0.0715, B at 0.045 > its 0.0202)."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from service import audit
from tests.conftest import bearer

pytestmark = pytest.mark.release_seed(5)

PURE = {"mechanism": "smooth_sensitivity", "k": 2, "epsilon": "0.3"}


def rows() -> np.ndarray:
    rng = np.random.default_rng(9)
    data = rng.normal(size=(2_000, 6)) * np.array([3, 2, 0.3, 0.2, 0.1, 0.1])
    return data / np.maximum(1.0, np.linalg.norm(data, axis=1, keepdims=True))


def post(client, keys, dataset_id, body, dry_run=False):
    query = "?dry_run=true" if dry_run else ""
    return client.post(
        f"/v1/datasets/{dataset_id}/releases{query}", headers=bearer(keys.analyst), json=body
    )


@pytest.mark.parametrize("granted", [False, True])
def test_pure_releases_without_a_delta_are_admitted_as_under_basic(
    client, keys, upload_dataset, run_worker, granted, session_factory
):
    made = upload_dataset(
        client, keys.owner, rows(), accounting="hybrid", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1.0,
    )  # fmt: skip
    if granted:
        grant = client.post(
            f"/v1/datasets/{made['id']}/grants",
            headers=bearer(keys.owner),
            json={"epsilon": "0.9", "delta": "5e-6"},
        )
        assert grant.status_code == 201, grant.text
    dry = post(client, keys, made["id"], PURE, dry_run=True)
    assert dry.status_code == 200, dry.text
    assert Decimal(dry.json()["delta"]) == 0
    assert dry.json()["releases_remaining"] == 3
    for _ in range(3):
        accepted = post(client, keys, made["id"], PURE)
        assert accepted.status_code == 202, accepted.text
        assert Decimal(accepted.json()["delta"]) == 0
    assert run_worker() == 3
    refused = post(client, keys, made["id"], PURE)
    assert refused.status_code == 409, refused.text
    budget = client.get(f"/v1/datasets/{made['id']}/budget", headers=bearer(keys.owner)).json()
    assert Decimal(budget["epsilon_spent"]) == Decimal("0.9")
    assert Decimal(budget["delta_spent"]) > 0  # B closed: its share counts as spent
    listed = client.get(
        f"/v1/releases?dataset_id={made['id']}", headers=bearer(keys.analyst)
    ).json()["items"]
    assert [item["status"] for item in listed] == ["succeeded"] * 3
    with session_factory() as session:  # the release, its event and its charge agree
        assert audit.verify(session).ok


def test_an_explicit_delta_is_charged_as_asked(client, keys, upload_dataset):
    made = upload_dataset(
        client, keys.owner, rows(), accounting="hybrid", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1.0,
    )  # fmt: skip
    dry = post(client, keys, made["id"], {**PURE, "delta": "1e-8"}, dry_run=True).json()
    assert Decimal(dry["delta"]) == Decimal("1e-8")


def test_a_gaussian_release_without_a_delta_keeps_the_default(client, keys, upload_dataset):
    made = upload_dataset(
        client, keys.owner, rows(), accounting="hybrid", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1.0,
    )  # fmt: skip
    body = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.3"}
    dry = post(client, keys, made["id"], body, dry_run=True).json()
    assert Decimal(dry["delta"]) == Decimal("1e-7")
