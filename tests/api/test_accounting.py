"""Accounting across releases through the API: derived budgets, costs in the dataset's currency,
the filter's refusals, the dry run's figures, and the done-when ratios of issue 23."""

from __future__ import annotations

import math
import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from api_schemas.datasets import DatasetCreate
from service import accounting, audit, datasets, ledger
from service.config import Settings
from service.db.models import Dataset, LedgerEntry
from service.mechanisms.analyze_gauss import noise_sigma
from tests.conftest import bearer

D, K = 50, 5


@pytest.fixture
def data() -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(7)
    rows = rng.normal(size=(200, D))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def upload(upload_dataset, client, keys, data, kind: str, **form: Any) -> dict[str, Any]:
    """A dataset of (1, 1e-6) in accounting ``kind`` (more form fields as given)."""
    result: dict[str, Any] = upload_dataset(
        client, keys.owner, data, epsilon_budget="1", delta_budget="1e-6", accounting=kind, **form
    )
    return result


def releases_url(dataset: dict[str, Any]) -> str:
    return f"/v1/datasets/{dataset['id']}/releases"


def ask(client: Any, key: str, dataset: dict[str, Any], dry: bool = False, **body: Any) -> Any:
    body = {"mechanism": "analyze_gauss", "k": K, "params": {"clip_norm": 1.0}, **body}
    suffix = "?dry_run=true" if dry else ""
    return client.post(releases_url(dataset) + suffix, headers=bearer(key), json=body)


def budget(client: Any, key: str, dataset: dict[str, Any]) -> dict[str, Any]:
    response = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(key))
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_gaussian_budget_is_derived_exactly_and_shown(client, keys, upload_dataset, data):
    dataset = upload(upload_dataset, client, keys, data, "gaussian")
    shown = dataset["budget"]
    assert shown["accounting"] == "gaussian"
    mu = Decimal(shown["mu_total"])
    assert mu == accounting.mu_budget(Decimal(1), Decimal("1e-6"))
    assert Decimal(shown["rho_total"]) == accounting.budget_rho_of_mu(mu)
    assert Decimal(shown["epsilon_spent"]) == 0 and Decimal(shown["mu_spent"]) == 0
    assert budget(client, keys.analyst, dataset)["mu_total"] == shown["mu_total"]


def test_zcdp_budget_and_its_split(client, keys, upload_dataset, data):
    dataset = upload(upload_dataset, client, keys, data, "zcdp")
    shown = dataset["budget"]
    assert Decimal(shown["delta_conversion"]) == Decimal("5e-7")
    assert Decimal(shown["rho_total"]) == accounting.rho_budget(Decimal(1), Decimal("5e-7"))
    assert Decimal(shown["delta_remaining"]) == Decimal("5e-7")
    custom = upload(upload_dataset, client, keys, data, "zcdp", delta_conversion="9e-7")
    assert Decimal(custom["budget"]["rho_total"]) > Decimal(shown["rho_total"])


def test_the_product_default_is_hybrid_and_pure_budgets_stay_basic(tmp_path, monkeypatch):
    # issue 31, item 5: the default is the union of filters (it was zcdp)
    monkeypatch.delenv("DPSS_DEFAULT_ACCOUNTING", raising=False)
    assert Settings(data_dir=tmp_path).default_accounting == "hybrid"
    form = DatasetCreate(name="x", epsilon_budget=Decimal(1), delta_budget=Decimal(0))
    assert datasets.check_budgets(form, "zcdp").accounting == "basic"
    assert datasets.check_budgets(form, "hybrid").accounting == "basic"
    form = DatasetCreate(name="x", epsilon_budget=Decimal(1), delta_budget=Decimal("1e-6"))
    assert datasets.check_budgets(form, "zcdp").accounting == "zcdp"
    terms = datasets.check_budgets(form, "hybrid")
    assert terms.accounting == "hybrid"
    assert terms.delta_gaussian == Decimal("9.6e-7")
    assert terms.delta_conversion == Decimal("1e-8")
    assert terms.delta_mechanisms == Decimal("2e-8")
    assert terms.delta_basic == Decimal("1e-8")


@pytest.mark.parametrize(
    ("form", "field"),
    [
        ({"accounting": "gaussian", "delta_budget": "0"}, "accounting"),
        ({"accounting": "basic", "mu_budget": "0.1"}, "mu_budget"),
        ({"accounting": "gaussian", "mu_budget": "5"}, "mu_budget"),
        ({"accounting": "zcdp", "rho_budget": "5"}, "rho_budget"),
        ({"accounting": "zcdp", "delta_conversion": "0.5"}, "delta_conversion"),
        ({"accounting": "nope"}, "accounting"),
    ],
)
def test_upload_refuses_budgets_that_do_not_fit(client, keys, data, form, field):
    from tests.conftest import npy_bytes

    fields = {"name": "x", "epsilon_budget": "1", "delta_budget": "1e-6", **form}
    response = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files={"file": ("d.npy", npy_bytes(data), "application/octet-stream")},
        data=fields,
    )
    assert response.status_code == 422, response.text
    assert field in response.text


def test_a_stated_mu_budget_below_the_derived_one_is_kept(client, keys, upload_dataset, data):
    dataset = upload(upload_dataset, client, keys, data, "gaussian", mu_budget="0.2")
    assert Decimal(dataset["budget"]["mu_total"]) == Decimal("0.2")


def sigma_of(client, keys, dataset, **cost) -> float:
    response = ask(client, keys.analyst, dataset, dry=True, **cost)
    assert response.status_code == 200, response.text
    return float(response.json()["scales"]["sigma"])


@pytest.mark.parametrize(
    ("kind", "n", "bound"),
    [
        ("gaussian", 1, (0.999999, 1.000001)),
        ("gaussian", 10, (3.0, math.inf)),
        ("gaussian", 100, (9.5, math.inf)),
        ("zcdp", 1, (1 / 1.12, math.inf)),
        ("zcdp", 10, (2.7, math.inf)),
        ("zcdp", 100, (8.5, math.inf)),
    ],
)
def test_done_when_sigma_ratios_against_basic(client, keys, upload_dataset, data, kind, n, bound):
    """N equal analyze_gauss releases on (1, 1e-6): each gets basic's sigma divided by at least
    the issue's factor (gaussian: equal at N = 1)."""
    dataset = upload(upload_dataset, client, keys, data, kind)
    # What each of the N gets on a basic dataset: the same mechanism at (1/N, 1e-6/N).
    basic = upload(upload_dataset, client, keys, data, "basic")
    basic_sigma = sigma_of(
        client, keys, basic, epsilon=str(Decimal(1) / n), delta=str(Decimal("1e-6") / n)
    )
    total = dataset["budget"]
    if kind == "gaussian":
        per = accounting.round_down(Decimal(total["mu_total"]) / Decimal(n).sqrt())
        sigma = sigma_of(client, keys, dataset, mu=str(per))
    else:
        per = accounting.round_down(Decimal(total["rho_total"]) / Decimal(n))
        sigma = sigma_of(client, keys, dataset, rho=str(per))
    ratio = basic_sigma / sigma
    assert bound[0] <= ratio <= bound[1], ratio


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
def test_m_releases_fit_exactly_and_the_next_is_refused(
    client, keys, upload_dataset, data, run_worker, session_factory, kind
):
    m = 4
    dataset = upload(upload_dataset, client, keys, data, kind)
    total = dataset["budget"]
    if kind == "gaussian":
        cost = {"mu": str(accounting.round_down(Decimal(total["mu_total"]) / 2))}
    else:
        cost = {"rho": str(accounting.round_down(Decimal(total["rho_total"]) / m))}
    preview = ask(client, keys.analyst, dataset, dry=True, **cost).json()
    assert preview["releases_remaining"] == m
    assert preview["accounting"] == kind
    assert Decimal(preview["rho"]) <= Decimal(total["rho_total"]) / m
    assert Decimal(preview["epsilon"]) > 0  # the single-release equivalent
    accepted = []
    for _ in range(m):
        response = ask(client, keys.analyst, dataset, **cost)
        assert response.status_code == 202, response.text
        accepted.append(response.json()["id"])
    refused = ask(client, keys.analyst, dataset, **cost)
    assert refused.status_code == 409, refused.text
    assert "rho_remaining" in refused.json()
    run_worker()
    # The released extras carry the very sigma the dry run showed.
    released = client.get(f"/v1/releases/{accepted[0]}", headers=bearer(keys.analyst)).json()
    assert released["status"] == "succeeded", released
    assert released["result"]["extras"]["gram_noise_std"] == preview["scales"]["sigma"]
    after = budget(client, keys.analyst, dataset)
    assert Decimal(after["rho_spent"]) <= Decimal(after["rho_total"])
    # What was spent amounts to (almost) the whole stated epsilon at delta_total (zcdp: less,
    # since the conversion may now use all of delta_total, not only delta_conversion).
    low = Decimal("0.99") if kind == "gaussian" else Decimal("0.9")
    assert low < Decimal(after["epsilon_spent"]) <= Decimal(1)
    if kind == "gaussian":
        assert Decimal(after["mu_spent"]) <= Decimal(after["mu_total"])
    # The audit chain's budget_set and release_requested events reconcile with the ledger.
    with session_factory() as session:
        report = audit.verify(session)
    assert report.ok, report.problems
    with session_factory.begin() as session:
        entry = session.scalars(select(LedgerEntry).where(LedgerEntry.kind == "charge")).first()
        entry.rho += Decimal("1e-30")
    with session_factory() as session:
        tampered = audit.verify(session)
    assert any("rho differs" in problem for problem in tampered.problems)


def test_epsilon_requests_are_calibrated_as_one_release_and_charged_in_rho(
    client, keys, upload_dataset, data
):
    dataset = upload(upload_dataset, client, keys, data, "gaussian")
    response = ask(client, keys.analyst, dataset, epsilon="0.5", delta="1e-7")
    assert response.status_code == 202, response.text
    release = response.json()
    # The mechanism's own mu for (0.5, 1e-7) (all its Gaussian steps together): the analytic
    # Gaussian's, to the bisection's tolerance (rounded down: never more than that).
    mu = math.sqrt(2.0) / noise_sigma(1.0, 0.5, 1e-7)
    charged = Decimal(release["rho"])
    assert float(charged) == pytest.approx(mu**2 / 2, rel=1e-8)
    assert float(charged) <= mu**2 / 2 * (1 + 1e-12)
    assert Decimal(release["epsilon"]) == Decimal("0.5")


@pytest.mark.parametrize(
    ("kind", "mechanism", "cost", "params"),
    [
        ("gaussian", "gap_perturbation", {"mu": "0.1"}, {}),
        ("gaussian", "friendly_aggregate", {"epsilon": "0.5", "delta": "1e-7"}, {}),
        ("gaussian", "smooth_sensitivity", {"epsilon": "0.5", "delta": "1e-7"}, {}),
        ("gaussian", "exact_gapmax", {"epsilon": "0.5", "delta": "1e-7"}, {}),
        # at delta = 0 auto's choice is the pure Cauchy smooth_sensitivity
        ("gaussian", "auto", {"epsilon": "0.5", "delta": "0"}, {}),
        # the Gaussian smooth-sensitivity variant has no zCDP profile
        ("zcdp", "smooth_sensitivity", {"epsilon": "0.5", "delta": "1e-7"}, {"noise": "gaussian"}),
    ],
)
def test_mechanisms_without_a_proven_profile_are_refused_naming_accounting(
    client, keys, upload_dataset, data, kind, mechanism, cost, params
):
    dataset = upload(upload_dataset, client, keys, data, kind, row_norm_bound=1.0)
    body = {"mechanism": mechanism, "k": 2, "params": params, **cost}
    # The dry run says so before anyone spends, with the same refusal.
    dry = client.post(
        releases_url(dataset) + "?dry_run=true", headers=bearer(keys.analyst), json=body
    )
    assert dry.status_code == 422, dry.text
    response = client.post(releases_url(dataset), headers=bearer(keys.analyst), json=body)
    assert response.status_code == 422, response.text
    assert "accounting" in response.text and response.json() == dry.json()
    assert Decimal(budget(client, keys.owner, dataset)["rho_spent"]) == 0


@pytest.mark.parametrize(
    ("kind", "cost", "field"),
    [
        ("basic", {"mu": "0.1"}, "mu"),
        ("gaussian", {"rho": "0.1"}, "rho"),
        ("zcdp", {"mu": "0.1"}, "mu"),
        ("gaussian", {"mu": "0.1", "epsilon": "1", "delta": "1e-7"}, "mu"),
        ("gaussian", {}, "epsilon"),
        ("zcdp", {"rho": "0.001", "delta": "1e-8"}, "delta"),
    ],
)
def test_costs_in_the_wrong_currency_are_refused(
    client, keys, upload_dataset, data, kind, cost, field
):
    delta = "0.001" if kind == "basic" else "1e-6"
    dataset = upload_dataset(
        client, keys.owner, data, epsilon_budget="1", delta_budget=delta, accounting=kind
    )
    response = ask(client, keys.analyst, dataset, **cost)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(field) or field in response.text


def test_zcdp_charges_approximate_steps_their_rho_and_delta(client, keys, upload_dataset, data):
    dataset = upload(upload_dataset, client, keys, data, "zcdp", row_norm_bound=1.0)
    body = {"mechanism": "gap_perturbation", "k": 2, "rho": "0.01", "delta": "1e-8"}
    response = client.post(releases_url(dataset), headers=bearer(keys.analyst), json=body)
    assert response.status_code == 202, response.text
    release = response.json()
    # Calibrated to the target: rho just under it, the approximate delta at most the given one.
    assert Decimal("0.00999") < Decimal(release["rho"]) <= Decimal("0.01")
    assert Decimal("0.99e-8") < Decimal(release["cost_delta"]) <= Decimal("1e-8")
    spent = budget(client, keys.owner, dataset)
    assert Decimal(spent["rho_spent"]) == Decimal(release["rho"])
    assert Decimal(spent["delta_spent"]) == Decimal(release["cost_delta"])
    friendly = {"mechanism": "friendly_aggregate", "k": 1, "epsilon": "0.5", "delta": "2e-7"}
    preview = client.post(
        releases_url(dataset) + "?dry_run=true", headers=bearer(keys.analyst), json=friendly
    )
    assert preview.status_code in (200, 422), preview.text
    if preview.status_code == 200:
        shown = preview.json()
        assert shown["mu"] is None and Decimal(shown["zcdp_delta"]) > 0


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
def test_auto_runs_itself_under_every_accounting_and_keeps_its_settings(
    client, keys, upload_dataset, data, kind
):
    dataset = upload(upload_dataset, client, keys, data, kind, row_norm_bound=1.0)
    cost = {"mu": "0.1"} if kind == "gaussian" else {"rho": "0.005"}
    body = {"mechanism": "auto", "k": 2, "params": {"center": "private"}, **cost}
    preview = client.post(
        releases_url(dataset) + "?dry_run=true", headers=bearer(keys.analyst), json=body
    )
    assert preview.status_code == 200, preview.text
    shown = preview.json()
    # It stays auto, says what it will run, and keeps its settings (centring, the clip norm).
    # 200 x 50 is high dimension (50 >= 200^(2/3) = 34), but at this budget the private
    # centre's error over 200 rows would stand out of the Gram noise, so the Gram candidate is
    # analyze_gauss, and the dry run says why (spatial_sign before 29 Nov 2026).
    assert shown["mechanism"] == "auto" and shown["scales"]["auto_choice"] == "analyze_gauss"
    said = f"{shown['scales']['auto_reason']} {shown['scales']['auto_details']}"
    assert "private centre's error would stand out" in said
    assert shown["params"]["center"] == "private" and shown["params"]["clip_norm"] == 1.0
    response = client.post(releases_url(dataset), headers=bearer(keys.analyst), json=body)
    assert response.status_code == 202, response.text
    assert response.json()["mechanism"] == "auto"
    target = Decimal("0.005")
    assert target * Decimal("0.999999") < Decimal(response.json()["rho"]) <= target


def test_auto_dry_run_on_a_gaussian_dataset_says_its_tests_are_off(
    client, keys, upload_dataset, data
):
    dataset = upload(upload_dataset, client, keys, data, "gaussian", row_norm_bound=1.0)
    body = {"mechanism": "auto", "k": 2, "epsilon": "0.5", "delta": "1e-7"}
    shown = client.post(
        releases_url(dataset) + "?dry_run=true", headers=bearer(keys.analyst), json=body
    ).json()
    assert shown["mechanism"] == "auto" and shown["params"]["structure_share"] == 0
    assert "gaussian dataset" in shown["scales"]["auto_details"]
    assert shown["mu"] is not None


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
def test_grants_in_the_dataset_currency(
    client, keys, make_key, session_factory, upload_dataset, data, run_worker, kind
):
    dataset = upload(upload_dataset, client, keys, data, kind)
    grants_url = f"/v1/datasets/{dataset['id']}/grants"
    # Two currencies at once are refused naming the field (epsilon alone is accepted: see
    # tests/api/test_spend_statement.py); a share above the dataset's too.
    wrong = client.post(
        grants_url, headers=bearer(keys.owner), json={"epsilon": "0.5", "rho": "0.001"}
    )
    assert wrong.status_code == 422 and "rho" in wrong.text
    share = {"mu": "0.1"} if kind == "gaussian" else {"rho": "0.005", "delta": "1e-8"}
    too_big = {"mu": "1"} if kind == "gaussian" else {"rho": "5"}
    assert client.post(grants_url, headers=bearer(keys.owner), json=too_big).status_code == 422
    created = client.post(grants_url, headers=bearer(keys.owner), json=share)
    assert created.status_code == 201, created.text
    shown = created.json()
    assert shown["accounting"] == kind
    granted = Decimal(shown["rho_total"])
    expected = (
        accounting.budget_rho_of_mu(Decimal("0.1")) if kind == "gaussian" else Decimal("0.005")
    )
    assert granted == expected
    # Two releases of half the grant fit; a third is refused by the grant (409 naming it).
    half = (
        {"mu": str(accounting.round_down(Decimal("0.1") / Decimal(2).sqrt()))}
        if kind == "gaussian"
        else {"rho": "0.0025"}
    )
    for _ in range(2):
        assert ask(client, keys.analyst, dataset, **half).status_code == 202
    refused = ask(client, keys.analyst, dataset, **half)
    assert refused.status_code == 409 and refused.json()["budget"] == "grant"
    listed = client.get(grants_url, headers=bearer(keys.owner)).json()["items"][0]
    assert Decimal(listed["rho_spent"]) <= granted
    with session_factory() as session:
        assert audit.verify(session).ok


def test_the_mechanism_list_names_each_mechanisms_accountings(client, keys):
    items = client.get("/v1/mechanisms", headers=bearer(keys.analyst)).json()["items"]
    by_name = {item["name"]: set(item["accountings"]) for item in items}
    # hybrid (issue 31, item 5) admits every mechanism: its basic filter charges any release
    assert all("hybrid" in accountings for accountings in by_name.values())
    assert by_name["analyze_gauss"] == {"basic", "gaussian", "zcdp", "hybrid"}
    assert by_name["friendly_aggregate"] == {"basic", "zcdp", "hybrid"}
    assert by_name["smooth_sensitivity"] == {"basic", "zcdp", "hybrid"}
    assert by_name["exact_gapmax"] == {"basic", "zcdp", "hybrid"}
    assert by_name["auto"] == {"basic", "gaussian", "zcdp", "hybrid"}


def test_a_basic_dry_run_also_shows_the_other_currencies(client, keys, upload_dataset, data):
    dataset = upload_dataset(client, keys.owner, data, accounting="basic")
    shown = ask(client, keys.analyst, dataset, dry=True, epsilon="0.5", delta="1e-7").json()
    assert shown["accounting"] == "basic" and Decimal(shown["epsilon"]) == Decimal("0.5")
    sigma = noise_sigma(1.0, 0.5, 1e-7)
    assert float(shown["mu"]) == pytest.approx(math.sqrt(2.0) / sigma, rel=1e-8)
    assert shown["releases_remaining"] == 20  # epsilon 10 / 0.5 (the fixture's budget)


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
def test_continual_gauss_is_charged_its_whole_tree(client, keys, upload_dataset, data, kind):
    dataset = upload(upload_dataset, client, keys, data, kind)
    cost = {"mu": "0.1"} if kind == "gaussian" else {"rho": "0.005"}
    body = {"mechanism": "continual_gauss", "k": 2, "params": {"clip_norm": 1.0, "horizon": 8}}
    response = client.post(
        releases_url(dataset), headers=bearer(keys.analyst), json={**body, **cost}
    )
    assert response.status_code == 202, response.text
    target = Decimal("0.005")
    assert target * Decimal("0.999999") < Decimal(response.json()["rho"]) <= target


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
def test_a_refund_gives_back_exactly_the_charge_and_reconciles(
    client, keys, upload_dataset, data, run_worker, session_factory, kind, refused_before_reading
):
    dataset = upload(upload_dataset, client, keys, data, kind, row_norm_bound=1.0)
    cost = {"mu": "0.1"} if kind == "gaussian" else {"rho": "0.005"}
    release = ask(client, keys.analyst, dataset, **cost).json()
    # The job fails before it reads a row: it provably never read them, so it is refunded.
    run_worker()
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.analyst)).json()
    assert body["refunded"] is True
    with session_factory() as session:
        entries = session.scalars(select(LedgerEntry).order_by(LedgerEntry.id)).all()
        assert [(e.kind, e.rho) for e in entries] == [
            ("charge", Decimal(release["rho"])),
            ("refund", Decimal(release["rho"])),
        ]
        report = audit.verify(session)
    assert report.ok, report.problems


def test_a_hybrid_refund_zeroes_its_release_in_every_filter_and_reconciles(
    client, keys, upload_dataset, data, run_worker, session_factory, refused_before_reading
):
    dataset = upload(upload_dataset, client, keys, data, "hybrid", row_norm_bound=1.0)
    release = ask(client, keys.analyst, dataset, mu="0.1").json()
    run_worker()
    body = client.get(f"/v1/releases/{release['id']}", headers=bearer(keys.analyst)).json()
    assert body["refunded"] is True
    with session_factory() as session:
        entries = session.scalars(select(LedgerEntry).order_by(LedgerEntry.id)).all()
        assert [e.kind for e in entries] == ["charge", "refund"]
        charge, refund = entries
        moved = ("epsilon", "delta", "rho", "gdp", "zcdp_delta")
        assert all(getattr(charge, name) == getattr(refund, name) for name in moved)
        assert charge.gdp is not None and charge.epsilon > 0
        # the refunded release is a zero-cost step in every filter (ledger.refund's argument;
        # it gave nothing back before follow-up 4 of issue 31 item 5)
        row = session.get(Dataset, uuid.UUID(dataset["id"]))
        state = ledger.budget_of(session, row)
        assert (state.gdp_spent, state.rho_spent) == (0, 0)
        assert (state.epsilon_spent, state.delta_spent) == (0, 0)
        assert state.hybrid().all_gdp and state.hybrid().all_profiled
        report = audit.verify(session)
    assert report.ok, report.problems


def test_a_zcdp_dry_run_of_a_gaussian_release_states_what_gaussian_accounting_would_save(
    client, keys, upload_dataset, data
):
    dataset = upload(upload_dataset, client, keys, data, "zcdp", row_norm_bound=1.0)
    shown = ask(client, keys.analyst, dataset, dry=True, rho="0.005").json()
    notes = [line for line in shown["meaning"] if "accounting gaussian" in line]
    # At (1, 1e-6): sqrt(rho_B / (mu_B^2/2)) = 1/1.105, so 9.5% less noise.
    mu = accounting.mu_budget(Decimal(1), Decimal("1e-6"))
    rho = Decimal(dataset["budget"]["rho_total"])
    saving = 1 - math.sqrt(float(rho) / (float(mu) ** 2 / 2))
    assert 0.09 < saving < 0.10 and len(notes) == 1 and f"{saving:.1%}" in notes[0]
    # Not for a release that is not purely Gaussian, nor on a gaussian dataset.
    friendly = {"mechanism": "friendly_aggregate", "k": 1, "epsilon": "0.5", "delta": "2e-7"}
    other = client.post(
        releases_url(dataset) + "?dry_run=true", headers=bearer(keys.analyst), json=friendly
    )
    if other.status_code == 200:
        assert not [line for line in other.json()["meaning"] if "accounting gaussian" in line]
    gaussian = upload(upload_dataset, client, keys, data, "gaussian", row_norm_bound=1.0)
    plain = ask(client, keys.analyst, gaussian, dry=True, mu="0.1").json()
    assert not [line for line in plain["meaning"] if "accounting gaussian" in line]


def test_hybrid_takes_epsilon_mu_or_rho_and_says_which_does_not_fit(
    client, keys, upload_dataset, data
):
    dataset = upload(upload_dataset, client, keys, data, "hybrid", row_norm_bound=1.0)
    # mu: the release's GDP mu (filter A'), calibrated to it from below
    by_mu = ask(client, keys.analyst, dataset, dry=True, mu="0.1").json()
    assert Decimal("0.0999999") < Decimal(by_mu["mu"]) <= Decimal("0.1")
    assert by_mu["admitted_by"] == ["gdp", "zcdp", "basic"]
    # rho: filter B's currency
    by_rho = ask(client, keys.analyst, dataset, dry=True, rho="0.001").json()
    assert Decimal(by_rho["rho"]) <= Decimal("0.001")
    # epsilon and delta: one release; at the whole (1, 1e-6) no filter admits it (A' has 96%
    # of delta, C 1%), and the dry run says so before anything is spent
    whole = ask(client, keys.analyst, dataset, dry=True, epsilon="1", delta="1e-6").json()
    assert whole["admitted_by"] == [] and whole["affordable"] is False
    # an approximate mechanism cannot be asked in mu (its steps have no GDP figure)
    friendly = {"mechanism": "friendly_aggregate", "k": 1, "mu": "0.1"}
    refused = client.post(releases_url(dataset), headers=bearer(keys.analyst), json=friendly)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"].startswith("mu") and "GDP filter" in refused.text
