"""A request in epsilon without delta: the service's default delta, recorded and charged."""

from __future__ import annotations

import uuid
from decimal import Decimal

import numpy as np
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
    # The cause and what to do, not only the symptom.
    assert "delta_budget is 0 (pure DP)" in body["detail"], body
    assert "smooth_sensitivity or auto" in body["detail"], body


@pytest.mark.parametrize("accounting", ["basic", "hybrid"])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_default_delta_that_rounds_to_zero_is_named_as_the_cause(
    client, keys, upload_dataset, rng, accounting, dry_run
):
    # An audit: at delta_budget 1e-30 the default (a hundredth: 1e-32) is below the ledger's 30
    # places and stored as 0, and the 422 read "analyze_gauss needs delta > 0 (only
    # smooth_sensitivity has a pure variant)", as if the analyst had asked for 0.
    data, _ = near_subspace(rng, 300, 6, 2)
    dataset = upload_dataset(
        client,
        keys.owner,
        data,
        row_norm_bound=1.0,
        delta_budget="1e-30",
        accounting=accounting,
    )
    response = ask(client, keys.analyst, dataset["id"], dry_run=dry_run)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("delta: analyze_gauss needs delta > 0 and the request gives none")
    assert "a hundredth of this dataset's delta_budget (0.000000000000000000000000000001)" in detail
    assert "rounds to 0" in detail, detail
    explicit = ask(client, keys.analyst, dataset["id"], dry_run=True, delta="1e-30")
    if accounting == "basic":  # basic charges the delta as given: 1e-30 fits
        assert "give delta yourself (at most 0.000000000000000000000000000001)" in detail
        assert explicit.status_code == 200 and explicit.json()["affordable"], explicit.text
    else:  # hybrid's shares of 1e-30 all round to 0: the advice must not send the analyst there
        assert "give delta yourself" not in detail and "no delta > 0 can be spent" in detail
        assert explicit.status_code != 200 or not explicit.json()["affordable"], explicit.text
    # A pure request still runs there without delta.
    pure = ask(client, keys.analyst, dataset["id"], dry_run=True, mechanism="smooth_sensitivity")
    assert pure.status_code == 200, pure.text


def test_a_grant_whose_default_delta_rounds_to_zero_is_named(client, keys, upload_dataset, rng):
    data, _ = near_subspace(rng, 300, 6, 2)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0, delta_budget="1e-5")
    grant(client, keys.owner, dataset["id"], epsilon="1", delta="1e-29")
    response = ask(client, keys.analyst, dataset["id"], dry_run=True)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert (
        "a hundredth of the delta of the grant it is charged to (0.00000000000000000000000000001)"
        in detail
    ), detail


def test_an_explicit_null_delta_is_refused_not_defaulted(client, keys, upload_dataset, rng):
    data, _ = near_subspace(rng, 300, 6, 2)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0, delta_budget="1e-5")
    response = ask(client, keys.analyst, dataset["id"], delta=None)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("delta: must be a number"), response.text


# --------------------------------------------------------------------------------------------
# Under a grant: the default fits the budget the release is charged to, the grant's.


def grant(client, key, dataset_id, **body):
    response = client.post(f"/v1/datasets/{dataset_id}/grants", headers=bearer(key), json=body)
    assert response.status_code == 201, response.text
    return response.json()


def charged_entry(session_factory, release_id):
    with session_factory() as session:
        return session.execute(
            select(LedgerEntry.delta, LedgerEntry.grant_id).where(
                LedgerEntry.release_id == uuid.UUID(release_id)
            )
        ).one()


def test_a_grant_with_a_small_delta_gets_a_default_within_it(
    client, keys, upload_dataset, rng, session_factory
):
    # basic: the grant's delta 1e-9 is charged per release; the dataset's default (1e-7) could
    # never fit it, its hundredth does.
    data, _ = near_subspace(rng, 300, 6, 2)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0, delta_budget="1e-5")
    given = grant(client, keys.owner, dataset["id"], epsilon="2", delta="1e-9")
    preview = ask(client, keys.analyst, dataset["id"], dry_run=True)
    assert preview.status_code == 200, preview.text
    shown = preview.json()
    assert Decimal(shown["delta"]) == Decimal("1e-11")
    assert shown["affordable"] is True and shown["budget"] == "grant"
    response = ask(client, keys.analyst, dataset["id"])
    assert response.status_code == 202, response.text
    release = response.json()
    assert Decimal(release["delta"]) == Decimal("1e-11")
    delta, grant_id = charged_entry(session_factory, release["id"])
    assert delta == Decimal("1e-11") and str(grant_id) == given["id"]


def test_a_grant_on_a_hybrid_dataset_admits_approximate_steps_with_no_delta_given(
    client, keys, upload_dataset, session_factory
):
    # hybrid: purely Gaussian releases went through filter A' at any default; a release with
    # approximate steps (friendly_aggregate's PTR tests) is charged to B or C, whose shares of
    # a 1e-9 grant (2% and 1%) the dataset's default of 1e-7 overran (409).
    data = np.random.default_rng(3).normal(size=(4_000, 4)) @ np.diag([1, 1, 0, 0])
    data /= np.maximum(1.0, np.linalg.norm(data, axis=1, keepdims=True))
    dataset = upload_dataset(
        client, keys.owner, data, accounting="hybrid", row_norm_bound=1.0, delta_budget="1e-5"
    )
    grant(client, keys.owner, dataset["id"], epsilon="2", delta="1e-9")
    body = {"mechanism": "friendly_aggregate", "k": 2, "epsilon": "1"}
    preview = ask(client, keys.analyst, dataset["id"], dry_run=True, **body)
    assert preview.status_code == 200, preview.text
    shown = preview.json()
    assert Decimal(shown["delta"]) == Decimal("1e-11")
    assert shown["affordable"] is True and shown["budget"] == "grant", shown
    assert shown["admitted_by"] and "gdp" not in shown["admitted_by"], shown
    response = ask(client, keys.analyst, dataset["id"], **body)
    assert response.status_code == 202, response.text
    release = response.json()
    assert Decimal(release["delta"]) == Decimal("1e-11")
    delta, grant_id = charged_entry(session_factory, release["id"])
    assert delta == Decimal("1e-11") and grant_id is not None


def test_a_grant_without_delta_gives_zero_and_the_gaussian_message(
    client, keys, upload_dataset, rng
):
    data, _ = near_subspace(rng, 300, 6, 2)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0, delta_budget="1e-5")
    grant(client, keys.owner, dataset["id"], epsilon="2", delta="0")
    for dry_run in (True, False):
        response = ask(client, keys.analyst, dataset["id"], dry_run=dry_run)
        assert response.status_code == 422, response.text
        assert "needs delta > 0" in response.json()["detail"], response.text


def test_a_revoked_grant_is_still_refused_as_revoked(client, keys, upload_dataset, rng):
    # The default is not taken from a revoked grant: the refusal stays the 403 that says so.
    data, _ = near_subspace(rng, 300, 6, 2)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0, delta_budget="1e-5")
    given = grant(client, keys.owner, dataset["id"], epsilon="2", delta="0")
    revoked = client.delete(
        f"/v1/datasets/{dataset['id']}/grants/{given['id']}", headers=bearer(keys.owner)
    )
    assert revoked.status_code == 200, revoked.text
    response = ask(client, keys.analyst, dataset["id"])
    assert response.status_code == 403, response.text
    assert response.json()["error"] == "grant_revoked", response.text


def test_a_zcdp_grant_without_a_delta_for_approximate_steps_keeps_the_datasets_default(
    client, keys, upload_dataset, rng
):
    # zcdp charges a purely Gaussian release rho only: a grant of rho alone (no delta for
    # approximate steps) still runs it at the dataset's default, not at 0.
    data, _ = near_subspace(rng, 300, 6, 2)
    dataset = upload_dataset(
        client, keys.owner, data, accounting="zcdp", row_norm_bound=1.0, delta_budget="1e-5"
    )
    grant(client, keys.owner, dataset["id"], rho="0.5")
    response = ask(client, keys.analyst, dataset["id"], dry_run=True)
    assert response.status_code == 200, response.text
    assert Decimal(response.json()["delta"]) == Decimal("1e-7")
