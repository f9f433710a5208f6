"""A request in epsilon without delta: the service's default delta, recorded and charged."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from sqlalchemy import select

from service.db.models import LedgerEntry
from tests.conftest import bearer
from tests.factories import near_subspace


def ask(client, key, dataset_id, dry_run=False, **body):
    payload = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.5", **body}
    return client.post(
        f"/v1/datasets/{dataset_id}/releases",
        headers=bearer(key),
        params={"dry_run": "true"} if dry_run else None,
        json=payload,
    )


@pytest.mark.parametrize(
    ("delta_budget", "expected"),
    [("1e-5", "1e-7"), ("0.001", "0.000001"), ("3e-3", "0.000001"), ("7e-9", "7e-11")],
)
def test_epsilon_without_delta_runs_at_the_default_and_charges_it(
    client, keys, upload_dataset, rng, session_factory, delta_budget, expected
):
    data, _ = near_subspace(rng, 300, 6, 2)
    dataset = upload_dataset(
        client, keys.owner, data, row_norm_bound=1.0, delta_budget=delta_budget
    )
    preview = ask(client, keys.analyst, dataset["id"], dry_run=True)
    assert preview.status_code == 200, preview.text
    response = ask(client, keys.analyst, dataset["id"])
    assert response.status_code == 202, response.text
    release = response.json()
    assert Decimal(release["delta"]) == Decimal(expected)
    with session_factory() as session:
        charged = session.scalars(
            select(LedgerEntry.delta).where(LedgerEntry.release_id == uuid.UUID(release["id"]))
        ).one()
    # The suite's accounting is basic: the release's delta is what the ledger charges.
    assert charged == Decimal(expected)


def test_a_given_delta_is_kept(client, keys, upload_dataset, rng):
    data, _ = near_subspace(rng, 300, 6, 2)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0, delta_budget="1e-5")
    response = ask(client, keys.analyst, dataset["id"], delta="3e-9")
    assert response.status_code == 202, response.text
    assert Decimal(response.json()["delta"]) == Decimal("3e-9")


def test_no_delta_budget_gives_zero_and_a_gaussian_mechanism_says_it_needs_delta(
    client, keys, upload_dataset, rng
):
    data, _ = near_subspace(rng, 300, 6, 2)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0, delta_budget="0")
    response = ask(client, keys.analyst, dataset["id"])
    assert response.status_code == 422, response.text
    body = response.json()
    assert "delta" in response.text and "needs delta > 0" in response.text, body


def test_an_explicit_null_delta_is_refused_not_defaulted(client, keys, upload_dataset, rng):
    data, _ = near_subspace(rng, 300, 6, 2)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0, delta_budget="1e-5")
    response = ask(client, keys.analyst, dataset["id"], delta=None)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("delta: must be a number"), response.text
