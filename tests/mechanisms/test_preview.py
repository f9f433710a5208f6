"""Each mechanism's preview reports the scales its run uses (same functions, checked on runs)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from service.mechanisms import (
    analyze_gauss,
    friendly_aggregate,
    friendly_ptr,
    gap_perturbation,
    smooth_sensitivity,
)
from service.mechanisms.base import Preview, PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism


def prepared(name: str, data: np.ndarray, k: int, eps: float, delta: float, **params: Any):
    mechanism = get_mechanism(name)
    assert mechanism is not None
    n, d = data.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    resolved = mechanism.prepare(ctx, k, eps, delta, mechanism.parse_params(params))
    spec = ReleaseSpec(k=k, epsilon=eps, delta=delta, params=resolved)
    shown = mechanism.preview(ctx, spec)
    assert isinstance(shown, Preview) and shown.meaning
    for value in shown.scales.values():
        assert not isinstance(value, float) or math.isfinite(value)
    return mechanism, spec, shown


def unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    rows = rng.standard_normal((n, d))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def recorder(monkeypatch, module, name: str) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []
    original = getattr(module, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)
    return calls


def test_analyze_gauss_preview_sigma_is_the_runs(monkeypatch, rng):
    data = unit_rows(rng, 50, 5)
    mechanism, spec, shown = prepared("analyze_gauss", data, 2, 0.5, 1e-6)
    calls = recorder(monkeypatch, analyze_gauss, "symmetric_gaussian")
    mechanism.run(data, spec, np.random.default_rng(1))
    assert calls[0][1] == shown.scales["sigma"]
    assert shown.scales["noise_spectral_norm"] == 2 * calls[0][1] * math.sqrt(5)
    # Davis-Kahan with Weyl: ||E|| / (gap - ||E||) = 0.1 at the stated gap.
    norm, gap = shown.scales["noise_spectral_norm"], shown.scales["gap_for_error_0_1"]
    assert norm / (gap - norm) == pytest.approx(0.1)


def test_gap_perturbation_preview_scales_are_the_runs(monkeypatch, rng):
    data = unit_rows(rng, 50, 5)
    mechanism, spec, shown = prepared("gap_perturbation", data, 2, 0.5, 1e-6)
    laplace_calls = recorder(monkeypatch, gap_perturbation, "laplace")
    mechanism.run(data, spec, np.random.default_rng(1))
    assert laplace_calls[0][0] == shown.scales["gap_noise_scale"]

    # The test passes exactly above the stated no-result gap when the Laplace draw is 0.
    monkeypatch.setattr(gap_perturbation, "laplace", lambda scale, rng: np.float64(0.0))
    edge = shown.scales["no_result_gap"]
    split = gap_perturbation.budget_split(spec.epsilon, spec.delta)
    args = (1.0, split.epsilon1, split.delta1, np.random.default_rng(0))
    assert gap_perturbation.gap_test(edge * (1 + 1e-9), *args).passed
    assert not gap_perturbation.gap_test(edge * (1 - 1e-9), *args).passed

    # When the test passes, the projector noise is the stated multiple of 2 C^2/(g_low - C^2).
    gap_low = 12.5
    monkeypatch.setattr(
        gap_perturbation, "gap_test", lambda *a: gap_perturbation.GapTest(gap_low, True)
    )
    noise_calls = recorder(monkeypatch, gap_perturbation, "symmetric_gaussian")
    mechanism.run(data, spec, np.random.default_rng(1))
    expected = shown.scales["projector_sigma_per_unit_sensitivity"] * 2.0 / (gap_low - 1.0)
    assert noise_calls[0][1] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("delta", [1e-6, 0.0])
def test_smooth_sensitivity_preview_beta_and_multiplier_are_the_runs(monkeypatch, rng, delta):
    data = unit_rows(rng, 50, 5)
    mechanism, spec, shown = prepared("smooth_sensitivity", data, 2, 0.5, delta)
    calls = recorder(monkeypatch, smooth_sensitivity, "smooth_bound")
    output = mechanism.run(data, spec, np.random.default_rng(1))
    assert output.extras["variant"] == shown.scales["variant"]
    assert calls[0][3] == shown.scales["beta"]
    smooth = smooth_sensitivity.smooth_bound(*calls[0])
    per_s = shown.scales["noise_per_unit_smooth_bound"]
    if delta > 0:
        used = smooth_sensitivity.gaussian_noise_scale(smooth, spec.epsilon, delta)
    else:
        used = smooth_sensitivity.cauchy_noise_scale(math.sqrt(10) * smooth, spec.epsilon)
    assert used == pytest.approx(per_s * smooth, rel=1e-12)
    assert smooth <= shown.scales["smooth_bound_cap"]
    # Below the stated gap S is at least half the cap; well above it, less.
    beta, cap, half = (
        shown.scales["beta"],
        shown.scales["smooth_bound_cap"],
        shown.scales["half_noise_gap"],
    )
    for gap in (0.5, half * 0.5, half * 0.999):
        assert smooth_sensitivity.smooth_bound(gap, 2, 1.0, beta) >= cap / 2
    assert smooth_sensitivity.smooth_bound(half * 3, 2, 1.0, beta) < cap / 2


def test_spectrum_preview_is_the_runs(rng):
    data = unit_rows(rng, 50, 5)
    mechanism, spec, shown = prepared("spectrum", data, 3, 0.5, 1e-6)
    extras = mechanism.run(data, spec, np.random.default_rng(1)).extras
    assert extras["noise_std"] == shown.scales["noise_std"]
    assert extras["signal_threshold"] == shown.scales["signal_threshold"]
    assert extras["grid"] == shown.scales["grid"]


def test_exact_gapmax_preview_is_the_runs(rng):
    data = np.outer(rng.integers(1, 50, size=40), [1.0, 2.0, 0.0, 3.0])
    mechanism, spec, shown = prepared("exact_gapmax", data, 1, 2.0, 1e-2)
    extras = mechanism.run(data, spec, np.random.default_rng(1)).extras
    for name in ("sample_rows", "null_score", "noise_bound"):
        assert extras[name] == shown.scales[name]


@pytest.mark.parametrize("boost", [{}, {"boost_beta": 0.5, "boost_alpha": 0.5}])
def test_histogram_aggregate_preview_is_the_runs(rng, boost):
    data = unit_rows(rng, 600, 3)
    mechanism, spec, shown = prepared(
        "histogram_aggregate", data, 1, 2.0, 1e-2, cell_width=0.5, **boost
    )
    extras = mechanism.run(data, spec, np.random.default_rng(1)).extras
    for name in ("t", "m", "q", "cell_width", "threshold", *(("groups",) if boost else ())):
        assert extras[name] == shown.scales[name]


@pytest.mark.usefixtures("basic_accounting")
@pytest.mark.parametrize("radius", [None, 0.5])
def test_friendly_aggregate_preview_weight_test_is_the_runs(monkeypatch, rng, radius):
    data = unit_rows(rng, 800, 3)
    extra = {} if radius is None else {"radius": radius}
    mechanism, spec, shown = prepared("friendly_aggregate", data, 1, 2.0, 1e-2, t=80, **extra)
    calls = recorder(monkeypatch, friendly_ptr, "laplace")
    floors = recorder(monkeypatch, friendly_ptr, "weight_lower_bound")
    mechanism.run(data, spec, np.random.default_rng(1))
    # The weight test's Laplace draw is the last before the Gaussian mean noise.
    assert calls[-1][0] == shown.scales["weight_noise_scale"]
    # the PTR step's call is the last (budget_split's agreeing_noise calls it first)
    noisy, sens, _, _ = floors[-1]
    assert noisy - friendly_aggregate.weight_lower_bound(*floors[-1]) == pytest.approx(
        shown.scales["weight_shift"], rel=1e-12
    )
    assert friendly_aggregate.weight_floor(sens) == shown.scales["ptr_floor"]
