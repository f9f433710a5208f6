"""A ``hybrid`` grant is stated in its own terms: total, spent and remaining all at the
grant's delta, the delta its filters enforce. On a ``(3, 1e-5)`` dataset, after one
``(0.5, 1e-6)`` Gaussian release under a ``(1, 1e-6)`` grant, the grant showed
``epsilon_total`` 1 (the grant's, at 1e-6) beside ``epsilon_spent`` 0.431 and
``epsilon_remaining`` 0.569 read at the dataset's 1e-5: the analyst was told 0.569 remained
under a grant whose own terms leave 0.5, and once the grant refused everything it still said
0.13 remained. Every screen that shows the grant now states 0.5 spent, and spending up to the
stated remaining is admitted while what the grant refuses is stated as (about) nothing left. Its
total is what its filters admit for a Gaussian release at its delta, 0.9979
(tests/api/test_stated_is_admitted.py)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from service import accounting
from service.ledger import BUDGET_CONTEXT
from tests.api.test_hybrid_admissible_epsilon import rows
from tests.conftest import bearer

pytestmark = pytest.mark.release_seed(3)

FIGURES = ("epsilon_total", "epsilon_spent", "epsilon_remaining", "delta_total", "mu_spent")
GAUSS = {"mechanism": "analyze_gauss", "k": 2, "delta": "1e-6"}


@pytest.fixture
def settings(settings):
    # The product's default accounting (the suite's fixture keeps basic for older figures).
    return settings.model_copy(update={"default_accounting": "hybrid"})


def granted(client: Any, keys: Any, upload_dataset: Any) -> tuple[str, str]:
    """A hybrid (3, 1e-5) dataset with a (1, 1e-6) all-analysts grant: (dataset, grant) ids."""
    dataset_id = str(
        upload_dataset(
            client, keys.owner, rows(), epsilon_budget="3", delta_budget="1e-5", row_norm_bound=1
        )["id"]
    )
    made = client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=bearer(keys.owner),
        json={"epsilon": "1", "delta": "1e-6"},
    )
    assert made.status_code == 201, made.text
    return dataset_id, str(made.json()["id"])


def release(client: Any, keys: Any, dataset_id: str, epsilon: str, dry_run: bool = False) -> Any:
    query = "?dry_run=true" if dry_run else ""
    return client.post(
        f"/v1/datasets/{dataset_id}/releases{query}",
        headers=bearer(keys.analyst),
        json={**GAUSS, "epsilon": epsilon},
    )


def shown(client: Any, keys: Any, dataset_id: str, grant_id: str) -> dict[str, Any]:
    """The grant as the owner's list and the analyst's list show it (asserted equal)."""
    url = f"/v1/datasets/{dataset_id}/grants"
    listed = client.get(url, headers=bearer(keys.owner)).json()["items"][0]
    mine = client.get("/v1/grants", headers=bearer(keys.analyst)).json()["items"][0]
    assert listed["id"] == mine["id"] == grant_id
    for name in FIGURES:
        assert listed[name] == mine[name], name
    return dict(listed)


def test_a_grant_is_stated_at_its_own_delta_on_every_screen(client, keys, upload_dataset):
    dataset_id, grant_id = granted(client, keys, upload_dataset)
    assert release(client, keys, dataset_id, "0.5").status_code == 202
    grant = shown(client, keys, dataset_id, grant_id)
    total, spent = Decimal(grant["epsilon_total"]), Decimal(grant["epsilon_spent"])
    remaining = Decimal(grant["epsilon_remaining"])
    # What the grant's filters admit for a Gaussian release at its 1e-6 (A' holds 96% of it).
    assert Decimal("0.997") < total < 1 and grant["delta_total"] == "0.000001"
    assert grant["stated_at_delta"] == "0.000001"
    # At the grant's delta the one (0.5, 1e-6) release spent 0.5 (it was 0.431, read at 1e-5).
    mu = Decimal(grant["mu_spent"])
    assert spent == accounting.gdp_epsilon(mu, Decimal("1e-6"))
    assert Decimal("0.4999") < spent <= Decimal("0.5001")
    # What remains is what a Gaussian release at the grant's delta is admitted at: its GDP
    # filter adds up mu^2, so more than total - spent (0.8386, not 0.4979).
    assert remaining > BUDGET_CONTEXT.subtract(total, spent)
    assert Decimal("0.8386") <= remaining < Decimal("0.8387")
    # A dry run's remaining figures are the grant's (the request is charged to it).
    dry = release(client, keys, dataset_id, "0.5", dry_run=True).json()
    assert dry["epsilon_remaining"] == grant["epsilon_remaining"]
    # The dataset's own budget is still stated at the dataset's delta.
    budget = client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(keys.owner)).json()
    assert Decimal(budget["epsilon_spent"]) < Decimal("0.44")


def test_spending_up_to_the_stated_remaining_is_admitted_and_no_further(
    client, keys, upload_dataset
):
    """The stated remaining (0.8386: Gaussian-DP composes two releases tighter than their sum)
    is admitted as one release at the grant's delta; the refusal's ``epsilon_admissible`` is
    that figure (3 digits, rounded down), admitted, and 1% more is refused; after it the grant
    states what its filters leave, little (0.025, what a Gaussian release is admitted at),
    where at the dataset's delta it stated 0.13 though its Gaussian filter was spent."""
    dataset_id, grant_id = granted(client, keys, upload_dataset)
    assert release(client, keys, dataset_id, "0.5").status_code == 202
    left = shown(client, keys, dataset_id, grant_id)["epsilon_remaining"]
    asked = str(accounting.significant_digits(Decimal(left), 4, "ROUND_FLOOR"))
    assert release(client, keys, dataset_id, asked, dry_run=True).json()["affordable"] is True
    refused = release(client, keys, dataset_id, "1")
    assert refused.status_code == 409 and refused.json()["budget"] == "grant"
    assert refused.json()["epsilon_remaining"] == left
    figure = refused.json()["epsilon_admissible"]
    assert figure is not None
    assert accounting.significant_digits(Decimal(left), 3, "ROUND_FLOOR") == Decimal(figure)
    more = str(Decimal(figure) * Decimal("1.01"))
    assert release(client, keys, dataset_id, more).status_code == 409
    assert release(client, keys, dataset_id, figure).status_code == 202
    grant = shown(client, keys, dataset_id, grant_id)
    assert Decimal(grant["epsilon_spent"]) <= 1
    # What the 3-digit figure left of the 0.8386 (0.0006) is worth to a release of its own:
    # mu^2 adds up, so 0.025 (it was 0.0027 stated as total - spent).
    assert Decimal(grant["epsilon_remaining"]) < Decimal("0.03")
