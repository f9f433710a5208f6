"""The Python client against the real ASGI app (SQLite and PostgreSQL, via tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from dpss_client.client import (
    AuthError,
    BudgetExceededError,
    Client,
    InvalidRequestError,
    NotFoundError,
    ReleaseFailed,
    ReleaseNoResult,
    WaitTimeoutError,
)
from tests.client.data import isotropic_rows, low_rank_rows

MakeKey = Callable[[str], str]


def test_upload_array_streams_npy(owner: Client) -> None:
    x = np.asfortranarray(low_rank_rows(300, 6, 2, seed=1))
    ds = owner.upload(
        x, name="fortran-array", epsilon_budget="1.0", delta_budget="1e-5", row_norm_bound=1.0
    )
    assert (ds.name, ds.n_rows, ds.n_cols, ds.row_norm_bound) == ("fortran-array", 300, 6, 1.0)
    assert ds.budget.epsilon_total == Decimal("1.0")
    assert ds.budget.delta_remaining == Decimal("0.00001")
    assert ds.id in {d.id for d in owner.datasets()}
    assert owner.dataset(ds.id).n_rows == 300


@pytest.mark.parametrize("suffix", [".csv", ".npy"])
def test_upload_path(owner: Client, tmp_path: Path, suffix: str) -> None:
    x = low_rank_rows(120, 5, 2, seed=2)
    path = tmp_path / f"patients{suffix}"
    if suffix == ".csv":
        np.savetxt(path, x, delimiter=",", fmt="%.17g")
    else:
        np.save(path, x)
    ds = owner.upload(path, epsilon_budget=2, delta_budget="0.000001")
    assert (ds.name, ds.n_rows, ds.n_cols, ds.row_norm_bound) == ("patients", 120, 5, None)
    assert ds.budget.epsilon_total == Decimal(2)


def test_release_wait_returns_orthonormal_basis(
    owner: Client, analyst: Client, run_worker: Callable[[], int]
) -> None:
    d, k = 8, 3
    ds = owner.upload(
        low_rank_rows(2000, d, k, seed=3),
        name="low-rank",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    release = analyst.release(ds.id, "analyze_gauss", k, "0.5", "1e-6")
    assert release.status == "queued"
    assert run_worker() >= 1
    basis = release.wait(progress=True)
    assert basis.shape == (d, k)
    np.testing.assert_allclose(basis.T @ basis, np.eye(k), atol=1e-8)
    assert release.status == "succeeded"
    assert release.info.result is not None and release.info.result.basis_sha256
    # Exact decimal accounting: 1 - 0.5 and 1e-5 - 1e-6, no float residue.
    budget = analyst.budget(ds.id)
    assert (budget.epsilon_remaining, budget.delta_remaining) == (
        Decimal("0.5"),
        Decimal("0.000009"),
    )
    # A second handle on the same release returns the same basis.
    np.testing.assert_array_equal(analyst.get_release(release.id).basis(), basis)


def test_ten_releases_of_a_tenth_fit_a_budget_of_one(
    owner: Client, analyst: Client, run_worker: Callable[[], int]
) -> None:
    ds = owner.upload(
        low_rank_rows(200, 4, 1, seed=4),
        name="tenths",
        epsilon_budget="1.0",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    for _ in range(10):
        analyst.release(ds.id, "analyze_gauss", 1, 0.1, 1e-7)
    assert analyst.budget(ds.id).epsilon_remaining == 0
    with pytest.raises(BudgetExceededError) as caught:
        analyst.release(ds.id, "analyze_gauss", 1, 0.1, 1e-7)
    assert caught.value.status == 409 and caught.value.code == "budget_exceeded"
    assert caught.value.epsilon_remaining == 0
    assert caught.value.delta_remaining == Decimal("0.000009")


@pytest.mark.parametrize("kind", ["gaussian", "zcdp"])
def test_mu_and_rho_wherever_epsilon_is_accepted(
    owner: Client, analyst: Client, run_worker: Callable[[], int], kind: str
) -> None:
    ds = owner.upload(
        low_rank_rows(200, 4, 1, seed=6),
        name=f"filter-{kind}",
        epsilon_budget="1",
        delta_budget="1e-6",
        row_norm_bound=1.0,
        accounting=kind,
        **({"mu_budget": "0.2"} if kind == "gaussian" else {"rho_budget": "0.02"}),
    )
    assert ds.budget.accounting == kind
    cost = {"mu": "0.1"} if kind == "gaussian" else {"rho": "0.005"}
    shown = analyst.preview_release(ds.id, "analyze_gauss", 1, **cost)
    assert shown.releases_remaining == 4 and shown.mu is not None
    for _ in range(4):
        analyst.release(ds.id, "analyze_gauss", 1, **cost)
    with pytest.raises(BudgetExceededError) as caught:
        analyst.release(ds.id, "analyze_gauss", 1, **cost)
    assert caught.value.rho_remaining is not None and caught.value.rho_remaining < Decimal("0.005")
    budget = analyst.budget(ds.id)
    assert budget.rho_spent is not None and budget.rho_spent <= budget.rho_total


def test_budget_exceeded_charges_nothing(owner: Client, analyst: Client) -> None:
    ds = owner.upload(
        low_rank_rows(100, 4, 1, seed=5),
        name="small-budget",
        epsilon_budget="0.5",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    with pytest.raises(BudgetExceededError) as caught:
        analyst.release(ds.id, "analyze_gauss", 1, "0.6", "1e-6")
    assert caught.value.epsilon_remaining == Decimal("0.5")
    assert caught.value.delta_remaining == Decimal("0.00001")
    assert analyst.budget(ds.id).epsilon_spent == 0


def test_no_result_raises(owner: Client, analyst: Client, run_worker: Callable[[], int]) -> None:
    if "gap_perturbation" not in {m.name for m in analyst.mechanisms()}:
        pytest.skip("gap_perturbation is not registered yet: no mechanism to force no_result")
    ds = owner.upload(
        isotropic_rows(500, 6, seed=6),
        name="isotropic",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    release = analyst.release(ds.id, "gap_perturbation", 2, "0.5", "1e-6")
    run_worker()
    with pytest.raises(ReleaseNoResult) as caught:
        release.wait()
    assert caught.value.code == "no_result"
    assert caught.value.release.status == "no_result"
    # The attempt is charged: a no_result is itself a private output.
    assert analyst.budget(ds.id).epsilon_spent == Decimal("0.5")


def test_wait_polls_until_finished(owner: Client, analyst: Client, worker_sleep: None) -> None:
    ds = owner.upload(
        low_rank_rows(300, 5, 2, seed=7),
        name="polled",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    release = analyst.release(ds.id, "analyze_gauss", 2, "0.5", "1e-6")
    assert release.wait(progress=False, poll_interval=0.01).shape == (5, 2)


def test_wait_timeout(owner: Client, analyst: Client) -> None:
    ds = owner.upload(
        low_rank_rows(100, 4, 1, seed=8),
        name="never-run",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    release = analyst.release(ds.id, "analyze_gauss", 1, "0.5", "1e-6")
    with pytest.raises(WaitTimeoutError):
        release.wait(timeout=0.3, poll_interval=0.05)
    assert release.status == "queued"


def test_idempotency_key_never_charges_twice(owner: Client, analyst: Client) -> None:
    ds = owner.upload(
        low_rank_rows(100, 4, 1, seed=9),
        name="idempotent",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    first = analyst.release(ds.id, "analyze_gauss", 1, "0.5", "1e-6", idempotency_key="abc")
    again = analyst.release(ds.id, "analyze_gauss", 1, "0.5", "1e-6", idempotency_key="abc")
    assert again.id == first.id
    assert analyst.budget(ds.id).epsilon_spent == Decimal("0.5")


def test_refusals_are_typed(
    owner: Client, analyst: Client, connect: Callable[[str], Client]
) -> None:
    x = low_rank_rows(50, 4, 1, seed=10)
    with pytest.raises(AuthError) as bad_key:
        connect("not-a-key").budget("00000000-0000-0000-0000-000000000000")
    assert bad_key.value.status == 401
    with pytest.raises(AuthError) as wrong_role:
        analyst.upload(x, name="nope", epsilon_budget=1, delta_budget=0)
    assert wrong_role.value.status == 403
    with pytest.raises(NotFoundError):
        analyst.budget("00000000-0000-0000-0000-000000000000")
    ds = owner.upload(x, name="refusals", epsilon_budget=1, delta_budget="1e-5")
    with pytest.raises(InvalidRequestError) as too_big_k:
        analyst.release(ds.id, "analyze_gauss", 5, "0.5", "1e-6")
    assert too_big_k.value.status == 422 and "k" in too_big_k.value.detail
    with pytest.raises(InvalidRequestError):
        analyst.release(ds.id, "no_such_mechanism", 1, "0.5", "1e-6")
    with pytest.raises(InvalidRequestError):
        analyst.release(ds.id, "analyze_gauss", 1, "0.5", "1e-6", no_such_param=1)
    assert analyst.budget(ds.id).epsilon_spent == 0


def test_mechanisms_and_audit(
    owner: Client, analyst: Client, make_key: MakeKey, connect: Callable[[str], Client]
) -> None:
    mechanisms = {m.name: m for m in analyst.mechanisms()}
    assert mechanisms["analyze_gauss"].releases_basis
    ds = owner.upload(
        low_rank_rows(60, 4, 1, seed=11), name="audited", epsilon_budget=1, delta_budget="1e-5"
    )
    analyst.release(ds.id, "analyze_gauss", 1, "0.25", "1e-6", clip_norm=2.0)
    auditor = connect(make_key("auditor"))
    page = auditor.audit(limit=1)
    assert len(page.items) == 1 and page.next_after is not None
    events = list(auditor.audit_events(page_size=2))
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert len({e.seq for e in events}) == len(events)
    kinds = {(e.event_type, e.dataset_id) for e in events}
    assert ("dataset_created", ds.id) in kinds
    assert ("release_requested", ds.id) in kinds
    with pytest.raises(AuthError):
        analyst.audit()


def test_failed_release_raises_and_is_refunded(
    owner: Client, analyst: Client, run_worker: Callable[[], int], refused_before_reading: None
) -> None:
    ds = owner.upload(
        low_rank_rows(100, 4, 1, seed=12),
        name="refused-before-reading",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    release = analyst.release(ds.id, "analyze_gauss", 1, "0.5", "1e-6")
    run_worker()
    with pytest.raises(ReleaseFailed) as caught:
        release.wait()
    assert caught.value.code == "failed"
    assert caught.value.release.refunded
    assert "refunded" in caught.value.detail


def test_release_defaults_to_auto_and_keeps_positional_calls(
    owner: Client, analyst: Client
) -> None:
    # `Client.release` required `mechanism` where the API advises `auto` when unsure and
    # `dpss releases create` sends it by default: now omitted means auto, k stays required,
    # and the positional (dataset, mechanism, k, epsilon, delta) order still works.
    ds = owner.upload(
        low_rank_rows(200, 5, 2, seed=41),
        name="defaults",
        epsilon_budget=2,
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    defaulted = analyst.release(ds.id, k=2, epsilon="0.5")
    assert defaulted.info.mechanism == "auto"
    assert defaulted.info.delta == Decimal("1e-7")  # min(1e-6, delta_total/100)
    positional = analyst.release(ds.id, "analyze_gauss", 2, "0.25", "1e-6")
    assert positional.info.mechanism == "analyze_gauss"
    preview = analyst.preview_release(ds.id, k=2, epsilon="0.25")
    assert preview.mechanism == "auto"
    with pytest.raises(TypeError, match="missing required argument 'k'"):
        analyst.release(ds.id, epsilon="0.5")
    with pytest.raises(TypeError, match="missing required argument 'k'"):
        analyst.preview_release(ds.id, epsilon="0.5")
    # A param auto does not take: the refusal says auto was the default and how to set it;
    # with mechanism="auto" named it is the service's message as it is.
    for call in (analyst.release, analyst.preview_release):
        with pytest.raises(InvalidRequestError) as defaulted_refusal:
            call(ds.id, k=2, epsilon="0.5", clip_quantile=0.3)
        detail = defaulted_refusal.value.detail
        assert detail.startswith("params.clip_quantile: unknown field (no mechanism was given")
        assert 'pass mechanism="analyze_gauss"' in detail
        with pytest.raises(InvalidRequestError) as named:
            call(ds.id, "auto", 2, "0.5", clip_quantile=0.3)
        assert "no mechanism was given" not in named.value.detail
    assert analyst.budget(ds.id).epsilon_spent == Decimal("0.75")


def test_an_array_uploaded_without_a_name_is_named_by_its_shape(owner: Client) -> None:
    # `name=` was required for arrays (TypeError) while a file defaults to its stem: a
    # newcomer's first `upload(x, epsilon_budget=..., delta_budget=...)` failed.
    ds = owner.upload(low_rank_rows(120, 5, 2, seed=42), epsilon_budget=1, delta_budget="1e-5")
    assert (ds.name, ds.n_rows, ds.n_cols) == ("array-120x5", 120, 5)
    rows = np.c_[np.repeat(np.arange(40), 3), low_rank_rows(120, 4, 2, seed=43)]
    people = owner.upload(rows, epsilon_budget=1, delta_budget="1e-5", privacy_unit_column=0)
    assert (people.name, people.n_cols) == ("array-120x4", 4)
