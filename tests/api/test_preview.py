"""Preview before spending: `?dry_run=true` validates like a real request and charges nothing."""

from __future__ import annotations

import math
import uuid
from decimal import Decimal

import numpy as np
import pytest
from sqlalchemy import func, select

from service import audit
from service.db.models import AuditEvent, LedgerEntry, Release
from service.mechanisms.analyze_gauss import (
    AnalyzeGaussParams,
    expected_noise_norm,
    gauss_split,
    gram_sensitivity,
)
from service.mechanisms.base import Preview, PublicContext, ReleaseSpec
from service.mechanisms.explained_variance import HIDDEN_WIDTH
from service.mechanisms.registry import get_mechanism
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import bearer, release_and_wait
from tests.factories import hybrid_with_filter_c_closed, near_subspace


def request(client, key, dataset_id, headers=None, dry_run=True, **body):
    payload = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-7", **body}
    return client.post(
        f"/v1/datasets/{dataset_id}/releases",
        params={"dry_run": "true"} if dry_run else None,
        headers={**bearer(key), **(headers or {})},
        json=payload,
    )


@pytest.fixture
def dataset(client, keys, upload_dataset, rng):
    data, _ = near_subspace(rng, 200, 6, 2)
    return upload_dataset(
        client, keys.owner, data, epsilon_budget="1.0", delta_budget="1e-5", row_norm_bound=1.0
    )


def counts(session_factory):
    with session_factory() as session:
        return (
            session.scalar(select(func.count()).select_from(Release)),
            session.scalar(select(func.count()).select_from(LedgerEntry)),
            list(session.scalars(select(AuditEvent.event_type).order_by(AuditEvent.seq))),
        )


def test_dry_run_charges_nothing_creates_nothing_and_writes_one_event(
    client, keys, dataset, session_factory
):
    releases_before, ledger_before, events_before = counts(session_factory)
    response = request(client, keys.analyst, dataset["id"])
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["dry_run"] is True
    assert body["affordable"] is True
    assert (body["epsilon"], body["delta"]) == ("0.1", "0.0000001")
    assert body["epsilon_remaining"] == "1"
    assert body["params"] == {"clip_norm": 1.0}
    sigma = gram_sensitivity(1.0) / gauss_split(0.1, 1e-7, AnalyzeGaussParams()).gram_mu
    assert body["scales"]["sigma"] == sigma
    assert body["scales"]["noise_spectral_norm"] == expected_noise_norm(sigma, 6)
    assert body["meaning"] and all(isinstance(line, str) for line in body["meaning"])
    releases_after, ledger_after, events_after = counts(session_factory)
    assert (releases_after, ledger_after) == (releases_before, ledger_before) == (0, 0)
    assert events_after == [*events_before, "release_previewed"]
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.analyst))
    assert budget.json()["epsilon_spent"] == "0"
    with session_factory() as session:
        event = session.scalars(select(AuditEvent).order_by(AuditEvent.seq.desc())).first()
        assert event.release_id is None
        cost = event.details["cost"]
        assert (Decimal(cost["epsilon"]), Decimal(cost["delta"])) == (
            Decimal("0.1"),
            Decimal("1e-7"),
        )
        assert event.details["params"] == {"clip_norm": 1.0}
        report = audit.verify(session)
    assert report.ok, report.problems


def test_audit_verify_flags_a_preview_that_names_a_release(client, keys, dataset, session_factory):
    assert request(client, keys.analyst, dataset["id"]).status_code == 200
    with session_factory() as session:
        event = session.scalars(
            select(AuditEvent).where(AuditEvent.event_type == "release_previewed")
        ).one()
        event.release_id = event.dataset_id
        session.commit()
        problems = audit.verify(session).problems
    assert any("release_previewed event names a release" in p for p in problems)


def test_an_unaffordable_dry_run_reports_it_instead_of_409(client, keys, dataset):
    response = request(client, keys.analyst, dataset["id"], epsilon="2")
    assert response.status_code == 200
    body = response.json()
    assert body["affordable"] is False
    assert (body["epsilon_remaining"], body["delta_remaining"]) == ("1", "0.00001")
    real = request(client, keys.analyst, dataset["id"], dry_run=False, epsilon="2")
    assert real.status_code == 409


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"mechanism": "nope"}, "mechanism"),
        ({"params": {"clip_norm": -1}}, "params.clip_norm"),
        ({"params": {"clip_norm": 1e300}}, "params.clip_norm"),
        ({"k": 7}, "k"),
        ({"epsilon": "0.1000000000000000000000000000001"}, "epsilon"),
    ],
)
def test_a_dry_run_is_refused_exactly_like_a_real_request(
    client, keys, dataset, session_factory, body, field
):
    events_before = counts(session_factory)[2]
    preview = request(client, keys.analyst, dataset["id"], **body)
    real = request(client, keys.analyst, dataset["id"], dry_run=False, **body)
    assert preview.status_code == real.status_code == 422
    assert preview.json() == real.json()
    assert field in preview.json()["detail"]
    assert counts(session_factory) == (0, 0, events_before)


def test_a_dry_run_over_the_memory_limit_gets_the_same_422(
    client, keys, dataset, settings, session_factory
):
    settings.worker_memory_mb = 1e-6
    preview = request(client, keys.analyst, dataset["id"])
    real = request(client, keys.analyst, dataset["id"], dry_run=False)
    assert preview.status_code == real.status_code == 422
    assert preview.json() == real.json()
    assert "DPSS_WORKER_MEMORY_MB" in preview.json()["detail"]
    # The limit as it is (it was "0 MiB": whole MiB, rounded down).
    assert "above the worker limit of 1 bytes" in preview.json()["detail"]
    assert counts(session_factory)[:2] == (0, 0)


def test_only_analysts_preview(client, keys, dataset):
    assert request(client, keys.owner, dataset["id"]).status_code == 403


def test_an_idempotency_key_is_refused_for_a_dry_run(client, keys, dataset, session_factory):
    response = request(client, keys.analyst, dataset["id"], headers={"Idempotency-Key": "k1"})
    assert response.status_code == 422
    assert "Idempotency-Key" in response.json()["detail"]
    assert counts(session_factory)[:2] == (0, 0)


def test_a_dry_run_of_a_missing_dataset_is_404(client, keys):
    missing = "00000000-0000-4000-8000-000000000000"
    assert request(client, keys.analyst, missing).status_code == 404


def test_openapi_documents_dry_run_and_the_preview_schema(client):
    spec = client.get("/openapi.json").json()
    operation = spec["paths"]["/v1/datasets/{dataset_id}/releases"]["post"]
    names = {p["name"]: p for p in operation["parameters"]}
    assert names["dry_run"]["in"] == "query"
    assert names["dry_run"]["description"]
    ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    schema = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert set(schema["required"]) >= {"affordable", "scales", "meaning", "epsilon"}
    assert all(prop.get("description") for prop in schema["properties"].values())


def test_a_non_finite_scale_is_shown_as_null_not_a_500(client, keys, dataset, monkeypatch):
    mechanism = get_mechanism("analyze_gauss")
    monkeypatch.setattr(
        type(mechanism),
        "preview",
        lambda self, ctx, spec: Preview(scales={"sigma": math.inf, "k": 2}, meaning=["x"]),
    )
    response = request(client, keys.analyst, dataset["id"])
    assert response.status_code == 200
    assert response.json()["scales"] == {"sigma": None, "k": 2}


def test_the_readme_example_with_json_numbers(client, keys, dataset):
    response = client.post(
        f"/v1/datasets/{dataset['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json={"mechanism": "analyze_gauss", "k": 3, "epsilon": 0.5, "delta": 1e-6},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["epsilon"], body["delta"], body["dry_run"]) == ("0.5", "0.000001", True)
    assert {"sigma", "noise_spectral_norm", "gap_for_error_0_1"} <= set(body["scales"])


def test_a_forecast_from_an_earlier_release_reads_its_released_figures(
    client, keys, dataset, run_worker
):
    # Issue 32 item 4: the dry run's forecast from what an earlier release published.
    body = {"k": 2, "epsilon": "0.3", "delta": "1e-7", "params": {"center": "private"}}
    earlier = release_and_wait(
        client, keys.analyst, dataset["id"], run_worker, mechanism="analyze_gauss", **body
    )
    assert earlier["status"] == "succeeded", earlier
    release_id = earlier["id"]
    extras = earlier["result"]["extras"]
    response = client.post(
        f"/v1/datasets/{dataset['id']}/releases",
        params={"dry_run": "true", "forecast_from": release_id},
        headers=bearer(keys.analyst),
        json={"mechanism": "analyze_gauss", **body},
    )
    assert response.status_code == 200, response.text
    scales = response.json()["scales"]
    share = scales["forecast_from_release_captured_share"]
    least = scales["forecast_from_release_captured_share_low"]
    most = scales["forecast_from_release_captured_share_high"]
    assert 0.0 <= least <= most <= 1.0
    assert 0.0 <= scales["forecast_from_release_unseen_share"] <= 1.0
    # A point only where the range is at most 0.2 wide (as the public-facts forecast's).
    assert scales["forecast_from_release_determined"] == (share is not None)
    if share is not None:
        assert least <= share <= most and most - least <= 0.2
    low, high = extras["explained_variance_ratio_interval"]
    if high - low < HIDDEN_WIDTH and not extras["explained_variance_hidden_by_noise"]:
        # (A narrow interval cut at 0 or 1 is flagged hidden and read off the spectrum: the
        # test failed once on such a release, unseeded.)
        # A measured share at an unchanged noise and k: no more than the earlier interval
        # allows (the centred routes; uncentred, the mean's direction is not in the share).
        assert scales["forecast_from_release_basis"] == "measured share"
        if extras.get("centring") != "none":
            assert most <= high + 1e-9
    else:
        # A hidden one: read from the released eigenvalues and trace.
        assert scales["forecast_from_release_basis"] == "spectrum"
    assert (
        scales["forecast_from_release_hidden_by_noise"]
        == (extras["explained_variance_hidden_by_noise"])
    )
    assert any("earlier release" in line for line in response.json()["meaning"])
    # Not a preview: refused at its field.
    refused = client.post(
        f"/v1/datasets/{dataset['id']}/releases",
        params={"forecast_from": release_id},
        headers=bearer(keys.analyst),
        json={"mechanism": "analyze_gauss", **body},
    )
    assert refused.status_code == 422
    assert "forecast_from" in refused.text
    # A release the caller cannot read is not found, whoever else may read it.
    other = client.post(
        f"/v1/datasets/{dataset['id']}/releases",
        params={"dry_run": "true", "forecast_from": str(uuid.uuid4())},
        headers=bearer(keys.analyst),
        json={"mechanism": "analyze_gauss", **body},
    )
    assert other.status_code == 404


def test_a_dry_run_whose_plan_counts_past_28_digits_answers(client, keys, upload_dataset, rng):
    # The advice counts epsilon_total // epsilon releases: 1e29 here, past the default decimal
    # context's 28 digits (it used to raise and answer 500).
    data, _ = near_subspace(rng, 200, 6, 2)
    dataset = upload_dataset(
        client, keys.owner, data, epsilon_budget="1000", delta_budget="1e-5", row_norm_bound=1.0
    )
    response = request(client, keys.analyst, dataset["id"], epsilon="1e-26")
    assert response.status_code == 200, response.text
    assert response.json()["dry_run"] is True


def test_a_forecast_from_a_release_before_its_visible_at_does_not_tell_it_ran(
    padded_client, padded_settings, keys, upload_dataset, session_factory, rng
):
    # The forecast reads the earlier release's result: before that release's visible_at the
    # analyst sees it queued, so the dry run must answer the same whether the job has run or
    # not (its real status, let alone its extras, would tell the run time the padding hides).
    data, _ = near_subspace(rng, 200, 6, 2)
    dataset = upload_dataset(
        padded_client, keys.owner, data, epsilon_budget="1.0", delta_budget="1e-5",
        row_norm_bound=1.0,
    )  # fmt: skip
    body = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.3", "delta": "1e-7"}
    made = padded_client.post(
        f"/v1/datasets/{dataset['id']}/releases", headers=bearer(keys.analyst), json=body
    )
    assert made.status_code == 202, made.text
    earlier = made.json()["id"]

    def forecast() -> tuple[int, str]:
        response = padded_client.post(
            f"/v1/datasets/{dataset['id']}/releases",
            params={"dry_run": "true", "forecast_from": earlier},
            headers=bearer(keys.analyst),
            json=body,
        )
        return response.status_code, response.text

    before = forecast()
    store = DatasetStore(padded_settings.datasets_dir)
    assert Worker(session_factory, store, padded_settings, worker_id="w").run_pending() == 1
    with session_factory() as session:  # no caller but admins sees it before visible_at
        assert session.get(Release, uuid.UUID(earlier)).status == "succeeded"
    assert forecast() == before
    assert before[0] == 422 and "forecast_from" in before[1]


def test_releases_remaining_is_zero_when_a_filter_the_others_overspent_is_closed(
    client, keys, upload_dataset, rng
):
    # Filter C is closed by the Gaussian releases A' admitted: a pure release is unaffordable,
    # and the dry run must not say that one more fits.
    dataset = hybrid_with_filter_c_closed(client, keys.owner, keys.analyst, upload_dataset, rng)
    shown = request(
        client, keys.analyst, dataset["id"], mechanism="smooth_sensitivity", epsilon="0.5",
        delta="0",
    ).json()  # fmt: skip
    assert shown["affordable"] is False and shown["admitted_by"] == [], shown
    assert shown["releases_remaining"] == 0, shown


def auto_forecast(client, key, dataset_id, earlier_id, **body):
    return client.post(
        f"/v1/datasets/{dataset_id}/releases",
        params={"dry_run": "true", "forecast_from": earlier_id},
        headers=bearer(key),
        json={"mechanism": "auto", "params": {"center": "private"}, **body},
    )


def test_a_forecast_from_a_default_pca_release_is_its_analyze_gauss_forecast(
    client, keys, dataset, run_worker
):
    # Issue 32 item 4 on the default path: PrivatePCA sends auto with a private centre, which
    # runs analyze_gauss at d < n^(2/3); its dry run took no forecast_from (422 "made for
    # analyze_gauss"), so the forecast was out of reach of a user who set nothing.
    body = {"k": 2, "epsilon": "0.3", "delta": "1e-7"}
    earlier = release_and_wait(
        client, keys.analyst, dataset["id"], run_worker, mechanism="auto",
        params={"center": "private"}, **body,
    )  # fmt: skip
    assert earlier["status"] == "succeeded", earlier
    extras = earlier["result"]["extras"]
    assert extras["auto_choice"] == "analyze_gauss"
    response = auto_forecast(client, keys.analyst, dataset["id"], earlier["id"], **body)
    assert response.status_code == 200, response.text
    scales = response.json()["scales"]
    # Exactly analyze_gauss's forecast between the component's specs (what ran, released).
    gauss = get_mechanism("analyze_gauss")
    spec = ReleaseSpec(2, 0.3, 1e-7, gauss.parse_params(extras["auto_params"]))
    ctx = PublicContext(n_rows=200, n_cols=6, row_norm_bound=1.0)
    expected, meaning = gauss.forecast_from(ctx, spec, spec, extras)
    assert {key: scales[key] for key in expected} == pytest.approx(expected)
    assert meaning[0] in response.json()["meaning"]


def test_a_forecast_from_a_high_dimension_default_release_is_its_measured_share(
    client, keys, upload_dataset, run_worker, rng
):
    # At d >= n^(2/3) auto runs spatial_sign (MNIST's default): the same request forecasts
    # from the earlier release's stated share and 90% interval; other settings get no figure
    # (the signs' Gram does not carry to another noise or k), and a request that would run
    # another mechanism is refused.
    data, _ = near_subspace(rng, 400, 60, 2, noise=0.3)
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)
    body = {"k": 2, "epsilon": "3", "delta": "1e-6"}
    earlier = release_and_wait(
        client, keys.analyst, dataset["id"], run_worker, mechanism="auto",
        params={"center": "private"}, **body,
    )  # fmt: skip
    extras = earlier["result"]["extras"]
    assert extras["auto_choice"] == "spatial_sign"
    low, high = extras["explained_variance_ratio_interval"]
    response = auto_forecast(client, keys.analyst, dataset["id"], earlier["id"], **body)
    assert response.status_code == 200, response.text
    scales = response.json()["scales"]
    assert scales["forecast_from_release_basis"] == "measured share"
    assert (
        scales["forecast_from_release_captured_share_low"],
        scales["forecast_from_release_captured_share_high"],
    ) == pytest.approx((low, high))
    share = scales["forecast_from_release_captured_share"]
    determined = high - low <= 0.2 and not extras["explained_variance_hidden_by_noise"]
    assert scales["forecast_from_release_determined"] is determined
    if determined:
        assert share == pytest.approx(min(max(sum(extras["explained_variance_ratio"]), low), high))
    else:
        assert share is None
    other = auto_forecast(client, keys.analyst, dataset["id"], earlier["id"], **{**body, "k": 3})
    assert other.status_code == 200, other.text
    assert other.json()["scales"]["forecast_from_release_captured_share"] is None
    assert other.json()["scales"]["forecast_from_release_determined"] is False
    switched = auto_forecast(
        client, keys.analyst, dataset["id"], earlier["id"], **{**body, "epsilon": "0.3"}
    )
    assert switched.status_code == 422
    assert "spatial_sign" in switched.text


def test_a_dry_run_states_epsilon_remaining_pure_as_the_budget_does(
    client, keys, upload_dataset, rng
):
    # epsilon_remaining_pure (what a pure release is admitted at now) was on budgets, grants
    # and 409s but not on a preview, where a user deciding a release looks: on hybrid after
    # filter C closed it is far below epsilon_remaining, and a pure request is refused.
    dataset = hybrid_with_filter_c_closed(client, keys.owner, keys.analyst, upload_dataset, rng)
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner)).json()
    pure = request(
        client, keys.analyst, dataset["id"], mechanism="smooth_sensitivity", epsilon="0.5",
        delta="0",
    ).json()  # fmt: skip
    gaussian = request(client, keys.analyst, dataset["id"]).json()
    for shown in (pure, gaussian):
        assert shown["epsilon_remaining_pure"] == budget["epsilon_remaining_pure"], shown
        assert shown["epsilon_remaining"] == budget["epsilon_remaining"], shown
    assert Decimal(pure["epsilon_remaining_pure"]) < Decimal(pure["epsilon_remaining"])
    assert pure["affordable"] is False
    # The hybrid note names the figure a pure request should read, not only epsilon_remaining.
    (note,) = [line for line in pure["meaning"] if line.startswith("No filter")]
    assert "epsilon_remaining_pure a pure release at delta 0" in note, note


def test_a_dry_run_under_a_grant_states_the_grants_epsilon_remaining_pure(client, keys, dataset):
    made = client.post(
        f"/v1/datasets/{dataset['id']}/grants",
        headers=bearer(keys.owner),
        json={"epsilon": "0.3", "delta": "1e-6"},
    )
    assert made.status_code == 201, made.text
    shown = request(client, keys.analyst, dataset["id"]).json()
    assert shown["budget"] == "grant", shown
    assert shown["epsilon_remaining_pure"] == made.json()["epsilon_remaining_pure"], shown


@pytest.mark.parametrize("k", [2, 6])
def test_a_noise_only_dry_run_states_what_a_random_subspace_keeps(
    client, keys, upload_dataset, rng, k
):
    # 30 isotropic rows at eps 0.1: no direction of any data stands out of the noise. Before,
    # the dry run said "about 0 of the variance" and "between 0.333 and 0.333" (k = d: "about
    # 0" and "between 1 and 1"); now one figure, k/d, said as what it is.
    rows = rng.standard_normal((30, 6))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    dataset = upload_dataset(
        client, keys.owner, rows, epsilon_budget="1.0", delta_budget="1e-5", row_norm_bound=1.0
    )
    response = request(client, keys.analyst, dataset["id"], k=k, params={"center": "none"})
    assert response.status_code == 200, response.text
    body = response.json()
    scales = body["scales"]
    assert scales["forecast_captured_share"] == pytest.approx(k / 6)
    assert scales["forecast_power_law_captured_share"] == pytest.approx(k / 6)
    text = " ".join(body["meaning"])
    assert "about 0 of the variance" not in text
    assert f"between {k / 6:.3g} and {k / 6:.3g}" not in text
    if k == 6:
        assert "keeps all of the variance whatever the spectrum" in text
        # No eigengap is needed for the whole space (there is no lambda_(d+1)).
        assert "k-th eigengap" not in text
        assert "the released subspace is the whole space" in text
    else:
        assert "random 2-dimensional subspace, which keeps k/d = 0.333" in text
