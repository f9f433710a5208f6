"""The certified subspace iteration behind the subset bases (issue 35, item 1).

``subset_top_k._gram_top_k`` takes each block's top-k eigenvectors from a subspace iteration
when its Gram is large: within ``1e-10`` of the exact top-k where the Davis-Kahan bound
certifies them, else (seventh pass) the iteration's last Ritz vectors instead of the dense
``eigh`` of before. What the aggregators' privacy argument needs from it: ``U_j`` is a function of
subset ``j`` alone (one moved row leaves every other basis bit for bit), orthonormal, total at
any scale; what their utility needs: within the tolerance of the exact top-k subspace.

Since the eighth pass, blocks with ``min(m, d) >= 8 (k + 2)`` take the fixed-count sketch on
the rows instead (``SKETCH_ROUTE``, tests/mechanisms/test_subset_sketch.py); the tests here that
are about the Gram route itself run it with ``SKETCH_ROUTE = False`` (the route of before, still
taken for ``3 b <= s < 8 b``). The per-subset, scale and batching tests run the default route.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.mechanisms import sample_aggregate as sa
from service.mechanisms import subset_top_k as stk


def _near_subspace(g: int, m: int, d: int, k: int, distance: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((d, k)))
    signal = rng.standard_normal((g, m, k)) @ basis.T
    return np.asarray(signal + distance * rng.standard_normal((g, m, d)), dtype=np.float64)


def _projectors(bases: np.ndarray) -> np.ndarray:
    return np.asarray(np.einsum("gik,gjk->gij", bases, bases))


def _svd_projectors(blocks: np.ndarray, k: int) -> np.ndarray:
    out = []
    for block in blocks:
        _, _, vt = np.linalg.svd(block, full_matrices=False)
        out.append(vt[:k].T @ vt[:k])
    return np.stack(out)


@pytest.mark.parametrize(
    ("m", "d"), [(60, 120), (150, 60), (80, 80)], ids=["lifted", "direct", "square"]
)
@pytest.mark.parametrize("distance", [1e-2, 1e-5, 0.0])
def test_iterated_bases_match_the_svd_near_a_subspace(
    m: int, d: int, distance: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stk, "SKETCH_ROUTE", False)  # the Gram route's certificate
    k = 4
    assert stk.iteration_width(min(m, d), k) > 0  # the iterative route is the one tested
    blocks = _near_subspace(6, m, d, k, distance, seed=1)
    s = min(m, d)
    scaled = np.ldexp(blocks, -stk.power_of_two_exponents(blocks)[:, None, None])
    gram = scaled @ scaled.transpose(0, 2, 1) if m < d else scaled.transpose(0, 2, 1) @ scaled
    certified, _, _ = stk._subspace_iteration(gram, k, stk.iteration_width(s, k), m < d)
    assert certified.all()
    bases = stk.top_k_right_singular(blocks, k)
    assert np.allclose(np.einsum("gik,gil->gkl", bases, bases), np.eye(k), atol=1e-12)
    assert np.max(np.abs(_projectors(bases) - _svd_projectors(blocks, k))) < 1e-9


def _power_law_blocks(g: int, m: int, d: int, seed: int) -> np.ndarray:
    """Rows with variance ``1/i`` along axis ``i`` (bench_aggregator_speed's "power"): no gap."""
    rng = np.random.default_rng(seed)
    return np.asarray(rng.standard_normal((g, m, d)) / np.sqrt(np.arange(1, d + 1)))


@pytest.mark.parametrize(
    ("m", "d"), [(40, 90), (150, 60), (80, 80)], ids=["lifted", "direct", "square"]
)
def test_blocks_without_a_gap_keep_their_ritz_vectors_without_a_dense_eigh(
    m: int, d: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seventh pass (issue 35 item 1): a block the iteration cannot certify keeps its last Ritz
    vectors; the dense ``eigh`` of its ``s x s`` Gram (22x ``X^T X`` at 50,000 x 100 on rows
    without a gap) is not called. Before, every such block took it. The kept basis is
    orthonormal (lifted too: ``V^T G V = diag(theta)``) and captures nearly the exact top-k's
    share of the block (Ritz values interlace: ``theta_i <= lambda_i``)."""
    monkeypatch.setattr(stk, "SKETCH_ROUTE", False)  # the Gram route (the sketch forms no Gram)
    k = 3
    s = min(m, d)
    blocks = _power_law_blocks(6, m, d, seed=2)
    sizes: list[int] = []
    real_eigh = stk.eigh_each

    def counting(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sizes.append(stack.shape[-1])
        return real_eigh(stack)

    monkeypatch.setattr(stk, "eigh_each", counting)
    bases = stk.top_k_right_singular(blocks, k)
    assert s not in sizes  # only the b x b Rayleigh-Ritz matrices were decomposed
    assert np.all(np.isfinite(bases))
    assert np.allclose(np.einsum("gik,gil->gkl", bases, bases), np.eye(k), atol=1e-10)
    exact = _svd_projectors(blocks, k)
    for block, basis, projector in zip(blocks, bases, exact, strict=True):
        kept = np.square(block @ basis).sum()
        best = np.trace(block @ projector @ block.T)
        assert best * 0.9 <= kept <= best * (1 + 1e-12)


def test_without_keeping_blocks_without_a_gap_take_the_dense_route_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``KEEP_UNCERTIFIED = False`` (the route of before, kept for the same-process comparison
    in docs/benchmarks.md): isotropic rows have no gap after k, the iteration settles nothing
    and the dense ``eigh`` decides every block, the same bits as calling it directly."""
    monkeypatch.setattr(stk, "KEEP_UNCERTIFIED", False)
    rng = np.random.default_rng(2)
    blocks = rng.standard_normal((5, 40, 90))
    scaled = np.ldexp(blocks, -stk.power_of_two_exponents(blocks)[:, None, None])
    gram = scaled @ scaled.transpose(0, 2, 1)
    certified, _, _ = stk._subspace_iteration(gram, 3, stk.iteration_width(40, 3), True)
    assert not certified.any()
    values, vectors, finite = stk._gram_top_k(gram, 3, lift=True)
    dense_values, dense_vectors = np.linalg.eigh(gram)
    assert finite.all()
    assert np.array_equal(values, dense_values[:, ::-1][:, :3])
    assert np.array_equal(vectors, dense_vectors[:, :, ::-1][:, :, :3])


@pytest.mark.parametrize("gap", [True, False], ids=["certified", "kept"])
@pytest.mark.parametrize(("m", "d"), [(50, 120), (60, 60)], ids=["lifted", "square"])
def test_a_moved_row_changes_only_its_own_subsets_basis_on_the_iterative_route(
    m: int, d: int, gap: bool
) -> None:
    """Lifted from ``X X^T`` (``m < d``) and directly from ``X^T X`` at ``m = d`` (fourth pass:
    the square case no longer lifts); near a subspace (certified) and without a gap (the Ritz
    vectors kept, seventh pass)."""
    t, k = 12, 3
    assert stk.iteration_width(min(m, d), k) > 0
    if gap:
        data = _near_subspace(1, t * m, d, k, 1e-4, seed=3)[0]
    else:
        data = _power_law_blocks(1, t * m, d, seed=3)[0]
    partition = sa.random_partition(t * m, t, np.random.default_rng(4))
    before = sa.subset_bases(data, partition, k, group_rows=200)
    row = int(partition[5, 7])
    for factor in (1e250, 1e-250, 0.0):
        moved = data.copy()
        moved[row] *= factor
        after = sa.subset_bases(moved, partition, k, group_rows=200)
        others = np.arange(t) != 5
        assert np.array_equal(before[others], after[others])
        assert np.allclose(after[5].T @ after[5], np.eye(k), atol=1e-8)


@pytest.mark.parametrize("scale", [1e-300, 1e300, 5e-324])
def test_extreme_scales_give_the_same_subspace(scale: float) -> None:
    """Per-block power-of-two scaling: rows of any binade give the bases of the unit-scale rows
    (5e-324, the smallest subnormal, rounds every entry to 0 or 5e-324: still orthonormal)."""
    blocks = _near_subspace(4, 40, 150, 3, 1e-3, seed=5)
    unit = stk.top_k_right_singular(blocks, 3)
    extreme = stk.top_k_right_singular(blocks * scale, 3)
    assert np.all(np.isfinite(extreme))
    assert np.allclose(np.einsum("gik,gil->gkl", extreme, extreme), np.eye(3), atol=1e-8)
    if scale != 5e-324:
        assert np.max(np.abs(_projectors(extreme) - _projectors(unit))) < 1e-9


def test_zero_and_duplicate_blocks_never_raise() -> None:
    rng = np.random.default_rng(6)
    row = rng.standard_normal(120)
    blocks = np.stack([np.zeros((40, 120)), np.tile(row, (40, 1)), rng.standard_normal((40, 120))])
    bases = stk.top_k_right_singular(blocks, 3)
    assert np.all(np.isfinite(bases))
    assert np.allclose(np.einsum("gik,gil->gkl", bases, bases), np.eye(3), atol=1e-8)


def test_the_start_is_a_public_constant() -> None:
    first = stk.public_start(90, 13)
    assert np.array_equal(first, np.random.default_rng(0x5AB5_7A27).standard_normal((90, 13)))
    assert not first.flags.writeable


def test_iterating_a_few_grams_at_a_time_changes_no_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``top_k_right_singular`` decomposes ``CACHE_BYTES`` of Grams at a time (fifth pass, for the
    cache): every step is per matrix, so any batching gives the same bases, certified or not."""
    blocks = np.concatenate(
        [
            _near_subspace(5, 60, 120, 3, 1e-4, seed=9),
            np.random.default_rng(9).normal(size=(2, 60, 120)),
        ]
    )
    monkeypatch.setattr(stk, "CACHE_BYTES", 1 << 40)  # one batch
    whole = stk.top_k_right_singular(blocks, 3)
    for grams in (1, 2, 3):
        monkeypatch.setattr(stk, "CACHE_BYTES", grams * 8 * 60 * 60)
        assert np.array_equal(stk.top_k_right_singular(blocks, 3), whole)


@pytest.mark.parametrize("gap", [True, False], ids=["iterated", "dense"])
def test_an_eigh_failure_sends_only_its_own_block_to_the_svd(
    gap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batched ``eigh`` raises for the whole stack if one matrix fails; ``eigh_each`` retries
    matrix by matrix, so the other blocks keep their bases bit for bit (the route stays a
    function of the block alone) and the failing block gets an orthonormal SVD basis.

    Without a gap the dense route is now reached only by blocks whose Ritz values are not
    finite; the "dense" case runs the route of before (``KEEP_UNCERTIFIED = False``), where
    every such block decomposes its Gram densely."""
    if not gap:
        monkeypatch.setattr(stk, "SKETCH_ROUTE", False)  # the Gram route of before
        monkeypatch.setattr(stk, "KEEP_UNCERTIFIED", False)
    rng = np.random.default_rng(12)
    blocks = _near_subspace(6, 60, 120, 3, 1e-4, seed=12) if gap else rng.normal(size=(6, 60, 120))
    before = stk.top_k_right_singular(blocks, 3)
    poisoned = blocks.copy()
    poisoned[2] *= 0.75  # a block of its own scale, so its Gram has a trace no other has
    # the trace of block 2's Gram, formed from its rows scaled by their own power of two
    exponent = math.frexp(float(np.max(np.abs(poisoned[2]))))[1]
    marker = float(np.sum(np.square(np.ldexp(poisoned[2], -exponent))))
    real_eigh = np.linalg.eigh
    hits = []

    def failing_eigh(stack: np.ndarray):  # type: ignore[no-untyped-def]
        # Fails on block 2's Gram and on its Ritz matrix (whose trace is within 1e-6 of the
        # Gram's near a subspace), as LAPACK failing to converge would.
        traces = np.trace(stack[None] if stack.ndim == 2 else stack, axis1=1, axis2=2)
        if np.any(np.isclose(traces, marker, rtol=1e-5)):
            hits.append(stack.shape)
            raise np.linalg.LinAlgError("Eigenvalues did not converge")
        return real_eigh(stack)

    monkeypatch.setattr(np.linalg, "eigh", failing_eigh)
    after = stk.top_k_right_singular(poisoned, 3)
    assert hits  # the failure was raised (for the stack, then for the block alone)
    others = np.arange(6) != 2
    assert np.array_equal(after[others], before[others])
    assert np.allclose(after[2].T @ after[2], np.eye(3), atol=1e-10)
