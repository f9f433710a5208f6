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
        ratio = np.asarray(out.extras["explained_variance_ratio"])
        low, high = out.extras["explained_variance_ratio_interval"]
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


def test_a_hidden_release_states_what_a_random_subspace_keeps_not_half() -> None:
    # Isotropic rows at a budget whose noise hides everything: the release is about a random
    # subspace (true share about k/d = 10/50). The interval's midpoint (0.5 whatever the data)
    # and the unshrunk c/(c + r) of the draws with c > 0 stated 0.39 on average here.
    rows = np.random.default_rng(3).standard_normal((400, 50))
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    ctx = PublicContext(n_rows=400, n_cols=50, row_norm_bound=1.0)
    resolved = MECHANISM.prepare(ctx, 10, 0.05, 1e-6, MECHANISM.parse_params({}))
    spec = ReleaseSpec(k=10, epsilon=0.05, delta=1e-6, params=resolved)
    stated, truth = [], []
    for seed in range(40):
        out = MECHANISM.run(rows, spec, np.random.default_rng(seed))
        assert out.basis is not None
        stated.append(sum(out.extras["explained_variance_ratio"]))
        truth.append(true_share(rows, out.basis, centred=False))
    assert abs(np.mean(truth) - 0.2) < 0.03
    assert abs(np.mean(stated) - np.mean(truth)) < 0.06, (np.mean(stated), np.mean(truth))


def test_a_hidden_sum_falls_back_to_the_prior_share_inside_the_interval() -> None:
    est = explained_variance(-5.0, 40.0, 3.0, np.ones(2), prior_share=0.04)
    low, high = est.interval
    assert est.ratio.sum() == pytest.approx(min(max(0.04, low), high))


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
