"""M7 spectrum: calibration (Mirsky), rounding, suggested k, utility, refusals and the audit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.mechanisms import spectrum as module
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.linalg import clip_rows
from service.mechanisms.noise import analytic_gaussian_sigma
from service.mechanisms.spectrum import (
    GRID_DIVISOR,
    Spectrum,
    SpectrumParams,
    noise_std,
    round_to_grid,
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
def test_noise_std_is_analytic_gaussian_for_2c(clip: float, eps: float, delta: float) -> None:
    assert spectrum_sensitivity(clip) == 2 * clip
    assert noise_std(clip, eps, delta) == analytic_gaussian_sigma(2 * clip, eps, delta)


def test_mirsky_bound_2c_holds_on_random_neighbours() -> None:
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(500):
        n = int(rng.integers(1, 6))
        data = clip_rows(rng.standard_normal((n, 4)) * 2, 1.0)
        neighbour = data.copy()
        neighbour[int(rng.integers(n))] = clip_rows(rng.standard_normal((1, 4)) * 2, 1.0)[0]
        a = np.linalg.svd(data, compute_uv=False)
        b = np.linalg.svd(neighbour, compute_uv=False)
        worst = max(worst, float(np.linalg.norm(a - b)))
    assert worst <= 2.0 + 1e-12


def test_noise_added_has_the_stated_std(monkeypatch: pytest.MonkeyPatch) -> None:
    # With no data signal (all-zero rows) the released values are |noise| sorted: compare the
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


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([100.0, 90.0, 80.0, 5.0, 3.0], 3),  # drop at 3 (80 vs the floor 2)
        ([100.0, 40.0, 39.0], 1),  # the first large drop wins
        ([10.0, 5.0, 4.0], 1),  # exactly DROP_RATIO counts
        ([10.0, 9.0, 8.0], 3),  # no drop, all significant: m
        ([1.0, 0.5, 0.1], 1),  # all noise: at least 1
        ([50.0], 1),
    ],
)
def test_suggest_k(values: list[float], expected: int) -> None:
    assert suggest_k(np.array(values), 1.0) == expected


# ---------------------------------------------------------------------------------------------
# Utility and the Mechanism wrapper


def test_released_values_are_within_the_stated_noise_and_suggest_three() -> None:
    data, _ = near_subspace(20_000, 20, 3, seed=2)
    truth = np.linalg.svd(data, compute_uv=False)
    rng = np.random.default_rng(3)
    for _ in range(5):
        values, suggested, std = spectrum(data, 20, 1.0, 1e-6, 1.0, rng)
        assert np.all(np.diff(values) <= 0) and np.all(values >= 0)
        grid = std / GRID_DIVISOR
        assert values / grid == pytest.approx(np.round(values / grid), abs=1e-6)
        # Clamping and sorting never increase the largest error: max |noise| of 20 draws.
        assert np.abs(values - truth).max() <= 5 * std + grid
        assert suggested == 3


def test_mechanism_run_extras() -> None:
    mechanism = Spectrum()
    ctx = PublicContext(n_rows=2000, n_cols=8, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 5, 1.0, 1e-6, SpectrumParams())
    data, _ = near_subspace(2000, 8, 2, seed=4)
    out = mechanism.run(data, ReleaseSpec(5, 1.0, 1e-6, params), np.random.default_rng(5))
    assert out.basis is None and out.no_result_reason is None
    assert set(out.extras) == {"singular_values", "suggested_k", "noise_std", "grid"}
    assert len(out.extras["singular_values"]) == 5
    assert all(isinstance(v, float) for v in out.extras["singular_values"])
    assert isinstance(out.extras["suggested_k"], int)
    assert out.extras["noise_std"] == noise_std(1.0, 1.0, 1e-6)
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

# One row of norm C against a zero row: the top singular value moves by C (half the Mirsky
# bound 2C; a single replacement moves the whole vector by at most ~C in the pairs we could
# build). The event is a threshold on the released top value.
PAIR = (np.array([[1.0, 0.0]]), np.array([[0.0, 0.0]]))


def release(data: np.ndarray, rng: np.random.Generator) -> Any:
    return spectrum(data, 1, EPS, DELTA, 1.0, rng)[0]


def top_above(values: np.ndarray) -> bool:
    return bool(values[0] > 1.2)


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
