"""The recommended settings at the default's speed (issue 32, item 5): the chosen-centring run
shares its passes over the rows (one probe pass gives both histograms and the mean's sum), keeps
no array of pairs unless the pairs route is taken, and computes the same statistics as the
separate passes did (so the release is distributed as before, the privacy argument unchanged).
Speed itself is measured in ``bench/bench_pca_speed.py``, never here."""

from __future__ import annotations

import math
import tracemalloc
from typing import Any

import numpy as np
import pytest

from service.mechanisms import centring_choice as cc
from service.mechanisms.analyze_gauss import AnalyzeGauss
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.linalg import (
    captured_energy,
    clipped_gram,
    clipped_sum,
    gram_norm_counts,
    top_k_eigh,
)

Rows = np.ndarray[Any, Any]


def offset_rows(n: int, d: int, seed: int, spread: float = 0.15) -> Rows:
    rng = np.random.default_rng(seed)
    x = spread * rng.standard_normal((n, d)) / np.sqrt(d) + 0.8 * np.ones(d) / np.sqrt(d)
    x[:: max(1, n // 7)] *= 3.0  # some rows above C = 1
    x[1] = 0.0  # a zero row
    return x


def mixed_scale_rows(n: int, d: int, seed: int) -> Rows:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    x[::5] *= 1e-170  # squares underflow
    x[::7] *= 1e160  # squares overflow
    return x


@pytest.mark.parametrize("rows", [offset_rows(301, 6, 0), mixed_scale_rows(200, 5, 1)])
@pytest.mark.parametrize("clip", [1.0, 1e-3])
@pytest.mark.parametrize("chunk", [8, 8192])
def test_the_probe_pass_gives_the_separate_passes_statistics(
    rows: Rows, clip: float, chunk: int
) -> None:
    n = rows.shape[0]
    order = np.random.default_rng(5).permutation(n)
    edges = cc.probe_edges(clip)
    got = cc.probe_pass(rows, clip, order, chunk)
    pairs = cc.paired_differences(rows, clip, order=order)
    np.testing.assert_array_equal(got.counts_u, gram_norm_counts(rows, clip, None, edges))
    np.testing.assert_array_equal(got.counts_p, gram_norm_counts(pairs, clip, None, edges))
    np.testing.assert_allclose(got.clipped_sum, clipped_sum(rows, clip), rtol=1e-12, atol=0)
    assert got.n_pairs == n // 2 == pairs.shape[0]


@pytest.mark.parametrize("rows", [offset_rows(301, 6, 2), mixed_scale_rows(200, 5, 3)])
def test_the_merged_clips_are_the_same_gram_rows(rows: Rows) -> None:
    clip = 1.0
    center = np.full(rows.shape[1], 0.2)
    basis = top_k_eigh(clipped_gram(rows, clip), 2)[1]
    for c, row_clip in ((None, None), (None, 0.4), (center, None), (center, 0.3)):
        expected = clipped_gram(rows, clip, center=c, row_clip=row_clip)
        got = cc.fast_gram(rows, clip, c, row_clip)
        np.testing.assert_allclose(got, expected, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(
            cc.fast_energy(rows, basis, clip, c), captured_energy(rows, basis, clip, c), rtol=1e-11
        )
    order = np.random.default_rng(4).permutation(rows.shape[0])
    pairs = cc.paired_differences(rows, clip, order=order)
    np.testing.assert_allclose(
        cc.paired_gram(rows, clip, order, 0.5), clipped_gram(pairs, clip, row_clip=0.5), rtol=1e-11
    )
    shifted = cc.paired_differences(rows, clip, offset=1, order=order) / np.sqrt(2.0)
    captured, residual, m = cc.paired_energy(rows, clip, order, 1, basis)
    assert m == shifted.shape[0]
    np.testing.assert_allclose(
        (captured, residual), captured_energy(shifted, basis, clip), rtol=1e-11
    )


def peak_bytes(rows: Rows, route_seed: int) -> tuple[int, str]:
    mechanism = AnalyzeGauss()
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 3, 1.0, 1e-6, mechanism.parse_params({"center": "private"}))
    spec = ReleaseSpec(3, 1.0, 1e-6, params)
    tracemalloc.start()
    try:
        out = mechanism.run(rows, spec, np.random.default_rng(route_seed))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert mechanism.memory_bytes(ctx, spec) >= peak
    return peak, str(out.extras["centring"])


@pytest.mark.parametrize("kind", ["mean", "none"])
def test_no_array_of_pairs_unless_the_pairs_route_is_taken(kind: str) -> None:
    # 200,000 x 20 rows (32 MB); the m x d pairs alone would be 16 MB. Chunks are 8,192 rows:
    # a pass holds a few chunk copies (1.3 MB each), never the pairs (before: the pairs, and
    # for the explained variance a second array of them).
    n, d = 200_000, 20
    rng = np.random.default_rng(7)
    if kind == "mean":
        rows = offset_rows(n, d, 7)
    else:
        rows = rng.standard_normal((n, d)) / np.sqrt(np.arange(1, d + 1)) / 4.0
    rows /= np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
    peak, route = peak_bytes(rows, 0)
    assert route == kind
    pairs_bytes = 8 * (n // 2) * d
    assert peak < pairs_bytes


@pytest.mark.parametrize("rows", [offset_rows(301, 6, 8), offset_rows(4001, 30, 9)])
@pytest.mark.parametrize("chunk", [7, 64, None])
def test_the_sequential_probe_pass_is_the_gathered_pass_to_the_bit(
    rows: Rows, chunk: int | None
) -> None:
    # The sequential pass (each pair read at its higher row, its partner gathered) does the
    # same per-row arithmetic as the pass in the permuted order: the same row counts,
    # factors and squared norms exactly; the sum up to its order. A pair's norm comes from
    # dot products (f_a^2 s_a + f_b^2 s_b - 2 f_a f_b x_a.x_b, issue 32 item 5), so it is
    # the materialised difference's norm up to a few ulps of f_a^2 s_a + f_b^2 s_b, and the
    # pairs' counts are the reference's except where a pair lies within that of an edge.
    order = np.random.default_rng(10).permutation(rows.shape[0])
    got = cc.probe_pass(rows, 1.0, order, chunk)
    expected = cc.gathered_probe_pass(rows, 1.0, order)
    for field in ("counts_u", "row_factors", "row_squares"):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field))
    np.testing.assert_allclose(got.clipped_sum, expected.clipped_sum, rtol=1e-12, atol=1e-15)
    assert got.pair_norms is not None and expected.pair_norms is not None
    clipped = got.row_squares * got.row_factors**2  # f^2 s <= C^2 = 1
    m = got.n_pairs
    scale = clipped[order[0 : 2 * m : 2]] + clipped[order[1 : 2 * m : 2]]
    error = np.abs(got.pair_norms**2 - expected.pair_norms**2)
    assert bool(np.all(error <= 1e-14 * scale))
    assert float(np.max(error)) > 0.0  # rounded differently: the comparison is not vacuous
    edges = cc.probe_edges(1.0)
    np.testing.assert_array_equal(got.counts_p, cc._count(got.pair_norms, edges, 1.0))
    near = np.abs(np.minimum(expected.pair_norms, 1.0)[:, None] - edges[None, :])
    movable = int(np.sum(np.any(near <= 1e-7 * edges[None, :], axis=1)))
    assert float(np.sum(np.abs(got.counts_p - expected.counts_p))) <= 2 * movable


@pytest.mark.parametrize("chunk", [1024, None])
def test_the_probe_takes_its_pairs_in_pieces_without_changing_a_bit(
    chunk: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The probe pass computes a chunk's pairs' dot products PROBE_PAIR_PIECE at a time (issue
    # 32 item 5: smaller buffers stay in cache). Work only: with pieces of 256, of 1 and of
    # the whole chunk (about 512 pairs a chunk here, so several pieces per chunk, and a last
    # piece shorter than the others), every count, norm, factor and the sum are the same bits.
    rows = offset_rows(4001, 30, 16)
    order = np.random.default_rng(17).permutation(rows.shape[0])
    got = []
    for piece in (cc.PROBE_PAIR_PIECE, 1, 10**9):
        monkeypatch.setattr(cc, "PROBE_PAIR_PIECE", piece)
        got.append(cc.probe_pass(rows, 1.0, order, chunk))
    _, _, _, bounds = cc._pairs_by_higher_row(order, rows.shape[0], 1024)
    assert int(np.max(np.diff(bounds))) > 256  # some chunk takes more than one piece
    for other in got[1:]:
        for field in ("counts_u", "counts_p", "clipped_sum", "row_factors", "pair_norms"):
            np.testing.assert_array_equal(getattr(got[0], field), getattr(other, field))
        np.testing.assert_array_equal(got[0].row_squares, other.row_squares)


@pytest.mark.parametrize("offset", [0, 1])
def test_the_pairs_from_known_factors_are_the_pairs_to_the_bit(offset: int) -> None:
    rows = offset_rows(1001, 12, 11)
    order = np.random.default_rng(12).permutation(rows.shape[0])
    factors = cc.probe_pass(rows, 1.0, order).row_factors
    assert factors is not None and bool(np.any(factors < 1.0))
    got = list(cc.pair_blocks(rows, order, offset, factors, chunk_rows=64))
    expected = list(cc.pair_chunks(rows, 1.0, offset, order, chunk_rows=64))
    assert [first for first, _ in got] == [first for first, _ in expected]
    for (_, a), (_, b) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


def power_offset_rows(n: int, d: int, seed: int) -> Rows:
    # A power-law spread around a common mean: at eps 0.3 the probe takes the pairs.
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) / np.sqrt(np.arange(1, d + 1))
    x /= np.sqrt(np.sum(1.0 / np.arange(1, d + 1)))
    return 0.15 * x + 0.8 * np.ones(d) / np.sqrt(d)


@pytest.mark.parametrize(
    ("rows", "route", "epsilon"),
    [
        (offset_rows(3000, 40, 13, spread=0.05), "mean", 1.0),
        (offset_rows(3000, 40, 14, spread=1.5), "none", 1.0),
        (power_offset_rows(3000, 78, 15), "pairs", 0.3),
    ],
)
def test_the_release_is_the_gathered_pass_release_to_the_bit(
    rows: Rows, route: str, epsilon: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the same random draws the release (basis, route, clips, centre, figures) is the
    # one the gathered pass and the pairs' own norms gave: the passes change the work and
    # the rounding (the pairs' norms from dot products, the explained-variance sums from
    # X U), not the statistics or the noise. On these rows no pair lies within rounding of
    # a bin edge, so the probe's counts, hence route and clips, are the same; the figures
    # agree to rounding.
    rows = rows / np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
    mechanism = AnalyzeGauss()
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    raw = mechanism.parse_params({"center": "private"})
    params = mechanism.prepare(ctx, 3, epsilon, 1e-6, raw)
    spec = ReleaseSpec(3, epsilon, 1e-6, params)
    got = mechanism.run(rows, spec, np.random.default_rng(16))
    from service.mechanisms import analyze_gauss as module

    def without_factors(counts: cc.ProbePass) -> cc.ProbePass:
        return cc.ProbePass(
            counts.counts_u, counts.counts_p, counts.clipped_sum, counts.n_pairs,
            counts.row_factors, counts.pair_norms, None,
        )  # fmt: skip

    def gathered(*args: Any) -> cc.ProbePass:
        return without_factors(cc.gathered_probe_pass(*args))

    monkeypatch.setattr(module, "probe_pass", gathered)
    real_gram, real_energy = module.paired_gram, module.paired_energy
    monkeypatch.setattr(module, "paired_gram", lambda *a: real_gram(*a[:5]))
    monkeypatch.setattr(module, "paired_energy", lambda *a, **k: real_energy(*a))
    expected = mechanism.run(rows, spec, np.random.default_rng(16))
    assert got.extras["centring"] == route
    np.testing.assert_array_equal(got.basis, expected.basis)
    assert_close(got.extras, expected.extras)


def assert_close(got: Any, expected: Any) -> None:
    """Equal structure and strings; numbers to 1e-9 relative (rounding, not statistics)."""
    if isinstance(expected, dict):
        assert sorted(got) == sorted(expected)
        for key in expected:
            assert_close(got[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert_close(a, b)
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)
    else:
        assert got == expected


@pytest.mark.parametrize("row_clip", [None, 0.5, 2.0])
def test_the_gram_from_known_norms_is_the_gram_to_the_bit(row_clip: float | None) -> None:
    rows = offset_rows(5000, 30, 17)  # some rows above C, a zero row; chunks of 1,024
    squares = cc.row_squares(rows)
    got = cc.fast_gram(rows, 1.0, None, row_clip, squares)
    np.testing.assert_array_equal(got, cc.fast_gram(rows, 1.0, None, row_clip))
    center = np.full(30, 0.1)
    np.testing.assert_array_equal(
        cc.fast_gram(rows, 1.0, center, row_clip, squares),
        cc.fast_gram(rows, 1.0, center, row_clip),
    )
    # Squares outside the safe range: the rescaled route, as without them.
    wild = mixed_scale_rows(3000, 5, 18)
    with np.errstate(over="ignore", under="ignore"):
        wild_squares = cc.row_squares(wild)
    np.testing.assert_array_equal(
        cc.fast_gram(wild, 1.0, None, row_clip, wild_squares),
        cc.fast_gram(wild, 1.0, None, row_clip),
    )


def test_a_memory_map_gets_the_arrays_release_to_the_bit(tmp_path: Any) -> None:
    # The probe pass reads a memory map ahead in chunks and gathers the partners from it: the
    # same rows, the same release.
    rows = power_offset_rows(3001, 78, 19)
    path = tmp_path / "rows.f64"
    rows.tofile(path)
    mapped = np.memmap(path, dtype=np.float64, mode="r", shape=rows.shape)
    mechanism = AnalyzeGauss()
    ctx = PublicContext(n_rows=3001, n_cols=78, row_norm_bound=1.0)
    raw = mechanism.parse_params({"center": "private"})
    params = mechanism.prepare(ctx, 3, 0.3, 1e-6, raw)
    spec = ReleaseSpec(3, 0.3, 1e-6, params)
    got = mechanism.run(mapped, spec, np.random.default_rng(20))
    expected = mechanism.run(rows, spec, np.random.default_rng(20))
    np.testing.assert_array_equal(got.basis, expected.basis)
    assert got.extras == expected.extras


def test_each_pair_and_row_stays_in_the_variance_steps_simplex_whatever_the_rounding() -> None:
    # The explained-variance step's sensitivity sqrt(2) V^2 needs each summand (captured,
    # residual) in {a, b >= 0, a + b <= V^2}. Its projection (from X U) and its norm (from
    # the probe's dot products) are rounded separately, so the captured part is clamped to
    # the norm. Norms given too small (as a badly rounded one would be) must not let a
    # summand leave the simplex: the two sums add up to the clipped norms' sum exactly.
    rows = offset_rows(2001, 12, 21)
    rows /= np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
    order = np.random.default_rng(22).permutation(rows.shape[0])
    counts = cc.probe_pass(rows, 1.0, order)
    assert counts.pair_norms is not None and counts.row_squares is not None
    basis = np.linalg.qr(np.random.default_rng(23).standard_normal((12, 4)))[0]
    bound = 0.05
    short = cc.ProbePass(
        counts.counts_u, counts.counts_p, counts.clipped_sum, counts.n_pairs,
        counts.row_factors, counts.pair_norms * 0.25, counts.row_squares,
    )  # fmt: skip
    found = cc.probe_paired_energy(rows, 1.0, order, short, basis, bound)
    assert found is not None
    totals = np.minimum((short.pair_norms**2) / 2.0, bound**2)
    assert found[0] + found[1] == pytest.approx(float(np.sum(totals)), rel=1e-12)
    assert found[0] + found[1] <= found[2] * bound**2 * (1.0 + 1e-12)
    # The mean route's rows: squared norms given too small, the same clamp.
    center = rows.mean(axis=0) + 0.01
    tiny = cc.ProbePass(
        counts.counts_u, counts.counts_p, counts.clipped_sum, counts.n_pairs,
        counts.row_factors, counts.pair_norms, counts.row_squares * 0.9,
    )  # fmt: skip
    sums = cc.probe_centred_energy(rows, tiny, basis, center, bound)
    assert sums is not None
    assert sums[0] + sums[1] <= rows.shape[0] * bound**2 * (1.0 + 1e-12)
    assert sums[0] <= sums[0] + sums[1]


# Float32 where public facts allow it (issue 32 item 5, fast_rows.single_gram_fits).


def test_the_float32_gram_is_the_gram_within_its_stated_bound() -> None:
    from service.mechanisms import fast_rows as fr

    rows = offset_rows(3000, 30, 31)  # some rows above C, a zero row; chunks of 1,024
    squares = cc.row_squares(rows)
    center = np.full(30, 0.1)
    for c, bound in ((None, 0.5), (center, 0.3)):
        exact = cc.fast_gram(rows, 1.0, c, bound, squares)
        got = cc.fast_gram(rows, 1.0, c, bound, squares, single=True)
        # Each block of b rows: |E| <= gamma_(b+2) sum ||y||^2 <= gamma_(b+2) b B^2.
        allowed = fr.single_gamma(fr.SINGLE_BLOCK_ROWS + 2) * rows.shape[0] * bound**2
        error = float(np.linalg.norm(got - exact))
        assert 0.0 < error <= allowed
        # Known squares or not, the same float32 rows: the same Gram to the bit.
        np.testing.assert_array_equal(got, cc.fast_gram(rows, 1.0, c, bound, single=True))


def test_one_replaced_row_moves_the_float32_gram_within_the_inflated_sensitivity() -> None:
    from service.mechanisms import fast_rows as fr

    rng = np.random.default_rng(32)
    rows = rng.standard_normal((2048, 20))
    other = rows.copy()
    other[700] = -3.0 * rows[700] + 0.5  # both above the clip: each scaled to the bound
    bound = 0.4
    got = [cc.fast_gram(x, 1.0, None, bound, single=True) for x in (rows, other)]
    moved = float(np.linalg.norm(got[0] - got[1]))
    assert moved <= math.sqrt(2.0) * bound**2 * (1.0 + fr.SINGLE_GRAM_SLACK)
    # Only the block holding the row (rows 512-767) differs: the others' float32 sums are
    # the same bits, so the move is that block's, up to the float64 accumulation.
    blocks = []
    for x in (rows, other):
        squares = fr.row_squares(x[512:768])
        factors = fr.clip_factors(squares, bound)
        part = fr.round_scaled(x[512:768], factors, squares, np.empty((256, 20), np.float32))
        blocks.append((part.T @ part).astype(np.float64))
    np.testing.assert_allclose(got[0] - got[1], blocks[0] - blocks[1], rtol=0, atol=1e-12)


def test_float32_is_chosen_from_public_facts_and_its_noise_carries_the_slack() -> None:
    from service.mechanisms import analyze_gauss as module
    from service.mechanisms import fast_rows as fr

    assert fr.single_gram_fits(8192, 1.0) and not fr.single_gram_fits(8191, 1.0)
    assert not fr.single_gram_fits(10**6, 2.0**-50) and not fr.single_gram_fits(10**6, 2.0**50)
    assert 5e-3 < fr.SINGLE_GRAM_SLACK < 6e-3
    assert fr.single_projections_fit(10**5, 100, 10, 1.0, 0.1)
    assert not fr.single_projections_fit(10**5, 100, 10, 1.0, 0.01)  # offset 100x the spread
    assert not fr.single_projections_fit(8191, 100, 10, 1.0, 1.0)
    n, d = 8192, 12
    rows = offset_rows(n, d, 33, spread=1.5)
    rows /= np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
    mechanism = AnalyzeGauss()
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 3, 1.0, 1e-6, mechanism.parse_params({"center": "private"}))
    out = mechanism.run(rows, ReleaseSpec(3, 1.0, 1e-6, params), np.random.default_rng(34))
    route = out.extras["centring"]
    assert route in ("mean", "none")
    split = module.gauss_split(1.0, 1e-6, params)
    mu = split.gram_mu if route == "mean" else math.hypot(split.mean_mu, split.gram_mu)
    expected = module.gram_sensitivity(out.extras["row_clip_norm"]) / mu
    assert out.extras["gram_noise_std"] == pytest.approx(
        expected * (1.0 + fr.SINGLE_GRAM_SLACK), rel=1e-12
    )


@pytest.mark.parametrize("route", ["mean", "none"])
def test_the_float32_variance_sums_are_the_sums_and_stay_in_their_simplex(route: str) -> None:
    n, d = 3000, 16
    rows = offset_rows(n, d, 35)
    order = np.random.default_rng(36).permutation(n)
    counts = cc.probe_pass(rows, 1.0, order)
    basis = np.linalg.qr(np.random.default_rng(37).standard_normal((d, 4)))[0]
    bound = 0.1
    if route == "none":
        exact = cc.probe_paired_energy(rows, 1.0, order, counts, basis, bound)
        got = cc.probe_paired_energy(rows, 1.0, order, counts, basis, bound, single=True)
        assert got is not None and exact is not None and got[2] == exact[2]
        totals = np.minimum((counts.pair_norms**2) / 2.0, bound**2)  # type: ignore[operator]
    else:
        center = rows.mean(axis=0) * 0.98
        squares = np.empty(n)
        cc.fast_gram(rows, 1.0, center, 0.2, counts.row_squares, centred_squares=squares)
        exact = cc.probe_centred_energy(rows, counts, basis, center, bound)
        got = cc.probe_centred_energy(
            rows, counts, basis, center, bound, single=True, centred_squares=squares
        )
        assert got is not None and exact is not None
        totals = np.minimum(squares, bound**2)
    # The captured part to float32 rounding; the two parts add up to the clipped norms'
    # sum (each summand clamped onto its simplex) whatever the projections' rounding.
    assert got[0] == pytest.approx(exact[0], rel=1e-4)
    assert got[0] != exact[0]
    assert got[0] + got[1] == pytest.approx(float(np.sum(totals)), rel=1e-12)


def test_rows_beyond_float32s_range_are_scaled_before_their_rounding() -> None:
    # Squared norms in the safe range but entries beyond float32's: such a row is scaled
    # in float64 first (round_scaled), so the float32 Gram and projections stay finite.
    rows = offset_rows(2048, 10, 38)
    rows[5] *= 1e45
    rows[6] *= 1e29  # its factor to 1e-6 is below 2^-100: scaled in float64 too
    rows[700] *= 1e-30
    squares = cc.row_squares(rows)
    exact = cc.fast_gram(rows, 1.0, None, 0.5, squares)
    got = cc.fast_gram(rows, 1.0, None, 0.5, squares, single=True)
    assert bool(np.all(np.isfinite(got)))
    bounded = cc.fast_gram(rows, 1.0, None, 1e-6, squares, single=True)
    assert float(np.linalg.norm(bounded - cc.fast_gram(rows, 1.0, None, 1e-6, squares))) <= (
        1e-3 * 2048 * 1e-12
    )
    from service.mechanisms import fast_rows as fr

    allowed = fr.single_gamma(fr.SINGLE_BLOCK_ROWS + 8) * rows.shape[0] * 0.5**2
    assert float(np.linalg.norm(got - exact)) <= allowed
    factors = fr.clip_factors(squares, 1.0)
    projected = fr.single_projections(rows, np.eye(10, 3), factors, squares)
    assert factors is not None
    np.testing.assert_allclose(projected, (rows * factors[:, None])[:, :3], rtol=1e-6, atol=1e-7)


def test_the_float32_centring_moves_within_the_slack_and_keeps_the_gram() -> None:
    from service.mechanisms import fast_rows as fr

    rows = offset_rows(2048, 16, 39)  # some rows above C, a zero row
    rows[9] *= 1e60  # squares above 2^100: clipped and centred in float64, then rounded
    center = rows[rows[:, 0] < 1.0].mean(axis=0)
    bound = 0.05
    squares = cc.row_squares(rows)

    def gram(x: Rows, single: bool = True) -> Rows:
        return cc.fast_gram(
            x, 1.0, center, bound, cc.row_squares(x), single=single, single_centring=single
        )

    exact = cc.fast_gram(rows, 1.0, center, bound, squares)
    got = gram(rows)
    assert 0.0 < float(np.linalg.norm(got - exact)) <= 1e-5 * float(np.linalg.norm(exact))
    other = rows.copy()
    other[300] = -4.0 * rows[300]  # another row of block 256-511
    moved = float(np.linalg.norm(got - gram(other)))
    assert moved <= math.sqrt(2.0) * bound**2 * (1.0 + fr.SINGLE_GRAM_SLACK)
    # The slack covers the float32 norms' rounding up to 2,048 columns.
    d = fr.SINGLE_CENTRING_MAX_COLS
    # A row kept or scaled by its float32-measured norm: at most B (1 + eta).
    eta = (
        math.sqrt((1 + fr.ROUNDING_SLACK) / (1 - fr.single_gamma(d))) * (1 + fr.single_gamma(2)) - 1
    )
    block = fr.SINGLE_BLOCK_ROWS
    assert (1 + eta) ** 2 * (1 + math.sqrt(2.0) * fr.single_gamma(block) * block) - 1 <= (
        fr.SINGLE_GRAM_SLACK
    )
    assert fr.single_centring_fits(d, 1.0, center, 0.1)
    assert not fr.single_centring_fits(d + 1, 1.0, center, 0.1)
    assert not fr.single_centring_fits(100, 1.0, center, 0.01)  # offset 100x the spread
    assert not fr.single_centring_fits(100, 1.0, center * 1e20, 0.1)


@pytest.mark.parametrize("n", [1, 2, 3, 64, 1025, 4097])
@pytest.mark.parametrize("chunk", [1, 7, 1024])
def test_the_pairs_by_higher_row_are_the_sorted_pairs(n: int, chunk: int) -> None:
    # The probe pass orders its pairs by their higher row in linear time; the reference sorts
    # them. Each chunk gets the same pairs (the same (low, high, j) triples), the whole order
    # by higher row.
    order = np.random.default_rng(n + chunk).permutation(n)
    low_by, high_by, by, bounds = cc._pairs_by_higher_row(order, n, chunk)
    m = n // 2
    first, second = order[0 : 2 * m : 2], order[1 : 2 * m : 2]
    low, high = np.minimum(first, second), np.maximum(first, second)
    ranked = np.argsort(high)
    np.testing.assert_array_equal(high_by, high[ranked])
    np.testing.assert_array_equal(low_by, low[ranked])
    np.testing.assert_array_equal(by, ranked)
    assert bounds.shape == ((n + chunk - 1) // chunk + 1,)
    for c in range(bounds.shape[0] - 1):
        inside = high_by[bounds[c] : bounds[c + 1]]
        assert np.all((inside >= c * chunk) & (inside < (c + 1) * chunk))
    assert bounds[-1] == m


def test_rows_tested_once_for_all_are_rounded_as_rows_tested_per_chunk() -> None:
    # The float32 passes test which rows round_scaled must scale in float64 once over all rows
    # (tame_rows) instead of per chunk: the same float32 rows and the same Gram to the bit.
    from service.mechanisms import fast_rows as fr

    rows = offset_rows(3000, 12, 41)
    squares = cc.row_squares(rows)
    factors = fr.clip_factors(squares, 0.5)
    assert factors is not None and fr.tame_rows(squares, factors)
    per_row = fr.round_scaled(rows, factors, squares, np.empty((3000, 12), np.float32)).copy()
    once = fr.round_scaled(
        rows,
        factors,
        squares,
        np.empty((3000, 12), np.float32),
        factors32=factors.astype(np.float32),
        tame=True,
    )
    assert np.array_equal(once, per_row)
    chunk = fr.gram_chunk_rows(12)
    buffer = np.empty((chunk, 12), np.float32)
    expected = np.zeros((12, 12))
    for start in range(0, 3000, chunk):
        part = slice(start, start + chunk)
        fr._add_single(expected, fr.round_scaled(rows[part], factors[part], squares[part], buffer))
    assert np.array_equal(fr.fast_gram(rows, 1.0, None, 0.5, squares, single=True), expected)
    projected = fr.single_projections(rows, np.eye(12, 3), factors, squares)
    assert np.array_equal(projected, per_row[:, :3].astype(np.float64))
    # One row beyond float32's range, or one factor below 2^-100: no longer tame.
    wild = rows.copy()
    wild[5] *= 1e45
    assert not fr.tame_rows(cc.row_squares(wild), None)
    tiny = factors.copy()
    tiny[7] = 2.0**-101
    assert not fr.tame_rows(squares, tiny)
