"""The single-precision screen of ``friendly_aggregate``'s projector friend counts (issue 35,
item 1, ninth pass).

Where the subsets disagree the centred band is useless and every tile of exact distances was
computed; ``friendly_screen.SingleScreen`` now places the pairs by a single-precision estimate
``S`` of ``F^2`` with a proven bound ``M``. What the privacy argument needs, as for the band:
every count equals the count of the exact per-pair distances ``F_jl`` (radii on and one ulp
around them), the bound holds, and a moved basis changes only its own pairs' counts.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms import friendly_screen as fs
from service.mechanisms import friendly_weights as fw
from service.mechanisms.friendly_radius import radius_grid
from tests.mechanisms.test_centred_projections import _bases, _counts_of, _exact_full, _tie_radii


@pytest.mark.parametrize(("d", "k"), [(100, 10), (300, 10)], ids=["packed", "cross-products"])
def test_the_screen_places_almost_every_pair_where_the_subsets_disagree(d: int, k: int) -> None:
    """Before the screen, disagreeing subsets computed every tile exactly
    (``last_exact_pairs == -1``); now only pairs within ``M`` of a radius are exact."""
    t = 200
    bases = _bases(t, d, k, 3.0, seed=5)
    block = fw.CentredProjectionBlock(bases)
    assert block.useless and block.screen is not None
    radii = radius_grid(np.sqrt(2.0 * k), 17)
    block.bins(0, t, radii)
    assert 0 <= block.last_exact_pairs < t  # of t (t - 1) / 2 = 19,900 pairs


@pytest.mark.parametrize(
    ("t", "d", "k"),
    [(45, 100, 10), (37, 6, 4), (70, 30, 5), (41, 13, 3), (40, 60, 3), (33, 250, 10)],
    ids=["packed-100", "packed-6", "packed-30", "packed-13", "cross-60", "cross-250"],
)
@pytest.mark.parametrize("rows", [None, 7])
def test_the_counts_are_those_of_the_exact_distances(
    t: int, d: int, k: int, rows: int | None
) -> None:
    bases = _bases(t, d, k, 3.0, seed=d + k + t)
    block = fw.CentredProjectionBlock(bases)
    assert block.screen is not None
    exact = _exact_full(block)
    radii = _tie_radii(exact, k, np.random.default_rng(t))
    counts = fw.count_friends(block, t, radii, rows=t if rows is None else rows)
    assert np.array_equal(counts, _counts_of(exact, radii))
    if rows is None:  # one block: the ties are unsure, and take the exact route
        assert block.last_exact_pairs > 0


@pytest.mark.parametrize(
    ("t", "d", "k"), [(60, 100, 10), (50, 30, 5), (40, 61, 7), (40, 60, 3), (30, 400, 10)]
)
def test_the_bound_holds_with_room_to_spare(t: int, d: int, k: int) -> None:
    """``|S - F^2| <= M`` on every pair, and by more than the factor 2 the margin keeps."""
    bases = _bases(t, d, k, 3.0, seed=t)
    block = fw.CentredProjectionBlock(bases)
    assert isinstance(block.screen, fs.CrossScreen) != fw.packed_projections(t, d, k)
    estimate = block.screen.estimate(0, t)
    exact = _exact_full(block)
    upper = np.triu_indices(t, 1)
    error = np.abs(estimate - exact**2)[upper]
    assert np.max(error) <= block.screen.margin / 2.0
    assert block.screen.margin < 0.05 * k  # far below the gaps of the grid's squares


@pytest.mark.parametrize("moved", [0, 17])
@pytest.mark.parametrize(("d", "k"), [(30, 5), (60, 3)], ids=["packed", "cross-products"])
def test_a_moved_basis_changes_only_its_own_pairs(moved: int, d: int, k: int) -> None:
    t = 60
    bases = _bases(t, d, k, 3.0, seed=3)
    other = bases.copy()
    other[moved] = _bases(1, d, k, 0.0, seed=99)[0] * 1.5  # not served by the screen
    before, after = fw.CentredProjectionBlock(bases), fw.CentredProjectionBlock(other)
    assert before.screen is not None and after.screen is not None
    exact = _exact_full(before)
    keep = np.arange(t) != moved
    radii = _tie_radii(exact[np.ix_(keep, keep)], k, np.random.default_rng(1))
    subs = []
    for block in (before, after):
        bins = block.bins(0, t, radii)
        fw._square_part_symmetric(bins)
        subs.append(bins[np.ix_(keep, keep)])
    assert np.array_equal(subs[0], subs[1])


@pytest.mark.parametrize("case", ["nan", "large", "duplicates", "zero"])
@pytest.mark.parametrize(("d", "k"), [(30, 5), (60, 3)], ids=["packed", "cross-products"])
def test_bases_the_screen_cannot_serve_take_the_exact_route(case: str, d: int, k: int) -> None:
    t = 50
    bases = _bases(t, d, k, 3.0, seed=8)
    if case == "nan":
        bases[4, 2, 1] = np.nan
    elif case == "large":
        bases[5:9] *= 1e30  # ||U||_F^2 > 4 k: a zero row of the screen, its pairs exact
    elif case == "duplicates":
        bases[10:30] = bases[10]
    else:
        bases[7] = 0.0
    block = fw.CentredProjectionBlock(bases)
    assert block.screen is not None
    with np.errstate(all="ignore"):
        exact = _exact_full(block)
        radii = _tie_radii(exact, k, np.random.default_rng(2))
        counts = fw.count_friends(block, t, radii, rows=t)
    assert np.array_equal(counts, _counts_of(exact, radii))


@pytest.mark.parametrize(("d", "k"), [(100, 10), (60, 3)], ids=["packed", "cross-products"])
def test_the_counts_are_those_of_every_tile_exact(
    monkeypatch: pytest.MonkeyPatch, d: int, k: int
) -> None:
    """The screen chooses work only: the counts with it equal those of the route of before."""
    t = 120
    bases = _bases(t, d, k, 3.0, seed=4)
    radii = _tie_radii(_exact_full(fw.CentredProjectionBlock(bases)), k, np.random.default_rng(4))
    screened = fw.count_friends(fw.CentredProjectionBlock(bases), t, radii, rows=37)
    monkeypatch.setattr(fw, "SINGLE_SCREEN", False)
    block = fw.CentredProjectionBlock(bases)
    assert block.screen is None
    assert np.array_equal(fw.count_friends(block, t, radii, rows=37), screened)


def test_gamma() -> None:
    assert fs.gamma(1) == pytest.approx(2.0**-24, rel=1e-6)
    assert fs.gamma(5050) > 5050 * 2.0**-24
