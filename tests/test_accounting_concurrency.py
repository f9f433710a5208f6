"""Concurrency under gaussian and zcdp accounting: 30 simultaneous requests against a budget for
exactly m releases; exactly m are accepted and the ledger holds exactly m charges (both
databases: ``committed_db`` runs on SQLite and PostgreSQL)."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service import accounting, auth
from service.app import create_app
from service.db.models import LedgerEntry
from tests.conftest import bearer, npy_bytes
from tests.test_concurrency import simultaneously

M = 6


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
def test_thirty_simultaneous_requests_against_a_budget_for_m(committed_db, settings, kind):
    _, factory = committed_db
    app = create_app(settings, session_factory=factory)
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
        _, analyst = auth.create_key(session, "analyst", "a", None)
    # A budget stated directly, for exactly M releases of the cost below.
    stated = {"gaussian": {"mu_budget": "0.6"}, "zcdp": {"rho_budget": "0.06"}}[kind]
    with TestClient(app) as client:
        dataset = client.post(
            "/v1/datasets",
            headers=bearer(owner),
            files={"file": ("x.npy", npy_bytes(np.eye(4)), "application/octet-stream")},
            data={
                "name": "d",
                "epsilon_budget": "8",
                "delta_budget": "1e-5",
                "row_norm_bound": "1",
                "accounting": kind,
                **stated,
            },
        ).json()
    path = f"/v1/datasets/{dataset['id']}/releases"
    # mu = 0.6/sqrt(6) and rho = 0.01 cost just under 1/M of the budget each (the calibrated
    # rho is rounded up from just below the target), so M fit and the (M+1)-th does not.
    cost = (
        {"mu": str(accounting.round_down(Decimal("0.6") / Decimal(M).sqrt()))}
        if kind == "gaussian"
        else {"rho": "0.01"}
    )
    body = {"mechanism": "analyze_gauss", "k": 1, **cost}
    statuses = simultaneously(
        app, 30, lambda client: client.post(path, headers=bearer(analyst), json=body).status_code
    )
    assert Counter(statuses) == {202: M, 409: 30 - M}
    with factory() as session:
        charges = session.scalar(select(func.count()).select_from(LedgerEntry))
        spent = sum(session.scalars(select(LedgerEntry.rho)), Decimal(0))
    assert charges == M
    total = Decimal(dataset["budget"]["rho_total"])
    assert total * (M - 1) / M < spent <= total
