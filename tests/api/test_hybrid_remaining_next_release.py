"""On the default accounting (``hybrid``), what a budget says remains is what the next release
of the default kind (Gaussian, at the budget's delta) is admitted at, a refusal names each filter
once, and a release's ``delta`` and ``cost_delta`` are described as the two figures they are.

What failed before:

* after ``PrivatePCA``'s default request (``auto``, a private centre) of epsilon 1 at the default
  delta ``1e-7`` on a ``(1, 1e-5)`` dataset, ``epsilon_remaining`` was 0.217 (``total - spent``,
  the spend's guarantee subtracted), yet a Gaussian release at ``(0.571, 1e-5)`` was admitted:
  the Gaussian-DP filter adds up ``mu^2``, not epsilon. A request 0.1% above the stated figure
  was admitted; now a request for exactly it is admitted and one 0.1% above is refused;
* the next request's 409 said "filter C (basic) has epsilon 0 left, it needs 0.9; filter C
  (basic) has, of its delta share, 0 left, ...": one filter named twice in one sentence;
* that release showed ``delta`` 1e-7 and ``cost_delta`` 0 (both true: the single-release delta
  its basic filter counts, and the approximate steps' delta its zCDP filter charges, none for
  Gaussian steps), but the fields' descriptions spoke of ``zcdp`` and ``basic`` only.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from service import accounting
from tests.api.test_hybrid_admissible_epsilon import budget_to_spend, post, rows
from tests.conftest import bearer

pytestmark = pytest.mark.release_seed(5)

#: What PrivatePCA sends by default (a centred request: ``auto`` with a private centre), at
#: epsilon 1 and the service's default delta (1e-7 on a (1, 1e-5) dataset).
PCA_DEFAULT = {"mechanism": "auto", "k": 2, "epsilon": "1", "params": {"center": "private"}}
ABOVE = Decimal("1.001")


@pytest.fixture
def settings(settings):
    # The product's default accounting (the suite's fixture keeps basic for older figures).
    return settings.model_copy(update={"default_accounting": "hybrid"})


def stated(client: Any, keys: Any, dataset_id: str, granted: bool) -> dict[str, Any]:
    if granted:
        listed = client.get(f"/v1/datasets/{dataset_id}/grants", headers=bearer(keys.owner))
        return dict(listed.json()["items"][0])
    return dict(client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(keys.owner)).json())


def gaussian(epsilon: Decimal, delta: str) -> dict[str, Any]:
    return {"mechanism": "analyze_gauss", "k": 2, "epsilon": str(epsilon), "delta": delta}


@pytest.mark.parametrize("granted", [False, True], ids=["dataset", "grant"])
def test_the_remaining_epsilon_is_what_the_next_gaussian_release_is_admitted_at(
    client, keys, upload_dataset, granted
):
    dataset_id = budget_to_spend(client, keys, upload_dataset, granted)
    assert post(client, keys, dataset_id, PCA_DEFAULT).status_code == 202
    budget = stated(client, keys, dataset_id, granted)
    assert budget["accounting"] == "hybrid"
    remaining, delta = Decimal(budget["epsilon_remaining"]), budget["delta_total"]
    # The spend's guarantee is still stated as spent; what remains is not total - spent.
    total, spent = Decimal(budget["epsilon_total"]), Decimal(budget["epsilon_spent"])
    assert Decimal("0.5") < spent < total
    assert remaining > total - spent

    above = post(client, keys, dataset_id, gaussian(remaining * ABOVE, delta))
    assert above.status_code == 409, above.text
    assert above.json()["epsilon_remaining"] == budget["epsilon_remaining"]
    dry = post(client, keys, dataset_id, gaussian(remaining, delta), dry_run=True)
    assert dry.status_code == 200 and dry.json()["affordable"] is True, dry.text
    assert dry.json()["epsilon_remaining"] == budget["epsilon_remaining"]
    made = post(client, keys, dataset_id, gaussian(remaining, delta))
    assert made.status_code == 202, made.text


def test_a_refusal_names_the_basic_filter_once(client, keys, upload_dataset):
    dataset_id = budget_to_spend(client, keys, upload_dataset, granted=False)
    assert post(client, keys, dataset_id, PCA_DEFAULT).status_code == 202
    refused = post(client, keys, dataset_id, {**PCA_DEFAULT, "epsilon": "0.9"})
    assert refused.status_code == 409, refused.text
    detail = refused.json()["detail"]
    assert detail.count("filter C (basic)") == 1, detail
    said = "filter C (basic) has epsilon 0 left, it needs 0.9, and of its delta share 0 left"
    assert said in detail, detail


def test_a_closed_basic_filter_is_named_once_with_both_its_figures():
    budget = accounting.hybrid_budget(Decimal(1), Decimal("1e-5"))
    state = accounting.HybridState(budget, Decimal("1.5"), Decimal("3e-7"))
    cost = accounting.ReleaseCost(Decimal("0.9"), Decimal("1e-7"), None, None, None)
    (basic,) = [reason for reason in state.refusals(cost) if "filter C" in reason]
    assert basic == (
        "filter C (basic) is closed: the releases admitted so far (by the other filters) spent "
        "1.5 of its epsilon 1 and 0.0000003 of its delta share 0.0000001"
    )


def test_a_release_s_delta_and_cost_delta_are_described_as_what_they_are(
    client, keys, upload_dataset
):
    dataset_id = budget_to_spend(client, keys, upload_dataset, granted=False)
    before = stated(client, keys, dataset_id, granted=False)
    made = post(client, keys, dataset_id, gaussian(Decimal("0.5"), "1e-7"))
    assert made.status_code == 202, made.text
    release = made.json()
    # Both true: the single-release delta the basic filter counts against its share, and the
    # approximate steps' delta the zCDP filter charges (none: analyze_gauss is Gaussian).
    assert Decimal(release["delta"]) == Decimal("1e-7")
    assert Decimal(release["cost_delta"]) == 0
    after = stated(client, keys, dataset_id, granted=False)
    moved = Decimal(after["delta_spent"]) - Decimal(before["delta_spent"])
    assert moved == Decimal("1e-7")
    fields = client.get("/openapi.json").json()["components"]["schemas"]["Release"]["properties"]
    assert "hybrid" in fields["delta"]["description"], fields["delta"]
    assert "basic filter" in fields["delta"]["description"], fields["delta"]
    assert "hybrid" in fields["cost_delta"]["description"], fields["cost_delta"]
    assert "0 for a release with only Gaussian" in fields["cost_delta"]["description"]


def test_a_gaussian_budget_states_what_the_next_gaussian_release_is_admitted_at(
    client, keys, upload_dataset
):
    # The same understatement on the gaussian accounting (one GDP filter): after a (0.5, 1e-5)
    # release of a (1, 1e-5) budget it said 0.5 remained (total - spent); a release of 0.834
    # at 1e-5 was admitted.
    made = upload_dataset(
        client, keys.owner, rows(), accounting="gaussian", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1,
    )  # fmt: skip
    dataset_id = str(made["id"])
    assert post(client, keys, dataset_id, gaussian(Decimal("0.5"), "0.00001")).status_code == 202
    budget = stated(client, keys, dataset_id, granted=False)
    remaining = Decimal(budget["epsilon_remaining"])
    assert Decimal("0.834") < remaining < Decimal("0.835"), budget
    above = post(client, keys, dataset_id, gaussian(remaining * ABOVE, "0.00001"))
    assert above.status_code == 409, above.text
    made = post(client, keys, dataset_id, gaussian(remaining, "0.00001"))
    assert made.status_code == 202, made.text
