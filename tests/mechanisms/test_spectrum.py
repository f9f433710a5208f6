"""M7 spectrum: calibration (eigenvalues, sqrt(2) C^2), rounding, suggested k, utility,
refusals and the audit with its negative control."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest

from service.mechanisms import spectrum as module
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.linalg import clip_rows
from service.mechanisms.noise import analytic_gaussian_sigma
from service.mechanisms.spectrum import (
    FALSE_SIGNAL,
    GRID_DIVISOR,
    Spectrum,
    SpectrumParams,
    noise_std,
    round_to_grid,
    signal_threshold,
    spectrum,
    spectrum_sensitivity,
    suggest_k,
)
from tests.mechanisms.privacy_audit import audit
from tests.mechanisms.synthetic import near_subspace

EPS, DELTA = 1.0, 1e-5


# ---------------------------------------------------------------------------------------------
# Calibration


@pytest.mark.parametrize(("clip", "eps", "delta"), [(1.0, 1.0, 1e-6), (3.0, 0.2, 1e-9)])
def test_noise_std_is_analytic_gaussian_for_sqrt2_c_squared(
    clip: float, eps: float, delta: float
) -> None:
    assert spectrum_sensitivity(clip) == math.sqrt(2) * clip**2
    assert noise_std(clip, eps, delta) == analytic_gaussian_sigma(
        math.sqrt(2) * clip**2, eps, delta
    )


def eigenvalues_of(rows: np.ndarray) -> np.ndarray:
    return np.sort(np.linalg.eigvalsh(rows.T @ rows))[::-1]


def test_eigenvalue_vector_sensitivity_by_brute_force() -> None:
    # Random neighbouring pairs (one clipped row replaced, some replaced rows at norm exactly C,
    # some zero): the top-m eigenvalue vector moves by <= sqrt(2) C^2 in l2 (Hoffman-Wielandt)
    # and <= 2 C^2 in l1 (interlacing), for every m.
    rng = np.random.default_rng(0)
    worst_l2 = worst_l1 = 0.0
    for trial in range(1500):
        n, d, clip = int(rng.integers(1, 7)), int(rng.integers(1, 6)), float(rng.uniform(0.3, 3))
        data = clip_rows(rng.standard_normal((n, d)) * rng.uniform(0.1, 5), clip)
        neighbour = data.copy()
        row = clip_rows(rng.standard_normal((1, d)) * 10, clip)[0]
        neighbour[int(rng.integers(n))] = 0.0 if trial % 5 == 0 else row
        change = eigenvalues_of(data) - eigenvalues_of(neighbour)
        for m in range(1, d + 1):
            worst_l2 = max(worst_l2, float(np.linalg.norm(change[:m])) / clip**2)
            worst_l1 = max(worst_l1, float(np.abs(change[:m]).sum()) / clip**2)
    assert worst_l2 <= math.sqrt(2) * (1 + 1e-9)
    assert worst_l1 <= 2 * (1 + 1e-9)
    assert worst_l2 > 1.3  # the search gets close to the bound: it could have failed
    # Attained: orthogonal rows of norm C.
    e = np.eye(3)
    pair = eigenvalues_of(np.vstack([e[:1], e[1:2]])) - eigenvalues_of(np.vstack([e[:1], e[:1]]))
    assert np.linalg.norm(pair) == pytest.approx(math.sqrt(2))


def test_noise_added_has_the_stated_std() -> None:
    # With no data signal (all-zero rows) the released values are the clamped noise: compare the
    # raw Gaussian draws through a spy on rng.normal.
    draws: list[tuple[float, int]] = []

    class Spy(np.random.Generator):
        def normal(self, loc: Any = 0.0, scale: Any = 1.0, size: Any = None) -> Any:
            draws.append((float(scale), int(size)))
            return super().normal(loc, scale, size)

    rng = Spy(np.random.PCG64(1))
    spectrum(np.zeros((10, 5)), 4, 0.5, 1e-7, 2.0, rng)
    assert draws == [(noise_std(2.0, 0.5, 1e-7), 4)]


def test_round_to_grid() -> None:
    values = np.array([0.0, 1.23456, 7.77777])
    rounded = round_to_grid(values, 0.01)
    assert rounded == pytest.approx([0.0, 1.23, 7.78])
    assert np.abs(rounded - values).max() <= 0.005 + 1e-12


# ---------------------------------------------------------------------------------------------
# The suggested k


def test_signal_threshold_is_a_union_bound_over_m() -> None:
    assert signal_threshold(1.0, 1) == pytest.approx(NormalDist().inv_cdf(1 - FALSE_SIGNAL))
    assert signal_threshold(2.0, 50) == pytest.approx(
        2.0 * NormalDist().inv_cdf(1 - FALSE_SIGNAL / 50)
    )
    # Pure noise (every true eigenvalue 0): all m values stay below it in >= 1 - FALSE_SIGNAL.
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((20_000, 50)).max(axis=1)
    assert np.mean(noise > signal_threshold(1.0, 50)) <= 2 * FALSE_SIGNAL


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1000.0, 900.0, 800.0, 5.0, 3.0], 3),  # drop at 3 (800 against the threshold 10)
        ([1000.0, 240.0, 239.0], 1),  # the first large drop (4x) wins
        ([100.0, 25.0, 24.0], 1),  # exactly DROP_RATIO counts
        ([100.0, 90.0, 80.0], 3),  # no drop, all significant: m
        ([30.0, 20.0], 2),  # the last significant value against the threshold: no 4x drop
        ([50.0, 12.0], 1),  # 50 >= 4 * max(12, 10)
        ([9.0, 5.0, 1.0], 1),  # all below the threshold: at least 1
        ([40.0], 1),
        ([11.0, 10.5, 0.0], 2),  # both just significant, no 4x drop: the count of them
    ],
)
def test_suggest_k(values: list[float], expected: int) -> None:
    assert suggest_k(np.array(values), 10.0) == expected


def test_suggest_k_never_picks_a_value_below_the_threshold() -> None:
    rng = np.random.default_rng(1)
    for _ in range(2000):
        values = np.sort(rng.exponential(10, size=int(rng.integers(1, 12))) ** 2)[::-1]
        k = suggest_k(values, 10.0)
        assert 1 <= k <= len(values)
        if np.any(values > 10.0):
            assert values[k - 1] > 10.0


# ---------------------------------------------------------------------------------------------
# Utility and the Mechanism wrapper


def test_released_values_are_within_the_stated_noise_and_suggest_three() -> None:
    data, _ = near_subspace(20_000, 20, 3, seed=2)
    truth = np.linalg.svd(data, compute_uv=False) ** 2
    rng = np.random.default_rng(3)
    for _ in range(5):
        values, suggested, std = spectrum(data, 20, 1.0, 1e-6, 1.0, rng)
        assert np.all(np.diff(values) <= 0) and np.all(values >= 0)
        grid = std / GRID_DIVISOR
        assert values / grid == pytest.approx(np.round(values / grid), abs=1e-6)
        # Clamping and sorting never increase the largest error: max |noise| of 20 draws.
        assert np.abs(values - truth).max() <= 5 * std + grid
        assert suggested == 3


def test_small_data_is_visible_where_singular_value_noise_hid_it() -> None:
    # 2,000 rows of norm ~0.5 near a 3-dim subspace (s_i ~ 16) at epsilon = 0.3: the old
    # route's noise on singular values (sigma for 2C, ~30) exceeded every s_i; on eigenvalues
    # (lambda_i ~ 270, sigma for sqrt(2) C^2 ~ 21) the top 3 stand clear and k = 3 is found.
    data, _ = near_subspace(2000, 20, 3, seed=5)
    data *= 0.5
    assert analytic_gaussian_sigma(2.0, 0.3, 1e-6) > np.linalg.svd(data, compute_uv=False)[0]
    rng = np.random.default_rng(6)
    suggestions = [spectrum(data, 10, 0.3, 1e-6, 1.0, rng)[1] for _ in range(20)]
    assert suggestions.count(3) >= 19


def test_mechanism_run_extras() -> None:
    mechanism = Spectrum()
    ctx = PublicContext(n_rows=2000, n_cols=8, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 5, 1.0, 1e-6, SpectrumParams())
    data, _ = near_subspace(2000, 8, 2, seed=4)
    out = mechanism.run(data, ReleaseSpec(5, 1.0, 1e-6, params), np.random.default_rng(5))
    assert out.basis is None and out.no_result_reason is None
    assert set(out.extras) == {
        "eigenvalues",
        "singular_values",
        "suggested_k",
        "noise_std",
        "signal_threshold",
        "grid",
    }
    eigenvalues = np.array(out.extras["eigenvalues"])
    assert len(eigenvalues) == 5
    assert all(isinstance(v, float) for v in out.extras["singular_values"])
    assert np.array(out.extras["singular_values"]) == pytest.approx(np.sqrt(eigenvalues))
    assert isinstance(out.extras["suggested_k"], int)
    assert out.extras["noise_std"] == noise_std(1.0, 1.0, 1e-6)
    assert out.extras["signal_threshold"] == signal_threshold(out.extras["noise_std"], 5)
    assert out.extras["grid"] == out.extras["noise_std"] / GRID_DIVISOR


def test_prepare_allows_k_up_to_min_n_d() -> None:
    mechanism = Spectrum()
    wide = PublicContext(n_rows=4, n_cols=10, row_norm_bound=1.0)
    assert mechanism.prepare(wide, 4, 1.0, 1e-6, SpectrumParams()).clip_norm == 1.0
    with pytest.raises(InvalidParameter) as error:
        mechanism.prepare(wide, 6, 1.0, 1e-6, SpectrumParams())
    assert error.value.field == "k"
    assert "min(n, d) = 4" in error.value.message and "2 too many" in error.value.message
    tall = PublicContext(n_rows=1000, n_cols=10, row_norm_bound=1.0)
    with pytest.raises(InvalidParameter):
        mechanism.prepare(tall, 11, 1.0, 1e-6, SpectrumParams())


@pytest.mark.parametrize(
    ("delta", "bound", "field"), [(0.0, 1.0, "delta"), (1e-6, None, "clip_norm")]
)
def test_prepare_refuses(delta: float, bound: float | None, field: str) -> None:
    ctx = PublicContext(n_rows=100, n_cols=10, row_norm_bound=bound)
    with pytest.raises(InvalidParameter) as error:
        Spectrum().prepare(ctx, 3, 1.0, delta, SpectrumParams())
    assert error.value.field == field


# ---------------------------------------------------------------------------------------------
# Empirical privacy audit

# The worst case of the l2 bound: X = (e1, e2) has eigenvalues (1, 1), X' = (e1, e1) has (2, 0),
# a move of exactly sqrt(2) C^2. The event is a threshold on the released gap
# lambda_1 - lambda_2 (after sorting), whose noise has std sqrt(2) sigma against a shift of 2.
PAIR = (np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[1.0, 0.0], [1.0, 0.0]]))


def release(data: np.ndarray, rng: np.random.Generator) -> Any:
    return spectrum(data, 2, EPS, DELTA, 1.0, rng)[0]


def top_above(values: np.ndarray) -> bool:
    return bool(values[0] - values[1] > 1.5)


def test_audit_passes(runs: int = 1500) -> None:
    result = audit(release, *PAIR, top_above, runs, DELTA, seed=6)
    assert result.eps_lower_bound <= EPS


def test_audit_negative_control_fails(monkeypatch: pytest.MonkeyPatch, runs: int = 1500) -> None:
    real = module.analytic_gaussian_sigma
    monkeypatch.setattr(module, "analytic_gaussian_sigma", lambda *a, **k: real(*a, **k) / 10)
    result = audit(release, *PAIR, top_above, runs, DELTA, seed=7)
    assert result.eps_lower_bound > EPS


@pytest.mark.slow
def test_audit_passes_long() -> None:
    test_audit_passes(runs=20_000)


def test_digits_spectrum_is_visible_on_eigenvalues() -> None:
    # scikit-learn's digits (1,797 rows, bundled with the package), rows scaled to norm 1,
    # C = 1, epsilon = 1: the old singular-value route's noise (sigma for 2C, ~8.4) exceeded
    # every singular value after the first (s_2 ~ 9.2 is within 1.1 sigma); on eigenvalues the
    # top 8 stand above the signal threshold and s_1..s_3 come out within a few percent
    # (bench/experiments/compare_spectrum_routes.py, removed; in git history at commit ad45863).
    from sklearn.datasets import load_digits

    digits = load_digits().data
    data = digits / np.linalg.norm(digits, axis=1, keepdims=True)
    truth = np.linalg.svd(data, compute_uv=False)[:20]
    old_std = analytic_gaussian_sigma(2.0, 1.0, 1e-6)
    assert np.all(truth[1:] < 1.2 * old_std)
    rng = np.random.default_rng(9)
    for _ in range(5):
        values, _, std = spectrum(data, 20, 1.0, 1e-6, 1.0, rng)
        assert np.count_nonzero(values > signal_threshold(std, 20)) >= 6
        assert np.abs(np.sqrt(values[:3]) - truth[:3]).max() / truth[2] < 0.1


def test_the_private_means_rank_one_term_does_not_read_as_a_component() -> None:
    # Issue 24 item 2: centring on a noisy mean adds n (mu_hat - mu)(mu_hat - mu)^T, of
    # expected size n d s^2, along one direction: the suggestion discounts it.
    from service.mechanisms.centring import budget_split
    from service.mechanisms.spectrum import (
        SpectrumParams,
        rank_one_bias,
        suggest_k,
        without_rank_one,
    )

    params = SpectrumParams(clip_norm=1.0, center="private")
    split = budget_split(0.5, 1e-6, params)
    bias = rank_one_bias(1000, 50, params, split)
    sigma = 2.0 / 1000 / 1  # sensitivity 2C/n; the analytic scale is above it
    assert bias > 1000 * 50 * sigma**2
    assert rank_one_bias(1000, 50, SpectrumParams(clip_norm=1.0), split) == 0.0
    values = np.array([bias + 60.0, 50.0, 45.0, 5.0, 4.0])
    assert suggest_k(values, 20.0) == 1  # the inflated top alone looks dominant
    adjusted = without_rank_one(values, bias)
    assert adjusted[:3] == pytest.approx([60.0, 50.0, 45.0])
    assert suggest_k(adjusted, 20.0) == 3


def _unit_rows(name: str) -> np.ndarray:
    from sklearn import datasets

    rows = np.asarray(getattr(datasets, f"load_{name}")().data, dtype=np.float64)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.mark.parametrize("name", ["digits", "breast_cancer"])
@pytest.mark.parametrize("epsilon", [0.3, 1.0])
def test_a_private_centre_invents_no_top_eigenvalue(name: str, epsilon: float) -> None:
    """Issue 30 item 15: on unit-norm digits at eps 0.3 the private mean's rank-one term was
    released as a top eigenvalue of 450-640 against a true 85 (breast_cancer: 530-620 against
    2.4). The bound, on every seed: the released top value is the true top eigenvalue of the
    centred X^T X give or take the signal threshold (the level that m noisy values of zero
    exceed with probability 1e-3), so nothing above the noise is invented or lost; where the
    truth stands above that threshold (digits at eps 1) it is also within a factor 1.5."""
    rows = _unit_rows(name)
    centred = rows - rows.mean(axis=0)
    truth = float(np.linalg.eigvalsh(centred.T @ centred)[-1])
    spec = ReleaseSpec(
        k=10, epsilon=epsilon, delta=1e-6, params=SpectrumParams(clip_norm=1.0, center="private")
    )
    ctx = PublicContext(n_rows=rows.shape[0], n_cols=rows.shape[1], row_norm_bound=1.0)
    previewed = Spectrum().preview(ctx, spec).scales
    for seed in range(10):
        out = Spectrum().run(rows, spec, np.random.default_rng(seed))
        top, threshold = out.extras["eigenvalues"][0], out.extras["signal_threshold"]
        assert abs(top - truth) <= threshold, (seed, top, truth, threshold)
        if truth > threshold:
            assert truth / 1.5 <= top <= 1.5 * truth, (seed, top, truth)
        # What ran is what the preview said, from public facts only.
        assert out.extras["center_route"] == previewed["center_route"]
        assert out.extras["noise_std"] == pytest.approx(previewed["noise_std"])
        assert len(out.extras["center"]) == rows.shape[1]  # the mean is still released


def test_the_route_is_pairs_only_where_the_means_noise_would_show() -> None:
    from service.mechanisms.centring import budget_split
    from service.mechanisms.spectrum import center_route, pairs_scale, rank_one_bias

    params = SpectrumParams(clip_norm=1.0, center="private")
    for n, d, eps in ((1797, 64, 0.3), (1797, 64, 1.0), (10**7, 20, 1.0), (10, 3, 0.1)):
        split = budget_split(eps, 1e-6, params)
        expected = (
            "pairs"
            if rank_one_bias(n, d, params, split)
            > noise_std(1.0, split.gram_epsilon, split.gram_delta)
            else "mean"
        )
        assert center_route(n, d, params, split, pairs=True) == expected
        assert center_route(n, d, params, split, pairs=False) == "mean"
        assert center_route(n, d, SpectrumParams(clip_norm=1.0), split, pairs=True) == "mean"
    assert center_route(10**7, 20, params, budget_split(1.0, 1e-6, params), pairs=True) == "mean"
    assert center_route(1797, 64, params, budget_split(0.3, 1e-6, params), pairs=True) == "pairs"
    assert pairs_scale(5) == 2.0 and pairs_scale(4) == 1.5


def test_the_paired_gram_is_unbiased_for_the_centred_scatter() -> None:
    """Over the pairing, ``E sum_j p_j p_j^T = m/(n-1) S``: the mean of many pairings, scaled by
    ``(n - 1)/m``, is the centred scatter matrix."""
    from service.mechanisms.spectrum import paired_gram, pairs_scale

    rng = np.random.default_rng(3)
    rows = clip_rows(rng.normal(0.3, 0.2, size=(41, 4)), 10.0)
    centred = rows - rows.mean(axis=0)
    scatter = centred.T @ centred
    draws = 4000
    mean = sum(paired_gram(rows, 10.0, rng.permutation(41), chunk_rows=6) for _ in range(draws))
    estimate = pairs_scale(41) * mean / draws
    assert np.abs(estimate - scatter).max() < 0.03 * np.abs(scatter).max()
    # Chunking is summation order only.
    order = rng.permutation(41)
    assert paired_gram(rows, 10.0, order, chunk_rows=5) == pytest.approx(
        paired_gram(rows, 10.0, order)
    )
