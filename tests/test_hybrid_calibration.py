"""Issue 31, item 5, done-when: on a dataset uploaded with the default accounting (``hybrid``),
the noise of a Gaussian release, through the service's own calibration path
(``releases._prepare``, shared by requests, dry runs and the worker), is within 1% of
``basic``'s at N = 1 and within 5% of the PLD accountant's (dp-accounting) at N = 10 and 100,
and the N releases are all admitted by the ledger's rule."""

from __future__ import annotations

import math
import uuid
from decimal import Decimal

import pytest

from api_schemas.datasets import DatasetCreate
from api_schemas.releases import ReleaseRequest
from service import accounting, datasets, ledger, releases
from service.config import Settings
from service.db.models import Dataset
from tests.test_accounting_hybrid import _pld_sigma

BUDGETS = [
    (Decimal(1), Decimal("1e-6")),
    (Decimal("0.1"), Decimal("1e-3")),  # the worst case of the measured grid
    (Decimal(8), Decimal("1e-8")),
]


def _dataset(epsilon: Decimal, delta: Decimal, kind: str | None = None) -> Dataset:
    """A dataset row as an upload with the product's defaults registers it (not stored)."""
    form = DatasetCreate(name="x", epsilon_budget=epsilon, delta_budget=delta, accounting=kind)
    product_default = Settings.model_fields["default_accounting"].default
    terms = datasets.check_budgets(form, product_default)
    return Dataset(
        id=uuid.uuid4(), name="x", n_rows=10_000, n_cols=20, row_norm_bound=1.0,
        epsilon_total=epsilon, delta_total=delta, n_batches=1, accounting=terms.accounting,
        rho_total=terms.rho_total, mu_total=terms.mu_total,
        delta_conversion=terms.delta_conversion, delta_gaussian=terms.delta_gaussian,
        delta_mechanisms=terms.delta_mechanisms, delta_basic=terms.delta_basic,
    )  # fmt: skip


def _sigma(prepared: releases.Prepared) -> float:
    return float(prepared.mechanism.preview(prepared.context, prepared.spec).scales["sigma"])


def _release(row: Dataset, **cost: Decimal) -> releases.Prepared:
    body = ReleaseRequest(mechanism="analyze_gauss", k=3, params={"clip_norm": 1.0}, **cost)
    return releases._prepare(body, row)


@pytest.mark.parametrize(("epsilon", "delta"), BUDGETS)
def test_default_dataset_gaussian_noise_against_basic_and_pld(epsilon, delta):
    row = _dataset(epsilon, delta)
    assert row.accounting == "hybrid"
    assert row.mu_total is not None
    basic = _release(_dataset(epsilon, delta, "basic"), epsilon=epsilon, delta=delta)
    for n in (1, 10, 100):
        mu = accounting.round_down(row.mu_total / Decimal(n).sqrt())
        prepared = _release(row, mu=mu)
        # every one of the n releases is admitted, and none more at this size
        state = ledger.state_of(row, *(Decimal(0),) * 3)
        for _ in range(n):
            assert state.affords(prepared.charge)
            add = ledger.BUDGET_CONTEXT.add
            charge = prepared.charge
            sums = [
                add(state.epsilon_spent, charge.epsilon),
                add(state.delta_spent, charge.delta),
                add(state.rho_spent, charge.rho),
                add(state.gdp_spent, charge.gdp or 0),
                add(state.zcdp_delta_spent, charge.zcdp_delta or 0),
            ]
            state = ledger.state_of(row, *sums)
        assert prepared.costs.gdp is not None
        # the release's noise per unit sensitivity: 1/mu of its Gaussian steps together
        unit = 1 / math.sqrt(float(prepared.costs.gdp))
        if n == 1:
            assert _sigma(prepared) <= 1.01 * _sigma(basic)
            assert basic.costs.gdp is not None
            assert unit <= 1.01 / math.sqrt(float(basic.costs.gdp))
        else:
            assert unit <= 1.05 * _pld_sigma(n, float(epsilon), float(delta))
