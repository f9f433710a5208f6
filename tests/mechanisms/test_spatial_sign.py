"""spatial_sign: calibration, the sign map, sensitivity, utility, totality and the audit."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from service.mechanisms import spatial_sign as module
from service.mechanisms.base import GaussianStep, PublicContext, ReleaseSpec
from service.mechanisms.composition import gaussian_total_mu
from service.mechanisms.linalg import subspace_distance
from service.mechanisms.registry import get_mechanism
from service.mechanisms.spatial_sign import (
    SpatialSign,
    SpatialSignParams,
    sign_gram,
    spatial_signs,
)
from tests.mechanisms.privacy_audit import audit
from tests.mechanisms.synthetic import near_subspace

EPS, DELTA = 1.0, 1e-5
MECHANISM = SpatialSign()


def prepared(
    n: int, d: int, k: int, eps: float, delta: float, raw: dict[str, Any], clip: float = 1.0
) -> tuple[PublicContext, ReleaseSpec[SpatialSignParams]]:
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=clip)
    params = MECHANISM.prepare(ctx, k, eps, delta, MECHANISM.parse_params(raw))
    return ctx, ReleaseSpec(k, eps, delta, params)


# ---------------------------------------------------------------------------------------------
# Calibration: the noise the run draws is the formula's, and the declared steps are the draws.


@pytest.mark.parametrize(
    ("clip", "eps", "delta", "raw"),
    [
        (1.0, 1.0, 1e-6, {}),
        (2.5, 0.3, 1e-9, {"center_share": 0.3}),
        (1.0, 1.0, 1e-6, {"center": "none"}),
    ],
)
def test_noise_scales_equal_the_formula(
    monkeypatch: pytest.MonkeyPatch, clip: float, eps: float, delta: float, raw: dict[str, Any]
) -> None:
    n, d = 50, 6
    ctx, spec = prepared(n, d, 2, eps, delta, raw, clip)
    mu = gaussian_total_mu(eps, delta, 0.0, 0.0)
    share = raw.get("center_share", 0.2) if raw.get("center", "private") == "private" else 0.0
    # With a centre (a PCA request) the explained-variance estimate takes 0.1 of mu^2 (its
    # step is checked in test_spatial_sign_variance.py); without one the Gram takes the rest.
    variance = 0.1 if raw.get("center", "private") != "none" else 0.0
    gram_sigma = math.sqrt(2.0) * clip**2 / (math.sqrt(1.0 - share - variance) * mu)
    drawn: dict[str, float] = {}
    real_gaussian, real_centre = module.symmetric_gaussian, module.private_center_sigma

    def gaussian(dim: int, sigma: float, rng: np.random.Generator) -> Any:
        drawn["gram"] = sigma
        return real_gaussian(dim, sigma, rng)

    def centre(data: Any, c: float, sigma: float, rng: np.random.Generator) -> Any:
        drawn["centre"] = sigma
        return real_centre(data, c, sigma, rng)

    monkeypatch.setattr(module, "symmetric_gaussian", gaussian)
    monkeypatch.setattr(module, "private_center_sigma", centre)
    rows = np.random.default_rng(0).standard_normal((n, d))
    out = MECHANISM.run(rows, spec, np.random.default_rng(1))
    assert drawn["gram"] == pytest.approx(gram_sigma, rel=1e-12)
    assert out.extras["gram_noise_std"] == pytest.approx(gram_sigma, rel=1e-12)
    declared = MECHANISM.privacy_steps(ctx, spec)
    steps = [step for step in declared if isinstance(step, GaussianStep)]
    assert len(steps) == len(declared)  # every step Gaussian: the gaussian accounting admits it
    # The declared steps compose to exactly the request's mu (rho = mu^2 / 2).
    assert sum((s.sensitivity / s.sigma) ** 2 for s in steps) == pytest.approx(mu**2, rel=1e-12)
    gram_step = steps[-2] if variance else steps[-1]
    assert gram_step.sensitivity == pytest.approx(math.sqrt(2.0) * clip**2)
    assert gram_step.sigma == pytest.approx(drawn["gram"], rel=1e-12)
    if share:
        centre_sigma = (2.0 * clip / n) / (math.sqrt(share) * mu)
        assert drawn["centre"] == pytest.approx(centre_sigma, rel=1e-12)
        assert steps[0].sensitivity == pytest.approx(2.0 * clip / n)
        assert steps[0].sigma == pytest.approx(centre_sigma, rel=1e-12)
        assert len(out.extras["center"]) == d
    else:
        assert "centre" not in drawn and len(steps) == 1 + (variance > 0)
    assert MECHANISM.preview(ctx, spec).scales["gram_noise_std"] == pytest.approx(gram_sigma)


def test_registered_and_charged_by_every_accounting() -> None:
    assert get_mechanism("spatial_sign") is not None
    assert {"basic", "gaussian", "zcdp"} <= SpatialSign.accountings


def test_recorded_params_rerun_what_ran() -> None:
    for raw in ({}, {"center": "none"}, {"center": [0.0, 0.5]}):
        params = MECHANISM.parse_params(raw)
        assert MECHANISM.parse_params(params.model_dump()) == params
    assert MECHANISM.parse_params({}).center == "private"
    assert "center_share" not in MECHANISM.parse_params({"center": "none"}).model_dump()


# ---------------------------------------------------------------------------------------------
# The sign map and its sensitivity


def test_signs_have_norm_c_or_zero_at_every_scale() -> None:
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((12, 5)) * 10.0 ** rng.choice([-300, -150, 0, 150, 300], (12, 1))
    rows[0] = 0.0
    rows[1] = [1e300, -1e300, 1e-300, 0.0, 5e-324]
    signs = spatial_signs(rows, 2.0, None)
    norms = np.linalg.norm(signs, axis=1)
    assert norms[0] == 0.0
    assert np.allclose(norms[1:], 2.0, rtol=1e-12)
    assert np.all(norms <= 2.0 * (1 + 1e-15))
    # Direction kept: the sign of a row is the row rescaled by a positive number.
    ordinary = rng.standard_normal(5)
    sign = spatial_signs(ordinary[None, :], 1.0, None)[0]
    assert np.allclose(sign, ordinary / np.linalg.norm(ordinary))


def test_sign_of_a_row_at_the_centre_is_zero() -> None:
    centre = np.array([0.3, -0.2, 0.1])
    rows = np.vstack([centre, centre + np.array([0.1, 0.0, 0.0])])
    signs = spatial_signs(rows, 1.0, centre)
    assert np.all(signs[0] == 0.0)
    assert np.allclose(signs[1], [1.0, 0.0, 0.0])


def test_sqrt2_c_squared_bounds_a_replacement_of_the_sign_gram() -> None:
    rng = np.random.default_rng(0)
    upper = np.triu_indices(4)
    base = rng.standard_normal((10, 4))
    centre = np.array([0.1, 0.0, -0.2, 0.0])
    worst = 0.0
    for _ in range(300):
        a, b = rng.standard_normal((2, 4)) * rng.choice([1e-3, 1.0, 1e3])
        change = sign_gram(np.vstack([base, a]), 1.0, centre) - sign_gram(
            np.vstack([base, b]), 1.0, centre
        )
        worst = max(worst, float(np.linalg.norm(change[upper])))
    assert worst <= math.sqrt(2.0) + 1e-9
    assert worst > 1.0  # the bound is nearly attained by near-orthogonal signs


# ---------------------------------------------------------------------------------------------
# Utility and totality


def test_recovers_a_clear_subspace() -> None:
    rows, truth = near_subspace(4000, 20, 2, noise=0.05, seed=1)
    _, spec = prepared(4000, 20, 2, 1.0, 1e-6, {})
    out = MECHANISM.run(rows, spec, np.random.default_rng(2))
    assert out.basis is not None and out.basis.shape == (20, 2)
    assert np.allclose(out.basis.T @ out.basis, np.eye(2), atol=1e-10)
    assert subspace_distance(out.basis, truth) < 0.2


@pytest.mark.parametrize(
    "rows",
    [
        np.zeros((5, 3)),
        np.full((7, 3), 1e300),
        np.full((7, 3), 1e-300),
        np.array([[1e300, -1e-300, 0.0], [1e-300, 1e300, 5e-324], [0.0, 0.0, 0.0]]),
        np.tile([[1.0, 2.0, 3.0]], (9, 1)),
        np.array([[1.7e308, -1.7e308, 1.7e308]]),
    ],
)
@pytest.mark.parametrize("raw", [{}, {"center": "none"}, {"center": [0.0, 0.5, 0.0]}])
def test_total_on_extreme_finite_values(rows: np.ndarray, raw: dict[str, Any]) -> None:
    n, d = rows.shape
    _, spec = prepared(n, d, 2, 1.0, 1e-6, raw)
    out = MECHANISM.run(rows, spec, np.random.default_rng(0))
    assert out.no_result_reason is None and out.basis is not None
    assert np.all(np.isfinite(out.basis)) and out.basis.shape == (d, 2)
    assert np.all(np.isfinite(out.extras["eigenvalues"]))


def test_memory_estimate_is_public_and_grows_with_d() -> None:
    small, spec_small = prepared(1000, 50, 3, 1.0, 1e-6, {})
    large, spec_large = prepared(1000, 500, 3, 1.0, 1e-6, {})
    assert MECHANISM.memory_bytes(small, spec_small) < MECHANISM.memory_bytes(large, spec_large)
    assert MECHANISM.memory_bytes(large, spec_large) >= 8 * 5 * 500 * 500


# ---------------------------------------------------------------------------------------------
# Empirical privacy audit
#
# Worst case for the Gaussian on the upper triangle: the signs of e1 and e2 are themselves, and
# the sign Grams differ by e1 e1^T - e2 e2^T, of upper-triangle norm sqrt(2) C^2 = D exactly.
# The top eigenvector of the 2 x 2 noisy matrix is nearer e1 iff its (1,1) entry wins: a
# threshold event on the privatised statistic. No centre, so the Gram step takes all of mu.
BASE = np.vstack([np.tile([1.0, 0.0], (20, 1)), np.tile([0.0, 1.0], (20, 1))])
PAIR = (np.vstack([BASE, [1.0, 0.0]]), np.vstack([BASE, [0.0, 1.0]]))
_, AUDIT_SPEC = prepared(41, 2, 1, EPS, DELTA, {"center": "none"})


def release(data: np.ndarray, rng: np.random.Generator) -> Any:
    return MECHANISM.run(data, AUDIT_SPEC, rng).basis


def near_e1(basis: np.ndarray) -> bool:
    return bool(basis[0, 0] ** 2 > 0.5)


def test_audit_passes(runs: int = 1500) -> None:
    result = audit(release, *PAIR, near_e1, runs, DELTA, seed=7)
    assert result.eps_lower_bound <= EPS


def test_audit_negative_control_fails(monkeypatch: pytest.MonkeyPatch, runs: int = 1500) -> None:
    # A tenth of the calibrated noise must be caught by the same audit.
    monkeypatch.setattr(module, "gram_sensitivity", lambda clip: math.sqrt(2.0) * clip**2 / 10)
    result = audit(release, *PAIR, near_e1, runs, DELTA, seed=8)
    assert result.eps_lower_bound > EPS


@pytest.mark.slow
def test_audit_passes_long() -> None:
    test_audit_passes(runs=20_000)


def test_the_preview_says_it_has_no_forecast_from_public_facts() -> None:
    # Issue 32 item 4 on the default path: MNIST's dry run (auto runs spatial_sign) carried no
    # forecast and said nothing of one; it says the share depends on the spectrum instead.
    ctx, spec = prepared(400, 60, 2, 3.0, 1e-6, {"center": "private"}, 1.0)
    shown = MECHANISM.preview(ctx, spec)
    assert shown.scales["forecast_captured_share"] is None
    assert shown.scales["forecast_depends_on_spectrum"] is True
    assert any("forecast_from" in line for line in shown.meaning)
