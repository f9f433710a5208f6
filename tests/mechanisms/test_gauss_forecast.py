"""The dry run's forecast from public facts (service/mechanisms/gauss_forecast.py): the figures
its sentence states agree with each other and with what a release keeps at the edges (noise
only, k = d, k = 1, d = 1, tiny n)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from service.mechanisms.gauss_forecast import (
    power_law_captured,
    recoverable_forecast,
    spectrum_bounds,
)


def _stated(meaning: str) -> list[str]:
    return re.findall(r"between (\S+) and (\S+) of", meaning)


@pytest.mark.parametrize(("n", "d", "k"), [(10, 4, 1), (10, 8, 2), (5, 64, 10), (50, 784, 10)])
def test_a_noise_only_forecast_states_k_over_d_and_no_degenerate_range(
    n: int, d: int, k: int
) -> None:
    # Before: the 1/i figure fell to 0 ("about 0 of the variance") beside "between k/d and
    # k/d", while a random k-subspace keeps k/d of any spectrum on average, never 0.
    forecast = recoverable_forecast(100.0, n, d, k, 1.0)
    assert forecast.share_range == pytest.approx((k / d, k / d))
    assert forecast.power_law_share == pytest.approx(k / d)
    assert "about 0 of" not in forecast.meaning
    assert not any(low == high for low, high in _stated(forecast.meaning))
    assert f"random {k}-dimensional subspace" in forecast.meaning
    assert f"k/d = {k / d:.3g}" in forecast.meaning
    # sigma sqrt(d) above the largest trace n C^2: said as a multiple, not "20 of n C^2".
    assert "times n C^2, the largest trace" in forecast.meaning


@pytest.mark.parametrize(("sigma", "n", "d"), [(100.0, 10, 4), (1.0, 1000, 4), (0.5, 10, 1)])
def test_k_equal_to_d_keeps_everything_and_says_so(sigma: float, n: int, d: int) -> None:
    # Before (k = d, noise only): "would capture about 0 of the variance (non-private PCA:
    # 1)" and "between 1 and 1"; d basis vectors span R^d, so every release keeps it all.
    forecast = recoverable_forecast(sigma, n, d, d, 1.0)
    assert forecast.power_law_share == 1.0
    assert forecast.share_range == (1.0, 1.0)
    assert "capture all of the variance" in forecast.meaning
    assert "span every direction" in forecast.meaning
    assert not _stated(forecast.meaning)


def test_one_component_reads_in_the_singular() -> None:
    meaning = recoverable_forecast(1.0, 1000, 4, 1, 1.0).meaning
    assert "k = 1 released component would" in meaning
    assert "The component stands out" in meaning
    assert "All k components" not in meaning


@pytest.mark.parametrize("d", [2, 5, 30, 200])
@pytest.mark.parametrize("n", [5, 100, 10**4, 10**6])
def test_the_power_law_point_lies_in_the_range_and_falls_with_the_noise(d: int, n: int) -> None:
    # auto_gram ranks its two Gram candidates by this figure: it must not rise with sigma
    # (the smaller noise keeps at least as much) and never leave what any spectrum allows.
    for k in sorted({1, max(1, d // 2), d - 1, d}):
        previous = math.inf
        for sigma in np.geomspace(1e-3, 1e5, 60):
            share = power_law_captured(float(sigma), n, d, k, 1.0)
            flat, one = spectrum_bounds(float(sigma), n, d, k, 1.0)
            assert flat - 1e-12 <= share <= one + 1e-12
            assert share <= previous + 1e-12
            previous = share


def test_the_power_law_point_is_the_non_private_share_without_noise() -> None:
    d, k = 64, 10
    weights = 1.0 / np.arange(1, d + 1)
    assert power_law_captured(1e-9, 1797, d, k, 1.0) == pytest.approx(
        float(weights[:k].sum() / weights.sum())
    )
