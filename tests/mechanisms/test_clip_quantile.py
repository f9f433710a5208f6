"""The private clip quantile (issue 24, item 3): its noise scale, its grid, its accuracy, its
use inside analyze_gauss, and an empirical privacy audit with a negative control."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from service.mechanisms import clip_quantile as module
from service.mechanisms.analyze_gauss import AnalyzeGauss, gauss_split, gram_sensitivity
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.clip_quantile import (
    GRID_STEPS,
    QUANTILE_ALPHA,
    count_noise_std,
    noisy_above,
    private_clip_norm,
    quantile_edges,
    resolvable_floor,
    resolvable_steps,
)
from service.mechanisms.composition import gaussian_total_mu
from service.mechanisms.linalg import gram_row_norms
from tests.mechanisms.privacy_audit import audit


def test_grid_and_noise_scale() -> None:
    edges = quantile_edges(3.0)
    assert edges.shape == (GRID_STEPS,) and edges[-1] == 3.0
    assert np.allclose(edges[1:] / edges[:-1], 2**0.25)
    # One replaced row moves two counts by 1: l2 sensitivity sqrt(2), Gaussian sqrt(2)/mu.
    assert count_noise_std(0.5) == pytest.approx(math.sqrt(2.0) / 0.5)


def test_without_noise_it_is_the_smallest_edge_with_few_enough_rows_above() -> None:
    norms = np.linspace(0.01, 1.0, 1000)
    edge = private_clip_norm(norms, 1.0, 0.5, 1e12, np.random.default_rng(0))
    edges = quantile_edges(1.0)
    assert np.count_nonzero(norms > edge) <= 500
    below = edges[np.searchsorted(edges, edge) - 1]
    assert np.count_nonzero(norms > below) > 500


def test_it_finds_the_median_within_a_grid_step() -> None:
    norms = np.random.default_rng(1).uniform(0.2, 0.4, 5000)
    mu = gaussian_total_mu(1.0, 1e-6, 0.0, 0.0) * math.sqrt(0.05)
    found = [private_clip_norm(norms, 1.0, 0.5, mu, np.random.default_rng(s)) for s in range(20)]
    median = float(np.median(norms))
    assert all(median / 2**0.5 <= f <= median * 2**0.5 for f in found)


def test_analyze_gauss_clips_at_it_and_calibrates_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = np.random.default_rng(2).standard_normal((4000, 8)) * 0.05
    mechanism = AnalyzeGauss()
    ctx = PublicContext(n_rows=4000, n_cols=8, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 2, 1.0, 1e-6, mechanism.parse_params({"clip_quantile": 0.5}))
    split = gauss_split(1.0, 1e-6, params)
    mus: list[float] = []
    real = module.clip_from_counts

    def spy(
        counts: Any, n: int, clip: float, q: float, mu: float, rng: np.random.Generator
    ) -> float:
        mus.append(mu)
        # The counts a row source would give: the same bins as the norms' own.
        norms = gram_row_norms(rows, clip)
        edges = quantile_edges(clip)
        bins = np.minimum(np.searchsorted(edges, norms, side="left"), edges.shape[0] - 1)
        np.testing.assert_array_equal(counts, np.bincount(bins, minlength=edges.shape[0]))
        return real(counts, n, clip, q, mu, rng)

    monkeypatch.setattr("service.mechanisms.analyze_gauss.clip_from_counts", spy)
    out = mechanism.run(rows, ReleaseSpec(2, 1.0, 1e-6, params), np.random.default_rng(3))
    row_clip = out.extras["row_clip_norm"]
    assert mus == [split.clip_mu] and row_clip in quantile_edges(1.0)
    assert 0.05 < row_clip < 0.4  # the rows' norms are ~0.14
    assert out.extras["gram_noise_std"] == pytest.approx(gram_sensitivity(row_clip) / split.gram_mu)
    # The explained variance is estimated on rows clipped to C, not C2.
    assert out.extras["variance_noise_std"] == pytest.approx(
        gram_sensitivity(1.0) / split.variance_mu
    )


# ---------------------------------------------------------------------------------------------
# The grid's resolvable floor (public; auto's reason states a clip below it, 30 Nov 2026)


def test_resolvable_steps_is_the_bridge_bound() -> None:
    """``B' = floor((q n)^2/(2 s^2 ln(1/alpha)))`` capped at the grid; public facts only."""
    mu = 0.01
    s = count_noise_std(mu)
    for n in (100, 1_000, 4_000, 20_000):
        bound = (0.3 * n) ** 2 / (2 * s * s * math.log(1 / QUANTILE_ALPHA))
        assert resolvable_steps(n, 0.3, mu) == min(GRID_STEPS, math.floor(bound))
    assert resolvable_steps(300, 0.3, 1e-3) == 0 and resolvable_steps(10**9, 0.3, 1e-3) == 48
    assert resolvable_steps(0, 0.3, 1.0) == 0 and resolvable_steps(10, 0.3, math.inf) == 48
    assert resolvable_floor(2.0, 300, 0.3, 1e-3) == 2.0
    assert resolvable_floor(2.0, 10**9, 0.3, 1.0) == quantile_edges(2.0)[0]
    assert resolvable_steps(4_000, 0.3, 0.01) == 12
    assert resolvable_floor(1.0, 4_000, 0.3, 0.01) == quantile_edges(1.0)[GRID_STEPS - 12]


@pytest.mark.parametrize(("n", "mu"), [(2_000, 0.0116), (2_000, 0.0201), (2_000, 0.0317)])
def test_the_bridge_bound_holds_at_the_floor(n: int, mu: float) -> None:
    """The derivation, on the module's own projection: with ``B'`` bins of pure noise, the
    count above some edge falls ``q n/2`` below its exact value at most ``QUANTILE_ALPHA`` of
    the time (the event that would put a read-out over those edges below the rows'
    ``q/2``-quantile)."""
    steps = resolvable_steps(n, 0.3, mu)
    assert 2 <= steps < GRID_STEPS
    rng = np.random.default_rng(9)
    dips = 0
    for _ in range(2_000):
        noise = rng.normal(0.0, count_noise_std(mu), steps)
        dips += int(np.min(noisy_above(noise, 0)[:-1]) <= -0.15 * n)
    assert dips / 2_000 <= QUANTILE_ALPHA


# Worst case for the counts: one row in the top bin on one side, the bottom bin on the other.
AUDIT_EPS, AUDIT_DELTA = 1.0, 1e-5
AUDIT_NORMS = np.array([1.0] * 4 + [0.0] * 5)
PAIR = (np.append(AUDIT_NORMS, 1.0), np.append(AUDIT_NORMS, 0.0))


def clip_release(norms: np.ndarray, rng: np.random.Generator) -> float:
    mu = gaussian_total_mu(AUDIT_EPS, AUDIT_DELTA, 0.0, 0.0)
    return private_clip_norm(norms, 1.0, 0.5, mu, rng)


def test_clip_quantile_audit_passes() -> None:
    result = audit(clip_release, *PAIR, lambda c: c >= 1.0, 3000, AUDIT_DELTA, seed=4)
    assert result.eps_lower_bound <= AUDIT_EPS


def test_clip_quantile_audit_negative_control_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    real = module.count_noise_std
    monkeypatch.setattr(module, "count_noise_std", lambda mu: real(mu) / 10)
    result = audit(clip_release, *PAIR, lambda c: c >= 1.0, 3000, AUDIT_DELTA, seed=5)
    assert result.eps_lower_bound > AUDIT_EPS
