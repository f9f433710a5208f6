"""One way to state spend (issue 31, item 2): every budget, 409, dry run and grant states
``(epsilon, delta)`` at the dataset's delta with the native figure beside it, the same figures
everywhere (``service.spend``); grants are accepted in epsilon on every accounting."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from service import accounting, audit, auth
from service.ledger import BUDGET_CONTEXT
from tests.conftest import bearer

ACCOUNTINGS = ["basic", "gaussian", "zcdp", "hybrid"]
#: What a 409 and a dry run say remains, and GET .../budget states.
REMAINING = (
    "epsilon_remaining",
    "delta_remaining",
    "rho_remaining",
    "mu_remaining",
    "delta_reserved_for_conversion",
)
RELEASE = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.5", "delta": "1e-7"}


def new_key(factory: sessionmaker[Session], role: str, name: str) -> tuple[str, str]:
    with factory.begin() as session:
        key, secret = auth.create_key(session, role, name, actor_key_id=None)  # type: ignore[arg-type]
        return str(key.id), secret


@pytest.fixture
def data() -> np.ndarray[Any, Any]:
    rows = np.random.default_rng(3).normal(size=(100, 6))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def upload(upload_dataset: Any, client: Any, keys: Any, data: Any, kind: str) -> dict[str, Any]:
    result: dict[str, Any] = upload_dataset(
        client,
        keys.owner,
        data,
        epsilon_budget="1",
        delta_budget="1e-5",
        accounting=kind,
        row_norm_bound="1",
    )
    return result


def remaining(body: dict[str, Any]) -> dict[str, Any]:
    return {name: body.get(name) for name in REMAINING}


def exhaust(client: Any, key: str, dataset: dict[str, Any], **cost: Any) -> dict[str, Any]:
    """Request releases until one is refused; the 409's body."""
    url = f"/v1/datasets/{dataset['id']}/releases"
    for _ in range(40):
        response = client.post(url, headers=bearer(key), json={**RELEASE, **cost})
        if response.status_code == 409:
            body: dict[str, Any] = response.json()
            assert body["error"] == "budget_exceeded", body
            return body
        assert response.status_code == 202, response.text
    raise AssertionError("the budget never ran out")


@pytest.mark.parametrize("kind", ACCOUNTINGS)
def test_a_dataset_409_states_what_the_budget_states(client, keys, upload_dataset, data, kind):
    dataset = upload(upload_dataset, client, keys, data, kind)
    refused = exhaust(client, keys.analyst, dataset)
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)).json()
    assert remaining(refused) == remaining(budget)
    # And they are not the ledger's raw columns: something was spent, in epsilon too.
    assert Decimal(budget["epsilon_spent"]) > 0
    assert Decimal(budget["epsilon_remaining"]) < 1
    if kind == "gaussian":
        assert refused["mu_remaining"] is not None and refused["delta_remaining"] == "0"
        assert refused["delta_reserved_for_conversion"] == budget["delta_total"]
    # A dry run states the same remaining figures.
    dry = client.post(
        f"/v1/datasets/{dataset['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=RELEASE,
    ).json()
    assert remaining(dry) == remaining(budget)


@pytest.mark.parametrize("kind", ACCOUNTINGS)
def test_a_grant_409_states_what_the_grant_states(
    client, keys, upload_dataset, data, session_factory, kind
):
    dataset = upload(upload_dataset, client, keys, data, kind)
    analyst_id, analyst = new_key(session_factory, "analyst", "alice's notebook")
    grants_url = f"/v1/datasets/{dataset['id']}/grants"
    created = client.post(
        grants_url,
        headers=bearer(keys.owner),
        json={"analyst_key_id": analyst_id, "epsilon": "0.6", "delta": "5e-6"},
    )
    assert created.status_code == 201, created.text
    refused = exhaust(client, analyst, dataset)
    assert refused["budget"] == "grant"
    listed = client.get(grants_url, headers=bearer(keys.owner)).json()["items"][0]
    assert remaining(refused) == remaining(listed)
    assert listed["analyst_key_name"] == "alice's notebook"
    assert Decimal(listed["epsilon_spent"]) > 0


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
def test_grants_in_epsilon_are_converted_down_and_stated_in_epsilon(
    client, keys, upload_dataset, data, session_factory, kind
):
    dataset = upload(upload_dataset, client, keys, data, kind)
    budget = dataset["budget"]
    grants_url = f"/v1/datasets/{dataset['id']}/grants"
    analyst_id, _ = new_key(session_factory, "analyst", "a")
    # The dataset's whole (epsilon, delta): the whole native budget, stated as epsilon 1.
    whole = client.post(
        grants_url,
        headers=bearer(keys.owner),
        json={"analyst_key_id": analyst_id, "epsilon": "1", "delta": "1e-5"},
    )
    assert whole.status_code == 201, whole.text
    shown = whole.json()
    assert shown["rho_total"] == budget["rho_total"]
    assert shown["delta_total"] == budget["delta_remaining"]  # mechanisms' share, as the dataset
    assert Decimal("0.999") < Decimal(shown["epsilon_total"]) <= 1
    assert shown["epsilon_spent"] == "0"
    if kind == "zcdp":
        # What a Gaussian release at the grant's delta is admitted at: its rho_total is the
        # epsilon converted by CKS at half the delta, looser than the Gaussian's own curve.
        assert 0 < Decimal(shown["epsilon_remaining"]) < Decimal(shown["epsilon_total"])
    else:
        assert shown["epsilon_remaining"] == shown["epsilon_total"]
    assert shown["delta_reserved_for_conversion"] == budget["delta_reserved_for_conversion"]
    # A smaller share: its rho is the conversion's, rounded down, so its epsilon is <= asked.
    other_id, _ = new_key(session_factory, "analyst", "b")
    small = client.post(
        grants_url,
        headers=bearer(keys.owner),
        json={"analyst_key_id": other_id, "epsilon": "0.25", "delta": "1e-6"},
    ).json()
    if kind == "gaussian":
        expected = accounting.budget_rho_of_mu(
            accounting.mu_budget(Decimal("0.25"), Decimal("1e-6"))
        )
    else:
        expected = accounting.rho_budget(Decimal("0.25"), Decimal("1e-6"))
    assert Decimal(small["rho_total"]) == expected
    assert 0 < Decimal(small["epsilon_total"]) <= Decimal("0.25")
    with session_factory() as session:
        assert audit.verify(session).ok


def test_a_hybrid_grant_in_epsilon_is_a_sub_budget_with_the_datasets_shares(
    client, keys, upload_dataset, data, session_factory
):
    dataset = upload(upload_dataset, client, keys, data, "hybrid")
    budget = dataset["budget"]
    grants_url = f"/v1/datasets/{dataset['id']}/grants"
    analyst_id, analyst = new_key(session_factory, "analyst", "a")
    whole = client.post(
        grants_url,
        headers=bearer(keys.owner),
        json={"analyst_key_id": analyst_id, "epsilon": "1", "delta": "1e-5"},
    )
    assert whole.status_code == 201, whole.text
    shown = whole.json()
    assert shown["accounting"] == "hybrid"
    # The whole budget: what its filters admit for a Gaussian release at 1e-5 (A' holds 96% of
    # the delta), as the dataset's own budget states it.
    assert shown["epsilon_spent"] == "0" and Decimal("0.997") < Decimal(shown["epsilon_total"]) < 1
    for name in ("epsilon_total", "rho_total", "mu_total", "delta_reserved_for_conversion"):
        assert shown[name] == budget[name], name
    for name in ("delta_remaining",):
        assert shown[name] == budget[name], name
    other_id, _ = new_key(session_factory, "analyst", "b")
    small = client.post(
        grants_url,
        headers=bearer(keys.owner),
        json={"analyst_key_id": other_id, "epsilon": "0.25", "delta": "1e-6"},
    )
    assert small.status_code == 201, small.text
    expected_mu = accounting.mu_budget(Decimal("0.25"), Decimal("9.6e-7"))
    assert Decimal(small.json()["mu_total"]) == expected_mu
    # rho and mu are not a hybrid grant's currency
    refused = client.post(grants_url, headers=bearer(keys.owner), json={"mu": "0.1"})
    assert refused.status_code == 422 and "epsilon" in refused.json()["detail"]
    # a release under the grant is charged to both; the grant states a non-zero spend
    response = client.post(
        f"/v1/datasets/{dataset['id']}/releases", headers=bearer(analyst), json=RELEASE
    )
    assert response.status_code == 202, response.text
    listed = client.get(grants_url, headers=bearer(keys.owner)).json()["items"][0]
    assert Decimal(listed["epsilon_spent"]) > 0 and Decimal(listed["mu_spent"]) > 0
    with session_factory() as session:
        assert audit.verify(session).ok


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
def test_a_native_grant_is_stated_in_epsilon_too(
    client, keys, upload_dataset, data, session_factory, kind
):
    dataset = upload(upload_dataset, client, keys, data, kind)
    share = {"mu": "0.1"} if kind == "gaussian" else {"rho": "0.005"}
    created = client.post(
        f"/v1/datasets/{dataset['id']}/grants", headers=bearer(keys.owner), json=share
    ).json()
    rho = Decimal(created["rho_total"])
    if kind == "gaussian":
        epsilon = accounting.gdp_epsilon(accounting.sqrt_up(2 * rho), Decimal("1e-5"))
        assert Decimal(created["mu_total"]) <= Decimal("0.1")
    else:
        epsilon = accounting.zcdp_epsilon(rho, Decimal("1e-5"))
    assert Decimal(created["epsilon_total"]) == epsilon > 0
    # The analyst sees the same epsilon (their grants list, as the dashboard shows it).
    mine = client.get("/v1/grants", headers=bearer(keys.analyst)).json()["items"][0]
    assert mine["epsilon_total"] == created["epsilon_total"]


def test_a_native_grant_above_the_mechanisms_delta_names_the_figure(
    client, keys, upload_dataset, data
):
    dataset = upload(upload_dataset, client, keys, data, "zcdp")
    refused = client.post(
        f"/v1/datasets/{dataset['id']}/grants",
        headers=bearer(keys.owner),
        json={"rho": "0.001", "delta": "1e-5"},
    )
    assert refused.status_code == 422
    assert "0.000005" in refused.json()["detail"]


@pytest.mark.parametrize(
    ("kind", "reserved"),
    [
        ("basic", None),
        ("gaussian", "0.00001"),
        ("zcdp", "0.000005"),
        # A''s 96% and B's conversion 1%
        ("hybrid", "0.0000097"),
    ],
)
def test_the_delta_held_for_the_conversion_is_stated(
    client, keys, upload_dataset, data, kind, reserved
):
    dataset = upload(upload_dataset, client, keys, data, kind)
    assert dataset["budget"].get("delta_reserved_for_conversion") == reserved


@pytest.mark.parametrize("kind", ACCOUNTINGS)
def test_the_ledger_states_each_charge_in_epsilon(client, keys, upload_dataset, data, kind):
    dataset = upload(upload_dataset, client, keys, data, kind)
    url = f"/v1/datasets/{dataset['id']}/releases"
    for _ in range(3):
        response = client.post(
            url, headers=bearer(keys.analyst), json={**RELEASE, "epsilon": "0.2"}
        )
        assert response.status_code == 202, response.text
    ledger_url = f"/v1/datasets/{dataset['id']}/ledger"
    whole = client.get(ledger_url, headers=bearer(keys.owner)).json()
    items = whole["items"]
    assert whole["accounting"] == kind and Decimal(whole["stated_at_delta"]) == Decimal("1e-5")
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)).json()
    # The running figure ends where the budget's epsilon_spent is; the increments add up to it.
    assert items[-1]["epsilon_after"] == budget["epsilon_spent"]
    total = Decimal(0)
    for item in items:
        total = BUDGET_CONTEXT.add(total, Decimal(item["epsilon_increment"]))
    assert total == Decimal(budget["epsilon_spent"])
    assert all(Decimal(item["epsilon_increment"]) > 0 for item in items)
    if kind == "basic":
        assert all(item["epsilon_increment"] == item["epsilon"] for item in items)
    else:
        assert all(Decimal(item["rho"]) > 0 for item in items)
        # Epsilons at a fixed delta do not add up: the first charge costs the most.
        assert Decimal(items[0]["epsilon_increment"]) > Decimal(items[-1]["epsilon_increment"])
    assert all((item["mu"] is not None) == (kind in ("gaussian", "hybrid")) for item in items)
    # Paged, the running figure carries over from the entries before the page.
    first = client.get(ledger_url + "?limit=2", headers=bearer(keys.owner)).json()
    rest = client.get(ledger_url + f"?cursor={first['next']}", headers=bearer(keys.owner)).json()
    assert first["items"] + rest["items"] == items


def test_metrics_export_spend_for_every_accounting(client, keys, upload_dataset, data):
    from prometheus_client.parser import text_string_to_metric_families

    spent: dict[str, Decimal] = {}
    totals: dict[str, Decimal] = {}
    remaining: dict[str, Decimal] = {}
    for kind in ACCOUNTINGS:
        dataset = upload(upload_dataset, client, keys, data, kind)
        response = client.post(
            f"/v1/datasets/{dataset['id']}/releases", headers=bearer(keys.analyst), json=RELEASE
        )
        assert response.status_code == 202, response.text
        budget = client.get(
            f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)
        ).json()
        spent[kind] = Decimal(budget["epsilon_spent"])
        totals[kind] = Decimal(budget["epsilon_total"])
        remaining[kind] = Decimal(budget["epsilon_remaining"])
    text = client.get("/metrics", headers=bearer(keys.admin)).text
    samples = {
        (sample.name, sample.labels.get("accounting")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    for kind in ACCOUNTINGS:
        assert samples[("dpss_datasets", kind)] == 1
        assert samples[("dpss_spent_epsilon", kind)] == pytest.approx(float(spent[kind]))
        assert samples[("dpss_spent_epsilon", kind)] > 0.3
        # hybrid, gaussian and zcdp: what the next Gaussian release is admitted at (their
        # filters add up mu^2 or rho, not epsilon), more than total - spent after a release
        left = float(remaining[kind])
        assert samples[("dpss_remaining_epsilon", kind)] == pytest.approx(left)
        if kind == "basic":
            assert left == pytest.approx(float(totals[kind] - spent[kind]))
        else:
            assert left > float(totals[kind] - spent[kind])
        assert (samples[("dpss_spent_rho", kind)] > 0) == (kind != "basic")


def test_a_hybrid_filter_outrun_by_another_states_nothing_left_never_less(
    client, keys, upload_dataset, data
):
    """The docs' session: (0.5, 1e-6), (0.1, 1e-6), then (0.9, 1e-6) on (1, 1e-5). The GDP
    filter admits the third; the zCDP filter's sums then pass its budget, so it has nothing
    left: every remaining figure is >= 0 (a negative rho_remaining was shown before)."""
    dataset = upload(upload_dataset, client, keys, data, "hybrid")
    url = f"/v1/datasets/{dataset['id']}/releases"
    for epsilon in ("0.5", "0.1", "0.9"):
        body = {**RELEASE, "epsilon": epsilon, "delta": "1e-6"}
        response = client.post(url, headers=bearer(keys.analyst), json=body)
        assert response.status_code == 202, response.text
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)).json()
    assert Decimal(budget["rho_spent"]) > Decimal(budget["rho_total"])  # B was outrun
    assert budget["rho_remaining"] == "0" and budget["delta_remaining"] == "0"
    for name in ("epsilon_remaining", "mu_remaining"):
        assert Decimal(budget[name]) >= 0, (name, budget[name])
    refused = exhaust(client, keys.analyst, dataset)
    assert remaining(refused) == remaining(budget)


def test_a_hybrid_delta_row_adds_up_and_states_the_basic_filters_share(
    client, keys, upload_dataset, data
):
    """Follow-up 3 of issue 31 item 5: delta_spent and delta_remaining are B's share for
    approximate steps and C's share for single releases, so with the delta held for the
    conversion they add up to delta_total, before and after releases, and C's spend shows."""
    dataset = upload(upload_dataset, client, keys, data, "hybrid")
    url = f"/v1/datasets/{dataset['id']}/releases"

    def budget() -> dict[str, Any]:
        shown: dict[str, Any] = client.get(
            f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)
        ).json()
        parts = ("delta_reserved_for_conversion", "delta_spent", "delta_remaining")
        assert sum(Decimal(shown[name]) for name in parts) == Decimal(shown["delta_total"])
        return shown

    fresh = budget()
    # B's 2% and C's 1% of 1e-5, all still available
    assert Decimal(fresh["delta_remaining"]) == Decimal("3e-7")
    assert Decimal(fresh["delta_spent"]) == 0
    # A single release of delta 1e-8 (a Gaussian one, which A' also takes): C counts it
    body = {**RELEASE, "epsilon": "0.2", "delta": "1e-8"}
    assert client.post(url, headers=bearer(keys.analyst), json=body).status_code == 202
    after = budget()
    assert Decimal(after["delta_spent"]) == Decimal("1e-8")
    assert Decimal(after["delta_remaining"]) == Decimal("2.9e-7")
    # C closed by its epsilon (0.2 + 0.9 > 1): its whole share is no longer available
    body = {**RELEASE, "epsilon": "0.9", "delta": "1e-8"}
    assert client.post(url, headers=bearer(keys.analyst), json=body).status_code == 202
    closed = budget()
    assert Decimal(closed["delta_spent"]) == Decimal("1e-7")
    assert Decimal(closed["delta_remaining"]) == Decimal("2e-7")
    refused = exhaust(client, keys.analyst, dataset, epsilon="0.9", delta="1e-8")
    assert remaining(refused) == remaining(budget())
