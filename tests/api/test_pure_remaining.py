"""A budget states what a pure release (``delta = 0``) is admitted at, ``epsilon_remaining_pure``,
beside ``epsilon_remaining`` (a Gaussian release's figure at the budget's delta), and a refusal
says at which delta each figure it gives holds.

What was missing before:

* under ``hybrid`` (the default) a fresh ``(1, 1e-6)`` budget stated 0.9979, the Gaussian figure,
  while its basic filter admits a pure release up to the owner's whole epsilon 1: a user of a
  pure mechanism (``smooth_sensitivity``'s Cauchy variant, ``auto`` at ``delta = 0``) could not
  read what they can get. Once the basic filter is closed (a Gaussian release at the budget's
  delta spends more than its 1% share), the pure figure is its Gaussian-DP or zCDP filter's,
  far below the Gaussian one (a pure step costs more ``mu`` than a Gaussian one);
* a refusal gave ``epsilon_admissible`` (at the request's delta) beside ``epsilon_remaining``
  (at the budget's) without saying so: 0.43 admitted beside 0.57 remaining read as a
  contradiction.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.api.test_hybrid_admissible_epsilon import rows
from tests.api.test_stated_is_admitted import ABOVE, DELTA, post, setup_budget, stated

pytestmark = pytest.mark.release_seed(5)

#: A pure release: smooth_sensitivity at delta 0 is its Cauchy variant, one pure step of the
#: whole epsilon (no private centre).
PURE = {"mechanism": "smooth_sensitivity", "k": 2, "delta": "0", "params": {"center": "none"}}


def pure(epsilon: Decimal) -> dict[str, Any]:
    return {**PURE, "epsilon": str(epsilon)}


def gaussian(epsilon: Decimal | str, delta: str = DELTA) -> dict[str, Any]:
    return {"mechanism": "analyze_gauss", "k": 2, "epsilon": str(epsilon), "delta": delta}


def exactly_admitted(client: Any, keys: Any, dataset_id: str, granted: bool) -> dict[str, Any]:
    """The stated pure remainder is admitted (dry run) and 0.1% above it refused (409 naming
    the budget, with the same figure); the budget read."""
    budget = stated(client, keys, dataset_id, granted)
    figure = Decimal(budget["epsilon_remaining_pure"])
    assert figure > 0, budget
    above = post(client, keys, dataset_id, pure(figure * ABOVE))
    assert above.status_code == 409, above.text
    assert above.json()["budget"] == ("grant" if granted else "dataset")
    assert above.json()["epsilon_remaining_pure"] == budget["epsilon_remaining_pure"]
    dry = post(client, keys, dataset_id, pure(figure), dry_run=True)
    assert dry.status_code == 200, dry.text
    assert dry.json()["affordable"] is True, dry.json()
    return budget


@pytest.mark.parametrize("granted", [False, True], ids=["dataset", "grant"])
def test_a_hybrid_budget_states_what_a_pure_release_is_admitted_at(
    client, keys, upload_dataset, granted
):
    dataset_id = setup_budget(client, keys, upload_dataset, "hybrid", granted)
    fresh = exactly_admitted(client, keys, dataset_id, granted)
    # Its basic filter admits a pure release of the owner's whole epsilon: more than the
    # stated total, the Gaussian figure at 1e-6.
    assert Decimal(fresh["epsilon_remaining_pure"]) == 1
    assert Decimal(fresh["epsilon_total"]) < 1
    assert post(client, keys, dataset_id, pure(Decimal(1))).status_code == 202

    # A Gaussian release at the budget's delta closes the basic filter (its 1% delta share):
    # the pure figure is now the Gaussian-DP or zCDP filter's, below the Gaussian one.
    dataset_id = setup_budget(client, keys, upload_dataset, "hybrid", granted)
    assert post(client, keys, dataset_id, gaussian("0.3")).status_code == 202
    after = exactly_admitted(client, keys, dataset_id, granted)
    assert 0 < Decimal(after["epsilon_remaining_pure"]) < Decimal(after["epsilon_remaining"])
    made = post(client, keys, dataset_id, pure(Decimal(after["epsilon_remaining_pure"])))
    assert made.status_code == 202, made.text


@pytest.mark.parametrize("kind", ["basic", "zcdp"])
def test_basic_and_zcdp_state_what_a_pure_release_is_admitted_at(
    client, keys, upload_dataset, kind
):
    dataset_id = setup_budget(client, keys, upload_dataset, kind, granted=False)
    spent = post(client, keys, dataset_id, gaussian("0.3"))
    assert spent.status_code == 202, spent.text
    budget = exactly_admitted(client, keys, dataset_id, granted=False)
    if kind == "basic":
        assert budget["epsilon_remaining_pure"] == budget["epsilon_remaining"]
    else:
        # A pure epsilon step is charged epsilon^2/2.
        rho = Decimal(budget["rho_remaining"])
        assert Decimal(budget["epsilon_remaining_pure"]) ** 2 / 2 <= rho


def test_a_gaussian_budget_states_no_pure_figure(client, keys, upload_dataset):
    dataset_id = setup_budget(client, keys, upload_dataset, "gaussian", granted=False)
    assert stated(client, keys, dataset_id, granted=False)["epsilon_remaining_pure"] is None


@pytest.mark.parametrize("granted", [False, True], ids=["dataset", "grant"])
def test_a_refusal_says_at_which_delta_each_figure_holds(client, keys, upload_dataset, granted):
    made = upload_dataset(
        client, keys.owner, rows(), accounting="hybrid", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1,
    )  # fmt: skip
    dataset_id = str(made["id"])
    if granted:
        grant = client.post(
            f"/v1/datasets/{dataset_id}/grants",
            headers={"Authorization": f"Bearer {keys.owner}"},
            json={"epsilon": "1", "delta": "1e-5"},
        )
        assert grant.status_code == 201, grant.text
    assert post(client, keys, dataset_id, gaussian("0.5", "0.00001")).status_code == 202
    budget = stated(client, keys, dataset_id, granted)
    # The same epsilon at a larger delta is less noise, so more mu: refused, and admitted at
    # less than epsilon_remaining.
    refused = post(client, keys, dataset_id, gaussian(budget["epsilon_remaining"], "0.0001"))
    assert refused.status_code == 409, refused.text
    body = refused.json()
    admissible = Decimal(body["epsilon_admissible"])
    assert 0 < admissible < Decimal(body["epsilon_remaining"])
    assert Decimal(body["stated_at_delta"]) == Decimal("1e-5")
    detail = body["detail"]
    admitted = body["epsilon_admissible"]
    said = f"(same mechanism and params, at its delta 0.0001) is admitted now at epsilon {admitted}"
    assert said in detail, detail
    left = Decimal(body["epsilon_remaining"])
    short = str(left.quantize(Decimal("0.0001"), rounding="ROUND_FLOOR"))
    assert (
        f"epsilon_remaining ({short}) is what a Gaussian release asked at the budget's delta "
        "0.00001 is admitted at"
    ) in detail, detail
    assert "epsilon_remaining_pure (" in detail and "what a pure release (delta 0) is" in detail
