"""Outside audit (issue 34 x grants x continual): a continual release on a person-level
dataset spent through an analyst's grant is charged once, at creation, to the grant and the
dataset in one ledger entry, for exactly what the dry run priced; its epochs add nothing; a
release that ends before reading anything (its unit index lost) is refunded to both, and one
that ends after an epoch is not. GET budget, the grant list and a later dry run agree."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest
from sqlalchemy import select

from service.db.models import LedgerEntry
from tests.api.test_append_rows import append
from tests.api.test_grants import new_key
from tests.api.test_privacy_unit_http import csv_bytes, people, upload
from tests.conftest import bearer, post_release

pytestmark = pytest.mark.release_seed(3405)

REQUEST = {
    "mechanism": "continual_gauss",
    "k": 2,
    "epsilon": "0.5",
    "delta": "1e-8",
    "params": {"horizon": 3},
}


@pytest.fixture(params=["basic", "hybrid"])
def granted(client, keys, session_factory, request):
    ids, rows = people(40, [1, 4, 15], 5, seed=7)
    response = upload(
        client,
        keys.owner,
        "visits.csv",
        csv_bytes(ids, rows, id_at=1),
        privacy_unit_column="patient",
        row_norm_bound="1",
        accounting=request.param,
    )
    assert response.status_code == 201, response.text
    dataset = response.json()
    assert dataset["budget"]["accounting"] == request.param
    analyst_id, analyst = new_key(session_factory, "analyst")
    grants = f"/v1/datasets/{dataset['id']}/grants"
    created = client.post(
        grants,
        headers=bearer(keys.owner),
        json={"analyst_key_id": analyst_id, "epsilon": "2", "delta": "1e-7"},
    )
    assert created.status_code == 201, created.text
    return dataset, analyst, grants, ids


def figures(client, keys, dataset, grants):
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner))
    (grant,) = client.get(grants, headers=bearer(keys.owner)).json()["items"]
    return budget.json(), grant


def same_spend(budget, grant):
    """The dataset and its only grant state one spend: the same epsilon, except that a hybrid
    grant states it at its own delta (1e-7, below the dataset's), so a larger epsilon for the
    same native figures."""
    if budget["accounting"] != "hybrid":
        assert Decimal(budget["epsilon_spent"]) == Decimal(grant["epsilon_spent"]) > 0
        return
    assert Decimal(grant["epsilon_spent"]) > Decimal(budget["epsilon_spent"]) > 0
    for name in ("rho_spent", "mu_spent"):
        assert budget[name] == grant[name], name


def charges(session_factory, kind="charge"):
    with session_factory() as session:
        return session.execute(select(LedgerEntry).where(LedgerEntry.kind == kind)).scalars().all()


def test_charged_once_to_grant_and_dataset_for_what_the_dry_run_priced(
    client, keys, granted, session_factory, run_worker, settings
):
    dataset, analyst, grants, ids = granted
    url = f"/v1/datasets/{dataset['id']}/releases"
    priced = client.post(url + "?dry_run=true", headers=bearer(analyst), json=REQUEST)
    assert priced.status_code == 200, priced.text
    assert figures(client, keys, dataset, grants)[1]["epsilon_spent"] == "0"
    release_id = post_release(client, analyst, dataset["id"], **REQUEST)
    (entry,) = charges(session_factory)
    assert str(entry.release_id) == release_id and entry.grant_id is not None
    budget, grant = figures(client, keys, dataset, grants)
    assert Decimal(priced.json()["epsilon"]) == entry.epsilon
    same_spend(budget, grant)
    if budget["accounting"] == "basic":
        assert Decimal(budget["epsilon_spent"]) == entry.epsilon
        assert Decimal(budget["delta_spent"]) == Decimal(grant["delta_spent"]) == entry.delta
    else:
        # hybrid: the native figures are the charge's; epsilon is the filters' statement
        # (spend.py), and delta_spent each budget's own shares (so the two differ by design).
        assert Decimal(priced.json()["rho"]) == entry.rho
        for name in ("rho_spent", "mu_spent"):
            assert Decimal(budget[name]) == Decimal(grant[name]) > 0, name
        assert Decimal(budget["rho_spent"]) == entry.rho
    before = (budget, grant)
    # Two epochs, a returning person in the second batch: nothing more is charged.
    assert run_worker() == 1
    response = append(
        client,
        keys.owner,
        dataset["id"],
        csv_bytes([ids[0]] * 3 + ["someone-new"] * 2, np.full((5, 5), 0.1), id_at=0),
        filename="more.csv",
        privacy_unit_column="patient",
    )
    assert response.status_code == 201, response.text
    assert run_worker() == 1
    shown = client.get(f"/v1/releases/{release_id}", headers=bearer(analyst)).json()
    assert shown["epochs_done"] == 2, shown
    assert len(charges(session_factory)) == 1 and charges(session_factory, "refund") == []
    assert figures(client, keys, dataset, grants) == before
    again = client.post(url + "?dry_run=true", headers=bearer(analyst), json=REQUEST).json()
    assert Decimal(again["epsilon"]) == entry.epsilon


@pytest.mark.parametrize("epochs_before", [0, 1])
def test_a_lost_unit_index_refunds_grant_and_dataset_only_before_any_epoch(
    client, keys, granted, session_factory, run_worker, store, settings, epochs_before
):
    dataset, analyst, grants, ids = granted
    release_id = post_release(client, analyst, dataset["id"], **REQUEST)
    if epochs_before:
        assert run_worker() == 1
        response = append(
            client,
            keys.owner,
            dataset["id"],
            csv_bytes([ids[0]] * 2, np.full((2, 5), 0.1), id_at=0),
            filename="more.csv",
            privacy_unit_column="patient",
        )
        assert response.status_code == 201, response.text
    matrix = next(p for p in settings.datasets_dir.iterdir() if p.suffix == ".npy")
    store.units_path(matrix.name).unlink()
    run_worker()
    shown = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.owner)).json()
    assert shown["status"] == "failed", shown
    refunds = charges(session_factory, "refund")
    assert len(refunds) == (0 if epochs_before else 1)
    assert len(charges(session_factory)) == 1
    budget, grant = figures(client, keys, dataset, grants)
    if not epochs_before:
        assert refunds[0].grant_id == charges(session_factory)[0].grant_id
        assert Decimal(budget["epsilon_spent"]) == Decimal(grant["epsilon_spent"]) == 0
        for name in ("rho_spent", "mu_spent"):
            if budget.get(name) is not None:
                assert Decimal(budget[name]) == Decimal(grant[name]) == 0, name
    else:
        same_spend(budget, grant)
