"""analyze_gauss's explained variance (issue 24, item 1): ratios in [0, 1] summing to at most 1,
and a stated 90% interval that covers the share the released components truly capture, on
digits and on synthetic data with known power-law spectra, centred and not."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_digits

from service.mechanisms import analyze_gauss as module
from service.mechanisms.analyze_gauss import AnalyzeGauss, explained_variance
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.explained_variance import (
    SUM_FIELDS,
    shown_variance_extras,
    withhold_hidden_point,
)
from service.mechanisms.linalg import clip_rows
from tests.mechanisms.privacy_audit import audit

MECHANISM = AnalyzeGauss()


def digits_rows() -> np.ndarray[Any, Any]:
    rows = load_digits().data[:1257]
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def power_law_rows(n: int, d: int, seed: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    scales = 1.0 / np.sqrt(np.arange(1, d + 1))
    rows = rng.standard_normal((n, d)) * scales @ np.linalg.qr(rng.standard_normal((d, d)))[0]
    return clip_rows(0.3 + rows / np.sqrt(np.sum(scales**2)) * 0.5, 1.0)


def true_share(rows: np.ndarray[Any, Any], basis: np.ndarray[Any, Any], centred: bool) -> float:
    """The share of the (centred on the true mean) sum of squares of the rows clipped to C = 1
    that the basis captures."""
    y = clip_rows(rows, 1.0)
    if centred:
        y = y - y.mean(axis=0)
    return float(np.sum((y @ basis) ** 2) / np.sum(y**2))


def coverage(rows: np.ndarray[Any, Any], runs: int, eps: float, **params: Any) -> float:
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    resolved = MECHANISM.prepare(ctx, 10, eps, 1e-6, MECHANISM.parse_params(params))
    spec = ReleaseSpec(k=10, epsilon=eps, delta=1e-6, params=resolved)
    hits = 0
    for seed in range(runs):
        out = MECHANISM.run(rows, spec, np.random.default_rng(seed))
        low, high = out.extras["explained_variance_ratio_interval"]
        if out.extras["explained_variance_hidden_by_noise"]:
            # Hidden: no point stated, the interval kept (issue 32 item 4).
            assert out.extras["explained_variance_ratio"] is None
            assert out.extras["explained_sum_of_squares"] is None
            assert 0.0 <= low <= high <= 1.0
        else:
            ratio = np.asarray(out.extras["explained_variance_ratio"])
            assert np.all(ratio >= 0) and ratio.sum() <= 1.0 + 1e-12
            assert 0.0 <= low <= ratio.sum() <= high <= 1.0
        assert out.basis is not None
        truth = true_share(rows, out.basis, params.get("center", "none") != "none")
        hits += low <= truth <= high
    return hits / runs


@pytest.mark.parametrize(
    ("eps", "params"),
    [
        (1.0, {"center": "private", "clip_quantile": 0.5}),
        (0.3, {"center": "private"}),
        (1.0, {}),
    ],
)
def test_the_interval_covers_the_truth_on_digits(eps: float, params: dict[str, Any]) -> None:
    # Stated 90%; 20 runs: a true coverage of 0.9 gives >= 15 hits with probability 0.99.
    assert coverage(digits_rows(), 20, eps, **params) >= 0.75


@pytest.mark.parametrize("center", ["none", "private"])
def test_the_interval_covers_the_truth_on_a_power_law_spectrum(center: str) -> None:
    assert coverage(power_law_rows(3000, 40, seed=5), 20, 1.0, center=center) >= 0.75


@pytest.mark.slow
@pytest.mark.parametrize("eps", [0.3, 1.0])
@pytest.mark.parametrize("center", ["none", "private"])
def test_coverage_reaches_the_issues_bar_over_many_runs(eps: float, center: str) -> None:
    # The issue's bar: the truth inside the stated 90% interval in at least 85% of runs.
    assert coverage(digits_rows(), 200, eps, center=center, clip_quantile=0.5) >= 0.85
    assert coverage(power_law_rows(3000, 40, seed=6), 200, eps, center=center) >= 0.85


def test_ratios_stay_in_the_unit_interval_whatever_the_noise() -> None:
    # Negative noisy sums, a huge bias bound, all-zero weights: never negative, never above 1.
    for captured, residual in ((-50.0, 10.0), (10.0, -50.0), (-5.0, -5.0), (1e9, 1.0)):
        est = explained_variance(captured, residual, 3.0, np.zeros(3), (1.0, 2.0), 1e6)
        assert np.all(est.ratio >= 0) and est.ratio.sum() <= 1.0
        low, high = est.interval
        assert 0.0 <= low <= est.ratio.sum() <= high <= 1.0


def test_a_noise_dominated_release_is_flagged_hidden_and_warned_about() -> None:
    # Isotropic rows at a budget whose noise hides everything (true share about k/d = 10/50):
    # the stated figure cannot be a measurement here, so every run says so, in the flag and in
    # the warning, while the interval still covers the truth.
    rows = np.random.default_rng(3).standard_normal((400, 50))
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    ctx = PublicContext(n_rows=400, n_cols=50, row_norm_bound=1.0)
    resolved = MECHANISM.prepare(ctx, 10, 0.05, 1e-6, MECHANISM.parse_params({}))
    spec = ReleaseSpec(k=10, epsilon=0.05, delta=1e-6, params=resolved)
    hits = 0
    for seed in range(20):
        out = MECHANISM.run(rows, spec, np.random.default_rng(seed))
        assert out.basis is not None
        low, high = out.extras["explained_variance_ratio_interval"]
        assert high - low >= module.HIDDEN_WIDTH
        assert out.extras["explained_variance_hidden_by_noise"] is True
        assert "noise hides how much variance" in out.extras["warning"]
        # Issue 32 item 4: no figure that reads as a measurement (it held one before).
        assert out.extras["explained_variance_ratio"] is None
        assert out.extras["explained_sum_of_squares"] is None
        hits += low <= true_share(rows, out.basis, centred=False) <= high
    assert hits >= 15


def test_withholding_the_point_touches_only_a_hidden_share() -> None:
    stored = {
        "explained_variance_ratio": [0.3, 0.2],
        "explained_sum_of_squares": [3.0, 2.0],
        "explained_variance_ratio_interval": [0.0, 1.0],
        "total_sum_of_squares": 10.0,
    }
    hidden = withhold_hidden_point({**stored, "explained_variance_hidden_by_noise": True})
    assert hidden["explained_variance_ratio"] is None
    assert hidden["explained_sum_of_squares"] is None
    assert hidden["explained_variance_ratio_interval"] == [0.0, 1.0]
    assert hidden["total_sum_of_squares"] == 10.0
    for flag in (False, None):
        shown = withhold_hidden_point({**stored, "explained_variance_hidden_by_noise": flag})
        assert shown["explained_variance_ratio"] == [0.3, 0.2]
    assert withhold_hidden_point({"eigenvalues": [1.0]}) == {"eigenvalues": [1.0]}


def test_a_hidden_share_shows_no_figures_whose_ratio_reads_as_a_point() -> None:
    # As the audit saw it (issue 32 item 4): the residual draw below 0 and the total equal to
    # the captured sum, so captured/total read 1 while the ratio was withheld.
    stored = {
        "captured_sum_of_squares": 180.0,
        "residual_sum_of_squares": -205.8,
        "total_sum_of_squares": 180.0,
        "variance_noise_std": 150.0,
        "explained_sum_of_squares": [1.0, 2.0],
        "explained_variance_ratio": [0.1, 0.2],
        "explained_variance_ratio_interval": [0.0, 1.0],
        "explained_variance_hidden_by_noise": True,
        "eigenvalues": [3.0, 2.0],
    }
    shown = shown_variance_extras(stored)
    sums = [shown[field] for field in (*SUM_FIELDS, "explained_sum_of_squares")]
    assert sums == [None, None, None, None]
    assert shown["explained_variance_ratio"] is None
    assert shown["explained_variance_ratio_interval"] == [0.0, 1.0]
    assert shown["variance_noise_std"] == 150.0
    assert shown["eigenvalues"] == [3.0, 2.0]
    assert stored["captured_sum_of_squares"] == 180.0  # the stored figures are not touched


@pytest.mark.parametrize("flag", [False, None])
def test_a_shown_noisy_sum_is_never_negative(flag: bool | None) -> None:
    stored = {
        "captured_sum_of_squares": 2188.9,
        "residual_sum_of_squares": -50.8,
        "total_sum_of_squares": 2188.9,
        "explained_variance_ratio": [0.6, 0.39],
        "explained_variance_hidden_by_noise": flag,
    }
    shown = shown_variance_extras(stored)
    assert shown["residual_sum_of_squares"] == 0.0
    assert shown["captured_sum_of_squares"] == 2188.9
    assert shown["total_sum_of_squares"] == 2188.9
    assert shown["explained_variance_ratio"] == [0.6, 0.39]
    low = shown_variance_extras({**stored, "captured_sum_of_squares": -3.0})
    assert low["captured_sum_of_squares"] == 0.0
    assert shown_variance_extras({"eigenvalues": [1.0]}) == {"eigenvalues": [1.0]}


def test_a_clear_release_is_not_flagged() -> None:
    # Power-law rows at eps 1: intervals about 0.1 wide, no flag and no hidden-variance warning.
    rows = power_law_rows(3000, 40, seed=5)
    ctx = PublicContext(n_rows=3000, n_cols=40, row_norm_bound=1.0)
    resolved = MECHANISM.prepare(ctx, 10, 1.0, 1e-6, MECHANISM.parse_params({}))
    spec = ReleaseSpec(k=10, epsilon=1.0, delta=1e-6, params=resolved)
    out = MECHANISM.run(rows, spec, np.random.default_rng(0))
    assert out.extras["explained_variance_hidden_by_noise"] is False
    assert "noise hides" not in out.extras.get("warning", "")


def test_a_non_positive_total_falls_back_to_the_prior_share_inside_the_interval() -> None:
    est = explained_variance(-5.0, 2.0, 3.0, np.ones(2), prior_share=0.04)
    assert est.interval == (0.0, 1.0)
    assert est.ratio.sum() == pytest.approx(0.04)
    assert est.hidden


# (captured, residual, noise sd): shares 0.05 to 0.88 with intervals 0.12-0.25 wide, where the
# previous estimator (shrunk towards k/d by a pseudo-sum of 2 sds) was 0.03-0.09 below the truth
# (0.807 stated on average for 0.88 at (880, 120, 60)).
NARROW_CASES = [(880.0, 120.0, 60.0), (300.0, 700.0, 60.0), (50.0, 950.0, 40.0),
                (2000.0, 1000.0, 150.0), (880.0, 120.0, 30.0)]  # fmt: skip


@pytest.mark.parametrize(("captured", "residual", "noise"), NARROW_CASES)
def test_the_point_estimate_is_unbiased_where_the_interval_is_narrow(
    captured: float, residual: float, noise: float
) -> None:
    rng = np.random.default_rng(11)
    truth = captured / (captured + residual)
    stated, widths, hits = [], [], 0
    for _ in range(2000):
        est = explained_variance(
            captured + rng.normal(0.0, noise), residual + rng.normal(0.0, noise), noise,
            np.ones(2), prior_share=0.02,
        )  # fmt: skip
        low, high = est.interval
        stated.append(est.ratio.sum())
        widths.append(high - low)
        hits += low <= truth <= high
    assert np.mean(widths) < module.HIDDEN_WIDTH
    # The issue's bar is 0.05; the estimator's own bias is below 0.005 in every case (the
    # mean of 2,000 draws has sd below 0.002), the old one's 0.03-0.09.
    assert abs(np.mean(stated) - truth) < 0.015, (np.mean(stated), truth)
    # Coverage kept: stated 90% (>= 0.915 by construction); 2,000 draws, margin 5 sds.
    assert hits / 2000 >= 0.88


def test_the_stated_share_matches_the_truth_on_digits_at_eps_1() -> None:
    # Recommended settings (private centre: clip quantile 0.3, chosen route), k = 10: intervals
    # about 0.18 wide (all 1,797 rows); the previous estimator stated 0.029 below the truth on
    # average here.
    rows = load_digits().data
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    ctx = PublicContext(n_rows=1797, n_cols=64, row_norm_bound=1.0)
    params = MECHANISM.parse_params({"center": "private"})
    resolved = MECHANISM.prepare(ctx, 10, 1.0, 1e-6, params)
    spec = ReleaseSpec(k=10, epsilon=1.0, delta=1e-6, params=resolved)
    errors = []
    for seed in range(20):
        out = MECHANISM.run(rows, spec, np.random.default_rng(100 + seed))
        assert out.basis is not None
        assert out.extras["explained_variance_hidden_by_noise"] is False
        truth = true_share(rows, out.basis, centred=True)
        errors.append(sum(out.extras["explained_variance_ratio"]) - truth)
    assert abs(np.mean(errors)) < 0.015, np.mean(errors)


# Empirical audit of the fresh (captured, residual) estimate for a fixed basis U = e1: the
# worst pair puts one row inside span(U) on one side and orthogonal to it on the other (the
# sums move by (C^2, -C^2), l2 sqrt(2) C^2). The released sums are all that depends on the data.
AUDIT_BASE = np.zeros((9, 2))
AUDIT_PAIR = (np.vstack([AUDIT_BASE, [1.0, 0.0]]), np.vstack([AUDIT_BASE, [0.0, 1.0]]))


def variance_noise(divisor: float) -> float:
    split = module.gauss_split(1.0, 1e-5, module.AnalyzeGaussParams())
    return module.gram_sensitivity(1.0) / split.variance_mu / divisor


def variance_release(
    rows: np.ndarray[Any, Any], rng: np.random.Generator, divisor: float = 1.0
) -> float:
    release = module.GaussRelease(np.array([[1.0], [0.0]]), np.array([5.0]), 5.0)
    noise = (variance_noise(divisor), 1.0, 0.0)
    extras = module.variance_extras(rows, release, 1.0, None, noise, rng)
    return float(extras["captured_sum_of_squares"] - extras["residual_sum_of_squares"])


def one_sd_above_the_first(divisor: float) -> Any:
    # captured - residual has mean 1 on the first side, -1 on the other, sd sqrt(2) noise.
    return lambda v: v > 1.0 + math.sqrt(2.0) * variance_noise(divisor)


def test_variance_estimate_audit_passes() -> None:
    result = audit(variance_release, *AUDIT_PAIR, one_sd_above_the_first(1.0), 3000, 1e-5, seed=7)
    assert result.eps_lower_bound <= 1.0


def test_variance_estimate_audit_negative_control_fails() -> None:
    def weak(rows: np.ndarray[Any, Any], rng: np.random.Generator) -> float:
        return variance_release(rows, rng, divisor=10.0)

    result = audit(weak, *AUDIT_PAIR, one_sd_above_the_first(10.0), 3000, 1e-5, seed=8)
    assert result.eps_lower_bound > 1.0


@pytest.mark.parametrize("scale", [1e-199, 1e-160, 1.0, 1e150, 1e300])
def test_the_bias_corrected_ratio_is_the_same_at_every_scale(scale: float) -> None:
    """Totality: the correction is computed as ``(s/T)^2``, so sums near the smallest doubles
    (``T^2`` underflows to 0; a hypothesis case had ``T = 5.7e-199``) or the largest give the
    scale-free answer instead of a ZeroDivisionError or an overflow."""
    from service.mechanisms.analyze_gauss import ratio_point

    reference = ratio_point(3.483931596089019, 2.219967258896202, 1.8893338373584702)
    assert reference is not None
    at_scale = ratio_point(
        3.483931596089019 * scale, 2.219967258896202 * scale, 1.8893338373584702 * scale
    )
    assert at_scale == pytest.approx(reference, rel=1e-12)


@pytest.mark.parametrize(("d", "params"), [(1, {}), (3, {"center": "private"}), (3, {})])
def test_a_basis_of_the_whole_space_states_a_share_of_one(d: int, params: dict[str, Any]) -> None:
    # k = d: the components span R^d, so they keep every row whole (a public fact); the noisy
    # sums used to state 0.81-0.88 at d = 1.
    rows = power_law_rows(400, d, seed=3)
    ctx = PublicContext(n_rows=400, n_cols=d, row_norm_bound=1.0)
    resolved = MECHANISM.prepare(ctx, d, 0.3, 1e-6, MECHANISM.parse_params(params))
    spec = ReleaseSpec(k=d, epsilon=0.3, delta=1e-6, params=resolved)
    for seed in range(5):
        out = MECHANISM.run(rows, spec, np.random.default_rng(seed))
        assert out.basis is not None
        assert out.extras["explained_variance_ratio_interval"] == [1.0, 1.0]
        assert out.extras["explained_variance_hidden_by_noise"] is False
        split_hidden = out.extras["components_above_noise"] < d
        assert out.extras["explained_variance_split_hidden_by_noise"] is split_hidden
        if split_hidden:
            # Fewer components above the noise than released: the split is no measurement.
            assert out.extras["explained_variance_ratio"] is None
            assert out.extras["explained_sum_of_squares"] is None
            continue
        assert math.isclose(sum(out.extras["explained_variance_ratio"]), 1.0, rel_tol=1e-12)
        assert min(out.extras["explained_sum_of_squares"]) >= 0


def test_a_narrow_interval_cut_at_zero_is_flagged_hidden() -> None:
    # Digits, standardised rows, k = 1, eps 1 (the route without a centre, the variance clip
    # at C): captured -72,475 and residual 187,284 with noise sd 43,554 on each. The interval
    # cut at 0 is [0, 0.15], narrow, so the release was not flagged and stated 0 for the 0.10
    # its component kept; uncut, the interval is about 1.5 wide.
    est = explained_variance(-72_475.0, 187_284.0, 43_554.0, np.ones(1), prior_share=1 / 64)
    low, high = est.interval
    assert high - low < module.HIDDEN_WIDTH
    assert est.hidden


@pytest.mark.parametrize(
    ("captured", "residual", "noise"),
    [(11_000.0, 86_000.0, 10_000.0), (11_000.0, 86_000.0, 43_554.0), (600.0, 400.0, 60.0)],
)
def test_a_release_not_flagged_hidden_states_its_share_within_the_goal(
    captured: float, residual: float, noise: float
) -> None:
    # Issue 32 item 4: where the share is not flagged hidden, the point estimate is within
    # 0.05 of the truth on average. With the noise about a tenth of the total (and more) the
    # unflagged releases were the low draws whose interval was cut at 0: 1,528 of 4,000
    # unflagged at sd 10,000, stating 0.07 below the 0.113 kept on average.
    rng = np.random.default_rng(5)
    truth = captured / (captured + residual)
    errors = []
    for _ in range(4000):
        est = explained_variance(
            captured + rng.normal(0.0, noise), residual + rng.normal(0.0, noise), noise,
            np.ones(1), prior_share=1 / 64,
        )  # fmt: skip
        if not est.hidden:
            errors.append(est.ratio.sum() - truth)
    # Fewer than 1% unflagged (the rare high draws of the total) is no cell to average over.
    if len(errors) >= 40:
        assert abs(np.mean(errors)) < 0.05, (len(errors), np.mean(errors))


def test_the_warning_of_a_cut_interval_says_what_the_noise_spans() -> None:
    # Rows whose captured share is small at a budget where the noise is about the total:
    # whatever the draw, a release whose interval came out narrow says why it is still hidden.
    rows = np.random.default_rng(4).standard_normal((300, 30))
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    ctx = PublicContext(n_rows=300, n_cols=30, row_norm_bound=1.0)
    resolved = MECHANISM.prepare(ctx, 1, 0.3, 1e-6, MECHANISM.parse_params({}))
    spec = ReleaseSpec(k=1, epsilon=0.3, delta=1e-6, params=resolved)
    for seed in range(30):
        out = MECHANISM.run(rows, spec, np.random.default_rng(seed))
        low, high = out.extras["explained_variance_ratio_interval"]
        assert out.extras["explained_variance_hidden_by_noise"] is True
        if high - low < module.HIDDEN_WIDTH:
            assert "cut at 0 or 1" in out.extras["warning"]


def test_a_narrow_interval_cut_at_zero_by_the_centre_bound_is_flagged_hidden() -> None:
    # MNIST 2,000 x 784, spatial_sign with a private centre, k = 10, eps 0.7: captured 250 and
    # residual 1,215 (noise sd 26), the centre's error bound about 313: the interval [0, 0.26]
    # came out narrow and unflagged while the release stated 0.21 for the 0.06 it kept.
    est = explained_variance(
        250.0, 1215.0, 26.0, np.ones(10), (0.0, 0.0), 313.0, prior_share=10 / 784
    )
    low, high = est.interval
    # 0.263 wide: above the derived edge (0.257) itself now, so hidden either way.
    assert low == 0.0 and 0.26 < high - low < 0.3
    assert est.hidden
    # The same with a larger residual: cut at 0 to 0.21, under the edge, while its box
    # before the cut is 0.29 wide; still hidden, by the uncut box alone.
    est = explained_variance(
        250.0, 1500.0, 26.0, np.ones(10), (0.0, 0.0), 313.0, prior_share=10 / 784
    )
    low, high = est.interval
    assert low == 0.0 and high - low < module.HIDDEN_WIDTH <= est.spread
    assert est.hidden


def _sums_of_width(width: float, share: float, total: float = 1000.0) -> tuple[float, float, float]:
    """``(captured, residual, noise_std)`` whose box interval (no centre) is ``width`` wide
    before its cut: ``2 z s / T = width``."""
    from service.mechanisms.explained_variance import BOX_Z

    return share * total, (1.0 - share) * total, width * total / (2.0 * BOX_Z)


def test_the_hidden_width_follows_from_the_points_accuracy() -> None:
    # Issue 32 item 4: a point's mean absolute error at most 0.05, sd at most w/(2z) for an
    # interval w wide, so w <= 0.05 * 2 ndtri(0.98) / sqrt(2/pi) = 0.2574 (not a round 0.3).
    from scipy.special import ndtri

    from dpss_client.pca import HIDDEN_WIDTH as CLIENT_WIDTH
    from service.mechanisms.explained_variance import POINT_ACCURACY, uncut_width

    expected = 0.05 * 2.0 * float(ndtri(0.98)) / math.sqrt(2.0 / math.pi)
    assert POINT_ACCURACY == 0.05
    assert math.isclose(module.HIDDEN_WIDTH, expected, rel_tol=1e-12)
    assert 0.257 < module.HIDDEN_WIDTH < 0.258
    # The client's copy (for releases older than the flag) is the same figure.
    assert math.isclose(CLIENT_WIDTH, module.HIDDEN_WIDTH, rel_tol=1e-12)
    # uncut_width is the construction the derivation assumes: 2 z s / T exactly, no centre.
    captured, residual, noise = _sums_of_width(0.28, 0.4)
    assert uncut_width(captured, residual, noise, 0.0) == pytest.approx(0.28, rel=1e-12)


@pytest.mark.parametrize("width", [0.26, 0.28, 0.299])
def test_an_interval_just_under_the_old_edge_now_hides_the_share(width: float) -> None:
    # An interval 0.26-0.299 wide, well inside [0, 1] (no cut): stated before (the edge was
    # 0.3), hidden now, the point's mean absolute error there being 0.051-0.058 at worst.
    captured, residual, noise = _sums_of_width(width, 0.4)
    est = explained_variance(captured, residual, noise, np.ones(2))
    low, high = est.interval
    assert high - low == pytest.approx(width, rel=1e-9) and 0.0 < low < high < 1.0
    assert est.hidden is True
    # Just under the new edge it is stated.
    captured, residual, noise = _sums_of_width(module.HIDDEN_WIDTH - 0.002, 0.4)
    assert explained_variance(captured, residual, noise, np.ones(2)).hidden is False


def _mean_abs_error(width: float, share: float, draws: int, seed: int) -> float:
    from service.mechanisms.explained_variance import ratio_point

    captured, residual, noise = _sums_of_width(width, share)
    rng = np.random.default_rng(seed)
    noisy = rng.normal(0.0, noise, size=(draws, 2)) + np.asarray([captured, residual])
    points = [ratio_point(float(c), float(r), noise) for c, r in noisy]
    assert all(p is not None for p in points)
    return float(np.mean(np.abs(np.asarray(points, dtype=float) - share)))


def test_the_derivations_factor_matches_the_estimators_simulated_error() -> None:
    # The estimator itself (ratio_point, unclamped), seeded: at a share of 0 (its sd largest,
    # s/T) an interval HIDDEN_WIDTH wide gives a mean absolute error of 0.05 (MC se ~1e-4); at
    # the former 0.3 it is 0.058, above the goal; at a share of 1/2 the sd is 1/sqrt(2) of it.
    at_edge = _mean_abs_error(module.HIDDEN_WIDTH, 0.0, 100_000, 11)
    assert at_edge == pytest.approx(0.05, abs=0.0015)
    assert _mean_abs_error(0.3, 0.0, 100_000, 12) > 0.056
    assert _mean_abs_error(module.HIDDEN_WIDTH, 0.5, 100_000, 13) == pytest.approx(
        0.05 / math.sqrt(2.0), abs=0.0015
    )


@pytest.mark.parametrize("share", [0.05, 0.2, 0.5, 0.8, 0.95])
def test_a_stated_point_just_inside_the_edge_is_within_the_goal_on_average(share: float) -> None:
    # The released point (clamped into its interval) wherever it is stated with an interval
    # just under HIDDEN_WIDTH: mean absolute error at most 0.05 at every share (seeded draws).
    captured, residual, noise = _sums_of_width(module.HIDDEN_WIDTH - 0.001, share)
    rng = np.random.default_rng(int(share * 100))
    errors = []
    for c_noise, r_noise in rng.normal(0.0, noise, size=(4000, 2)):
        est = explained_variance(captured + c_noise, residual + r_noise, noise, np.ones(2))
        if not est.hidden:
            errors.append(abs(float(est.ratio.sum()) - share))
    assert len(errors) > 1000
    assert float(np.mean(errors)) <= 0.05 + 0.002


def _stated_errors(
    width: float, share: float, draws: int, seed: int, split: bool
) -> tuple[list[float], int, int]:
    """The released estimator on seeded draws of the two sums (no centre) at a true box width
    ``width``: the stated points' absolute errors, how many were stated, and how many of the
    stated releases' intervals cover ``share``. ``split``: the service's decision (a fission
    draw per release); else the decision on the full sums' width (the rule before the split)."""
    captured, residual, noise = _sums_of_width(width, share)
    rng = np.random.default_rng(seed)
    errors: list[float] = []
    covered = 0
    for c_noise, r_noise, z in rng.normal(0.0, 1.0, size=(draws, 3)):
        est = explained_variance(
            captured + noise * c_noise,
            residual + noise * r_noise,
            noise,
            np.ones(2),
            split_draw=math.sqrt(2.0) * noise * z if split else None,
        )
        if not est.hidden:
            errors.append(abs(float(est.ratio.sum()) - share))
            covered += est.interval[0] <= share <= est.interval[1]
    return errors, len(errors), covered


@pytest.mark.parametrize("share", [0.05, 0.1, 0.15])
@pytest.mark.parametrize("width", [0.26, 0.28])
def test_a_point_stated_near_the_edge_is_within_the_goal_despite_the_selection(
    share: float, width: float
) -> None:
    # Issue 32 item 4's selection effect: where the true interval is just above the edge, the
    # few releases that got under it drew a high noisy total, which pulled their point up (the
    # rule on the full sums, same draws: 18% stated at 0.28, mean absolute error 0.052-0.062 at
    # these shares). The decision now reads a split of the total independent of the point, so
    # the stated points' error is the point's own: at most 0.05 on average (seeded, 6,000
    # draws, MC se ~6e-4), and the stated releases' intervals still cover 90%.
    seed = int(share * 1000 + width * 100)
    errors, stated, covered = _stated_errors(width, share, 6000, seed, split=True)
    assert stated > 600  # 24-36% of the runs state a point: no empty promise
    assert float(np.mean(errors)) <= 0.05
    assert covered >= 0.9 * stated
    if width == 0.28 and share <= 0.1:
        # The same draws under the rule before the split miss the goal (the defect).
        old, _, _ = _stated_errors(width, share, 6000, seed, split=False)
        assert float(np.mean(old)) > 0.053


def test_the_split_decision_is_independent_of_the_points_error() -> None:
    # The fission (split_total): T^ + tau Z and T^ - Z/tau are uncorrelated, and uncorrelated
    # with c^ - r^ (jointly Gaussian, hence independent), at the variances the derivation uses.
    from service.mechanisms.explained_variance import SPLIT_RATIO, split_total

    rng = np.random.default_rng(71)
    noise = 3.0
    sums = rng.normal(0.0, noise, size=(200_000, 2)) + np.asarray([40.0, 60.0])
    draws = rng.normal(0.0, math.sqrt(2.0) * noise, size=200_000)
    decision, c_point, r_point = split_total(sums[:, 0], sums[:, 1], draws)  # type: ignore[arg-type]
    point_total = np.asarray(c_point) + np.asarray(r_point)
    difference = np.asarray(c_point) - np.asarray(r_point)
    assert np.allclose(difference, sums[:, 0] - sums[:, 1])
    cov = np.cov(np.vstack([np.asarray(decision), point_total, difference]))
    tau = SPLIT_RATIO
    assert cov[0, 0] == pytest.approx(2 * noise**2 * (1 + tau**2), rel=0.01)
    assert cov[1, 1] == pytest.approx(2 * noise**2 * (1 + 1 / tau**2), rel=0.01)
    assert cov[2, 2] == pytest.approx(2 * noise**2, rel=0.01)
    corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    assert abs(corr[0, 1]) < 0.01 and abs(corr[0, 2]) < 0.01 and abs(corr[1, 2]) < 0.01


def test_the_split_releases_the_same_sums_at_the_same_noise() -> None:
    # Privacy: the split is post-processing. The released sums are the one draw at
    # variance_noise_std they were before (same seed, same figures), and the fission draw comes
    # after it, independent of the data (its figure, the decision's width, is released).
    rows = np.random.default_rng(5).standard_normal((50, 2))
    rows = clip_rows(rows, 1.0)
    release = module.GaussRelease(np.array([[1.0], [0.0]]), np.array([5.0]), 5.0)
    noise = (0.7, 0.1, 0.0)
    extras = module.variance_extras(rows, release, 1.0, None, noise, np.random.default_rng(9))
    from service.mechanisms.linalg import captured_energy
    from service.mechanisms.noise import GRID_DIVISOR, round_to_grid

    exact = np.asarray(captured_energy(rows, release.basis, 1.0, None))
    rng = np.random.default_rng(9)
    expected = round_to_grid(exact + rng.normal(0.0, 0.7, size=2), 0.7 / GRID_DIVISOR)
    assert extras["captured_sum_of_squares"] == expected[0]
    assert extras["residual_sum_of_squares"] == expected[1]
    assert extras["variance_noise_std"] == 0.7
    z = float(rng.normal(0.0, math.sqrt(2.0) * 0.7))
    from service.mechanisms.explained_variance import SPLIT_RATIO, decision_width

    width = decision_width(float(expected.sum()) + SPLIT_RATIO * z, 0.7, 0.0)
    assert extras["explained_variance_decision_width"] == pytest.approx(width, rel=1e-12)
    assert extras["explained_variance_hidden_by_noise"] is (width >= module.HIDDEN_WIDTH)
