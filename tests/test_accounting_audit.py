"""Empirical privacy audit of two adaptively chosen releases under each accounting (issue 23).

The analyst's interaction: a ``spectrum`` release (k = 1) with half the dataset's budget, then,
chosen from its output, a second one with the other half (if the first value looks large) or a
quarter. Both are calibrated and costed by the service's own path (``releases._prepare``: the
request in ``mu``/``rho``, the steps the ledger charges), and the two charges fit the filter. A
worst-case pair: ``n`` rows ``e1`` (norm ``C = 1``) against one of them replaced by 0, which moves
the top eigenvalue by ``C^2``. The event ``v1 + v2 > 2n`` is fixed before the runs;
``eps_hat = ln((p_low - delta)/p_high)`` (Clopper-Pearson, tests/mechanisms/privacy_audit.py)
must stay below the dataset's ``epsilon_budget``, and with the noise divided by 10 (the negative
control) it must exceed it, so the audit is shown able to fail.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pytest

from api_schemas.releases import ReleaseRequest
from service import accounting, ledger, releases
from service.db.models import Dataset
from service.mechanisms import spectrum as spectrum_module
from tests.mechanisms.privacy_audit import audit

N, D = 20, 2
EPSILON, DELTA = Decimal(1), Decimal("1e-6")


def dataset(kind: str) -> Dataset:
    row = Dataset(
        name="audit", n_rows=N, n_cols=D, row_norm_bound=1.0, epsilon_total=EPSILON,
        delta_total=DELTA, accounting=kind, n_batches=1,
    )  # fmt: skip
    if kind == "gaussian":
        row.mu_total = accounting.mu_budget(EPSILON, DELTA)
        row.rho_total = accounting.budget_rho_of_mu(row.mu_total)
    else:
        row.delta_conversion = DELTA / 2
        row.rho_total = accounting.rho_budget(EPSILON, row.delta_conversion)
    return row


def share(row: Dataset, fraction: Decimal) -> dict[str, Decimal]:
    """A request for ``fraction`` of the budget in the dataset's currency."""
    assert row.rho_total is not None
    if row.accounting == "gaussian":
        assert row.mu_total is not None
        return {"mu": accounting.round_down(row.mu_total * fraction.sqrt())}
    return {"rho": accounting.round_down(row.rho_total * fraction)}


def interaction(kind: str) -> Any:
    row = dataset(kind)
    first, big, small = (
        releases._prepare(
            ReleaseRequest(mechanism="spectrum", k=1, params={"clip_norm": 1.0}, **share(row, f)),
            row,
        )
        for f in (Decimal("0.5"), Decimal("0.5"), Decimal("0.25"))
    )
    # Every path the analyst may take fits the filter (the ledger's own comparison).
    state = ledger.state_of(row, Decimal(0), Decimal(0), Decimal(0))
    for second in (big, small):
        spent = ledger.BudgetState(
            state.epsilon_total, state.delta_total, Decimal(0), Decimal(0),
            accounting=kind, rho_total=row.rho_total, rho_spent=first.charge.rho,
            delta_limit=state.delta_limit,
        )  # fmt: skip
        assert spent.affords(second.charge)

    def run(data: np.ndarray, rng: np.random.Generator) -> float:
        v1 = first.mechanism.run(data, first.spec, rng).extras["eigenvalues"][0]
        second = big if v1 > N - 0.5 else small  # chosen from the first release's output
        v2 = second.mechanism.run(data, second.spec, rng).extras["eigenvalues"][0]
        return float(v1 + v2)

    return run


def pair() -> tuple[np.ndarray, np.ndarray]:
    data = np.zeros((N, D))
    data[:, 0] = 1.0
    neighbour = data.copy()
    neighbour[0] = 0.0
    return data, neighbour


def run_audit(kind: str, runs: int, monkeypatch: pytest.MonkeyPatch, divide: float) -> float:
    # Calibrated and costed first; only the run's noise is then divided (the negative control
    # must not go through the calibration, which would just pick a smaller epsilon for it).
    mechanism = interaction(kind)
    original = spectrum_module.noise_std
    monkeypatch.setattr(spectrum_module, "noise_std", lambda c, e, d: original(c, e, d) / divide)
    data, neighbour = pair()
    result = audit(mechanism, data, neighbour, lambda total: total > 2 * N, runs, float(DELTA))
    monkeypatch.setattr(spectrum_module, "noise_std", original)
    return result.eps_lower_bound


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
def test_two_adaptive_releases_stay_within_the_budget_and_the_control_fails(kind, monkeypatch):
    assert run_audit(kind, 1500, monkeypatch, 1.0) <= float(EPSILON)
    assert run_audit(kind, 1500, monkeypatch, 10.0) > float(EPSILON)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
def test_two_adaptive_releases_long(kind, monkeypatch):
    assert run_audit(kind, 50_000, monkeypatch, 1.0) <= float(EPSILON)
    assert run_audit(kind, 50_000, monkeypatch, 10.0) > float(EPSILON)
