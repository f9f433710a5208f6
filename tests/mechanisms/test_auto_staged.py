"""``auto``'s staged regime (the aggregator's own private search is the structure test) and its
agreement regime (a two-count agreement test where that search is unreliable; after a
coarse-only agreement friendly_aggregate runs with a public radius given).

Checked here: continuing gives bit-identical output to the aggregator's own run (same seed);
the decision is a function of public facts and the released exponent only; a stop sends exactly
``(3 eps/4, delta)`` to analyze_gauss and a failed friendly test exactly ``(eps2, delta2)``; the
declared cost is the request; extreme inputs end succeeded or no_result; and on a seeded small
grid auto continues the aggregator on data within 1e-5 of a subspace and runs analyze_gauss on
isotropic data.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest

from bench.grids import near_subspace
from service.mechanisms import auto as auto_module
from service.mechanisms.analyze_gauss import noise_sigma
from service.mechanisms.auto import (
    AGREEMENT_FRACTION,
    AGREEMENT_SHARE,
    FINE_WIDTH_RATIO,
    GIVEN_RADIUS_FACTORS,
    RADIUS_TEST_SHARE,
    SEARCH_SHARE,
    Auto,
    AutoParams,
    agreement_decision,
    break_even_radius,
    fallback_budgets,
    friendly_spurious_stop_probability,
    noisy_agreement_count,
    noisy_agreement_counts,
    plan,
    predicted_friendly_error,
    predicted_gauss_error,
    ptr_fallback_budget,
    spurious_stop_probability,
    staged_decision,
)
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.friendly_aggregate import (
    FriendlyAggregate,
    GdpSplit,
    budget_split,
    radius_grid,
    radius_steps,
    release_split,
    split_search_threshold,
)
from service.mechanisms.histogram_aggregate import HistogramAggregate
from service.mechanisms.linalg import subspace_distance
from service.mechanisms.registry import MECHANISMS

AUTO = Auto()
K, DELTA = 3, 1e-6
#: Issue 24, item 5: where a test chose friendly_aggregate and friendly ends short of a result
#: before its own test (no radius, a radius where it is predicted to lose, a noisy weight below
#: its test's need), analyze_gauss gets at least this share of epsilon (less 1e-12: rounding).
FALLBACK_SHARE_FLOOR = 0.6 - 1e-12
#: A staged cell: friendly's search is reliable (t = 666, eps0 = 0.25: spurious stops 4e-4)
#: and the tail test is not useful (2/(0.1 n) = 1e-3 > 7.5e-4).
N = 20_000


def ctx(n: int, d: int) -> PublicContext:
    return PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)


def auto_spec(n: int, d: int, eps: float) -> ReleaseSpec[AutoParams]:
    return ReleaseSpec(K, eps, DELTA, AUTO.prepare(ctx(n, d), K, eps, DELTA, AutoParams()))


def isotropic(n: int, d: int, seed: int) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, d))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# The plan (public facts)


@pytest.mark.parametrize(("n", "eps"), [(N, 1.0), (200_000, 0.1)])
def test_where_the_tail_test_is_unaffordable_the_aggregator_is_staged(
    n: int, eps: float, basic_accounting: None
) -> None:
    the_plan = plan(ctx(n, 10), K, eps, DELTA, AutoParams(clip_norm=1.0))
    assert the_plan.aggregator is None and the_plan.test_epsilon == 0.0
    assert the_plan.agreement_epsilon == 0.0
    assert the_plan.staged is not None and the_plan.staged.name == "friendly_aggregate"
    # the aggregator gets the request less the noisy total weight's eps_w (before its test):
    # its own run, its own split
    w = the_plan.search_weight_epsilon
    assert w == pytest.approx(RADIUS_TEST_SHARE * eps, rel=1e-15)
    assert the_plan.staged.epsilon + w == pytest.approx(eps, rel=1e-15)
    assert the_plan.staged.delta == DELTA
    assert the_plan.staged.params.aggregator == "projection"  # type: ignore[attr-defined]
    t = the_plan.staged.params.t  # type: ignore[attr-defined]
    split = budget_split(the_plan.staged.epsilon, DELTA, False, t=t)
    assert split.eps0 == SEARCH_SHARE * the_plan.staged.epsilon
    # after a stop: analyze_gauss with exactly the unspent (eps - eps0, delta)
    assert the_plan.default.name == "analyze_gauss"
    assert the_plan.default.delta == DELTA
    assert the_plan.default.epsilon + split.eps0 == pytest.approx(eps, rel=1e-15)
    # after a low noisy weight: everything but the search and the weight
    weight_stop = the_plan.search_weight_stop
    assert weight_stop is not None and weight_stop.delta == DELTA
    assert weight_stop.epsilon + split.eps0 + w == pytest.approx(eps, rel=1e-15)
    # after a failed test: analyze_gauss with exactly friendly's (eps2, delta2), and the four
    # steps search + weight + test + that fallback compose to the request
    assert the_plan.ptr_fallback is not None
    assert (the_plan.ptr_fallback.epsilon, the_plan.ptr_fallback.delta) == (
        split.eps2,
        split.delta2,
    )
    assert split.eps0 + w + split.eps1 + split.eps2 == pytest.approx(eps, rel=1e-15)
    assert split.delta1 + split.delta2 == pytest.approx(DELTA, rel=1e-15)


@pytest.mark.parametrize(("n", "eps"), [(5_000, 1.0), (50_000, 0.1)])
def test_where_friendlys_search_is_unreliable_an_agreement_test_decides(
    n: int, eps: float, basic_accounting: None
) -> None:
    the_plan = plan(ctx(n, 10), K, eps, DELTA, AutoParams(clip_norm=1.0))
    full = plan(ctx(n, 10), K, eps, DELTA, AutoParams(clip_norm=1.0, structure_share=0.0))
    assert full.staged is None  # share 0: no data-dependent choice at all
    assert the_plan.staged is not None and the_plan.staged.name == "friendly_aggregate"
    s = the_plan.agreement_epsilon
    assert s == pytest.approx(AGREEMENT_SHARE * eps, rel=1e-15)
    # friendly's own search here stops on unstructured data about half the time
    own = dataclasses.replace(the_plan.staged, epsilon=eps)
    assert friendly_spurious_stop_probability(own) > 0.4
    # test (s, 0) + analyze_gauss ((eps - s), delta) = the request; friendly's own search run
    # leaves eps_w for the noisy weight at its searched radius (before its test), when its
    # prepare accepts the smaller budget
    ws = the_plan.search_weight_epsilon
    assert ws in (0.0, pytest.approx(RADIUS_TEST_SHARE * eps, rel=1e-15))
    assert the_plan.default.epsilon + s == pytest.approx(eps, rel=1e-15)
    assert the_plan.staged.epsilon + s + ws == pytest.approx(eps, rel=1e-15)
    assert the_plan.default.delta == the_plan.staged.delta == DELTA
    t = the_plan.staged.params.t  # type: ignore[attr-defined]
    split = budget_split(eps - s - ws, DELTA, False, t=t)
    assert the_plan.ptr_fallback is not None
    assert (the_plan.ptr_fallback.epsilon, the_plan.ptr_fallback.delta) == (
        split.eps2,
        split.delta2,
    )
    assert s + ws + split.eps0 + split.eps1 + split.eps2 == pytest.approx(eps, rel=1e-15)
    stop, weight_stop = the_plan.agreement_stop, the_plan.search_weight_stop
    assert stop is not None
    # a stop after the search: everything but the test and the search
    assert stop.epsilon + s + split.eps0 == pytest.approx(eps, rel=1e-15)
    if ws > 0:
        # a weight below the bar: everything but the test, the search and the weight
        assert weight_stop is not None and weight_stop.delta == DELTA
        assert weight_stop.epsilon + s + split.eps0 + ws == pytest.approx(eps, rel=1e-15)
    else:
        assert weight_stop is None
    assert the_plan.agreement_t == t and the_plan.agreement_width > 0
    assert the_plan.agreement_fine_width == the_plan.agreement_width / FINE_WIDTH_RATIO
    # the given-radius friendly runs (after a coarse-only agreement): public radii r*/2 and
    # r*, exact budget: test (s, 0) + noisy weight (eps_w, 0) + friendly (eps - s - eps_w)
    coarse, wide, fallback = the_plan.coarse, the_plan.coarse_wide, the_plan.coarse_fallback
    assert coarse is not None and wide is not None and fallback is not None
    w = the_plan.radius_test_epsilon
    assert w == pytest.approx(RADIUS_TEST_SHARE * eps, rel=1e-15)
    # r* is calibrated on friendly at (eps - s), as before the weight check existed
    at_rest = dataclasses.replace(the_plan.staged, epsilon=eps - s)
    r_star = break_even_radius(at_rest, n, 10, K, 1.0, eps - s)
    assert GIVEN_RADIUS_FACTORS == (0.5, 1.0)
    assert coarse.params.radius == 0.5 * r_star  # type: ignore[attr-defined]
    assert wide.params.radius == r_star  # type: ignore[attr-defined]
    # the wide run spends a second eps_w on its own weight when its prepare accepts that
    wide_checks = 2 if the_plan.wide_weight_stop is not None else 1
    for run, checks in ((coarse, 1), (wide, wide_checks)):
        assert run.params.t == t  # type: ignore[attr-defined]
        assert run.epsilon + s + checks * w == pytest.approx(eps, rel=1e-15)
        assert run.delta == DELTA
    given = budget_split(eps - s - w, DELTA, True, t=t)
    assert given.eps0 == 0.0
    assert given.eps1 + given.eps2 == pytest.approx(eps - s - w, rel=1e-15)
    assert (fallback.epsilon, fallback.delta) == (given.eps2, given.delta2)
    if the_plan.wide_weight_stop is not None:
        stop_w, wide_fallback = the_plan.wide_weight_stop, the_plan.coarse_wide_fallback
        assert wide_fallback is not None
        assert (stop_w.epsilon, stop_w.delta) == (wide.epsilon, DELTA)
        wide_split = budget_split(wide.epsilon, DELTA, True, t=t)
        assert (wide_fallback.epsilon, wide_fallback.delta) == (
            wide_split.eps2,
            wide_split.delta2,
        )


def test_spurious_stop_probability_matches_simulation() -> None:
    rng = np.random.default_rng(0)
    bar, sens, eps0, m = 124.5, 3.0, 0.25, 18
    threshold = bar + rng.laplace(0.0, 2 * sens / eps0, 100_000)
    queries = rng.laplace(0.0, 4 * sens / eps0, (100_000, m))
    simulated = float(np.mean(queries.max(axis=1) >= threshold))
    assert spurious_stop_probability(bar, sens, eps0, m) == pytest.approx(simulated, abs=0.01)
    assert spurious_stop_probability(bar, sens, 10 * eps0, m) < 1e-6


def test_the_agreement_count_has_sensitivity_one() -> None:
    rng = np.random.default_rng(1)
    near, _ = near_subspace(600, 6, 2, 1e-4, seed=1)
    worst = 0.0
    for trial in range(30):
        other = near.copy()
        other[int(rng.integers(600))] = rng.standard_normal(6) * rng.choice([1e-3, 1.0, 1e3])
        # the test's public randomness (partition, reference points, offsets) is shared, so
        # compare the noiseless counts: eps huge makes the Laplace draw negligible but equal
        a = noisy_agreement_count(near, 2, 60, 0.05, 1e12, np.random.default_rng(trial))
        b = noisy_agreement_count(other, 2, 60, 0.05, 1e12, np.random.default_rng(trial))
        worst = max(worst, abs(a - b))
    assert worst <= 1.0 + 1e-9
    # and the noise has scale 1/eps_a: mean absolute deviation of Lap(b) is b
    zeros = np.zeros((600, 6))
    draws = [
        noisy_agreement_count(zeros, 2, 60, 0.05, 0.5, np.random.default_rng(s)) for s in range(800)
    ]
    assert float(np.mean(np.abs(np.array(draws) - 60.0))) == pytest.approx(2.0, rel=0.15)


def test_histogram_is_staged_when_friendly_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auto_module, "_aggregator", lambda *args: None)
    the_plan = plan(ctx(N, 10), K, 1.0, DELTA, AutoParams(clip_norm=1.0))
    assert the_plan.staged is not None and the_plan.staged.name == "histogram_aggregate"
    assert the_plan.ptr_fallback is None
    assert the_plan.default.epsilon == 0.75


def test_a_zero_share_disables_the_staged_choice_too() -> None:
    the_plan = plan(ctx(N, 10), K, 1.0, DELTA, AutoParams(clip_norm=1.0, structure_share=0))
    assert the_plan.staged is None and the_plan.default.epsilon == 1.0


def test_declared_cost_is_the_request() -> None:
    spec = auto_spec(N, 10, 1.0)
    assert AUTO.cost_rule.startswith("Charges exactly the requested")
    shown = AUTO.preview(ctx(N, 10), spec)
    assert shown.scales["staged_search"] is True and shown.scales["agreement_test"] is False
    # a quarter of friendly's eps - eps_w (the noisy weight check before its test)
    assert shown.scales["search_epsilon"] == pytest.approx(0.25 * (1 - RADIUS_TEST_SHARE))
    assert "weight_check_stop.analyze_gauss.sigma" in shown.scales
    assert any("noisy total weight" in line for line in shown.meaning)
    assert "friendly_aggregate.t" in shown.scales and "analyze_gauss.sigma" in shown.scales
    assert any("radius search" in line for line in shown.meaning)
    shown = AUTO.preview(ctx(5_000, 10), auto_spec(5_000, 10, 1.0))
    assert shown.scales["agreement_test"] is True and shown.scales["agreement_epsilon"] == 0.05
    # two counts, each with eps_a/2: Lap(2/eps_a) = Lap(40)
    assert shown.scales["agreement_noise_scale"] == 40.0
    given = shown.scales["agreement_given_radius"]
    assert isinstance(given, float) and given > 0
    assert shown.scales["radius_given.friendly_aggregate.epsilon0"] == 0.0
    assert "radius_given.ptr_fallback.analyze_gauss.sigma" in shown.scales
    assert any("Agreement test" in line for line in shown.meaning)
    # the main analyze_gauss (eps - eps_a) and the fallback (friendly's eps2) are shown apart
    main_sigma = shown.scales["analyze_gauss.sigma"]
    fallback_sigma = shown.scales["ptr_fallback.analyze_gauss.sigma"]
    assert isinstance(main_sigma, float) and isinstance(fallback_sigma, float)
    assert fallback_sigma > 2 * main_sigma


# ---------------------------------------------------------------------------------------------
# The decision: public facts and the released exponent only


def test_the_decision_is_monotone_in_the_radius_and_data_free() -> None:
    the_plan = plan(ctx(N, 50), K, 1.0, DELTA, AutoParams(clip_norm=1.0))
    staged = the_plan.staged
    assert staged is not None
    radii = radius_grid(np.sqrt(2.0 * K), radius_steps("projection"))
    steps = radius_steps("projection")
    decisions = [
        staged_decision(staged, ctx(N, 50), K, 1.0, steps - i, float(radii[i])).proceed
        for i in range(steps + 1)
    ]
    # small radii (large exponents) continue, large radii stop, with one switch in between
    assert decisions[0] and not decisions[-1]
    assert decisions == sorted(decisions, reverse=True)
    assert not staged_decision(staged, ctx(N, 50), K, 1.0, None, None).proceed
    gauss = predicted_gauss_error(N, 50, K, 1.0, 0.75, DELTA)
    params: Any = staged.params
    for i, go in enumerate(decisions):
        predicted = predicted_friendly_error(params, float(radii[i]), 50, K, 1.0, DELTA)
        assert go == (predicted < gauss)


@pytest.mark.parametrize("exponent", [15, 2])
def test_same_exponent_different_data_same_decision(
    monkeypatch: pytest.MonkeyPatch, exponent: int
) -> None:
    real_search = FriendlyAggregate.search
    steps = radius_steps("projection")
    radius = float(radius_grid(np.sqrt(2.0 * K), steps)[steps - exponent])

    def forced(self: Any, data: Any, spec: Any, rng: Any) -> Any:
        state = real_search(self, data, spec, rng)
        return dataclasses.replace(state, radius_exponent=exponent, radius=radius)

    monkeypatch.setattr(FriendlyAggregate, "search", forced)
    spec = auto_spec(N, 10, 1.0)
    near, _ = near_subspace(N, 10, K, 1e-5, seed=1)
    outcomes = []
    for data in (near, isotropic(N, 10, 2)):
        out = AUTO.run(data, spec, np.random.default_rng(3))
        outcomes.append({k: v for k, v in out.extras["auto_search"].items() if k != "ptr_failed"})
    assert outcomes[0] == outcomes[1]
    assert outcomes[0]["exponent"] == exponent
    assert outcomes[0]["continued"] is (exponent == 15)
    assert outcomes[0]["continued"] is (
        outcomes[0]["predicted_error"] < outcomes[0]["predicted_analyze_gauss_error"]
    )


# ---------------------------------------------------------------------------------------------
# The runs: bit-identical continuation, exact budgets


def _spy_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float, float]]:
    runs: list[tuple[str, float, float]] = []
    for name in ("analyze_gauss", "friendly_aggregate", "histogram_aggregate"):
        mechanism = MECHANISMS[name]
        real_run = type(mechanism).run

        def spy(self: Any, data: Any, spec: Any, rng: Any, _real: Any = real_run) -> Any:
            runs.append((self.name, spec.epsilon, spec.delta))
            return _real(self, data, spec, rng)

        monkeypatch.setattr(type(mechanism), "run", spy)
    return runs


def test_continuing_friendly_is_bit_identical_to_its_own_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the noisy weight check between its search and its test draws from the same generator:
    # without that draw (the check passed) the rest is friendly's own run, draw for draw
    monkeypatch.setattr(auto_module, "noisy_total_weight", lambda total, *args: np.inf)
    data, basis = near_subspace(N, 10, K, 1e-5, seed=4)
    spec = auto_spec(N, 10, 1.0)
    out = AUTO.run(data, spec, np.random.default_rng(11))
    assert out.extras["auto_choice"] == "friendly_aggregate"
    assert out.extras["auto_search"]["continued"] is True
    assert out.extras["auto_search"]["weight_check_passed"] is True
    staged = plan(ctx(N, 10), K, 1.0, DELTA, spec.params).staged
    assert staged is not None
    own = MECHANISMS["friendly_aggregate"].run(
        data, ReleaseSpec(K, staged.epsilon, DELTA, staged.params), np.random.default_rng(11)
    )
    assert own.basis is not None and out.basis is not None
    assert np.array_equal(out.basis, own.basis)
    for key, value in own.extras.items():
        assert out.extras[key] == value
    assert subspace_distance(out.basis, basis) < 1e-2


def test_continuing_histogram_is_bit_identical_to_its_own_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auto_module, "_aggregator", lambda *args: None)
    data, _ = near_subspace(N, 10, K, 1e-5, seed=5)
    spec = auto_spec(N, 10, 1.0)
    out = AUTO.run(data, spec, np.random.default_rng(12))
    assert out.extras["auto_choice"] == "histogram_aggregate"
    assert out.extras["auto_search"]["continued"] is True
    staged = plan(ctx(N, 10), K, 1.0, DELTA, spec.params).staged
    assert staged is not None
    own = MECHANISMS["histogram_aggregate"].run(
        data, ReleaseSpec(K, 1.0, DELTA, staged.params), np.random.default_rng(12)
    )
    assert own.basis is not None and out.basis is not None
    assert np.array_equal(out.basis, own.basis)
    # and the staged phases equal the whole run on their own as well
    histogram = MECHANISMS["histogram_aggregate"]
    assert isinstance(histogram, HistogramAggregate)
    inner = ReleaseSpec(K, 1.0, DELTA, staged.params)
    rng = np.random.default_rng(12)
    again = histogram.finish(histogram.search(data, inner, rng), inner, rng, N)
    assert again.basis is not None and np.array_equal(again.basis, own.basis)


def test_a_stop_gives_analyze_gauss_all_but_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _spy_runs(monkeypatch)
    data = isotropic(N, 10, 6)
    spec = auto_spec(N, 10, 1.0)
    for seed in range(20):  # the search stops at a large radius (or finds none)
        runs.clear()
        out = AUTO.run(data, spec, np.random.default_rng(seed))
        if not out.extras["auto_search"]["continued"]:
            break
    else:
        pytest.fail("no stop in 20 seeds")
    rest = 1.0 - SEARCH_SHARE * (1.0 - RADIUS_TEST_SHARE)  # the search had (eps - eps_w)/4
    assert runs == [("analyze_gauss", pytest.approx(rest, rel=1e-15), DELTA)]
    assert out.extras["auto_choice"] == "analyze_gauss"
    assert (out.extras["auto_epsilon"], out.extras["auto_delta"]) == (
        pytest.approx(rest, rel=1e-15),
        DELTA,
    )


def _spurious_search(monkeypatch: pytest.MonkeyPatch) -> None:
    real_search = FriendlyAggregate.search
    steps = radius_steps("projection")
    radius = float(radius_grid(np.sqrt(2.0 * K), steps)[0])

    def spurious(self: Any, data: Any, spec: Any, rng: Any) -> Any:
        # what a spurious stop looks like: the smallest radius, where no subset has friends
        state = real_search(self, data, spec, rng)
        weights = np.zeros_like(state.weights)
        return dataclasses.replace(state, radius_exponent=steps, radius=radius, weights=weights)

    monkeypatch.setattr(FriendlyAggregate, "search", spurious)


def test_a_spurious_stop_gives_analyze_gauss_all_but_search_and_weight(
    monkeypatch: pytest.MonkeyPatch, basic_accounting: None
) -> None:
    # regime 2's failed-test path (issue 24, item 5): a stop where no subset agrees used to
    # end in a failed test and analyze_gauss at the mean's eps2; the noisy weight check now
    # stops it first (weight 0 against a bar of ~0.5 t, noise Lap(~30): certain at this seed)
    _spurious_search(monkeypatch)
    runs = _spy_runs(monkeypatch)
    spec = auto_spec(N, 10, 1.0)
    the_plan = plan(ctx(N, 10), K, 1.0, DELTA, spec.params)
    weight_stop = the_plan.search_weight_stop
    assert weight_stop is not None
    out = AUTO.run(isotropic(N, 10, 7), spec, np.random.default_rng(8))
    assert out.extras["auto_search"]["continued"] is True
    assert out.extras["auto_search"]["weight_check_passed"] is False
    assert runs == [("analyze_gauss", weight_stop.epsilon, DELTA)]
    assert out.basis is not None and out.extras["auto_choice"] == "analyze_gauss"
    assert out.extras["auto_epsilon"] >= FALLBACK_SHARE_FLOOR * 1.0
    assert fallback_budgets(the_plan)["weight_check"] == (weight_stop.epsilon, DELTA)


def test_a_failed_test_gives_analyze_gauss_exactly_eps2(
    monkeypatch: pytest.MonkeyPatch, basic_accounting: None
) -> None:
    # the weight check passed (forced) and the test failed anyway: the mean's unspent share
    _spurious_search(monkeypatch)
    monkeypatch.setattr(auto_module, "noisy_total_weight", lambda total, *args: np.inf)
    runs = _spy_runs(monkeypatch)
    spec = auto_spec(N, 10, 1.0)
    staged = plan(ctx(N, 10), K, 1.0, DELTA, spec.params).staged
    assert staged is not None
    split = budget_split(staged.epsilon, DELTA, False, t=staged.params.t)  # type: ignore[attr-defined]
    out = AUTO.run(isotropic(N, 10, 7), spec, np.random.default_rng(8))
    assert out.extras["auto_search"]["continued"] is True
    assert out.extras["auto_search"]["ptr_failed"] is True
    assert runs == [("analyze_gauss", split.eps2, split.delta2)]
    assert out.basis is not None and out.extras["auto_choice"] == "analyze_gauss"
    assert split.eps0 + split.eps1 + split.eps2 + RADIUS_TEST_SHARE == pytest.approx(1.0, rel=1e-15)


# ---------------------------------------------------------------------------------------------
# Totality and the seeded small grid


@pytest.mark.parametrize("n", [5_000, N])
@pytest.mark.parametrize("kind", ["tiny", "huge", "duplicates", "zeros", "mixed"])
def test_extreme_values_end_succeeded_or_no_result(kind: str, n: int) -> None:
    d = 10
    rng = np.random.default_rng(13)
    rows = rng.standard_normal((n, d))
    data: np.ndarray
    if kind == "tiny":
        data = rows * 1e-300
    elif kind == "huge":
        data = rows * 1e300
    elif kind == "duplicates":
        data = np.tile(rows[:1], (n, 1))
    elif kind == "zeros":
        data = np.zeros((n, d))
    else:
        data = rows * np.where(rng.random((n, 1)) < 0.5, 1e-300, 1e300)
    spec = auto_spec(n, d, 1.0)
    for seed in range(2):
        out = AUTO.run(data, spec, np.random.default_rng(seed))
        assert out.basis is not None or out.no_result_reason is not None
        if out.basis is not None:
            assert out.basis.shape == (d, K) and np.all(np.isfinite(out.basis))


@pytest.mark.parametrize(
    ("n", "eps", "d"), [(5_000, 1.0, 10), (5_000, 1.0, 50), (50_000, 0.1, 10), (N, 1.0, 10)]
)
def test_seeded_grid_aggregator_near_a_subspace_gauss_on_isotropic(
    n: int, eps: float, d: int
) -> None:
    spec = auto_spec(n, d, eps)
    near, basis = near_subspace(n, d, K, 1e-5, seed=0)
    out = AUTO.run(near, spec, np.random.default_rng(20))
    assert out.extras["auto_choice"] == "friendly_aggregate"
    assert out.basis is not None and subspace_distance(out.basis, basis) < 1e-2
    out = AUTO.run(isotropic(n, d, 1), spec, np.random.default_rng(21))
    assert out.extras["auto_choice"] == "analyze_gauss"


# ---------------------------------------------------------------------------------------------
# The agreement regime's restricted radius grid (v3)


def test_the_two_counts_each_have_sensitivity_one_and_scale_two_over_eps() -> None:
    rng = np.random.default_rng(2)
    near, _ = near_subspace(600, 6, 2, 1e-4, seed=2)
    widths = (0.002, 0.05)
    worst = 0.0
    for trial in range(30):
        other = near.copy()
        other[int(rng.integers(600))] = rng.standard_normal(6) * rng.choice([1e-3, 1.0, 1e3])
        a = noisy_agreement_counts(near, 2, 60, widths, 1e12, np.random.default_rng(trial))
        b = noisy_agreement_counts(other, 2, 60, widths, 1e12, np.random.default_rng(trial))
        worst = max(worst, *(abs(x - y) for x, y in zip(a, b, strict=True)))
    assert worst <= 1.0 + 1e-9
    zeros = np.zeros((600, 6))
    draws = np.array(
        [
            noisy_agreement_counts(zeros, 2, 60, widths, 0.5, np.random.default_rng(s))
            for s in range(800)
        ]
    )
    # each count gets eps_a/2: Lap(2/eps_a) = Lap(4), mean absolute deviation 4
    for column in draws.T:
        assert float(np.mean(np.abs(column - 60.0))) == pytest.approx(4.0, rel=0.15)


def test_the_agreement_decision_is_a_function_of_the_released_counts_only() -> None:
    the_plan = plan(ctx(50_000, 50), K, 0.1, DELTA, AutoParams(clip_norm=1.0))
    bar = AGREEMENT_FRACTION * the_plan.agreement_t
    assert the_plan.coarse is not None
    assert agreement_decision(the_plan, bar, bar)[0] is the_plan.staged
    assert agreement_decision(the_plan, bar, 0.0)[0] is the_plan.staged
    assert agreement_decision(the_plan, bar - 1e-9, bar)[0] is the_plan.coarse
    assert agreement_decision(the_plan, bar - 1e-9, bar - 1e-9)[0] is None
    chosen, test = agreement_decision(the_plan, 0.0, bar + 5.0)
    assert test["agreed"] is True and test["agreed_fine"] is False
    assert test["radius_given"] is True and chosen is the_plan.coarse
    # the released outcome carries no noisy count
    assert set(test) == {
        "test",
        "epsilon",
        "width",
        "fine_width",
        "t",
        "threshold",
        "agreed",
        "agreed_fine",
        "radius_given",
    }
    # without a given-radius run (refused), a coarse agreement runs friendly's own search
    bare = dataclasses.replace(the_plan, coarse=None, coarse_fallback=None)
    assert agreement_decision(bare, 0.0, bar)[0] is bare.staged


@pytest.mark.parametrize("outcome", ["fine", "narrow", "wide"])
def test_friendly_runs_as_the_outcome_selects_with_exact_budgets(
    monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    n, d, eps = 5_000, 10, 1.0
    spec = auto_spec(n, d, eps)
    the_plan = plan(ctx(n, d), K, eps, DELTA, spec.params)
    assert the_plan.coarse is not None and the_plan.coarse_wide is not None
    bar = AGREEMENT_FRACTION * the_plan.agreement_t
    counts = [bar if outcome == "fine" else 0.0, bar]
    monkeypatch.setattr(auto_module, "noisy_agreement_counts", lambda *args: list(counts))
    # the radius is picked from the released noisy weight alone: pin it on either side of the
    # public bar, whatever the data
    bar_w = auto_module.radius_test_threshold(the_plan.coarse)
    released = bar_w if outcome == "narrow" else bar_w - 1e-9
    weights_seen: list[float] = []

    def noisy_weight(total: float, t: int, eps_w: float, rng: Any) -> float:
        weights_seen.append(eps_w)
        return released

    monkeypatch.setattr(auto_module, "noisy_total_weight", noisy_weight)
    runs = _spy_runs(monkeypatch)
    seen: list[tuple[float, float | None]] = []
    from service.mechanisms import friendly_aggregate as fa

    real_search = fa.friendly_search

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append((args[2], kwargs["radius"]))
        return real_search(*args, **kwargs)

    monkeypatch.setattr(fa, "friendly_search", spy)
    s, w = the_plan.agreement_epsilon, the_plan.radius_test_epsilon
    narrow = the_plan.coarse.params.radius  # type: ignore[attr-defined]
    wide = the_plan.coarse_wide.params.radius  # type: ignore[attr-defined]
    # different data, same released values: the same runs (the plan sees no data)
    for data in (near_subspace(n, d, K, 1e-5, seed=3)[0], isotropic(n, d, 4)):
        out = AUTO.run(data, spec, np.random.default_rng(5))
        test = out.extras["auto_search"]
        assert test["radius_given"] is (outcome != "fine")
        assert test.get("radius_narrow") is {"fine": None, "narrow": True, "wide": False}[outcome]
    if outcome == "fine":
        # test (eps_a, 0) + friendly's own search run (eps - eps_a - eps_w, delta); its noisy
        # weight at the searched radius (eps_w) is drawn by the module's own function
        ws = the_plan.search_weight_epsilon
        assert [(pytest.approx(e, rel=1e-15), r) for e, r in seen] == [(eps - s - ws, None)] * 2
        assert weights_seen in ([], [ws], [ws, ws])
    else:
        # test (eps_a, 0) + weight (eps_w, 0) + given-radius run (eps - eps_a - eps_w, delta);
        # the narrow run continues the weight's partition, the wide one draws its own
        # the wide run, when its budget allows, first gets its own noisy weight at r* (eps_w on
        # its fresh partition) and runs at eps - eps_a - 2 eps_w
        checked = the_plan.wide_weight_stop is not None
        per_data = 2 if outcome == "wide" and checked else 1
        assert weights_seen == [w] * (2 * per_data)
        first = (eps - s - w, narrow)
        second = (eps - s - (2 * w if checked else w), wide)
        expected = [first] if outcome == "narrow" else [first, second]
        assert [(pytest.approx(e, rel=1e-15), r) for e, r in seen] == expected * 2
    # the narrow run, the checked wide run and the fine path continue a search (search +
    # finish, no run call)
    friendly_runs = [r for r in runs if r[0] == "friendly_aggregate"]
    unchecked_wide = outcome == "wide" and the_plan.wide_weight_stop is None
    assert len(friendly_runs) == (2 if unchecked_wide else 0)
    for _, epsilon, delta in friendly_runs:
        spent = s + w
        assert epsilon + spent == pytest.approx(eps, rel=1e-15) and delta == DELTA
    fallbacks = [r for r in runs if r[0] == "analyze_gauss"]
    chosen_fallback = the_plan.ptr_fallback if outcome == "fine" else the_plan.coarse_fallback
    assert chosen_fallback is not None
    allowed = {(chosen_fallback.epsilon, chosen_fallback.delta)}
    if outcome == "wide":  # a wide weight below its need, or the wide run's failed test
        for other in (the_plan.wide_weight_stop, the_plan.coarse_wide_fallback):
            if other is not None:
                allowed.add((other.epsilon, other.delta))
    if outcome == "fine":  # or after a search that stopped too wide, or a low weight
        assert the_plan.agreement_stop is not None
        allowed.add((the_plan.agreement_stop.epsilon, the_plan.agreement_stop.delta))
        if the_plan.search_weight_stop is not None:
            stop_ = the_plan.search_weight_stop
            allowed.add((stop_.epsilon, stop_.delta))
    for fallback in fallbacks:  # after a failed friendly test (or a wide stop) only
        assert fallback[1:] in allowed


def test_the_noisy_weight_has_friendlys_sensitivity_and_scale() -> None:
    from service.mechanisms.friendly_aggregate import (
        friendly_search,
        ramp_width,
        total_weight,
        weight_sensitivity,
    )

    t = 60
    sens = weight_sensitivity(t, ramp_width(t))
    rng = np.random.default_rng(2)
    near, _ = near_subspace(600, 6, 2, 1e-3, seed=2)
    worst = 0.0
    for trial in range(20):
        other = near.copy()
        other[int(rng.integers(600))] = rng.standard_normal(6) * rng.choice([1e-3, 1.0, 1e3])
        totals = []
        for rows in (near, other):  # same public randomness (partition), one row replaced
            state = friendly_search(
                rows, 2, 1.0, DELTA, np.random.default_rng(trial), t=t,
                aggregator="projection", radius=0.05,
            )  # fmt: skip
            totals.append(total_weight(state.weights))
        worst = max(worst, abs(totals[0] - totals[1]))
    assert 0 < worst <= sens + 1e-9
    # the noise has scale Delta_W/eps_w: mean absolute deviation of Lap(b) is b
    draws = np.array(
        [auto_module.noisy_total_weight(10.0, t, 0.5, np.random.default_rng(s)) for s in range(800)]
    )
    assert float(np.mean(np.abs(draws - 10.0))) == pytest.approx(sens / 0.5, rel=0.15)


def test_the_radius_bar_is_what_friendlys_search_needs() -> None:
    the_plan = plan(ctx(50_000, 50), K, 0.1, DELTA, AutoParams(clip_norm=1.0))
    narrow = the_plan.coarse
    assert narrow is not None
    t = narrow.params.t  # type: ignore[attr-defined]
    split = release_split(narrow.epsilon, DELTA, True, t=t)
    expected = split_search_threshold(t, split)
    assert auto_module.radius_test_threshold(narrow) == expected >= 0.75 * t


@pytest.mark.parametrize("outcome", ["coarse", "fine"])
@pytest.mark.parametrize("kind", ["tiny", "huge", "duplicates", "zeros", "mixed"])
def test_the_agreed_runs_are_total_on_extreme_values(
    monkeypatch: pytest.MonkeyPatch, kind: str, outcome: str
) -> None:
    n, d = 5_000, 10
    spec = auto_spec(n, d, 1.0)
    the_plan = plan(ctx(n, d), K, 1.0, DELTA, spec.params)
    bar = AGREEMENT_FRACTION * the_plan.agreement_t
    # force the outcome: coarse only, friendly_aggregate with a public radius given (the noisy
    # weight is real here, so either radius may run); fine, friendly's own search, then its
    # continuation or analyze_gauss as the released radius says
    counts = [0.0, bar] if outcome == "coarse" else [bar, bar]
    monkeypatch.setattr(auto_module, "noisy_agreement_counts", lambda *args: list(counts))
    rows = np.random.default_rng(14).standard_normal((n, d))
    data = {
        "tiny": rows * 1e-300,
        "huge": rows * 1e300,
        "duplicates": np.tile(rows[:1], (n, 1)),
        "zeros": np.zeros((n, d)),
        "mixed": rows * np.where(np.random.default_rng(15).random((n, 1)) < 0.5, 1e-300, 1e300),
    }[kind]
    for seed in range(2):
        out = AUTO.run(data, spec, np.random.default_rng(seed))
        assert out.extras["auto_search"]["radius_given"] is (outcome == "coarse")
        if outcome == "coarse":
            assert isinstance(out.extras["auto_search"]["radius_narrow"], bool)
        else:
            assert isinstance(out.extras["auto_search"]["searched"]["continued"], bool)
        json.dumps(out.extras, allow_nan=False)  # nothing non-finite reaches a client
        assert out.basis is not None or out.no_result_reason is not None
        if out.basis is not None:
            assert out.basis.shape == (d, K) and np.all(np.isfinite(out.basis))


@pytest.mark.parametrize(("n", "eps", "radius_given"), [(N, 1.0, False), (50_000, 0.1, False),
                                                        (50_000, 0.1, True)])  # fmt: skip
def test_under_f3_the_fallback_is_at_least_as_noisy_as_the_mean_it_replaces(
    n: int, eps: float, radius_given: bool
) -> None:
    # F3 accounts the mean as a mean_mu-GDP Gaussian; analyze_gauss (a Gaussian mechanism of
    # sensitivity sqrt(2) C^2) at the fallback budget must be mean_mu-GDP or less, i.e. its
    # noise at least sqrt(2) C^2/mean_mu, so it can take the mean's place in the composition.
    staged = plan(ctx(n, 10), K, eps, DELTA, AutoParams(clip_norm=1.0)).staged
    assert staged is not None
    t = staged.params.t  # type: ignore[attr-defined]
    budget = eps if radius_given else staged.epsilon
    split = release_split(budget, DELTA, radius_given, t=t, accounting="gdp")
    assert isinstance(split, GdpSplit)
    fallback_eps, fallback_delta = ptr_fallback_budget(split)
    assert fallback_delta <= split.delta1
    assert fallback_delta == pytest.approx(split.delta1, rel=1e-6)
    for clip in (1.0, 3.0, 1e-3):
        sigma = noise_sigma(clip, fallback_eps, fallback_delta)
        assert sigma >= np.sqrt(2.0) * clip**2 / split.mean_mu
        assert sigma == pytest.approx(np.sqrt(2.0) * clip**2 / split.mean_mu, rel=1e-6)
    # and the plan uses exactly that budget
    the_plan = plan(ctx(n, 10), K, eps, DELTA, AutoParams(clip_norm=1.0))
    if not radius_given and the_plan.agreement_epsilon == 0.0:
        assert the_plan.ptr_fallback is not None
        assert (the_plan.ptr_fallback.epsilon, the_plan.ptr_fallback.delta) == (
            fallback_eps,
            fallback_delta,
        )


def test_the_preview_shows_both_given_radii_and_the_weights_noise() -> None:
    shown = AUTO.preview(ctx(5_000, 10), auto_spec(5_000, 10, 1.0))
    narrow, wide = shown.scales["agreement_given_radius"], shown.scales["agreement_wide_radius"]
    assert isinstance(narrow, float) and isinstance(wide, float) and wide == 2 * narrow
    assert shown.scales["radius_test_epsilon"] == pytest.approx(RADIUS_TEST_SHARE, rel=1e-15)
    from service.mechanisms.friendly_aggregate import ramp_width, weight_sensitivity

    t = plan(ctx(5_000, 10), K, 1.0, DELTA, AutoParams(clip_norm=1.0)).agreement_t
    scale = shown.scales["radius_test_noise_scale"]
    assert scale == pytest.approx(weight_sensitivity(t, ramp_width(t)) / RADIUS_TEST_SHARE)
    assert "radius_given_wide.friendly_aggregate.epsilon0" in shown.scales


def test_after_a_fine_agreement_a_search_stopping_wide_gives_analyze_gauss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A false fine agreement on data far from any subspace: friendly's own search then stops
    # at a radius where every subset is everyone's friend (a random-level average). As in
    # regime 2 its predicted error there decides: analyze_gauss at the unspent 3/4 of
    # (eps - eps_a) and all of delta. On data near a subspace the same path continues friendly.
    n, d, eps = 5_000, 10, 1.0
    spec = auto_spec(n, d, eps)
    the_plan = plan(ctx(n, d), K, eps, DELTA, spec.params)
    stop = the_plan.agreement_stop
    assert stop is not None and stop.name == "analyze_gauss"
    s, ws = the_plan.agreement_epsilon, the_plan.search_weight_epsilon
    # everything but the test and friendly's search (a quarter of its eps - s - eps_w)
    assert stop.epsilon == pytest.approx(eps - s - SEARCH_SHARE * (eps - s - ws), rel=1e-15)
    assert stop.delta == DELTA
    bar = AGREEMENT_FRACTION * the_plan.agreement_t
    monkeypatch.setattr(auto_module, "noisy_agreement_counts", lambda *args: [bar, bar])
    runs = _spy_runs(monkeypatch)
    far = AUTO.run(isotropic(n, d, 21), spec, np.random.default_rng(22))
    searched = far.extras["auto_search"]["searched"]
    assert searched["continued"] is False
    assert far.extras["auto_choice"] == "analyze_gauss"
    assert runs == [("analyze_gauss", stop.epsilon, stop.delta)]
    runs.clear()
    near = AUTO.run(near_subspace(n, d, K, 1e-5, seed=23)[0], spec, np.random.default_rng(24))
    assert near.extras["auto_search"]["searched"]["continued"] is True
    assert near.extras["auto_choice"] == "friendly_aggregate"
    assert near.basis is not None


def test_a_weight_below_the_tests_need_after_the_search_gives_analyze_gauss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 24 item 5, the starved fallback: after a fine agreement friendly's search can stop
    # spuriously (weight 0 at the found radius); its test would then fail and leave
    # analyze_gauss only the mean's share. The noisy weight at the searched radius decides
    # first, from the released value and the public bar alone.
    n, d, eps = 5_000, 10, 1.0
    spec = auto_spec(n, d, eps)
    the_plan = plan(ctx(n, d), K, eps, DELTA, spec.params)
    stop = the_plan.search_weight_stop
    assert stop is not None and the_plan.staged is not None
    ws = the_plan.search_weight_epsilon
    assert ws == pytest.approx(RADIUS_TEST_SHARE * eps, rel=1e-15)
    bar = auto_module.search_weight_threshold(the_plan.staged)
    # the bar is the weight at which the test passes with probability 1/2: far above 0
    t = the_plan.agreement_t
    assert 0.3 * t < bar < t
    agreement = AGREEMENT_FRACTION * t
    monkeypatch.setattr(auto_module, "noisy_agreement_counts", lambda *a: [agreement] * 2)
    data = near_subspace(n, d, K, 1e-5, seed=23)[0]
    for released, passes in ((bar - 1e-9, False), (bar, True)):
        monkeypatch.setattr(auto_module, "noisy_total_weight", lambda *a, v=released: v)
        runs = _spy_runs(monkeypatch)
        out = AUTO.run(data, spec, np.random.default_rng(24))
        test = out.extras["auto_search"]
        assert test["searched"]["continued"] is True
        assert test["weight_check_passed"] is passes
        if passes:
            assert out.extras["auto_choice"] == "friendly_aggregate" and runs == []
        else:
            assert out.extras["auto_choice"] == "analyze_gauss"
            assert runs == [("analyze_gauss", stop.epsilon, stop.delta)]
            # everything but the test, the search and the weight: 3/4 of friendly's budget
            assert stop.epsilon == pytest.approx(0.75 * the_plan.staged.epsilon, rel=1e-12)
