"""Issue 31, item 1, done-when: on a dataset uploaded with the product's default accounting,
smooth_sensitivity, exact_gapmax and auto (choosing an aggregator on exactly low-rank data)
succeed, each charged its declared profile in the dataset's currency."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from service import accounting
from service.config import Settings
from service.mechanisms.linalg import subspace_distance
from tests.conftest import bearer, release_and_wait

#: What an upload that names no accounting gets in the product (the suite's settings keep
#: ``basic`` for older tests; this test asks for the product's default explicitly).
PRODUCT_DEFAULT = Settings.model_fields["default_accounting"].default

pytestmark = pytest.mark.release_seed(20)


def exactly_low_rank(n: int, d: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.normal(size=(d, k)))
    rows = rng.normal(size=(n, k)) @ basis.T * (0.5 / np.sqrt(k))
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(1.0, norms), basis


def upload_default(upload_dataset, client, keys, data, **form):
    dataset = upload_dataset(
        client, keys.owner, data, accounting=PRODUCT_DEFAULT, row_norm_bound=1.0, **form
    )
    assert dataset["budget"]["accounting"] == PRODUCT_DEFAULT != "basic"
    return dataset


def spent_rho(client, keys, dataset) -> Decimal:
    shown = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner))
    return Decimal(shown.json()["rho_spent"])


def test_smooth_sensitivity_runs_cauchy_and_is_charged_its_pure_step(
    client, keys, upload_dataset, run_worker
):
    data, _ = exactly_low_rank(2_000, 6, 2, seed=1)
    dataset = upload_default(upload_dataset, client, keys, data)
    dry = client.post(
        f"/v1/datasets/{dataset['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json={"mechanism": "smooth_sensitivity", "k": 2, "epsilon": "2", "delta": "1e-6"},
    ).json()
    # hybrid's GDP filter charges the pure Cauchy step at pure_mu(2): its dry run says so
    assert dry["admitted_by"][0] == "gdp"
    mu = accounting.pure_mu(Decimal(2))  # the step's mu, squared and rooted, rounded up
    assert mu <= Decimal(dry["mu"]) <= mu + Decimal("1e-29")
    result = release_and_wait(
        client,
        keys.analyst,
        dataset["id"],
        run_worker,
        mechanism="smooth_sensitivity",
        k=2,
        epsilon="2",
        delta="1e-6",
    )
    assert result["status"] == "succeeded", result
    assert result["result"]["extras"]["variant"] == "cauchy"
    assert Decimal(result["rho"]) == Decimal(2)  # (eps^2/2) for eps = 2, exact
    assert spent_rho(client, keys, dataset) == Decimal(2)


def test_exact_gapmax_recovers_the_subspace_charged_approximate_zcdp(
    client, keys, upload_dataset, run_worker
):
    rng = np.random.default_rng(41)
    spanning = rng.integers(-5, 6, size=(2, 10)).astype(np.float64)
    basis = np.linalg.qr(spanning.T)[0]
    data = rng.integers(-(2**20), 2**20, size=(400, 2)).astype(np.float64) @ spanning
    dataset = upload_dataset(client, keys.owner, data, accounting=PRODUCT_DEFAULT)
    result = release_and_wait(
        client,
        keys.analyst,
        dataset["id"],
        run_worker,
        mechanism="exact_gapmax",
        k=2,
        epsilon="1",
        delta="1e-6",
    )
    assert result["status"] == "succeeded", result
    released = np.array(result["result"]["basis"])
    assert np.linalg.norm(released @ released.T - basis @ basis.T, 2) < 1e-12
    assert Decimal(result["rho"]) == Decimal("0.5")
    assert Decimal(result["cost_delta"]) >= Decimal("1e-6") * (1 - Decimal("1e-15"))


def test_auto_chooses_an_aggregator_on_exactly_low_rank_data(
    client, keys, upload_dataset, run_worker
):
    data, basis = exactly_low_rank(5_000, 10, 2, seed=0)
    dataset = upload_default(upload_dataset, client, keys, data)
    body = {"mechanism": "auto", "k": 2, "epsilon": "1", "delta": "1e-6"}
    dry = client.post(
        f"/v1/datasets/{dataset['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=body,
    )
    assert dry.status_code == 200, dry.text
    # The dry run says what auto will do, and what it costs in rho, before anything is spent.
    assert "friendly_aggregate" in dry.json()["scales"]["auto_choice"]
    declared = Decimal(dry.json()["rho"])
    result = release_and_wait(client, keys.analyst, dataset["id"], run_worker, **body)
    assert result["status"] == "succeeded", result
    assert result["mechanism"] == "auto"
    assert result["result"]["extras"]["auto_choice"] in {
        "friendly_aggregate",
        "histogram_aggregate",
    }
    released = np.array(result["result"]["basis"])
    assert subspace_distance(released, basis) < 1e-2
    assert Decimal(result["rho"]) == declared == spent_rho(client, keys, dataset)


def test_friendly_aggregate_runs_on_a_default_dataset_and_filter_b_or_c_charges_it(
    client, keys, upload_dataset, run_worker
):
    data, basis = exactly_low_rank(5_000, 10, 2, seed=3)
    dataset = upload_default(upload_dataset, client, keys, data)
    body = {"mechanism": "friendly_aggregate", "k": 2, "epsilon": "1", "delta": "1e-6"}
    dry = client.post(
        f"/v1/datasets/{dataset['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=body,
    )
    assert dry.status_code == 200, dry.text
    # approximate PTR steps: not the GDP filter's; zCDP (B) or basic (C) admits it
    assert dry.json()["admitted_by"] and "gdp" not in dry.json()["admitted_by"]
    result = release_and_wait(client, keys.analyst, dataset["id"], run_worker, **body)
    assert result["status"] == "succeeded", result
    released = np.array(result["result"]["basis"])
    assert subspace_distance(released, basis) < 1e-2
    shown = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner))
    assert Decimal(shown.json()["epsilon_spent"]) > 0


@pytest.fixture
def product_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"default_accounting": PRODUCT_DEFAULT})


def test_an_upload_naming_no_accounting_gets_hybrid_in_the_product(
    product_settings, session_factory, keys, upload_dataset
):
    from fastapi.testclient import TestClient

    from service.app import create_app

    app = create_app(product_settings, session_factory=session_factory)
    with TestClient(app, raise_server_exceptions=False) as client:
        data, _ = exactly_low_rank(200, 4, 1, seed=5)
        dataset = upload_dataset(client, keys.owner, data, epsilon_budget="1", delta_budget="1e-6")
        budget = dataset["budget"]
        assert PRODUCT_DEFAULT == budget["accounting"] == "hybrid"
        assert Decimal(budget["delta_reserved_for_conversion"]) == Decimal("9.7e-7")
        # B's 2% for approximate steps and C's 1% for single releases, unspent (follow-up 3:
        # C's share was missing from the statement, which said 2e-8), so the rows add up
        assert Decimal(budget["delta_remaining"]) == Decimal("3e-8")
        assert Decimal(budget["delta_spent"]) == 0
        # Unspent: all of A''s mu remains (it read 1e-30 less: its root rounded down past it)
        assert budget["mu_remaining"] == budget["mu_total"]
        assert budget["rho_remaining"] == budget["rho_total"]
