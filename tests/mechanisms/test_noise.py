"""Calibration of every primitive in service/mechanisms/noise.py."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from randomgen import ChaCha
from scipy import stats

from service.mechanisms.noise import (
    analytic_gaussian_sigma,
    cauchy,
    gaussian_delta,
    haar_orthogonal,
    laplace,
    secure_generator,
    symmetric_gaussian,
    truncated_laplace,
    truncated_laplace_params,
    truncated_laplace_ppf,
)

# ---------------------------------------------------------------------------------------------
# Analytic Gaussian (Balle & Wang 2018)


def delta_direct(sigma: float, sensitivity: float, epsilon: float) -> float:
    """Balle & Wang's delta(sigma) in linear space, an independent check of the log-space one."""
    a = sensitivity / (2 * sigma)
    b = epsilon * sigma / sensitivity
    return float(stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b))


@pytest.mark.parametrize(
    ("sigma", "sensitivity", "epsilon"),
    [(1.0, 1.0, 1.0), (3.0, 1.0, 0.5), (0.5, 2.0, 2.0), (10.0, 7.0, 0.1), (4.0, 1.0, 1.0)],
)
def test_gaussian_delta_matches_the_linear_space_formula(
    sigma: float, sensitivity: float, epsilon: float
) -> None:
    assert gaussian_delta(sigma, sensitivity, epsilon) == pytest.approx(
        delta_direct(sigma, sensitivity, epsilon), rel=1e-9, abs=1e-15
    )


def test_gaussian_delta_decreases_in_sigma() -> None:
    sigmas = np.geomspace(0.1, 100, 200)
    deltas = [gaussian_delta(s, 1.0, 1.0) for s in sigmas]
    assert all(x >= y for x, y in itertools.pairwise(deltas))


@settings(max_examples=300, deadline=None)
# delta(.) rounds differently at D = 1 and here: scaling the unit sigma alone missed by 1e-10.
@example(log_sensitivity=0.0625, epsilon=0.001, log_delta=-10.0533279121552)
@given(
    log_sensitivity=st.floats(min_value=-4, max_value=4),
    epsilon=st.floats(min_value=1e-3, max_value=30.0),
    log_delta=st.floats(min_value=-15, max_value=-0.5),
)
def test_analytic_sigma_is_the_smallest_that_meets_the_bound(
    log_sensitivity: float, epsilon: float, log_delta: float
) -> None:
    sensitivity = 10.0**log_sensitivity
    delta = 10.0**log_delta
    sigma = analytic_gaussian_sigma(sensitivity, epsilon, delta)
    assert gaussian_delta(sigma, sensitivity, epsilon) <= delta
    assert gaussian_delta(0.99 * sigma, sensitivity, epsilon) > delta


@settings(max_examples=100, deadline=None)
@given(
    epsilon=st.floats(min_value=1e-3, max_value=1.0),
    log_delta=st.floats(min_value=-12, max_value=-2),
)
def test_analytic_sigma_beats_the_classical_one_for_eps_below_one(
    epsilon: float, log_delta: float
) -> None:
    delta = 10.0**log_delta
    classical = math.sqrt(2 * math.log(1.25 / delta)) / epsilon
    assert analytic_gaussian_sigma(1.0, epsilon, delta) <= classical


def test_analytic_sigma_scales_linearly_with_sensitivity() -> None:
    base = analytic_gaussian_sigma(1.0, 1.0, 1e-6)
    assert analytic_gaussian_sigma(7.5, 1.0, 1e-6) == pytest.approx(7.5 * base, rel=1e-9)


def test_analytic_sigma_refuses_bad_arguments() -> None:
    for args in [(0.0, 1.0, 1e-6), (1.0, 0.0, 1e-6), (1.0, 1.0, 0.0), (1.0, 1.0, 1.0)]:
        with pytest.raises(ValueError):
            analytic_gaussian_sigma(*args)


# ---------------------------------------------------------------------------------------------
# Laplace and truncated Laplace


def test_laplace_matches_its_cdf() -> None:
    samples = laplace(2.5, np.random.default_rng(1), size=20_000)
    assert stats.kstest(samples, stats.laplace(scale=2.5).cdf).pvalue > 1e-3


@pytest.mark.parametrize(
    ("sensitivity", "epsilon", "delta"), [(2.0, 1.0, 1e-6), (1.0, 0.1, 1e-3), (3.0, 5.0, 1e-9)]
)
def test_truncated_laplace_params(sensitivity: float, epsilon: float, delta: float) -> None:
    lam, bound = truncated_laplace_params(sensitivity, epsilon, delta)
    assert lam == pytest.approx(sensitivity / epsilon)
    assert bound == pytest.approx(
        sensitivity / epsilon * math.log(1 + (math.exp(epsilon) - 1) / (2 * delta)), rel=1e-12
    )
    # Lemma 2.14's condition: the shifted tail mass beyond A equals delta.
    assert (math.exp(epsilon) - 1) / (2 * (math.exp(bound / lam) - 1)) == pytest.approx(delta)


def truncated_laplace_cdf(x: np.ndarray, lam: float, bound: float) -> np.ndarray:
    tail = math.exp(-bound / lam)
    norm = 2 * (1 - tail)
    below = (np.exp(np.clip(x, -bound, 0) / lam) - tail) / norm
    above = 1 - (np.exp(-np.clip(x, 0, bound) / lam) - tail) / norm
    return np.where(x < 0, below, above)


@pytest.mark.parametrize(("sensitivity", "epsilon", "delta"), [(2.0, 1.0, 1e-6), (2.0, 3.0, 0.2)])
def test_truncated_laplace_samples_stay_in_range_and_match_the_cdf(
    sensitivity: float, epsilon: float, delta: float
) -> None:
    lam, bound = truncated_laplace_params(sensitivity, epsilon, delta)
    samples = truncated_laplace(sensitivity, epsilon, delta, np.random.default_rng(2), size=20_000)
    assert np.all(np.abs(samples) <= bound)
    result = stats.kstest(samples, lambda x: truncated_laplace_cdf(np.asarray(x), lam, bound))
    assert result.pvalue > 1e-3


def test_truncated_laplace_ppf_endpoints() -> None:
    lam, bound = truncated_laplace_params(2.0, 1.0, 1e-6)
    ends = truncated_laplace_ppf(np.array([0.0, 0.5, 1.0]), lam, bound)
    assert ends == pytest.approx([-bound, 0.0, bound], abs=1e-9)
    grid = np.linspace(0.01, 0.99, 99)
    values = truncated_laplace_ppf(grid, lam, bound)
    assert truncated_laplace_cdf(values, lam, bound) == pytest.approx(grid, abs=1e-12)


def test_cauchy_is_standard() -> None:
    samples = cauchy(np.random.default_rng(3), size=20_000)
    assert stats.kstest(samples, stats.cauchy.cdf).pvalue > 1e-3


# ---------------------------------------------------------------------------------------------
# Symmetric Gaussian matrix E(sigma)


def test_symmetric_gaussian_structure_and_variance() -> None:
    rng = np.random.default_rng(4)
    draws = np.stack([symmetric_gaussian(4, 2.0, rng) for _ in range(20_000)])
    assert np.array_equal(draws, np.swapaxes(draws, 1, 2))
    rows, cols = np.triu_indices(4)
    upper = draws[:, rows, cols]
    # Every upper entry, diagonal included, has variance sigma^2 (not 2 sigma^2 on the diagonal).
    assert upper.var(axis=0) == pytest.approx(np.full(len(rows), 4.0), rel=0.05)
    assert np.abs(upper.mean(axis=0)).max() < 0.1
    correlation = np.corrcoef(upper.T) - np.eye(len(rows))
    assert np.abs(correlation).max() < 0.05


# ---------------------------------------------------------------------------------------------
# Haar rotations and the generator


@pytest.mark.parametrize("dim", [1, 2, 3, 7])
def test_haar_orthogonal_is_orthogonal(dim: int) -> None:
    rng = np.random.default_rng(5)
    for _ in range(20):
        q = haar_orthogonal(dim, rng)
        assert q.shape == (dim, dim)
        assert q.T @ q == pytest.approx(np.eye(dim), abs=1e-12)


def test_haar_orthogonal_is_haar() -> None:
    # For Haar Q in O(n), (Q_00 + 1)/2 ~ Beta((n-1)/2, (n-1)/2); both determinant signs occur.
    rng = np.random.default_rng(6)
    draws = [haar_orthogonal(4, rng) for _ in range(4000)]
    entries = np.array([(q[0, 0] + 1) / 2 for q in draws])
    assert stats.kstest(entries, stats.beta(1.5, 1.5).cdf).pvalue > 1e-3
    signs = np.sign([np.linalg.det(q) for q in draws])
    assert 0.45 < np.mean(signs > 0) < 0.55
    ones = [haar_orthogonal(1, rng)[0, 0] for _ in range(400)]
    assert set(ones) == {-1.0, 1.0}


def test_secure_generator_is_chacha_and_unseeded() -> None:
    first, second = secure_generator(), secure_generator()
    assert isinstance(first.bit_generator, ChaCha)
    assert not np.array_equal(first.random(8), second.random(8))


@pytest.mark.parametrize("sensitivity", [1e-300, 1e-200, 1e-150, 1e150, 1e250, 1e300])
def test_analytic_sigma_is_scale_free_at_extreme_sensitivities(sensitivity: float) -> None:
    # delta(sigma) depends on D / sigma only: sigma(D) = D sigma(1). The bisection on the raw
    # scale divided by an underflowed midpoint at D ~ 1e-200 (ZeroDivisionError).
    for epsilon, delta in [(1.0, 1e-6), (0.01, 1e-12), (50.0, 0.1)]:
        sigma = analytic_gaussian_sigma(sensitivity, epsilon, delta)
        unit = analytic_gaussian_sigma(1.0, epsilon, delta)
        assert math.isfinite(sigma) and sigma > 0
        assert sigma == pytest.approx(sensitivity * unit, rel=1e-12)
        assert gaussian_delta(sigma, sensitivity, epsilon) <= delta
