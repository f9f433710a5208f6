"""The forecast range's ends simulated at finite ``d`` (issue 32 item 4): where the new noise
puts every known direction below its edge, the asymptotic overlaps are 0, so the released
figures' own uncertainty (eigenvalues at ``+- Z sqrt(2) sigma``, the stated share at its
interval's ends) moved no end of the range; the range was the simulated release's spread
around the central reading alone. Power-law rows (3,000 x 100, ``bench_forecast_coverage``'s
set), eps 1 to 0.1 at k 5: 3 of 20 releases kept more than the high end. Each test failed
before the ends were simulated."""

from __future__ import annotations

import dataclasses

from service.mechanisms.forecast_figures import ReleasedFigures
from service.mechanisms.gauss_release_forecast import NewRelease, range_from_release

#: Release 6 of the bench's power-law cell at eps 1, k 5 (measured, uncentred), as released.
FIGURES = ReleasedFigures(
    ratios=(
        0.10697902964580162,
        0.07314232209377089,
        0.06103461031305019,
        0.04451970897578616,
        0.035834001517826744,
    ),
    interval=(0.263918376105603, 0.37854408970898656),
    eigenvalues=(
        271.18281139989733,
        190.1116211278893,
        161.85432657147436,
        124.8473925991059,
        106.83601781601372,
    ),
    trace=1846.157913767712,
    sigma=4.000749618634426,
    n_cols=100,
    n_rows=3000,
    row_clip=0.7857258949933876,
    uncentred=True,
    sums=2708.095549116137,
)
#: eps 1 to 0.1: the Gram noise's ratio (public, ``gauss_preview.release_forecast``).
RATIO = 8.593479261599981


def test_the_high_end_covers_what_release_6_kept_at_eps_0_1() -> None:
    # The release at eps 0.1 (seed of the bench's cell) kept 0.0977; the high end was 0.0957.
    found = range_from_release(FIGURES, NewRelease(5, RATIO))
    assert found.low <= 0.0977 <= found.high


def test_a_wider_stated_interval_widens_the_range_below_the_edge() -> None:
    # The new noise (sigma 34 x sqrt(100) = 344 at the earlier clip) is above every known
    # eigenvalue: a larger stated share's top must still raise the high end (before: the
    # same high end whatever the interval's top).
    narrow = range_from_release(FIGURES, NewRelease(5, RATIO))
    low, high = FIGURES.interval
    wide = dataclasses.replace(FIGURES, interval=(low, high + 0.08))
    widened = range_from_release(wide, NewRelease(5, RATIO))
    assert widened.high > narrow.high + 0.002
