"""Every budget states what its ledger admits next, on every accounting, for a dataset and for a
grant: a request for exactly the stated remainder (in the currency the accounting admits in)
is admitted, the same request 0.1% above is refused with a 409 that names the budget, the dry
run states the same figures, and once the remainder is spent the budget states nothing left
(and refuses a further request); for a one-shot release and a continual one.

What failed before (each a budget stated at another figure than it admits):

* ``hybrid`` (the default), a ``(1, 1e-6)`` dataset or grant: it stated 1 remaining at
  ``1e-6``, but its Gaussian-DP filter holds 96% of the delta, so a Gaussian release asked at
  ``(1, 1e-6)`` was refused (admitted at most 0.9979), and once that filter was spent 0.0021
  stayed "remaining" that nothing could spend. The budget now states the admitted 0.9979.
* ``gaussian`` and ``zcdp`` grants of ``(1, 1e-6)`` on a ``(3, 1e-5)`` dataset: their total was
  stated at the asked ``1e-6`` but their spend at the dataset's ``1e-5`` (the asked delta was
  not kept), so a grant whose ``mu`` (``rho``) was all spent said 0.14 (0.17) remaining. The
  grant now keeps the asked delta (``grants.stated_delta``, migration 0024) and states all
  three figures at it.
* ``zcdp``, a ``(1, 1e-6)`` dataset: ``epsilon_remaining`` was ``total - spent`` (CKS
  conversions of ``rho``), 1 unspent while a Gaussian release at ``(1, 1e-6)`` was refused
  (0.897 admitted), 0.442 after a third of its ``rho`` while 0.722 was admitted. It now states
  what a Gaussian release at the budget's delta is admitted at, as ``gaussian`` and ``hybrid``
  do; ``rho_remaining`` was and is admitted exactly (both checked after one and two releases).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.api.test_hybrid_admissible_epsilon import rows
from tests.conftest import bearer

pytestmark = pytest.mark.release_seed(5)

DELTA = "0.000001"
ABOVE = Decimal("1.001")
ACCOUNTINGS = ("basic", "gaussian", "zcdp", "hybrid")
#: A one-shot release and a continual one (charged its whole tree at once): the default
#: path's Gaussian mechanisms.
MECHANISMS = (
    {"mechanism": "analyze_gauss", "k": 2},
    {"mechanism": "continual_gauss", "k": 2, "params": {"clip_norm": 1.0, "horizon": 8}},
)
#: What a release calibrated in doubles may leave unspent of what it asked, relatively.
SLACK = Decimal("1e-8")


def setup_budget(client: Any, keys: Any, upload_dataset: Any, kind: str, granted: bool) -> str:
    """A ``(1, 1e-6)`` budget to spend: a dataset of that budget, or a ``(1, 1e-6)`` grant to
    every analyst on a ``(3, 1e-5)`` dataset; the dataset's id."""
    budget = ("3", "1e-5") if granted else ("1", DELTA)
    dataset_id = str(
        upload_dataset(
            client, keys.owner, rows(), accounting=kind, epsilon_budget=budget[0],
            delta_budget=budget[1], row_norm_bound=1,
        )["id"]
    )  # fmt: skip
    if granted:
        made = client.post(
            f"/v1/datasets/{dataset_id}/grants",
            headers=bearer(keys.owner),
            json={"epsilon": "1", "delta": DELTA},
        )
        assert made.status_code == 201, made.text
    return dataset_id


def stated(client: Any, keys: Any, dataset_id: str, granted: bool) -> dict[str, Any]:
    """The budget as the API states it: the grant's row in the owner's list, or the dataset's
    budget."""
    if granted:
        listed = client.get(f"/v1/datasets/{dataset_id}/grants", headers=bearer(keys.owner))
        return dict(listed.json()["items"][0])
    return dict(client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(keys.owner)).json())


def exactly_the_remainder(
    kind: str,
    budget: dict[str, Any],
    mechanism: dict[str, Any],
    scale: Decimal = Decimal(1),
    currency: str = "epsilon",
) -> dict[str, Any]:
    """The request for exactly (``scale`` times) the stated remainder, in the currency the
    accounting admits in: ``basic`` ``(epsilon, delta)``; ``gaussian``, ``zcdp`` and
    ``hybrid`` a Gaussian release at ``epsilon_remaining`` and the delta the figures are stated
    at (the budget's ``1e-6``); with ``currency="rho"``, ``zcdp``'s ``rho_remaining``."""
    body: dict[str, Any] = dict(mechanism)
    if currency == "rho":
        return {**body, "rho": str(Decimal(budget["rho_remaining"]) * scale)}
    epsilon = str(Decimal(budget["epsilon_remaining"]) * scale)
    delta = budget["delta_remaining"] if kind == "basic" else DELTA
    return {**body, "epsilon": epsilon, "delta": delta}


def post(client: Any, keys: Any, dataset_id: str, body: dict, dry_run: bool = False) -> Any:
    query = "?dry_run=true" if dry_run else ""
    return client.post(
        f"/v1/datasets/{dataset_id}/releases{query}", headers=bearer(keys.analyst), json=body
    )


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=["release", "continual"])
@pytest.mark.parametrize("granted", [False, True], ids=["dataset", "grant"])
@pytest.mark.parametrize("kind", ACCOUNTINGS)
def test_the_stated_remainder_is_what_is_admitted(
    client, keys, upload_dataset, kind, granted, mechanism
):
    dataset_id = setup_budget(client, keys, upload_dataset, kind, granted)
    whose = "grant" if granted else "dataset"
    before = stated(client, keys, dataset_id, granted)
    assert before["accounting"] == kind
    if kind == "zcdp":
        # Its epsilon_total is the owner's (a spent rho_total converts to it by CKS at half the
        # delta); a Gaussian release at the whole delta is admitted at less.
        assert 0 < Decimal(before["epsilon_remaining"]) < Decimal(before["epsilon_total"])
    else:
        assert Decimal(before["epsilon_remaining"]) == Decimal(before["epsilon_total"]) > 0

    above = post(client, keys, dataset_id, exactly_the_remainder(kind, before, mechanism, ABOVE))
    assert above.status_code == 409, above.text
    assert above.json()["budget"] == whose
    assert above.json()["epsilon_remaining"] == before["epsilon_remaining"]

    exact = exactly_the_remainder(kind, before, mechanism)
    dry = post(client, keys, dataset_id, exact, dry_run=True)
    assert dry.status_code == 200, dry.text
    assert dry.json()["affordable"] is True, dry.json()
    assert dry.json()["epsilon_remaining"] == before["epsilon_remaining"]
    assert dry.json()["budget"] == whose
    made = post(client, keys, dataset_id, exact)
    assert made.status_code == 202, made.text

    # All of it spent: nothing is stated as left (but what the release's calibration in
    # doubles left unspent, below 1e-8 of it), and a further request is refused.
    after = stated(client, keys, dataset_id, granted)
    total = Decimal(after["epsilon_total"])
    # hybrid and gaussian state what the next Gaussian release is admitted at: a leftover of
    # mu^2 (the filter's currency) is worth its square root in epsilon (1.3e-6 of the total
    # was seen, and a release of it is admitted), so its bound is the square root of the slack.
    left_slack = SLACK.sqrt() if kind != "basic" else SLACK
    assert Decimal(after["epsilon_remaining"]) <= total * left_slack, after
    # zcdp: the Gaussian release at epsilon_remaining spent rho_total, whose conversion is the
    # total (within what the calibration in doubles left of it).
    assert Decimal(after["epsilon_spent"]) >= total * (1 - left_slack), after
    assert Decimal(after["epsilon_total"]) == Decimal(before["epsilon_total"])
    small = dict(mechanism)
    small.update({"rho": "0.0001"} if kind == "zcdp" else {"epsilon": "0.05", "delta": "1e-9"})
    refused = post(client, keys, dataset_id, small)
    assert refused.status_code == 409, refused.text
    assert refused.json()["budget"] == whose


@pytest.mark.parametrize("granted", [False, True], ids=["dataset", "grant"])
@pytest.mark.parametrize("currency", ["epsilon", "rho"])
def test_a_zcdp_budget_states_what_it_admits_after_one_and_two_releases(
    client, keys, upload_dataset, granted, currency
):
    """After each of two releases (a third of its rho each), a ``zcdp`` budget's
    ``epsilon_remaining`` (a Gaussian release at the budget's delta) and ``rho_remaining`` are
    what it admits: exactly the figure is, 0.1% above is refused (409 naming the budget, with
    the same figure)."""
    dataset_id = setup_budget(client, keys, upload_dataset, "zcdp", granted)
    whose = "grant" if granted else "dataset"
    mechanism = MECHANISMS[0]
    third = Decimal(stated(client, keys, dataset_id, granted)["rho_total"]) / 3
    for _ in range(2):
        spent = post(client, keys, dataset_id, {**mechanism, "rho": str(third)})
        assert spent.status_code == 202, spent.text
        budget = stated(client, keys, dataset_id, granted)
        total, spent_eps = Decimal(budget["epsilon_total"]), Decimal(budget["epsilon_spent"])
        remaining = Decimal(budget["epsilon_remaining"])
        # CKS conversions do not subtract: more is admitted than total - spent.
        assert remaining > total - spent_eps, budget
        exact = exactly_the_remainder("zcdp", budget, mechanism, currency=currency)
        dry = post(client, keys, dataset_id, exact, dry_run=True)
        assert dry.status_code == 200, dry.text
        assert dry.json()["affordable"] is True, dry.json()
        above = exactly_the_remainder("zcdp", budget, mechanism, ABOVE, currency=currency)
        refused = post(client, keys, dataset_id, above)
        assert refused.status_code == 409, refused.text
        assert refused.json()["budget"] == whose
        assert refused.json()["epsilon_remaining"] == budget["epsilon_remaining"]
        assert refused.json()["rho_remaining"] == budget["rho_remaining"]
