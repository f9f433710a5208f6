"""analyze_gauss's explained variance (issue 24, item 1): ratios in [0, 1] summing to at most 1,
and a stated 90% interval that covers the share the released components truly capture, on
digits and on synthetic data with known power-law spectra, centred and not."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_digits

from service.mechanisms.analyze_gauss import AnalyzeGauss, explained_variance
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.linalg import clip_rows

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
