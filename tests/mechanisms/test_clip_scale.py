"""Clip norms whose square, times what a clipping mechanism's calibration computes, over- or
underflows are refused at prepare time (422, before charging), with the boundary tested."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from service.mechanisms.analyze_gauss import (
    AnalyzeGauss,
    AnalyzeGaussParams,
    gauss_split,
)
from service.mechanisms.base import (
    MAX_MAGNITUDE_LOG2,
    MIN_MAGNITUDE_LOG2,
    ClippingMechanism,
    InvalidParameter,
    PublicContext,
    ReleaseSpec,
    clip_norm_range,
)
from service.mechanisms.gap_perturbation import GapPerturbation
from service.mechanisms.smooth_sensitivity import SmoothSensitivity
from service.mechanisms.spectrum import Spectrum

MECHANISMS: list[ClippingMechanism] = [  # type: ignore[type-arg]
    AnalyzeGauss(),
    GapPerturbation(),
    SmoothSensitivity(),
    Spectrum(),
]
CTX = PublicContext(n_rows=100_000, n_cols=50, row_norm_bound=None)


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.name)
@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 1e-6), (1e-3, 1e-12), (0.5, 1e-30)])
def test_boundary_just_inside_accepted_just_outside_refused(
    mechanism: ClippingMechanism,
    epsilon: float,
    delta: float,  # type: ignore[type-arg]
) -> None:
    low, high = mechanism.c2_multiples(CTX, 3, epsilon, delta)
    c_min, c_max = clip_norm_range(low, high)
    assert 0 < c_min < 1 < c_max < math.inf
    params = mechanism.params_model()
    for clip in (c_min * (1 + 1e-9), c_max * (1 - 1e-9)):
        resolved = mechanism.prepare(
            CTX, 3, epsilon, delta, params.model_copy(update={"clip_norm": clip})
        )
        assert resolved.clip_norm == clip
    for clip, word in ((c_min * (1 - 1e-9), "small"), (c_max * (1 + 1e-9), "large")):
        with pytest.raises(InvalidParameter) as error:
            mechanism.prepare(CTX, 3, epsilon, delta, params.model_copy(update={"clip_norm": clip}))
        assert error.value.field == "clip_norm"
        assert f"too {word}" in error.value.message and "rescale" in error.value.message


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.name)
def test_squares_that_overflow_or_underflow_are_refused(
    mechanism: ClippingMechanism,  # type: ignore[type-arg]
) -> None:
    # C^2 itself is not a double here (1e200^2 = inf, 1e-200^2 = 0): decided in log space.
    for clip in (1e200, 1e155, 1e-160, 1e-200, 5e-324):
        ctx = PublicContext(n_rows=10, n_cols=3, row_norm_bound=clip)
        with pytest.raises(InvalidParameter) as error:
            mechanism.prepare(ctx, 1, 1.0, 1e-6, mechanism.params_model())
        assert error.value.field == "clip_norm"
    for clip in (1e-100, 1e100):  # extreme, but every magnitude stays representable
        ctx = PublicContext(n_rows=10, n_cols=3, row_norm_bound=clip)
        assert mechanism.prepare(ctx, 1, 1.0, 1e-6, mechanism.params_model()).clip_norm == clip


def test_analyze_gauss_multiples_follow_its_calibration() -> None:
    low, high = AnalyzeGauss().c2_multiples(CTX, 3, 0.5, 1e-8)
    split = gauss_split(0.5, 1e-8, AnalyzeGaussParams())
    unit = math.sqrt(2.0) / split.gram_mu
    variance = math.sqrt(2.0) / split.variance_mu  # the larger: a smaller share of mu^2
    assert low == pytest.approx(min(1.0, unit / 1000))
    assert high == pytest.approx(50 * (100_000 + 64 * variance))
    # The refusal is exactly where C^2 high crosses 2^MAX (and C^2 low crosses 2^MIN).
    c_min, c_max = clip_norm_range(low, high)
    assert math.log2(c_max**2 * high) == pytest.approx(MAX_MAGNITUDE_LOG2)
    assert math.log2(c_min**2 * low) == pytest.approx(MIN_MAGNITUDE_LOG2)


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.name)
def test_runs_at_the_accepted_extremes_are_finite(
    mechanism: ClippingMechanism,  # type: ignore[type-arg]
) -> None:
    # At the edges of the accepted range, with rows far beyond C, the run still computes in
    # range: a basis (when released) is finite and orthonormal, every extra is finite.
    rng = np.random.default_rng(0)
    data = rng.standard_normal((60, 4)) * np.array([1e300, 1e-300, 1.0, 1e150])
    ctx = PublicContext(n_rows=60, n_cols=4, row_norm_bound=None)
    low, high = mechanism.c2_multiples(ctx, 2, 1.0, 1e-6)
    c_min, c_max = clip_norm_range(low, high)
    for clip in (c_min * 1.001, c_max * 0.999):
        params = mechanism.prepare(
            ctx, 2, 1.0, 1e-6, mechanism.params_model().model_copy(update={"clip_norm": clip})
        )
        out = mechanism.run(data, ReleaseSpec(2, 1.0, 1e-6, params), rng)
        if out.basis is not None:
            assert np.all(np.isfinite(out.basis))
            assert out.basis.T @ out.basis == pytest.approx(np.eye(2), abs=1e-10)
        json.dumps(out.extras, allow_nan=False)  # every number finite
