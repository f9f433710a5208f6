"""Calibration of the forecast from an earlier release (issue 32 item 4): the range
``forecast_from_release_captured_share_low`` / ``_high`` is stated at 90%, so over fresh
releases it must hold what the release then keeps in about 90% of them. Fixed seeds (the
releases of ``bench/bench_forecast_coverage.py``'s cells, the same seeds): each count below is
deterministic, and the bound is the cell's measured count (a drop of coverage fails).

The cells are those the fixes moved: a release of ``k = 1`` whose new mean's noise spike was
counted as taking its only component (the range was ``[0, 0]``, 0 of 20 covered), and budgets
going down, where the simulated spread's quantile was the normal's for an estimated sd."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_digits

from service.mechanisms.analyze_gauss import AnalyzeGauss
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.gauss_preview import release_forecast
from service.mechanisms.linalg import clip_rows

Rows = np.ndarray[Any, Any]
MECHANISM = AnalyzeGauss()
DELTA = 1e-6
RUNS = 20
#: As bench/bench_forecast_coverage.py: the seed of a setting's releases.
EPSILONS = (0.1, 0.3, 1.0, 3.0)
KS = (1, 2, 5, 10)
SEED_BASE = 10_000


def _rows() -> Rows:
    data = load_digits().data
    return np.asarray(data / np.linalg.norm(data, axis=1, keepdims=True))


def _spec(ctx: PublicContext, eps: float, k: int) -> ReleaseSpec[Any]:
    params = MECHANISM.parse_params({"center": "private"})
    resolved = MECHANISM.prepare(ctx, k, eps, DELTA, params)
    return ReleaseSpec(k=k, epsilon=eps, delta=DELTA, params=resolved)


def _kept(rows: Rows, basis: Rows) -> float:
    y = clip_rows(rows, 1.0)
    y = y - y.mean(axis=0)
    return float(np.sum((y @ basis) ** 2) / np.sum(y**2))


def covered(
    rows: Rows, k: int, earlier: float, new: float, epsilons: tuple[float, ...] = EPSILONS
) -> tuple[int, float]:
    """How many of :data:`RUNS` fresh releases at ``new`` the range forecast from a release at
    ``earlier`` holds, and the ranges' mean width; the seeds are the bench's cells' with its
    ``epsilons`` (also ``tests/mechanisms/test_forecast_uncentred_mean.py``'s)."""
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    before, after = _spec(ctx, earlier, k), _spec(ctx, new, k)

    def seed(eps: float, rep: int) -> int:
        return SEED_BASE * (epsilons.index(eps) * len(KS) + KS.index(k) + 1) + rep

    hits, widths = 0, []
    for rep in range(RUNS):
        source = MECHANISM.run(rows, before, np.random.default_rng(seed(earlier, rep)))
        fresh = MECHANISM.run(rows, after, np.random.default_rng(seed(new, rep)))
        assert fresh.basis is not None
        found = release_forecast(ctx, after, before, source.extras)
        assert found is not None
        forecast = found[1]
        hits += forecast.low <= _kept(rows, fresh.basis) <= forecast.high
        widths.append(forecast.high - forecast.low)
    return hits, float(np.mean(widths))


@pytest.mark.parametrize(
    ("k", "earlier", "new", "least"),
    [
        # The new mean's spike outranks digits' top eigenvalue at eps 0.3 (80 against 55):
        # counted as taking the one component, the range was [0, 0]; the release keeps
        # 0.03-0.08 (the spike and the data's direction mix). Before: 0 of 20.
        (1, 1.0, 0.3, 16),
        (1, 3.0, 0.3, 17),
        # Budgets going down: the spread of 12 simulated releases at Student t's quantile.
        # Before: 13, 16 and 16 of 20.
        (2, 1.0, 0.1, 18),
        (5, 1.0, 0.1, 19),
        (5, 3.0, 0.1, 19),
    ],
)
def test_the_forecast_range_holds_fresh_releases_at_its_stated_level(
    k: int, earlier: float, new: float, least: int
) -> None:
    hits, width = covered(_rows(), k, earlier, new)
    assert hits >= least, (hits, width)
    # Not by widening to nothing: each range stays narrow enough to be a forecast.
    assert width < 0.2


def test_an_uncentred_releases_first_share_is_not_carried_as_a_datas_direction() -> None:
    # MNIST's figures at eps 3 (uncentred route, d = 784, k = 2): the first component, the rows'
    # mean tilted towards the data, stated 0.197 with its eigenvalue about 1,004; at eps 1 the
    # same component (eigenvalue about 1,010) held 0.02-0.04 and the releases kept 0.07-0.10,
    # below a range whose low end carried 0.197 (0 of 20 covered).
    from service.mechanisms.forecast_figures import ReleasedFigures
    from service.mechanisms.gauss_release_forecast import NewRelease, range_from_release

    figures = ReleasedFigures(
        ratios=(0.197, 0.026),
        interval=(0.20, 0.25),
        eigenvalues=(1003.9, 144.4),
        trace=2372.7,
        sigma=40.8 / 28.0 * 1.0,
        n_cols=784,
        n_rows=4000,
        row_clip=0.785,
        uncentred=True,
    )
    found = range_from_release(figures, NewRelease(2, 3.0))
    assert found.low <= 0.09 <= found.high
    assert found.point is None or found.high - found.low <= 0.2


def test_a_component_read_as_the_means_leaves_the_range_room_for_the_data() -> None:
    # An uncentred release whose share was hidden (digits at eps 0.1: the probe read its clip at
    # the grid's bottom and took no centring) forecasting k = 1: the one component was read as
    # the rows' mean's, keeping nothing, and the range was [0, 0]; the new release took the
    # mean route and kept 0.02-0.08 (11 of 20 outside). The high end now also reads the
    # component as the data's.
    from service.mechanisms.forecast_figures import ReleasedFigures
    from service.mechanisms.gauss_release_forecast import NewRelease, range_from_release

    figures = ReleasedFigures(
        ratios=(0.0,),
        interval=(0.0, 0.9),
        eigenvalues=(60.0,),
        trace=400.0,
        sigma=1.0,
        n_cols=64,
        n_rows=1797,
        row_clip=0.5,
        uncentred=True,
    )
    found = range_from_release(figures, NewRelease(1, 0.5))
    assert found.high > 0.02
    assert found.point is None or found.high - found.low <= 0.2


def _breast_cancer() -> Rows:
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer().data
    return np.asarray(data / np.linalg.norm(data, axis=1, keepdims=True))


@pytest.mark.parametrize(
    ("data", "k", "earlier", "new", "least", "widest"),
    [
        # Down to eps 0.1 the release keeps about a random direction's share (0.007-0.034 at
        # k = 1, d = 64); the range's top was that share's mean, 1/64 (issue 32 item 4, re-
        # measured 30 Nov 2026). Before: 13 and 16 of 20; after: 20 and 20, 0.060 wide.
        ("digits", 1, 0.3, 0.1, 19, 0.1),
        ("digits", 1, 1.0, 0.1, 19, 0.1),
        # breast_cancer at eps 0.3: the clip at its grid's floor, the earlier share hidden and
        # read off a trace whose noise is 0.3-0.6 of it; read at the noisy trace alone the
        # ranges were as narrow as [0.928, 0.990] for a release keeping 0.71. Before: 12 of 20
        # (0.62 wide); after: 18, 0.79 wide (no point: the earlier share was hidden).
        ("breast_cancer", 1, 0.3, 1.0, 17, 0.85),
    ],
)
def test_the_range_carries_the_spreads_the_release_figures_leave_open(
    data: str, k: int, earlier: float, new: float, least: int, widest: float
) -> None:
    rows = _rows() if data == "digits" else _breast_cancer()
    hits, width = covered(rows, k, earlier, new)
    assert hits >= least, (hits, width)
    assert width < widest
