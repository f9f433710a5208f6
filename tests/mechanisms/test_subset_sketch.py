"""The fixed-count sketch behind the subset bases (issue 35, item 1, eighth pass).

``subset_top_k._sketch_top_k``: for ``min(m, d) >= 8 (k + 2)`` each block's top-k right singular
vectors come from one fixed round of randomized subspace iteration on its own rows
(``(X^T X)^2 Omega``, Householder QR, Rayleigh-Ritz), never from its Gram. What the aggregators'
privacy argument needs: ``U_j`` is a function of subset ``j`` alone, orthonormal, total at any
scale, and the work done does not depend on the data. What their utility needs: the subspace
within ``(s_{b+1} / s_k)^4`` of the exact top-k, far inside the subsets' own spread
``s_{k+1} / s_k``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.mechanisms import sample_aggregate as sa
from service.mechanisms import subset_top_k as stk
from tests.mechanisms.test_subset_iteration import (
    _near_subspace,
    _power_law_blocks,
    _projectors,
    _svd_projectors,
)


@pytest.mark.parametrize(
    ("m", "d"), [(60, 120), (150, 60), (80, 80)], ids=["wide", "tall", "square"]
)
@pytest.mark.parametrize("distance", [1e-1, 1e-2, 1e-5, 0.0])
def test_sketch_bases_are_within_the_gap_bound_of_the_svd(m: int, d: int, distance: float) -> None:
    """Measured: 0.24-0.43 ``(s_{b+1}/s_k)^4`` (the bound of one round with two products by
    ``X^T X``); at most 0.5% of the subsets' spread ``s_{k+1}/s_k`` at distance 0.1, 5e-6 of
    it at 0.01, rounding below that."""
    k = 4
    b = stk.iteration_width(min(m, d), k)
    assert stk.sketch_route(m, d, k)
    blocks = _near_subspace(6, m, d, k, distance, seed=1)
    bases = stk.top_k_right_singular(blocks, k)
    assert np.allclose(np.einsum("gik,gil->gkl", bases, bases), np.eye(k), atol=1e-12)
    error = np.max(np.abs(_projectors(bases) - _svd_projectors(blocks, k)), axis=(1, 2))
    values = np.linalg.svd(blocks, compute_uv=False)
    rate = values[:, b] / values[:, k - 1]
    spread = values[:, k] / values[:, k - 1]
    assert np.all(error <= rate**4 + 1e-12)
    assert np.all(error <= 0.01 * spread + 1e-12)


def _calls(blocks: np.ndarray, k: int, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The shapes handed to every matrix product, QR and ``eigh`` while the bases are found."""
    calls: list[tuple[Any, ...]] = []
    real_matmul, real_qr, real_eigh = np.matmul, np.linalg.qr, stk.eigh_each

    def matmul(a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(("matmul", np.shape(a), np.shape(b)))
        return real_matmul(a, b, *args, **kwargs)

    def qr(a: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(("qr", np.shape(a)))
        return real_qr(a, *args, **kwargs)

    def eigh(a: Any) -> Any:
        calls.append(("eigh", np.shape(a)))
        return real_eigh(a)

    with monkeypatch.context() as patch:
        patch.setattr(np, "matmul", matmul)
        patch.setattr(np.linalg, "qr", qr)
        patch.setattr(stk, "eigh_each", eigh)
        stk.top_k_right_singular(blocks, k)
    return calls


@pytest.mark.parametrize(("m", "d"), [(60, 120), (150, 60)], ids=["wide", "tall"])
def test_the_work_is_the_same_for_any_data(m: int, d: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """One fixed round: the same products, QRs and ``eigh`` calls, of the same shapes, for rows
    near a subspace, without a gap, with a moderate gap, and for zero or duplicate rows. The
    Gram route of before (``SKETCH_ROUTE = False``) iterated until a block certified, so its
    work followed the data (checked here: its calls differ between these stacks)."""
    k, g = 3, 4
    rng = np.random.default_rng(7)
    stacks = [
        _near_subspace(g, m, d, k, 1e-4, seed=7),
        _power_law_blocks(g, m, d, seed=7),
        _near_subspace(g, m, d, k, 0.03, seed=8),
        np.stack([np.zeros((m, d)), np.tile(rng.standard_normal(d), (m, 1))] * (g // 2)),
    ]
    assert stk.sketch_route(m, d, k)
    now = [_calls(stack, k, monkeypatch) for stack in stacks]
    assert all(calls == now[0] for calls in now)
    assert ("qr", (g, d, k + 2)) in now[0]
    monkeypatch.setattr(stk, "SKETCH_ROUTE", False)
    before = [_calls(stack, k, monkeypatch) for stack in stacks]
    assert any(calls != before[0] for calls in before)


@pytest.mark.parametrize("gap", [True, False], ids=["near", "no-gap"])
@pytest.mark.parametrize(("m", "d"), [(60, 120), (150, 60)], ids=["wide", "tall"])
def test_a_moved_row_changes_only_its_own_subsets_basis_on_the_sketch(
    m: int, d: int, gap: bool
) -> None:
    """Through ``subset_bases`` (the first product is one BLAS call over a batch's stacked rows:
    each row's entries still come from that row alone), in batches of several subsets."""
    t, k = 12, 3
    assert stk.sketch_route(m, d, k)
    if gap:
        data = _near_subspace(1, t * m, d, k, 1e-4, seed=3)[0]
    else:
        data = _power_law_blocks(1, t * m, d, seed=3)[0]
    partition = sa.random_partition(t * m, t, np.random.default_rng(4))
    before = sa.subset_bases(data, partition, k)
    row = int(partition[5, 7])
    for factor in (1e250, 1e-250, 0.0, np.inf):
        moved = data.copy()
        moved[row] = factor * (moved[row] if np.isfinite(factor) else 1.0)
        if not np.all(np.isfinite(moved)):
            continue  # finite rows only (the loader refuses others)
        after = sa.subset_bases(moved, partition, k)
        others = np.arange(t) != 5
        assert np.array_equal(before[others], after[others])
        assert np.allclose(after[5].T @ after[5], np.eye(k), atol=1e-10)


def test_batches_change_no_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``CACHE_BYTES`` of rows at a time: any batching gives the same bases."""
    blocks = np.concatenate(
        [_near_subspace(5, 60, 120, 3, 1e-4, seed=9), _power_law_blocks(2, 60, 120, seed=9)]
    )
    monkeypatch.setattr(stk, "CACHE_BYTES", 1 << 40)
    whole = stk.top_k_right_singular(blocks, 3)
    for rows in (1, 2, 3):
        monkeypatch.setattr(stk, "CACHE_BYTES", rows * 8 * 60 * 120)
        assert np.array_equal(stk.top_k_right_singular(blocks, 3), whole)


def test_small_blocks_keep_the_certified_gram_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below ``8 b`` (here ``s = 30 < 40``) the Gram route decides, as before, bit for bit."""
    blocks = _near_subspace(4, 30, 60, 3, 1e-3, seed=10)
    assert stk.iteration_width(30, 3) > 0 and not stk.sketch_route(30, 60, 3)
    now = stk.top_k_right_singular(blocks, 3)
    monkeypatch.setattr(stk, "SKETCH_ROUTE", False)
    assert np.array_equal(stk.top_k_right_singular(blocks, 3), now)


def test_a_failing_eigh_sends_only_its_block_to_the_svd(monkeypatch: pytest.MonkeyPatch) -> None:
    """``eigh_each`` marks a matrix LAPACK cannot decompose (NaN values): that block alone gets
    an SVD basis, the others keep theirs bit for bit."""
    blocks = _near_subspace(4, 60, 120, 3, 1e-4, seed=11)
    before = stk.top_k_right_singular(blocks, 3)
    real = stk.eigh_each

    def failing(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        values, vectors = real(stack)
        values[1] = np.nan
        return values, vectors

    monkeypatch.setattr(stk, "eigh_each", failing)
    after = stk.top_k_right_singular(blocks, 3)
    others = np.arange(4) != 1
    assert np.array_equal(after[others], before[others])
    assert not np.array_equal(after[1], before[1])
    assert np.max(np.abs(_projectors(after[1:2]) - _svd_projectors(blocks[1:2], 3))) < 1e-9
