"""Hybrid (the default accounting) under concurrency, on real commits (``committed_db``: SQLite
and PostgreSQL), a case the earlier concurrency tests (one accounting, one mechanism, one app)
do not name: two apps, each with its own engine and connection pool (two API processes'
worth), race 18 mixed requests (Gaussian, pure at delta 0, approximate) and 6 idempotent
retries of a fourth for the last of one ``(1, 1e-5)`` budget. Replayed in ledger order, every
charge is one that an independent re-implementation of the three filters (exact rationals)
admits after the charges before it; every charge has its own release and every distinct 202
its charge. Passed when written (8-10 charges per run): an audit, not a fix."""

from __future__ import annotations

import threading
import uuid
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service import auth
from service.app import create_app
from service.db.engine import make_engine, make_session_factory
from service.db.models import Dataset, LedgerEntry, Release
from tests.conftest import bearer, npy_bytes

GAUSS = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.2", "delta": "1e-7"}
PURE = {"mechanism": "smooth_sensitivity", "k": 1, "epsilon": "0.08", "delta": "0"}
APPROXIMATE = {"mechanism": "gap_perturbation", "k": 1, "epsilon": "0.1", "delta": "1e-8"}


@pytest.fixture
def settings(settings):
    return settings.model_copy(update={"default_accounting": "hybrid"})


def _admitted(totals: Dataset, before: list[LedgerEntry], entry: LedgerEntry) -> bool:
    """A' (every entry has a GDP figure, sum <= mu_total^2), B (every entry profiled, sum rho
    <= rho_total, sum zcdp_delta <= delta_mechanisms) or C (sum epsilon <= epsilon_total, sum
    delta <= delta_basic) on ``before + [entry]``, in exact rationals."""
    seq = [*before, entry]

    def total(name: str) -> Fraction:
        return sum((Fraction(getattr(e, name)) for e in seq), Fraction(0))

    a = all(e.gdp is not None for e in seq) and total("gdp") <= Fraction(totals.mu_total) ** 2
    b = (
        all(e.zcdp_delta is not None for e in seq)
        and total("rho") <= Fraction(totals.rho_total)
        and total("zcdp_delta") <= Fraction(totals.delta_mechanisms)
    )
    c = total("epsilon") <= Fraction(totals.epsilon_total) and total("delta") <= Fraction(
        totals.delta_basic
    )
    return a or b or c


def _race(apps: list[Any], calls: list[tuple[dict[str, Any], dict[str, str]]], path: str):
    barrier = threading.Barrier(len(calls))
    results: list[tuple[int, int, str]] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        body, headers = calls[index]
        with TestClient(apps[index % len(apps)]) as client:
            barrier.wait()
            response = client.post(path, headers=headers, json=body)
        with lock:
            results.append((index, response.status_code, response.json().get("id", "")))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [(status, release_id) for _, status, release_id in sorted(results)]


def test_two_processes_race_mixed_requests_for_the_last_of_a_hybrid_budget(committed_db, settings):
    url, factory = committed_db
    engines = [make_engine(url) for _ in range(2)]
    try:
        apps = [create_app(settings, session_factory=make_session_factory(e)) for e in engines]
        with factory.begin() as session:
            _, owner = auth.create_key(session, "owner", "o", None)
            _, analyst = auth.create_key(session, "analyst", "a", None)
        with TestClient(apps[0]) as client:
            dataset = client.post(
                "/v1/datasets",
                headers=bearer(owner),
                files={"file": ("x.npy", npy_bytes(np.eye(4)), "application/octet-stream")},
                data={"name": "d", "epsilon_budget": "1", "delta_budget": "1e-5",
                      "row_norm_bound": "1"},
            ).json()  # fmt: skip
        path = f"/v1/datasets/{dataset['id']}/releases"
        plain = bearer(analyst)
        retried = {**plain, "Idempotency-Key": "retried"}
        calls = [(body, plain) for body in (GAUSS, PURE, APPROXIMATE) * 6]
        calls += [({**PURE, "epsilon": "0.05"}, retried)] * 6
        results = _race(apps, calls, path)
        assert {status for status, _ in results} <= {202, 409}
        accepted = {release_id for status, release_id in results if status == 202}
        retry_ids = {release_id for status, release_id in results[-6:] if status == 202}
        with factory() as session:
            totals = session.get(Dataset, uuid.UUID(dataset["id"]))
            assert totals is not None
            entries = list(
                session.scalars(
                    select(LedgerEntry)
                    .where(LedgerEntry.dataset_id == totals.id)
                    .order_by(LedgerEntry.id)
                )
            )
            releases = {str(r) for r in session.scalars(select(Release.id))}
        assert all(entry.kind == "charge" for entry in entries)
        charged = {str(entry.release_id) for entry in entries}
        assert len(charged) == len(entries) and charged == releases == accepted
        assert len(retry_ids) <= 1  # one release for the six retries of one key
        for index, entry in enumerate(entries):
            assert _admitted(totals, entries[:index], entry), index
        # The budget is used up: nothing of the Gaussian kind is still admitted.
        with TestClient(apps[1]) as client:
            assert client.post(path, headers=plain, json=GAUSS).status_code == 409
    finally:
        for engine in engines:
            engine.dispose()
