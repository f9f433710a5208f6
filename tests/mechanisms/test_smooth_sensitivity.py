"""M3 smooth_sensitivity: the smooth bound, noise calibration, rotation, utility and audits."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from service.mechanisms import smooth_sensitivity as module
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.gap_perturbation import top_k_with_gap
from service.mechanisms.linalg import clip_rows, clipped_gram, subspace_distance
from service.mechanisms.smooth_sensitivity import (
    GAUSSIAN_MAX_EPSILON,
    SmoothSensitivity,
    SmoothSensitivityParams,
    cauchy_beta,
    cauchy_noise_scale,
    gaussian_beta,
    gaussian_noise_scale,
    local_bound,
    smooth_bound,
    smooth_sensitivity,
)
from tests.mechanisms.privacy_audit import audit
from tests.mechanisms.synthetic import near_subspace

EPS, DELTA = 1.0, 1e-5


# ---------------------------------------------------------------------------------------------
# The local and smooth bounds


def test_local_bound_formula() -> None:
    cap = math.sqrt(2 * 3)
    # g - (2j+1) C^2 > 0 and 2C^2/(...) below the cap.
    assert local_bound(100.0, 3, 1.0, 0) == pytest.approx(2 / 99)
    assert local_bound(100.0, 3, 2.0, 5) == pytest.approx(8 / (100 - 11 * 4))
    # Capped at sqrt(2k), and the cap when the denominator is not positive.
    assert local_bound(1.5, 3, 1.0, 0) == pytest.approx(cap)
    assert local_bound(0.5, 3, 1.0, 0) == pytest.approx(cap)
    assert local_bound(100.0, 3, 1.0, 49.5) == pytest.approx(cap)
    assert local_bound(100.0, 3, 1.0, 60) == pytest.approx(cap)
    values = local_bound(50.0, 2, 1.0, np.arange(40.0))
    assert np.all(np.diff(values) >= 0)


def brute_force_smooth_bound(gap: float, k: int, clip: float, beta: float) -> float:
    steps = np.arange(0.0, math.ceil(gap / (2 * clip**2)) + 50)
    return float(np.max(np.exp(-beta * steps) * local_bound(gap, k, clip, steps)))


def test_smooth_bound_matches_a_brute_force_maximum() -> None:
    rng = np.random.default_rng(0)
    for _ in range(400):
        clip = float(rng.uniform(0.2, 3))
        gap = float(10 ** rng.uniform(-1, 5)) * clip**2
        k = int(rng.integers(1, 6))
        beta = float(10 ** rng.uniform(-5, 0))
        assert smooth_bound(gap, k, clip, beta) == pytest.approx(
            brute_force_smooth_bound(gap, k, clip, beta), rel=1e-12
        )


def test_smooth_bound_at_the_edges() -> None:
    # A small gap: A is the cap from j = 0.
    assert smooth_bound(0.5, 2, 1.0, 0.1) == pytest.approx(2.0)
    # A huge gap and a moderate beta: the maximum is A(0).
    assert smooth_bound(1e6, 2, 1.0, 0.01) == pytest.approx(2 / (1e6 - 1))
    # beta -> 0: the cap dominates.
    assert smooth_bound(1e3, 2, 1.0, 1e-9) == pytest.approx(2.0, rel=1e-5)


def test_a0_bounds_the_local_sensitivity_up_to_rotation() -> None:
    # min_R ||U - U' R||_F <= A(0) for every neighbour X' of X.
    rng = np.random.default_rng(1)
    checked = 0
    for trial in range(300):
        d, k = 5, 1 + trial % 3
        data = clip_rows(rng.standard_normal((40, d)) * rng.uniform(0.2, 2, size=d), 1.0)
        neighbour = data.copy()
        neighbour[int(rng.integers(40))] = clip_rows(rng.standard_normal((1, d)) * 2, 1.0)[0]
        u, gap = top_k_with_gap(clipped_gram(data, 1.0), k)
        u2, _ = top_k_with_gap(clipped_gram(neighbour, 1.0), k)
        singular = np.linalg.svd(u2.T @ u, compute_uv=False)
        procrustes = math.sqrt(max(0.0, 2 * k - 2 * singular.sum()))
        assert procrustes <= float(local_bound(gap, k, 1.0, 0)) + 1e-9
        checked += gap > 3.0
    assert checked > 50  # many pairs had a gap where A(0) is below the cap


@pytest.mark.parametrize(("eps", "delta", "dim"), [(1.0, 1e-6, 60), (0.3, 1e-9, 6)])
def test_gaussian_calibration(eps: float, delta: float, dim: int) -> None:
    assert gaussian_beta(eps, delta, dim) == pytest.approx(eps / (4 * (dim + math.log(2 / delta))))
    assert gaussian_noise_scale(0.01, eps, delta) == pytest.approx(
        5 * 0.01 * math.sqrt(2 * math.log(2 / delta)) / eps
    )


@pytest.mark.parametrize(("eps", "dim"), [(1.0, 60), (0.3, 6)])
def test_cauchy_calibration(eps: float, dim: int) -> None:
    assert cauchy_beta(eps, dim) == pytest.approx(eps / (6 * dim))
    assert cauchy_noise_scale(0.02, eps) == pytest.approx(6 * 0.02 / eps)


@pytest.mark.parametrize("delta", [1e-6, 0.0])
def test_release_uses_the_smooth_bound_of_the_data(
    monkeypatch: pytest.MonkeyPatch, delta: float
) -> None:
    seen: list[float] = []
    if delta > 0:
        real_g = module.gaussian_noise_scale
        monkeypatch.setattr(
            module, "gaussian_noise_scale", lambda s, e, dl: seen.append(s) or real_g(s, e, dl)
        )
    else:
        real_c = module.cauchy_noise_scale
        monkeypatch.setattr(
            module, "cauchy_noise_scale", lambda s, e: seen.append(s) or real_c(s, e)
        )
    data, _ = near_subspace(3000, 6, 2, seed=2)
    clip, eps, d, k = 1.3, 0.7, 6, 2
    _, variant = smooth_sensitivity(data, k, eps, delta, clip, np.random.default_rng(3))
    _, gap = top_k_with_gap(clipped_gram(data, clip), k)
    if delta > 0:
        assert variant == "gaussian"
        assert seen == [smooth_bound(gap, k, clip, eps / (4 * (d * k + math.log(2 / delta))))]
    else:
        assert variant == "cauchy"
        expected = math.sqrt(d * k) * smooth_bound(gap, k, clip, eps / (6 * d * k))
        assert seen == [pytest.approx(expected)]


def test_rotation_acts_inside_the_subspace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "gaussian_noise_scale", lambda *a: 0.0)
    data, _ = near_subspace(2000, 6, 2, seed=4)
    top, _ = top_k_with_gap(clipped_gram(data, 1.0), 2)
    first = smooth_sensitivity(data, 2, 1.0, 1e-6, 1.0, np.random.default_rng(5))[0]
    second = smooth_sensitivity(data, 2, 1.0, 1e-6, 1.0, np.random.default_rng(6))[0]
    # Without noise the release is the top-k subspace, in a basis that varies with the rotation.
    assert subspace_distance(first, top) < 1e-6 and subspace_distance(second, top) < 1e-6
    assert first.T @ first == pytest.approx(np.eye(2), abs=1e-12)
    assert np.abs(first - second).max() > 0.1


# ---------------------------------------------------------------------------------------------
# Utility and the Mechanism wrapper


def test_gaussian_utility_near_a_three_dimensional_subspace() -> None:
    data, basis = near_subspace(20_000, 20, 3, seed=7)
    rng = np.random.default_rng(8)
    errors = [
        subspace_distance(smooth_sensitivity(data, 3, 1.0, 1e-6, 1.0, rng)[0], basis)
        for _ in range(3)
    ]
    # S = A(0) ~ 3e-4, per-entry sigma ~ 8e-3: measured error ~ 0.04.
    assert max(errors) < 0.08


def test_cauchy_median_utility_near_a_three_dimensional_subspace() -> None:
    data, basis = near_subspace(200_000, 20, 3, seed=9)
    rng = np.random.default_rng(10)
    errors = [
        subspace_distance(smooth_sensitivity(data, 3, 1.0, 0.0, 1.0, rng)[0], basis)
        for _ in range(7)
    ]
    # Heavy tails: single releases range from ~0.03 to ~1; the median was ~0.13 over 15 runs.
    assert float(np.median(errors)) < 0.3


def test_mechanism_extras_hold_only_the_variant_and_the_check() -> None:
    mechanism = SmoothSensitivity()
    ctx = PublicContext(n_rows=2000, n_cols=6, row_norm_bound=1.0)
    data, _ = near_subspace(2000, 6, 2, seed=11)
    for delta, variant in [(1e-6, "gaussian"), (0.0, "cauchy")]:
        params = mechanism.prepare(ctx, 2, 1.0, delta, SmoothSensitivityParams())
        out = mechanism.run(data, ReleaseSpec(2, 1.0, delta, params), np.random.default_rng(12))
        assert out.basis is not None and out.basis.shape == (6, 2)
        # the variant and the usefulness check's integer (and sentence), no noisy double
        assert out.extras["variant"] == variant
        assert set(out.extras) <= {"variant", "components_above_noise", "warning", "warning_code"}
        assert out.no_result_reason is None


@pytest.mark.parametrize(("k", "bound", "field"), [(7, 1.0, "k"), (2, None, "clip_norm")])
def test_prepare_refuses(k: int, bound: float | None, field: str) -> None:
    ctx = PublicContext(n_rows=500, n_cols=6, row_norm_bound=bound)
    with pytest.raises(InvalidParameter) as error:
        SmoothSensitivity().prepare(ctx, k, 1.0, 0.0, SmoothSensitivityParams())
    assert error.value.field == field


# ---------------------------------------------------------------------------------------------
# Empirical privacy audits

# H = diag(1100.5, 100.5) with off-diagonal +-C^2/2 (one row (1, +-1)/sqrt(2)): the largest
# rotation one replacement can cause, ~ +-C^2/(2g) each side, i.e. ||u - u'|| ~ C^2/g = S/2.
# With g = 1000 the smooth bound is A(0) (the e^{-beta J} sqrt(2k) term is far below). The event
# is a threshold on the (sign-free) rotation u_0 u_1 of the released vector.
#
# The negative control divides the noise by 100, not 10: Theorem 9.1's 5 sqrt(2 ln(2/delta)) is
# ~6.6x the analytic-Gaussian sigma at these parameters and Davis-Kahan is loose by 2 on this
# (best) pair, so noise / 10 is still about (1, 1e-5)-DP here and no audit could catch it; the
# same holds for Cauchy (6 sqrt(D) S / 10 against a shift of S / 2 is still ~0.6-DP).
ROTATION_BASE = np.vstack([np.tile([1.0, 0.0], (1100, 1)), np.tile([0.0, 1.0], (100, 1))])
ROTATION_PAIR = (
    np.vstack([ROTATION_BASE, [[math.sqrt(0.5), math.sqrt(0.5)]]]),
    np.vstack([ROTATION_BASE, [[math.sqrt(0.5), -math.sqrt(0.5)]]]),
)


def rotated_up(basis: np.ndarray) -> bool:
    return bool(basis[0, 0] * basis[1, 0] > 5e-4)


def release_with(delta: float) -> Any:
    def release(data: np.ndarray, rng: np.random.Generator) -> Any:
        return smooth_sensitivity(data, 1, EPS, delta, 1.0, rng)[0]

    return release


@pytest.mark.parametrize("delta", [DELTA, 0.0])
def test_audit_passes(delta: float, runs: int = 1500) -> None:
    result = audit(release_with(delta), *ROTATION_PAIR, rotated_up, runs, delta, seed=13)
    assert result.eps_lower_bound <= EPS


@pytest.mark.parametrize(
    ("delta", "scale_name"), [(DELTA, "gaussian_noise_scale"), (0.0, "cauchy_noise_scale")]
)
def test_audit_negative_control_fails(
    monkeypatch: pytest.MonkeyPatch, delta: float, scale_name: str, runs: int = 1500
) -> None:
    real = getattr(module, scale_name)
    monkeypatch.setattr(module, scale_name, lambda *a: real(*a) / 100)
    result = audit(release_with(delta), *ROTATION_PAIR, rotated_up, runs, delta, seed=14)
    assert result.eps_lower_bound > EPS


@pytest.mark.slow
@pytest.mark.parametrize("delta", [DELTA, 0.0])
def test_audit_passes_long(delta: float) -> None:
    test_audit_passes(delta, runs=20_000)


# ---------------------------------------------------------------------------------------------
# The Gaussian variant's proved epsilon range (seed 004, Theorem 9: epsilon in (0, 1))


def test_gaussian_variant_accepts_epsilon_up_to_one_and_refuses_just_above() -> None:
    mechanism = SmoothSensitivity()
    ctx = PublicContext(n_rows=500, n_cols=6, row_norm_bound=1.0)
    assert GAUSSIAN_MAX_EPSILON == 1.0
    inside = mechanism.prepare(ctx, 2, 1.0, 1e-6, SmoothSensitivityParams())
    assert inside.clip_norm == 1.0
    for outside in (math.nextafter(1.0, 2.0), 1.5, 40.0, 1000.0):
        with pytest.raises(InvalidParameter) as error:
            mechanism.prepare(ctx, 2, outside, 1e-6, SmoothSensitivityParams())
        assert error.value.field == "epsilon"
        assert "epsilon" in error.value.message and "<= 1" in error.value.message
        assert f"got {outside:g}" in error.value.message


def test_cauchy_variant_keeps_every_epsilon() -> None:
    # Its argument (per-coordinate sliding 2 asinh(a/2) <= a and dilation <= beta) has no
    # small-epsilon condition.
    ctx = PublicContext(n_rows=500, n_cols=6, row_norm_bound=1.0)
    for epsilon in (0.5, 1.0, 40.0, 1000.0):
        params = SmoothSensitivity().prepare(ctx, 2, epsilon, 0.0, SmoothSensitivityParams())
        assert params.clip_norm == 1.0


def test_cauchy_sliding_and_dilation_bounds_hold_for_every_shift() -> None:
    # The two facts the Cauchy variant's range rests on, checked on a fine grid:
    # sup_z ln(f(z) / f(z + a)) = 2 asinh(a/2) <= a for the standard Cauchy density f, and
    # the density ratio of scales s and s e^b lies within e^{+-|b|}.
    z = np.linspace(-200, 200, 400_001)
    for a in (1e-3, 0.1, 1.0, 5.0, 40.0):
        worst = float(np.max(np.log1p((z + a) ** 2) - np.log1p(z**2)))
        assert worst <= 2 * math.asinh(a / 2) + 1e-9 and 2 * math.asinh(a / 2) <= a
        assert worst >= 2 * math.asinh(a / 2) - 1e-3
    for b in (-0.3, 0.01, 0.3):
        s, t = 1.0, math.exp(b)
        ratio = (s / t) * (t**2 + z**2) / (s**2 + z**2)
        assert np.all(np.abs(np.log(ratio)) <= abs(b) + 1e-12)
