"""The two spreads the forecast from an earlier release now carries into its 90% range
(issue 32 item 4, ``service/mechanisms/forecast_spread.py``): each checked against a direct
simulation of what it claims (fixed seeds, so each count is deterministic), and through the
forecast on the releases where the range missed before (``test_forecast_coverage.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.mechanisms import gauss_forecast
from service.mechanisms.forecast_spread import UPPER, Z, random_share_high, trace_readings


@pytest.mark.parametrize(("m", "dims"), [(1, 64), (2, 30), (10, 64), (3, 200)])
def test_random_share_high_is_the_upper_quantile_of_a_random_subspaces_share(
    m: int, dims: int
) -> None:
    # One direction's squared projection on uniformly random m-subspaces of R^dims.
    rng = np.random.default_rng(7)
    draws = 4000
    shares = np.empty(draws)
    for i in range(draws):
        basis, _ = np.linalg.qr(rng.standard_normal((dims, m)))
        shares[i] = float(np.sum(basis[0] ** 2))
    above = int(np.sum(shares > random_share_high(m, dims)))
    expected = (1.0 - UPPER) * draws
    # Binomial(4000, 0.05): sd 13.8; 4 sds either side.
    assert abs(above - expected) < 4.0 * math.sqrt(expected * UPPER)
    # Above the mean m / dims (the figure the range's top used before).
    assert random_share_high(m, dims) > m / dims


def test_random_share_high_ends() -> None:
    assert random_share_high(0, 10) == 0.0
    assert random_share_high(10, 10) == 1.0


@pytest.mark.parametrize(("trace", "exact"), [(100.0, True), (12.0, False)])
def test_trace_readings_hold_the_share_at_the_traces_noise(trace: float, exact: bool) -> None:
    # A share lambda / tr read off a trace with noise N(0, d sigma^2): the true share lies
    # between the two readings in about 90% of draws (5% each side). With the noise as large
    # as the trace (the clip at its grid's floor) the high reading is capped at the whole
    # trace (and a trace read below 0 reads nothing), so each misses less often, never more.
    rng = np.random.default_rng(11)
    d, sigma = 30, 1.0
    top = 0.75 * trace
    below = above = 0
    runs = 4000
    for _ in range(runs):
        noisy = trace + rng.normal(0.0, sigma * math.sqrt(d))
        low, high = trace_readings(np.asarray([top / noisy]), noisy, sigma, d)
        below += top / trace < low[0]
        above += top / trace > high[0]
    slack = 4.0 * math.sqrt(0.05 * 0.95 * runs)
    for count in (below, above):
        if exact:
            assert abs(count - 0.05 * runs) < slack
        else:
            assert count < 0.05 * runs + slack
    # The same level as the forecast's own eigenvalue readings.
    assert gauss_forecast.Z == Z
