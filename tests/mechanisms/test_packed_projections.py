"""The packed projector distances of ``friendly_aggregate`` (issue 35, item 1).

``friendly_weights.packed_projection_block`` computes ``||U_j U_j^T - U_l U_l^T||_F`` from the
packed upper triangles of the projectors (``d (d + 1) / 2`` multiply-adds a pair instead of
``k^2 d``). What the privacy argument needs: each distance within ``projection_rounding(d, k)``
of the exact distance of the computed bases (the allowance the sensitivity is calibrated with),
and a function of its pair alone; what the equivalence with the cross-product route needs: the
same counts, hence the same release, except for a distance within rounding of a radius.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms import friendly_aggregators as fagg
from service.mechanisms import friendly_weights as fw
from service.mechanisms.friendly_radius import radius_grid


def _bases(t: int, d: int, k: int, spread: float, seed: int) -> np.ndarray:
    """``t`` orthonormal ``d x k`` bases around one subspace (``spread`` 0: identical;
    large: unrelated)."""
    rng = np.random.default_rng(seed)
    centre = rng.standard_normal((d, k))
    out = [np.linalg.qr(centre + spread * rng.standard_normal((d, k)))[0] for _ in range(t)]
    return np.ascontiguousarray(np.stack(out))


def _exact(bases: np.ndarray) -> np.ndarray:
    """Distances from the explicit ``d x d`` projectors, in extended precision."""
    projectors = np.einsum("gik,gjk->gij", bases, bases).astype(np.longdouble)
    diff = projectors[:, None] - projectors[None, :]
    return np.asarray(np.sqrt(np.sum(diff * diff, axis=(2, 3))), dtype=np.float64)


def _full(block: fw.BlockFn, t: int) -> np.ndarray:
    dist = block(0, t)
    fw._square_part_symmetric(dist)
    return dist


@pytest.mark.parametrize(("d", "k"), [(6, 4), (30, 5), (100, 10)], ids=["one-chunk", "d30", "d100"])
@pytest.mark.parametrize("spread", [0.0, 1e-4, 3.0])
def test_packed_distances_are_within_the_rounding_allowance(d: int, k: int, spread: float) -> None:
    t = 24
    assert fw.packed_projections(t, d, k)
    bases = _bases(t, d, k, spread, seed=d + k)
    packed = _full(fw.packed_projection_block(bases), t)
    exact = _exact(bases)
    old = _full(fw.projection_distance_block(bases), t)
    upper = np.triu_indices(t, 1)
    assert np.max(np.abs(packed - exact)[upper]) <= fw.projection_rounding(d, k)
    # far inside it in practice, and next to the cross-product route of before (compared
    # squared: at distance 0 both are square roots of rounding, ~1e-8)
    assert np.max(np.abs(packed**2 - old**2)[upper]) < 1e-12
    assert np.all(np.diag(packed) == 0.0)


@pytest.mark.parametrize("d", [1, 2, 5, 6, 30, 31])
def test_packed_rows_hold_each_triangle_entry_once_with_its_weight(d: int) -> None:
    """The packed form (the cross block of the halves, then both halves' triangles side by
    side) holds exactly the upper triangle of ``U U^T``, off-diagonal entries times ``sqrt 2``:
    the same multiset of values as the triangle itself, and inner products equal to
    ``||U_j^T U_l||_F^2``; the padding after the ``L`` entries is zero."""
    k = min(d, 3)
    bases = _bases(5, d, k, 1.0, seed=d)
    n_chunks, chunk = fw.packed_chunks(d, k)
    rows = fw.packed_projector_rows(bases, n_chunks, chunk)
    length = fw.packed_length(d)
    assert rows.shape == (5, n_chunks * chunk)
    assert np.all(rows[:, length:] == 0.0)
    upper_rows, upper_cols = np.triu_indices(d)
    weight = np.where(upper_rows == upper_cols, 1.0, np.sqrt(2.0))
    for j in range(5):
        triangle = (bases[j] @ bases[j].T)[upper_rows, upper_cols] * weight
        assert np.allclose(np.sort(rows[j, :length]), np.sort(triangle), rtol=0, atol=1e-15)
    overlaps = np.einsum("jik,lim->jlkm", bases, bases)
    assert np.allclose(rows @ rows.T, np.sum(overlaps**2, axis=(2, 3)), rtol=0, atol=1e-13)


@pytest.mark.parametrize(("d", "k"), [(1, 1), (6, 4), (30, 5), (100, 10), (198, 10)])
def test_packed_chunks_keep_the_proofs_length_and_pad_little(d: int, k: int) -> None:
    n_chunks, chunk = fw.packed_chunks(d, k)
    length = fw.packed_length(d)
    assert chunk <= fw.PACKED_CHUNK_KD * k * d  # the rounding proof's chunk length
    assert n_chunks == -(-length // (fw.PACKED_CHUNK_KD * k * d))
    assert 0 <= n_chunks * chunk - length < n_chunks


def test_a_moved_basis_changes_only_its_own_distances() -> None:
    t, d, k = 40, 30, 5
    bases = _bases(t, d, k, 1e-3, seed=3)
    moved = bases.copy()
    moved[17] = _bases(1, d, k, 0.0, seed=99)[0]
    before = _full(fw.packed_projection_block(bases), t)
    after = _full(fw.packed_projection_block(moved), t)
    others = np.ones((t, t), dtype=bool)
    others[17, :] = others[:, 17] = False
    assert np.array_equal(before[others], after[others])  # bit for bit
    assert not np.array_equal(before[17], after[17])


def test_blocking_does_not_change_the_counts() -> None:
    t, d, k = 60, 30, 5
    bases = _bases(t, d, k, 1e-3, seed=4)
    radii = radius_grid(np.sqrt(2.0 * k), 17)
    block = fw.packed_projection_block(bases)
    whole = fw.count_friends(block, t, radii, rows=t)
    pieces = fw.count_friends(block, t, radii, rows=7)
    old = fw.count_friends(fw.projection_distance_block(bases), t, radii, rows=t)
    assert np.array_equal(whole, pieces)
    assert np.array_equal(whole, old)


def test_the_route_is_chosen_from_public_sizes() -> None:
    assert fw.packed_projections(500, 100, 10)  # the bench's default
    assert not fw.packed_projections(500, 199, 10)  # d + 1 = 2 k^2: cross products
    assert not fw.packed_projections(500, 40, 3)
    assert not fw.packed_projections(10_000, 100, 10)  # packed projectors above 32 MB
    _, rows = fw.projection_block(_bases(8, 30, 5, 0.0, seed=5))
    assert rows == 8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_release_equals_the_cross_product_route(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same draws, same data: the search, weights and released basis are those of the route of
    before (their distances differ by ~1e-12, no radius falls between them)."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((30, 5)))
    data = rng.standard_normal((6_000, 5)) @ basis.T / np.sqrt(5)
    data += 1e-3 * rng.standard_normal(data.shape) / np.sqrt(30)

    def run() -> tuple[fagg.FriendlySearch, fagg.FriendlyResult]:
        draws = np.random.default_rng(100 + seed)
        state = fagg.friendly_search(data, 5, 1.0, 1e-6, draws, t=120, aggregator="projection")
        return state, fagg.friendly_continue(state, draws)

    new_state, new = run()
    monkeypatch.setattr(
        fagg,
        "projection_block",
        lambda bases: (fw.projection_distance_block(bases), fw.block_rows(bases.shape[0], 25)),
    )
    old_state, old = run()
    assert new_state.radius == old_state.radius
    assert np.array_equal(new_state.weights, old_state.weights)
    assert (new.basis is None) == (old.basis is None)
    if new.basis is not None:
        assert old.basis is not None and np.array_equal(new.basis, old.basis)


def _force_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every projection release takes the packed route (the audit pairs have k = 1, where the
    public rule would keep the cross products)."""
    monkeypatch.setattr(fw, "packed_projections", lambda t, d, k: True)


def test_the_whole_pipeline_audit_passes_on_the_packed_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cone pair's audit (search, PTR, Gaussian release; tight for ``Delta_W`` at the
    radius where AboveThreshold stops) with the packed distances."""
    from tests.mechanisms import test_friendly_aggregate as tfa

    _force_packed(monkeypatch)
    bases = np.stack([row[:, None] / np.linalg.norm(row) for row in tfa._cone_pair()[0]])
    assert isinstance(fw.projection_block(bases)[0], fw.CentredProjectionBlock)
    assert tfa._cone_audit(tfa._full_pipeline, runs=800, seed=52) <= tfa.CONE_EPS


def test_the_packed_route_audit_has_teeth(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.mechanisms import test_friendly_aggregate as tfa

    _force_packed(monkeypatch)
    tfa._divide_noise_by_ten(monkeypatch)
    assert tfa._cone_audit(tfa._full_pipeline, runs=800, seed=53) > tfa.CONE_EPS
