"""The aggregators' faster paths compute what the slower ones did (issue 35, item 1).

The subset bases (each block scaled by its own power of two, then its Gram) and the width
search's largest cell counts were made cheaper; the privacy argument is unchanged only if
the computed values are: each reference below is the code of before, run beside the new one on
the same blocks or points, and compared bit for bit (``array_equal``), or, for the released
output, through the mechanism with the same seed on several data sets.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms import subset_top_k as stk
from service.mechanisms import width_selection as ws
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism


def _old_scale_and_gram(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Before: ``ldexp`` of all blocks at once, then one batched ``matmul`` (of the side the
    subset bases now take: ``X^T X`` from ``m = d`` on, fourth pass)."""
    scaled = np.ldexp(blocks, -stk.power_of_two_exponents(blocks)[:, None, None])
    _, m, d = blocks.shape
    if m >= d:
        return scaled, np.matmul(scaled.transpose(0, 2, 1), scaled)
    return scaled, np.matmul(scaled, scaled.transpose(0, 2, 1))


@pytest.mark.parametrize("shape", [(7, 30, 50), (5, 60, 20), (4, 25, 25)])
@pytest.mark.parametrize("scale", [1.0, 0.7, 3.0, 1e-300, 1e300, 2.0**-1060, 5e-324, 0.0])
def test_scale_and_gram_is_the_per_block_scaled_route_at_every_scale(
    shape: tuple[int, int, int], scale: float
) -> None:
    """Every block, of any scale (1e-300, 1e300, subnormal and zero rows among them), is scaled
    by its own power of two before its Gram (ALGORITHMS.md, "Totality"), bit for bit the
    per-block route: no block's work depends on its values' range."""
    rng = np.random.default_rng(int(1e3 * shape[1] + shape[2]))
    blocks = rng.standard_normal(shape)
    blocks[1] *= 1e-5  # blocks of different exponents in one batch
    blocks[2, 0, 0] = 1e-310  # a subnormal entry beside normal ones
    blocks = blocks * scale
    old_scaled, old_gram = _old_scale_and_gram(blocks)
    for in_place in (False, True):
        rows = blocks.copy()
        scaled = rows if in_place else np.empty_like(rows)
        gram = stk.scale_and_gram(rows, scaled)
        for j in range(shape[0]):
            assert np.array_equal(scaled[j], old_scaled[j])
            assert np.array_equal(gram[j], old_gram[j])


@pytest.mark.parametrize("shape", [(13, 100, 100), (9, 40, 60), (6, 70, 30), (2, 1, 5)])
def test_batched_scale_and_gram_is_the_per_block_route(
    shape: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks that fit the cache are peaked, scaled and multiplied a batch at a time (issue 35,
    eighth pass): the same scaled rows and Grams, bit for bit, as the block-by-block route, for
    a batch mixing exponents 0 and nonzero, a zero block, a block at the edge of the normal
    scaling range, a subnormal entry, duplicated rows and signed zeros; and a batch with an
    exponent beyond the normal range goes block by block (``ldexp``)."""
    rng = np.random.default_rng(sum(shape))
    blocks = rng.standard_normal(shape)
    blocks[0] *= 0.7 / np.max(np.abs(blocks[0]))  # peak in [0.5, 1): exponent 0
    blocks[1] = 0.0
    blocks[1, 0, :2] = (-0.0, 0.0)
    if shape[0] > 2:
        blocks[2] *= 2.0**1000  # exponent 1,000: 2^-1000 is still a normal double
        blocks[3, 0, 0] = 1e-310
        blocks[4] = blocks[4, :1]  # duplicate rows
    per_block = {}
    for batched in (False, True):
        monkeypatch.setattr(stk, "CACHE_BYTES", (1 << 30) if batched else 0)
        for in_place in (False, True):
            rows = blocks.copy()
            scaled = rows if in_place else np.empty_like(rows)
            gram = stk.scale_and_gram(rows, scaled)
            if not batched:
                per_block[in_place] = (scaled.copy(), gram)
                continue
            old_scaled, old_gram = per_block[in_place]
            assert np.array_equal(scaled, old_scaled)
            assert np.array_equal(np.signbit(scaled), np.signbit(old_scaled))
            assert np.array_equal(gram, old_gram)
    # The batch route declines a batch with an exponent outside the normal range and writes
    # nothing; scale_and_gram then takes the per-block route (ldexp).
    extreme = blocks.copy()
    extreme[0] *= 1e-310 / np.max(np.abs(extreme[0]))
    out, gram = np.full_like(extreme, 7.0), np.full((shape[0],) + (min(shape[1:]),) * 2, 7.0)
    assert not stk._scale_and_gram_batch(extreme, out, gram)
    assert np.all(out == 7.0) and np.all(gram == 7.0)


@pytest.mark.parametrize(
    "exponent", [-1074, -1073, -1024, -1023, -1022, -3, 0, 1, 1022, 1023, 1024]
)
def test_scale_by_power_of_two_is_ldexp_at_every_exponent(exponent: int) -> None:
    rng = np.random.default_rng(abs(exponent))
    finite = np.finfo(np.float64)
    values = np.concatenate(
        [
            rng.standard_normal(50),
            [0.0, -0.0, 5e-324, -5e-324, 2.2e-308, finite.max / 4, 3e-310, 1.5 * 2.0**-1070],
        ]
    )
    block = np.ldexp(values / np.max(np.abs(values)), exponent - 1).reshape(2, -1)
    # the exponent of the block's largest entry: scaling puts it in [0.5, 1)
    peak = float(np.max(np.abs(block)))
    if peak == 0.0:
        return
    own = int(np.frexp(peak)[1])
    out = np.empty_like(block)
    stk.scale_by_power_of_two(block, own, out)
    assert np.array_equal(out, np.ldexp(block, -own))
    assert np.array_equal(np.signbit(out), np.signbit(np.ldexp(block, -own)))


def test_nested_cells_equal_the_fingerprint_counts_and_survive_collisions() -> None:
    rng = np.random.default_rng(3)
    for _ in range(60):
        t, dim = int(rng.integers(1, 50)), int(rng.integers(1, 1500))  # up to 3 steps
        centres = rng.integers(-40, 40, size=(3, dim)) * int(rng.integers(1, 2**20))
        spread = rng.integers(0, 2 ** int(rng.integers(1, 10)), size=(t, dim))
        finest = centres[rng.integers(0, 3, size=t)] + spread * rng.integers(0, 2, size=(t, 1))
        coefficients = ws.fingerprint_coefficients(dim)
        nested = ws.NestedCells(finest, coefficients)
        shifts = [0, 1, 3, 8, 40, 2, 5]
        rng.shuffle(shifts)  # levels grouped from whichever finer level is known
        for shift in shifts:
            fingerprinted = ws.largest_class_count(np.right_shift(finest, shift), coefficients)
            assert nested.largest(shift) == fingerprinted
        # Every row collides under zero multipliers: the exact cells are still found.
        colliding = np.zeros((dim, 2), dtype=np.uint64)
        labels = ws.exact_classes(finest, np.arange(t), 0, colliding)
        _, exact = np.unique(finest, axis=0, return_inverse=True)
        exact = exact.reshape(-1)
        same = labels[:, None] == labels[None, :]
        assert np.array_equal(same, exact[:, None] == exact[None, :])
        assert ws.NestedCells(finest, colliding).largest(0) == int(np.bincount(exact).max())


@pytest.mark.parametrize("seed", range(6))
def test_width_queries_equal_the_per_width_fingerprint_counts(seed: int) -> None:
    """The bisection that skips the fine widths answers every width as before."""
    rng = np.random.default_rng(seed)
    t, dim = 80, 40
    centre = rng.standard_normal(dim) if seed % 2 else np.zeros(dim)
    points = centre + 10.0 ** -int(rng.integers(0, 6)) * rng.standard_normal((t, dim))
    points[: seed * 10] = centre  # some points on one spot: a count above 1 at every width
    widths = ws.width_grid(float(rng.uniform(1.0, 50.0)))
    unit = rng.uniform(size=dim)
    query = ws.largest_cell_count_query(points, widths, unit)
    finest = ws.cells(points, float(widths[0]), unit * float(widths[-1])).astype(np.int64)
    coefficients = ws.fingerprint_coefficients(dim)
    before = [
        float(ws.largest_class_count(np.right_shift(finest, j), coefficients))
        for j in range(widths.shape[0])
    ]
    order = list(range(widths.shape[0]))
    if seed % 3 == 0:
        order = order[::-1]  # any order of asking gives the same answers
    answers = {j: query(j) for j in order}
    assert [answers[j] for j in range(widths.shape[0])] == before
    assert before[0] < before[-1] or seed == 0  # not vacuous: counts grow with the width


def _release(name: str, rows: np.ndarray, seed: int) -> np.ndarray | None:
    mechanism = get_mechanism(name)
    assert mechanism is not None
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 4, 1.0, 1e-6, mechanism.parse_params({}))
    out = mechanism.run(rows, ReleaseSpec(4, 1.0, 1e-6, params), np.random.default_rng(seed))
    return None if out.basis is None else np.asarray(out.basis)


@pytest.mark.parametrize("name", ["friendly_aggregate", "histogram_aggregate"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_released_basis_equals_the_old_bases_route(
    name: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same seed, with the old scaling and Grams and the old width counts patched in:
    the released basis is the same, bit for bit (near a subspace and not)."""
    rng = np.random.default_rng(100 + seed)
    n, d = 12_000, 30
    if seed == 2:
        rows = rng.standard_normal((n, d)) / np.sqrt(np.arange(1, d + 1))
    else:
        basis, _ = np.linalg.qr(rng.standard_normal((d, 4)))
        rows = rng.standard_normal((n, 4)) @ basis.T + 1e-3 * rng.standard_normal((n, d))
    rows /= np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
    new = _release(name, rows, seed)

    def old_scale_and_gram(blocks: np.ndarray, scaled: np.ndarray) -> np.ndarray:
        old_scaled, gram = _old_scale_and_gram(blocks)
        scaled[...] = old_scaled
        return gram

    def old_query(points: np.ndarray, widths: np.ndarray, unit: np.ndarray):  # type: ignore[no-untyped-def]
        finest = ws.cells(points, float(widths[0]), unit * float(widths[-1])).astype(np.int64)
        coefficients = ws.fingerprint_coefficients(points.shape[1])
        return lambda j: float(ws.largest_class_count(np.right_shift(finest, j), coefficients))

    monkeypatch.setattr(stk, "scale_and_gram", old_scale_and_gram)
    monkeypatch.setattr(ws, "largest_cell_count_query", old_query)
    old = _release(name, rows, seed)
    assert (new is None) == (old is None)
    if new is not None and old is not None:
        assert np.array_equal(new, old)


def _former_stability_histogram(
    points: np.ndarray,
    width: float,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    offsets: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """``stability_histogram`` as it was before the in-place cells (issue 35, third pass)."""
    from service.mechanisms import histogram_aggregate as ha

    if offsets is None:
        offsets = np.asarray(rng.uniform(0.0, width, size=points.shape[1]), dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        cells = np.floor((points - offsets) / width)
    np.clip(cells, -ws.CELL_INDEX_LIMIT, ws.CELL_INDEX_LIMIT, out=cells)
    first, counts = ws.cell_counts(cells)  # a canonical copy: cells keep their -0.0
    occupied = cells[first]
    noisy = counts + ha.laplace(ha.count_noise_scale(epsilon), rng, size=counts.shape[0])
    best = int(np.argmax(noisy))
    if not noisy[best] > ha.threshold(epsilon, delta):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        lower = np.asarray(offsets + occupied[best] * width, dtype=np.float64)
    return lower, np.asarray(offsets, dtype=np.float64)


def test_in_place_histogram_cells_release_the_same_corner_bit_for_bit() -> None:
    """Cells computed in one buffer and canonicalised in place (``-0.0`` to ``+0.0``): the
    released lower corner and offsets are the former doubles, signed zeros included."""
    from service.mechanisms import histogram_aggregate as ha

    rng = np.random.default_rng(8)
    released = 0
    for trial in range(150):
        t, dim = int(rng.integers(3, 60)), int(rng.integers(1, 200))
        centre = rng.standard_normal(dim) * 10.0 ** float(rng.integers(-5, 5))
        spread = 10.0 ** float(rng.integers(-8, 1)) * rng.standard_normal((t, dim))
        points = centre + spread * (rng.random((t, 1)) < 0.5)
        points[:, :2] = -1e-300 if trial % 3 == 0 else points[:, :2]  # cells of -1 and -0.0
        points[:, 2:3] = -0.0 if trial % 5 == 0 else points[:, 2:3]
        width = 10.0 ** float(rng.uniform(-6, 1))
        new = ha.stability_histogram(points, width, 1.0, 1e-6, np.random.default_rng(trial))
        old = _former_stability_histogram(points, width, 1.0, 1e-6, np.random.default_rng(trial))
        assert (new is None) == (old is None)
        if new is not None and old is not None:
            released += 1
            for a, b in zip(new, old, strict=True):
                assert np.array_equal(a.view(np.uint64), b.view(np.uint64))
    assert released > 30
    # Cells of -0.0 (a -0.0 coordinate at a zero offset) and +0.0 share a cell, and the corner
    # released is the former double.
    points = np.zeros((40, 3))
    points[::2, 0] = -0.0
    offsets = np.array([0.0, 0.25, 0.0])
    for seed in range(5):
        new = ha.stability_histogram(points, 1.0, 1.0, 1e-6, np.random.default_rng(seed), offsets)
        old = _former_stability_histogram(
            points, 1.0, 1.0, 1e-6, np.random.default_rng(seed), offsets
        )
        assert new is not None and old is not None
        for a, b in zip(new, old, strict=True):
            assert np.array_equal(a.view(np.uint64), b.view(np.uint64))
