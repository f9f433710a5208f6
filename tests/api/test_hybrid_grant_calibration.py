"""A release asked in ``mu`` or ``rho`` on a ``hybrid`` dataset under a grant is calibrated as a
single ``(epsilon, delta)`` release at a tenth of the GRANT's filter C share of delta (the
dataset's tenth can be more than the grant's whole share: one such release closed the grant's
filter C for good), and the ledger charges exactly what the dry run declared."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest
from sqlalchemy import select

from service.db.models import LedgerEntry
from tests.conftest import bearer

pytestmark = pytest.mark.release_seed(11)


def rows(n: int = 2_000, d: int = 6, seed: int = 4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    data = rng.normal(size=(n, d))
    return data / np.linalg.norm(data, axis=1, keepdims=True)


@pytest.fixture
def granted(client, keys, upload_dataset):
    dataset = upload_dataset(
        client, keys.owner, rows(), accounting="hybrid", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1.0,
    )  # fmt: skip
    made = client.post(
        f"/v1/datasets/{dataset['id']}/grants",
        headers=bearer(keys.owner),
        json={"epsilon": "0.8", "delta": "1e-7"},  # C's share: 1e-9, a tenth of the dataset's
    )
    assert made.status_code == 201, made.text
    return dataset["id"]


def post(client, keys, dataset_id, body, dry_run=False):
    query = "?dry_run=true" if dry_run else ""
    return client.post(
        f"/v1/datasets/{dataset_id}/releases{query}", headers=bearer(keys.analyst), json=body
    )


@pytest.mark.parametrize("currency", [{"mu": "0.05"}, {"rho": "0.001"}])
def test_a_release_in_mu_or_rho_under_a_grant_keeps_the_grants_filter_c_open(
    client, keys, granted, session_factory, currency
):
    body = {"mechanism": "analyze_gauss", "k": 2, **currency}
    dry = post(client, keys, granted, body, dry_run=True)
    assert dry.status_code == 200, dry.text
    shown = dry.json()
    assert shown["budget"] == "grant"
    # a tenth of the grant's C share (1e-7 x 1%), not of the dataset's (1e-5 x 1%)
    assert Decimal(shown["delta"]) == Decimal("1e-10")
    assert "basic" in shown["admitted_by"], shown
    made = post(client, keys, granted, body)
    assert made.status_code == 202, made.text
    with session_factory() as session:
        entry = session.execute(select(LedgerEntry)).scalar_one()
    # The ledger charged exactly what the dry run declared, within what was asked.
    assert entry.epsilon == Decimal(shown["epsilon"]) and entry.delta == Decimal(shown["delta"])
    assert entry.rho == Decimal(shown["rho"])
    assert entry.gdp is not None
    if "mu" in currency:
        assert entry.gdp <= Decimal(currency["mu"]) ** 2
    else:
        assert entry.rho <= Decimal(currency["rho"])
    # The grant's filter C still admits the same release again.
    again = post(client, keys, granted, body, dry_run=True).json()
    assert "basic" in again["admitted_by"], again
