"""The centred projector distances of ``friendly_aggregate`` (issue 35, item 1).

``friendly_weights.CentredProjectionBlock`` places each pair against the radius grid by a
cheap two-sided bound on its squared projector distance (second order in the distance to one
subset's basis) and computes the exact packed distance only for the tiles of pairs the bound
cannot place. What the privacy argument needs: every count equals the count of the exact
per-pair distances ``F_jl`` (each a function of its pair alone, within
``projection_rounding`` of the true distance), whichever pairs needed their tile, whichever
basis the bound is centred on. The tests put radii exactly on (and one ulp around) exact
distances, where a wrong band would show.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.mechanisms import friendly_weights as fw
from service.mechanisms.friendly_radius import radius_grid


def _bases(t: int, d: int, k: int, spread: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centre = rng.standard_normal((d, k))
    out = [np.linalg.qr(centre + spread * rng.standard_normal((d, k)))[0] for _ in range(t)]
    return np.ascontiguousarray(np.stack(out))


def _exact_full(block: fw.CentredProjectionBlock) -> np.ndarray:
    dist = block(0, block.t)
    fw._square_part_symmetric(dist)
    return dist


def _tie_radii(exact: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """The grid, plus radii on exact distances and one ulp either side of them."""
    t = exact.shape[0]
    upper = exact[np.triu_indices(t, 1)]
    upper = upper[np.isfinite(upper)]
    picks = rng.choice(upper, size=min(6, upper.size), replace=False)
    ties = np.concatenate([picks, np.nextafter(picks, 0.0), np.nextafter(picks, np.inf)])
    grid = radius_grid(np.sqrt(2.0 * k), 17)
    return np.unique(np.concatenate([grid, ties[ties > 0]]))


def _counts_of(dist: np.ndarray, radii: np.ndarray) -> np.ndarray:
    return np.stack([np.count_nonzero(dist <= r, axis=1) for r in radii], axis=1)


@pytest.mark.parametrize(
    ("t", "d", "k"), [(37, 6, 4), (70, 30, 5), (45, 100, 10), (40, 60, 3), (33, 250, 10)]
)
@pytest.mark.parametrize("spread", [0.0, 1e-6, 1e-3, 3e-2, 3.0])
@pytest.mark.parametrize("rows", [None, 7])
def test_the_counts_are_those_of_the_exact_distances(
    t: int, d: int, k: int, spread: float, rows: int | None
) -> None:
    bases = _bases(t, d, k, spread, seed=d + k + t)
    block = fw.CentredProjectionBlock(bases)
    exact = _exact_full(block)
    radii = _tie_radii(exact, k, np.random.default_rng(t))
    counts = fw.count_friends(block, t, radii, rows=t if rows is None else rows)
    assert np.array_equal(counts, _counts_of(exact, radii))


@pytest.mark.parametrize("spread", [0.0, 1e-4, 3.0])
@pytest.mark.parametrize(("d", "k"), [(30, 5), (60, 3)], ids=["packed", "cross-products"])
def test_the_exact_distances_are_within_the_rounding_allowance(
    spread: float, d: int, k: int
) -> None:
    t = 40
    bases = _bases(t, d, k, spread, seed=11)
    exact = _exact_full(fw.CentredProjectionBlock(bases))
    projectors = np.einsum("gik,gjk->gij", bases, bases).astype(np.longdouble)
    diff = projectors[:, None] - projectors[None, :]
    truth = np.asarray(np.sqrt(np.sum(diff * diff, axis=(2, 3))), dtype=np.float64)
    route = fw.packed_projection_block if fw.packed_projections(t, d, k) else None
    packed = (route or fw.projection_distance_block)(bases)(0, t)
    fw._square_part_symmetric(packed)
    upper = np.triu_indices(t, 1)
    assert np.max(np.abs(exact - truth)[upper]) <= fw.projection_rounding(d, k)
    assert np.max(np.abs(exact**2 - packed**2)[upper]) < 1e-12  # the one-block route's
    assert np.all(np.diag(exact) == 0.0)


def test_the_band_places_almost_every_pair_where_the_subsets_agree() -> None:
    t, d, k = 200, 100, 10
    bases = _bases(t, d, k, 1e-3, seed=5)
    block = fw.CentredProjectionBlock(bases)
    radii = radius_grid(np.sqrt(2.0 * k), 17)
    block.bins(0, t, radii)
    assert 0 <= block.last_exact_pairs < t  # of t (t - 1) / 2 = 19,900 pairs


@pytest.mark.parametrize("moved", [0, 17])  # the basis the bound is centred on, and another
def test_a_moved_basis_changes_only_its_own_pairs(moved: int) -> None:
    """The bound is centred on ``bases[0]``; moving it (or any basis) changes no count of a
    pair it is not in, even with radii on the other pairs' exact distances."""
    t, d, k = 60, 30, 5
    bases = _bases(t, d, k, 1e-3, seed=3)
    other = bases.copy()
    other[moved] = _bases(1, d, k, 0.0, seed=99)[0]
    before, after = fw.CentredProjectionBlock(bases), fw.CentredProjectionBlock(other)
    exact = _exact_full(before)
    radii = _tie_radii(np.delete(np.delete(exact, moved, 0), moved, 1), k, np.random.default_rng(1))
    keep = np.ones(t, dtype=bool)
    keep[moved] = False
    for block in (before, after):
        bins = block.bins(0, t, radii)
        fw._square_part_symmetric(bins)
        block.sub = bins[np.ix_(keep, keep)]  # type: ignore[attr-defined]
    assert np.array_equal(before.sub, after.sub)  # type: ignore[attr-defined]
    assert np.array_equal(_exact_full(after)[np.ix_(keep, keep)], exact[np.ix_(keep, keep)])


@pytest.mark.parametrize(
    "case", ["nan", "not-orthonormal", "slightly-not-orthonormal", "far-reference", "duplicates"]
)
def test_bases_the_band_cannot_serve_take_the_exact_route(case: str) -> None:
    t, d, k = 50, 30, 5
    bases = _bases(t, d, k, 1e-3, seed=8)
    if case == "nan":
        bases[4, 2, 1] = np.nan
    elif case == "not-orthonormal":
        bases[5:9] *= 1.0 + 1e-5
    elif case == "slightly-not-orthonormal":  # inside the band's allowance
        bases[5:9] *= 1.0 + 1e-9
    elif case == "far-reference":
        bases[0] = _bases(1, d, k, 0.0, seed=123)[0]
    else:
        bases[10:30] = bases[10]
    block = fw.CentredProjectionBlock(bases)
    exact = _exact_full(block)
    radii = _tie_radii(exact, k, np.random.default_rng(2))
    counts = fw.count_friends(block, t, radii, rows=t)
    assert np.array_equal(counts, _counts_of(exact, radii))


def test_packed_rows_are_functions_of_their_basis_alone() -> None:
    """What the tiles rely on: a basis packed alone, in a run or with all gives the same row."""
    t, d, k = 30, 31, 4
    bases = _bases(t, d, k, 1e-2, seed=6)
    n_chunks, chunk = fw.packed_chunks(d, k)
    whole = fw.packed_projector_rows(bases, n_chunks, chunk)
    for lo, hi in [(0, 1), (3, 4), (5, 17), (29, 30)]:
        part = fw.packed_projector_rows(bases[lo:hi], n_chunks, chunk)
        assert np.array_equal(part, whole[lo:hi])
    picked = np.array([2, 9, 28])
    assert np.array_equal(
        fw.packed_projector_rows(np.ascontiguousarray(bases[picked]), n_chunks, chunk),
        whole[picked],
    )


@st.composite
def neighbouring_bases(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    """Bases around one subspace at a spread from 1e-14 to 1e-1 (some exact duplicates, one far
    basis, some a few ulps off orthonormal); the neighbour replaces one basis (often the first,
    which the band is centred on) by a far one, a duplicate or a near one."""
    t = draw(st.integers(3, 70))
    d = draw(st.sampled_from([2, 5, 12, 30, 61]))
    k = draw(st.integers(1, min(d - 1, 5)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    spread = 10.0 ** draw(st.floats(-14, -1))
    bases = _bases(t, d, k, spread, seed)
    bases[rng.random(t) < draw(st.floats(0, 0.5))] = bases[0]
    bases[draw(st.integers(0, t - 1))] = _bases(1, d, k, 0.0, seed + 1)[0]
    if draw(st.booleans()):
        bases[rng.random(t) < 0.3] *= 1.0 + 1e-15 * rng.integers(1, 8)
    neighbour = bases.copy()
    moved = 0 if draw(st.booleans()) else draw(st.integers(0, t - 1))
    neighbour[moved] = draw(
        st.sampled_from(
            [
                _bases(1, d, k, 0.0, seed + 2)[0],
                bases[(moved + 1) % t],
                _bases(1, d, k, spread, seed)[0],
            ]
        )
    )
    return bases, neighbour, moved


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(neighbouring_bases())
def test_property_counts_are_exact_and_weights_move_by_at_most_delta_w(
    case: tuple[np.ndarray, np.ndarray, int],
) -> None:
    """On both neighbours the counts equal those of the exact per-pair distances (radii on
    the distances, and one ulp either side), and the weights' total moves by at most
    ``Delta_W`` at every radius."""
    bases, neighbour, moved = case
    t, _, k = bases.shape
    exact = _exact_full(fw.CentredProjectionBlock(bases))
    radii = _tie_radii(exact, k, np.random.default_rng(t))
    b = fw.ramp_width(t)
    keep = np.arange(t) != moved
    totals = []
    for stack in (bases, neighbour):
        block = fw.CentredProjectionBlock(stack)
        counts = fw.count_friends(block, t, radii, rows=fw.centred_rows(t, block.tile))
        mine = _exact_full(block)
        assert np.array_equal(counts, _counts_of(mine, radii))
        # the other pairs' exact distances, bit for bit (functions of their pair alone)
        assert np.array_equal(mine[np.ix_(keep, keep)], exact[np.ix_(keep, keep)])
        weights = fw.weights_from_counts(counts, t, b)
        totals.append(np.array([fw.total_weight(column) for column in weights.T]))
    assert np.all(np.abs(totals[0] - totals[1]) <= fw.weight_sensitivity(t, b) * (1 + 1e-9))


@pytest.mark.parametrize(("d", "k"), [(30, 5), (60, 3)], ids=["packed", "cross-products"])
def test_threads_give_the_same_counts(d: int, k: int) -> None:
    """Blocks on several threads share the lazily built packed rows and stacked bases."""
    t = 90
    bases = _bases(t, d, k, 1e-3, seed=21)
    exact = _exact_full(fw.CentredProjectionBlock(bases))
    radii = _tie_radii(exact, k, np.random.default_rng(3))
    expected = _counts_of(exact, radii)
    for workers in (1, 3):
        block = fw.CentredProjectionBlock(bases)
        counts = fw.count_friends(block, t, radii, rows=8, workers=workers)
        assert np.array_equal(counts, expected)
