"""On the default accounting (``hybrid``, a service with no settings), what a budget says remains
is what a Gaussian release at its delta is admitted at, not what every kind of release may ask
for: after two Gaussian releases of epsilon 0.3 (at the default delta 1e-7, all of filter C's 1%
share) on a ``(1, 1e-5)`` dataset, ``epsilon_remaining`` is 0.92 (the Gaussian-DP filter adds up
``mu^2``; 0.67 as ``total - spent``), yet a pure release (smooth_sensitivity) of 0.3 is refused:
C is closed by the two deltas, A' charges it ``pure_mu(0.3)^2 = 0.141`` against 0.062 left and B
``0.045`` against 0.0155. The 409 and the dry run named no figure the request could have; they
now give ``epsilon_admissible``, the largest epsilon the same request is admitted at, and that
figure is itself admitted (a request 1% above it is refused)."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from tests.conftest import bearer

pytestmark = pytest.mark.release_seed(3)

GAUSS = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.3"}
PURE = {"mechanism": "smooth_sensitivity", "k": 2, "epsilon": "0.3"}
APPROXIMATE = {"mechanism": "friendly_aggregate", "k": 2}


@pytest.fixture
def settings(settings):
    # The product's default accounting (the suite's fixture keeps basic for older figures).
    return settings.model_copy(update={"default_accounting": "hybrid"})


def rows() -> np.ndarray:
    rng = np.random.default_rng(9)
    data = rng.normal(size=(40_000, 6)) * np.array([3, 2, 0.3, 0.2, 0.1, 0.1])
    return data / np.maximum(1.0, np.linalg.norm(data, axis=1, keepdims=True))


def post(client, keys, dataset_id, body, dry_run=False):
    query = "?dry_run=true" if dry_run else ""
    return client.post(
        f"/v1/datasets/{dataset_id}/releases{query}", headers=bearer(keys.analyst), json=body
    )


def above(figure: str) -> str:
    return str(Decimal(figure) * Decimal("1.01"))


def budget_to_spend(client, keys, upload_dataset, granted: bool) -> str:
    """A hybrid (1, 1e-5) dataset's id; with ``granted``, a (0.9, 9e-6) grant on it to the
    analyst, which the requests are then charged to."""
    made = upload_dataset(
        client, keys.owner, rows(), epsilon_budget="1", delta_budget="1e-5", row_norm_bound=1.0
    )
    dataset_id = made["id"]
    if granted:
        grant = client.post(
            f"/v1/datasets/{dataset_id}/grants",
            headers=bearer(keys.owner),
            json={"epsilon": "0.9", "delta": "9e-6"},
        )
        assert grant.status_code == 201, grant.text
    return str(dataset_id)


@pytest.mark.parametrize("granted", [False, True], ids=["dataset", "grant"])
def test_a_refusal_gives_the_epsilon_the_same_request_is_admitted_at(
    client, keys, upload_dataset, granted
):
    dataset_id = budget_to_spend(client, keys, upload_dataset, granted)
    for _ in range(2):
        assert post(client, keys, dataset_id, GAUSS).status_code == 202
    budget = client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(keys.owner)).json()
    assert budget["accounting"] == "hybrid"
    # what a Gaussian release at 1e-5 is admitted at (0.67 as total - spent)
    assert Decimal("0.92") < Decimal(budget["epsilon_remaining"]) < Decimal("0.93")

    refused = post(client, keys, dataset_id, PURE)
    assert refused.status_code == 409, refused.text
    figure = refused.json()["epsilon_admissible"]
    assert figure is not None and Decimal(0) < Decimal(figure) < Decimal("0.3")
    assert f"admitted now at epsilon {figure}" in refused.json()["detail"]
    dry = post(client, keys, dataset_id, PURE, dry_run=True).json()
    assert dry["affordable"] is False and dry["epsilon_admissible"] == figure
    assert post(client, keys, dataset_id, {**PURE, "epsilon": above(figure)}).status_code == 409
    at = post(client, keys, dataset_id, {**PURE, "epsilon": figure}, dry_run=True).json()
    assert at["affordable"] is True and at["epsilon_admissible"] is None
    assert post(client, keys, dataset_id, {**PURE, "epsilon": figure}).status_code == 202


def test_an_approximate_request_above_the_stated_remaining_is_re_priced(
    client, keys, upload_dataset
):
    dataset_id = upload_dataset(
        client, keys.owner, rows(), epsilon_budget="1", delta_budget="1e-5", row_norm_bound=1.0
    )["id"]
    assert post(client, keys, dataset_id, {**GAUSS, "epsilon": "0.5"}).status_code == 202
    budget = client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(keys.owner)).json()
    remaining = budget["epsilon_remaining"]
    body = {**APPROXIMATE, "epsilon": remaining}
    refused = post(client, keys, dataset_id, body)
    assert refused.status_code == 409, refused.text
    figure = refused.json()["epsilon_admissible"]
    assert figure is not None and Decimal(figure) < Decimal(remaining)
    assert post(client, keys, dataset_id, {**body, "epsilon": above(figure)}).status_code == 409
    assert post(client, keys, dataset_id, {**body, "epsilon": figure}).status_code == 202


def test_a_request_in_mu_gets_no_epsilon_figure(client, keys, upload_dataset):
    dataset_id = upload_dataset(
        client, keys.owner, rows(), epsilon_budget="1", delta_budget="1e-5", row_norm_bound=1.0
    )["id"]
    refused = post(client, keys, dataset_id, {"mechanism": "analyze_gauss", "k": 2, "mu": "0.3"})
    assert refused.status_code == 409, refused.text
    assert refused.json()["epsilon_admissible"] is None


def test_the_search_runs_after_the_refusing_transaction_not_under_its_lock(
    client, keys, upload_dataset, monkeypatch
):
    """The search prepares the request a dozen times (about 1.5 s for ``auto`` on a loaded
    machine): inside the request's transaction it held the dataset's lock (on SQLite the
    database's write lock) all that time. It now runs on what a second unit of work read,
    after the refusal or the dry run has ended, inside no transaction."""
    from sqlalchemy.orm.session import _sessions

    from service import preview, releases, repricing

    def _all_sessions():
        return list(_sessions.values())

    inside: list[str] = []
    searched_inside: list[str] = []
    search = repricing.admissible_epsilon

    def watched(name, function):
        def run(*args, **kwargs):
            inside.append(name)
            try:
                return function(*args, **kwargs)
            finally:
                inside.pop()

        monkeypatch.setattr(releases if name == "request" else preview, function.__name__, run)

    watched("request", releases.request_release)
    watched("preview", preview.preview_release)

    def recorded(*args, **kwargs):
        searched_inside.extend(inside or ["outside"])
        # No session is open: on SQLite every transaction holds the write lock.
        assert not any(session.in_transaction() for session in _all_sessions())
        return search(*args, **kwargs)

    monkeypatch.setattr(repricing, "admissible_epsilon", recorded)
    dataset_id = upload_dataset(
        client, keys.owner, rows(), epsilon_budget="1", delta_budget="1e-5", row_norm_bound=1.0
    )["id"]
    for _ in range(2):
        assert post(client, keys, dataset_id, GAUSS).status_code == 202
    refused = post(client, keys, dataset_id, PURE)
    assert refused.status_code == 409 and refused.json()["epsilon_admissible"] is not None
    dry = post(client, keys, dataset_id, PURE, dry_run=True).json()
    assert dry["epsilon_admissible"] == refused.json()["epsilon_admissible"]
    assert searched_inside == ["outside", "outside"]


@pytest.mark.parametrize("granted", [False, True], ids=["dataset", "grant"])
def test_a_request_whose_delta_no_filter_takes_gets_another_delta(
    client, keys, upload_dataset, granted
):
    """Three approximate releases at the default delta (1e-7) spend filter C's delta share
    (1e-7) and most of B's: the same approximate request at the default delta then has no
    admitted epsilon (``epsilon_admissible`` null, and the 409 named no way out), but at delta
    1e-8 it is admitted. The refusal and the dry run now offer that delta and its epsilon,
    checked: the offer is accepted and 1% above its epsilon is refused."""
    dataset_id = budget_to_spend(client, keys, upload_dataset, granted)
    for _ in range(3):
        spent = post(client, keys, dataset_id, {**APPROXIMATE, "epsilon": "0.1", "delta": "1e-7"})
        assert spent.status_code == 202, spent.text
    body = {**APPROXIMATE, "epsilon": "1", "delta": "1e-7"}
    refused = post(client, keys, dataset_id, body)
    assert refused.status_code == 409, refused.text
    answer = refused.json()
    assert answer["epsilon_admissible"] is None
    delta, figure = answer["delta_admissible"], answer["delta_admissible_epsilon"]
    assert Decimal(delta) == Decimal("1e-8")
    assert figure is not None and Decimal(0) < Decimal(figure) < Decimal(1)
    assert f"admitted now at delta 0.00000001 with epsilon {figure}" in answer["detail"]
    dry = post(client, keys, dataset_id, body, dry_run=True).json()
    assert dry["affordable"] is False and dry["epsilon_admissible"] is None
    assert (dry["delta_admissible"], dry["delta_admissible_epsilon"]) == (delta, figure)
    offered = {**body, "delta": delta, "epsilon": figure}
    assert post(client, keys, dataset_id, {**offered, "epsilon": above(figure)}).status_code == 409
    assert post(client, keys, dataset_id, offered).status_code == 202


def test_a_request_in_mu_gets_no_delta_either(client, keys, upload_dataset):
    dataset_id = upload_dataset(
        client, keys.owner, rows(), epsilon_budget="1", delta_budget="1e-5", row_norm_bound=1.0
    )["id"]
    for _ in range(3):
        spent = post(client, keys, dataset_id, {**APPROXIMATE, "epsilon": "0.1", "delta": "1e-7"})
        assert spent.status_code == 202, spent.text
    refused = post(client, keys, dataset_id, {**APPROXIMATE, "rho": "0.5", "delta": "1e-7"})
    assert refused.status_code == 409, refused.text
    assert refused.json()["delta_admissible"] is None
    assert refused.json()["delta_admissible_epsilon"] is None
