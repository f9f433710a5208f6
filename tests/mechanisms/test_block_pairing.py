"""The pairing in blocks (issue 32 item 5): from 8,192 rows (32,768 at d = 100: at least 128
pairs of blocks of about 128 KB) the chosen-centring run pairs whole
blocks of consecutive rows, matched by a random bijection, so that its probe reads each row
once (``block_probe.block_probe_pass``). The pairing is a perfect matching drawn from the
CSPRNG before the data is read, so every "one row, one pair" sensitivity and every noise scale
is unchanged; the probe pass computes the statistics of the uniform-pairing pass for the same
pairing. Speed is measured in ``bench/bench_pca_speed.py``, never here."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from service.mechanisms import analyze_gauss as module
from service.mechanisms import centring_choice as cc
from service.mechanisms.analyze_gauss import AnalyzeGauss
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.block_probe import block_probe_pass
from service.mechanisms.fast_rows import SINGLE_GRAM_SLACK
from service.mechanisms.linalg import gram_norm_counts
from service.mechanisms.paired_rows import (
    PAIR_BLOCK_MIN_ROWS,
    block_pairing,
    pair_block_rows,
    paired_differences,
)

Rows = np.ndarray[Any, Any]


def rows_over_clip(n: int, d: int, seed: int) -> Rows:
    rng = np.random.default_rng(seed)
    x = 0.15 * rng.standard_normal((n, d)) / np.sqrt(d) + 0.8 / np.sqrt(d)
    x[:: max(1, n // 97)] *= 3.0  # some rows above C = 1
    x[5] = 0.0
    return x


@pytest.mark.parametrize(("n", "d"), [(32_768, 100), (33_001, 7), (50_000, 100), (12_001, 784)])
def test_the_pairing_is_a_perfect_matching_of_whole_blocks(n: int, d: int) -> None:
    pairing = block_pairing(np.random.default_rng(3), n, d)
    size = pairing.block_rows
    assert size == pair_block_rows(n, d) and 16 <= size <= 128 and size <= n // 256
    assert np.array_equal(np.sort(pairing.order), np.arange(n))  # each row in one pair at most
    pairs = pairing.low_starts.shape[0]
    assert pairs == (n // size) // 2
    starts = np.concatenate([pairing.low_starts, pairing.high_starts])
    assert np.all(starts % size == 0) and np.unique(starts).size == 2 * pairs  # whole, distinct
    steps = np.arange(size)
    for j in range(pairs):
        assert np.array_equal(np.sort(pairing.within[j]), steps)
        block = pairing.order[2 * j * size : 2 * (j + 1) * size]
        assert np.array_equal(block[0::2], pairing.low_starts[j] + steps)
        assert np.array_equal(block[1::2], pairing.high_starts[j] + pairing.within[j])
    # The rest: every row not in a paired block, in some order.
    covered = (starts[:, None] + steps).ravel()
    rest = np.setdiff1d(np.arange(n), covered)
    assert np.array_equal(np.sort(pairing.order[2 * pairs * size :]), rest)
    assert rest.size < 2 * size


@pytest.mark.parametrize(("n", "d"), [(PAIR_BLOCK_MIN_ROWS - 1, 2000), (32_767, 100), (20_000, 50)])
def test_below_the_threshold_the_pairing_is_the_uniform_permutation_drawn_before(
    n: int, d: int
) -> None:
    assert pair_block_rows(n + 1 if n == 32_767 else n, d) == (128 if n == 32_767 else 1)
    pairing = block_pairing(np.random.default_rng(8), n, d)
    assert pairing.block_rows == 1
    assert np.array_equal(pairing.order, np.random.default_rng(8).permutation(n))


def test_the_pairing_depends_on_the_generator_and_shape_only() -> None:
    first = block_pairing(np.random.default_rng(5), 40_000, 50)
    second = block_pairing(np.random.default_rng(5), 40_000, 50)
    assert first.block_rows > 1 and np.array_equal(first.order, second.order)
    other = block_pairing(np.random.default_rng(6), 40_000, 50)
    assert not np.array_equal(first.order, other.order)


@pytest.mark.parametrize(
    ("n", "d", "clip"), [(33_001, 30, 1.0), (32_768, 5, 0.05), (14_000, 300, 1.0)]
)
def test_the_block_pass_gives_the_probe_statistics_of_the_same_pairing(
    n: int, d: int, clip: float
) -> None:
    rows = rows_over_clip(n, d, n)
    pairing = block_pairing(np.random.default_rng(1), n, d)
    assert pairing.block_rows > 1
    got = block_probe_pass(rows, clip, pairing)
    same = cc.probe_pass(rows, clip, pairing.order)
    # The rows' statistics are the same arithmetic per row: the same bits.
    np.testing.assert_array_equal(got.counts_u, same.counts_u)
    assert got.row_factors is not None and got.row_squares is not None
    np.testing.assert_array_equal(got.row_factors, same.row_factors)
    np.testing.assert_array_equal(got.row_squares, same.row_squares)
    np.testing.assert_allclose(got.clipped_sum, same.clipped_sum, rtol=1e-12, atol=1e-9)
    assert got.n_pairs == same.n_pairs == n // 2
    assert got.pair_norms is not None and same.pair_norms is not None
    np.testing.assert_allclose(got.pair_norms, same.pair_norms, rtol=1e-12, atol=1e-14)
    # Against the separate passes' definitions (rows' histogram, materialised pairs).
    edges = cc.probe_edges(clip)
    np.testing.assert_array_equal(got.counts_u, gram_norm_counts(rows, clip, None, edges))
    expected_p = gram_norm_counts(
        paired_differences(rows, clip, 0, pairing.order), clip, None, edges
    )
    assert np.abs(got.counts_p - expected_p).sum() <= 2  # a pair on a bin's edge, at most
    assert got.counts_p.sum() == n // 2


def test_rows_at_extreme_scales_take_the_gathered_pass() -> None:
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((33_000, 5))
    rows[::5] *= 1e-170
    rows[::7] *= 1e160
    pairing = block_pairing(np.random.default_rng(4), 33_000, 5)
    assert pairing.block_rows > 1
    got = block_probe_pass(rows, 1.0, pairing)
    expected = cc.gathered_probe_pass(rows, 1.0, pairing.order)
    np.testing.assert_array_equal(got.counts_u, expected.counts_u)
    np.testing.assert_array_equal(got.counts_p, expected.counts_p)
    np.testing.assert_array_equal(got.clipped_sum, expected.clipped_sum)


def test_one_replaced_row_moves_one_row_count_and_one_pair_count() -> None:
    """The probe's noise 2/mu_Q per count is for l2 sensitivity 2: a replaced row moves each
    histogram by one down and one up, at most."""
    n, d = 33_000, 20
    rows = rows_over_clip(n, d, 11)
    pairing = block_pairing(np.random.default_rng(9), n, d)
    assert pairing.block_rows > 1
    before = block_probe_pass(rows, 1.0, pairing)
    for row in (0, 4321, pairing.order[-1], int(pairing.high_starts[3]) + 7):
        changed = rows.copy()
        changed[row] = np.full(d, 2.0 / math.sqrt(d)) * (-1) ** row  # far from every other
        after = block_probe_pass(changed, 1.0, pairing)
        moved_u = np.abs(after.counts_u - before.counts_u)
        moved_p = np.abs(after.counts_p - before.counts_p)
        assert moved_u.sum() <= 2 and moved_p.sum() <= 2
        assert math.sqrt(float(np.sum(moved_u**2 + moved_p**2))) <= cc.PROBE_SENSITIVITY
        assert np.linalg.norm(after.clipped_sum - before.clipped_sum) <= 2.0 * (1 + 1e-9)


def test_sorted_and_periodic_rows_are_paired_across_the_whole_order() -> None:
    """The pairs' mean squared norm estimates the trace of the covariance (``E||p||^2 =
    E||x - x'||^2/2``) on rows stored sorted by their first coordinate, and on rows with a
    period of 16 (the within-block bijection breaks it), within the 1/256 same-block bound
    and the sampling error."""
    rng = np.random.default_rng(12)
    n, d = 40_000, 8
    x = 0.1 * rng.standard_normal((n, d))
    x = x[np.argsort(x[:, 0])]
    periodic = np.tile(0.1 * rng.standard_normal((16, d)), (n // 16, 1))
    for rows in (x, periodic):
        pairing = block_pairing(np.random.default_rng(13), n, d)
        got = block_probe_pass(rows, 1.0, pairing)
        assert got.pair_norms is not None
        trace = float(np.trace(np.cov(rows.T)))
        assert float(np.mean(got.pair_norms**2)) == pytest.approx(trace, rel=0.03)


class Recording(np.random.Generator):
    """A generator that records the scale of every normal draw."""

    scales: list[float]

    def normal(self, loc: Any = 0.0, scale: Any = 1.0, size: Any = None) -> Any:
        self.scales.append(float(scale))
        return super().normal(loc, scale, size)


@pytest.mark.parametrize("offset", [0.8, 0.0])  # the mean route, then the none route
def test_every_noise_scale_of_a_block_paired_run_is_the_stated_one(offset: float) -> None:
    n, d = 33_000, 12
    rng0 = np.random.default_rng(21)
    rows = offset / math.sqrt(d) + rng0.standard_normal((n, d)) / np.sqrt(np.arange(1, d + 1)) / 4
    rows /= np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
    mechanism = AnalyzeGauss()
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 3, 1.0, 1e-6, mechanism.parse_params({"center": "private"}))
    rng = Recording(np.random.PCG64(22))
    rng.scales = []
    out = mechanism.run(rows, ReleaseSpec(3, 1.0, 1e-6, params), rng)
    split = module.gauss_split(1.0, 1e-6, params)
    route = out.extras["centring"]
    assert route == ("mean" if offset else "none")
    probe = cc.PROBE_SENSITIVITY / split.clip_mu
    assert rng.scales[:2] == [pytest.approx(probe, rel=1e-15)] * 2  # the two histograms
    mu = split.gram_mu if route == "mean" else math.hypot(split.mean_mu, split.gram_mu)
    gram = module.gram_sensitivity(out.extras["row_clip_norm"]) / mu * (1 + SINGLE_GRAM_SLACK)
    assert out.extras["gram_noise_std"] == pytest.approx(gram, rel=1e-12)
    variance = module.gram_sensitivity(out.extras["variance_clip_norm"]) / split.variance_mu
    stated = [probe, probe, gram, variance]  # every draw, in order
    if route == "mean":
        stated.insert(2, module.mean_sensitivity(1.0, n) / split.mean_mu)
    assert rng.scales == [pytest.approx(scale, rel=1e-12) for scale in stated]


@pytest.mark.parametrize(
    ("offset", "d", "spread", "route"),
    [(0.8, 10, 0.25, "mean"), (0.0, 10, 0.25, "none"), (0.8, 300, 0.02, "pairs")],
)
def test_the_block_paired_release_is_the_uniform_pass_release_of_the_same_pairing(
    offset: float, d: int, spread: float, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 33_000 if d < 100 else 14_000
    assert pair_block_rows(n, d) > 1
    rng0 = np.random.default_rng(31)
    rows = offset / math.sqrt(d) + spread * rng0.standard_normal((n, d)) / np.sqrt(
        np.arange(1, d + 1)
    )
    rows /= np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
    mechanism = AnalyzeGauss()
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    epsilon = 0.3 if route == "pairs" else 1.0
    raw = mechanism.parse_params({"center": "private"})
    spec = ReleaseSpec(3, epsilon, 1e-6, mechanism.prepare(ctx, 3, epsilon, 1e-6, raw))
    got = mechanism.run(rows, spec, np.random.default_rng(32))
    monkeypatch.setattr(
        module, "block_probe_pass", lambda data, clip, p: cc.probe_pass(data, clip, p.order)
    )
    expected = mechanism.run(rows, spec, np.random.default_rng(32))
    assert got.extras["centring"] == expected.extras["centring"] == route
    np.testing.assert_allclose(got.basis, expected.basis, rtol=1e-9, atol=1e-12)
    for key in ("row_clip_norm", "variance_clip_norm", "gram_noise_std", "trace"):
        assert got.extras[key] == pytest.approx(expected.extras[key], rel=1e-9)
