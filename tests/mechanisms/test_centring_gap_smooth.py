"""``center`` for gap_perturbation and smooth_sensitivity: the budget split, the pure (Laplace)
private mean of the Cauchy variant, its calibration and audit, utility far from the origin,
refusals, previews and totality."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from service.mechanisms import centring
from service.mechanisms import gap_perturbation as gp_module
from service.mechanisms import smooth_sensitivity as ss_module
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.centring import (
    mean_l1_sensitivity,
    mean_laplace_scale,
    mean_sigma,
    private_center_pure,
)
from service.mechanisms.gap_perturbation import GapPerturbation
from service.mechanisms.linalg import clip_rows, subspace_distance
from service.mechanisms.noise import GRID_DIVISOR
from service.mechanisms.smooth_sensitivity import SmoothSensitivity
from tests.mechanisms.privacy_audit import audit
from tests.mechanisms.test_centring import offset_data

MECHANISMS = {"gap_perturbation": GapPerturbation(), "smooth_sensitivity": SmoothSensitivity()}


def prepared(name: str, n: int, d: int, k: int, eps: float, delta: float, **params: Any) -> Any:
    mechanism = MECHANISMS[name]
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    resolved = mechanism.prepare(ctx, k, eps, delta, mechanism.parse_params(params))
    return mechanism, ctx, ReleaseSpec(k=k, epsilon=eps, delta=delta, params=resolved)


# ---------------------------------------------------------------------------------------------
# Calibration of the pure private mean


@pytest.mark.parametrize(("clip", "n", "d", "eps"), [(1.0, 100, 4, 1.0), (2.5, 7, 9, 0.3)])
def test_laplace_scale_is_l1_sensitivity_over_epsilon(
    clip: float, n: int, d: int, eps: float
) -> None:
    assert mean_l1_sensitivity(clip, n, d) == 2 * clip * math.sqrt(d) / n
    assert mean_laplace_scale(clip, n, d, eps) == pytest.approx(
        2 * clip * math.sqrt(d) / (n * eps), rel=1e-15
    )


def test_l1_sensitivity_bounds_a_replacement_and_is_attained() -> None:
    rng = np.random.default_rng(0)
    n, d, clip = 5, 4, 1.5
    worst = 0.0
    for _ in range(2000):
        rows = clip_rows(rng.standard_normal((n + 1, d)) * 4, clip)
        change = rows[:n].mean(axis=0) - np.vstack([rows[: n - 1], rows[n:]]).mean(axis=0)
        worst = max(worst, float(np.abs(change).sum()))
    assert worst <= mean_l1_sensitivity(clip, n, d) + 1e-12
    # Attained by a = -b = C (1, .., 1)/sqrt(d).
    a = clip * np.ones(d) / math.sqrt(d)
    assert np.abs((a - (-a)) / n).sum() == pytest.approx(mean_l1_sensitivity(clip, n, d))


def test_pure_mean_noise_has_the_laplace_std_and_grid() -> None:
    data = np.random.default_rng(1).standard_normal((40, 3000)) * 0.01
    scale = mean_laplace_scale(1.0, 40, 3000, 0.5)
    mu = private_center_pure(data, 1.0, 0.5, np.random.default_rng(2))
    draws = mu - clip_rows(data, 1.0).mean(axis=0)
    # Lap(b) has standard deviation sqrt(2) b; 3000 draws put the sample std within 8%.
    assert float(np.std(draws)) == pytest.approx(math.sqrt(2) * scale, rel=0.08)
    grid = scale / GRID_DIVISOR
    assert np.allclose(mu / grid, np.round(mu / grid))


# ---------------------------------------------------------------------------------------------
# The budget split, by spying on the stages


@pytest.mark.parametrize("share", [0.2, 0.5])
def test_gap_perturbation_spends_share_on_the_mean(
    monkeypatch: pytest.MonkeyPatch, share: float
) -> None:
    data = np.random.default_rng(3).standard_normal((80, 4)) * 0.3 + 0.4
    mechanism, ctx, spec = prepared(
        "gap_perturbation", 80, 4, 2, 0.8, 1e-6, center="private", center_share=share
    )
    means: list[tuple[Any, ...]] = []
    stages: list[tuple[float, float, bool]] = []
    real_center, real_gp = centring.private_center, gp_module.gap_perturbation_release

    def spy_center(*args: Any) -> Any:
        means.append(args[1:4])
        return real_center(*args)

    def spy_gp(data: Any, k: int, eps: float, delta: float, *rest: Any, **kw: Any) -> Any:
        stages.append((eps, delta, kw.get("center") is not None))
        return real_gp(data, k, eps, delta, *rest, **kw)

    monkeypatch.setattr(centring, "private_center", spy_center)
    monkeypatch.setattr(gp_module, "gap_perturbation_release", spy_gp)
    out = mechanism.run(data, spec, np.random.default_rng(4))
    assert means == [(1.0, share * 0.8, share * 1e-6)]
    assert stages == [((1 - share) * 0.8, (1 - share) * 1e-6, True)]
    assert len(out.extras["center"]) == 4
    shown = mechanism.preview(ctx, spec).scales
    assert shown["center_sigma"] == mean_sigma(1.0, 80, share * 0.8, share * 1e-6)
    # The gap test's Laplace scale is 2 C^2 / eps1 with eps1 half of the Gram step's epsilon.
    assert shown["gap_noise_scale"] == pytest.approx(2.0 / ((1 - share) * 0.8 / 2), rel=1e-15)
    assert shown["gram_epsilon"] == (1 - share) * 0.8


@pytest.mark.parametrize(("delta", "pure"), [(1e-6, False), (0.0, True)])
def test_smooth_sensitivity_spends_share_on_the_mean(
    monkeypatch: pytest.MonkeyPatch, delta: float, pure: bool
) -> None:
    data = np.random.default_rng(5).standard_normal((80, 4)) * 0.3 + 0.4
    mechanism, ctx, spec = prepared(
        "smooth_sensitivity", 80, 4, 2, 0.8, delta, center="private", center_share=0.25
    )
    gaussian_means: list[tuple[Any, ...]] = []
    laplace_means: list[tuple[Any, ...]] = []
    stages: list[tuple[float, float]] = []
    real_g, real_l = centring.private_center, centring.private_center_pure
    real_ss = ss_module.smooth_sensitivity_release

    def spy_g(*args: Any) -> Any:
        gaussian_means.append(args[1:4])
        return real_g(*args)

    def spy_l(*args: Any) -> Any:
        laplace_means.append(args[1:3])
        return real_l(*args)

    def spy_ss(data: Any, k: int, eps: float, delta: float, *rest: Any, **kw: Any) -> Any:
        stages.append((eps, delta))
        return real_ss(data, k, eps, delta, *rest, **kw)

    monkeypatch.setattr(centring, "private_center", spy_g)
    monkeypatch.setattr(centring, "private_center_pure", spy_l)
    monkeypatch.setattr(ss_module, "smooth_sensitivity_release", spy_ss)
    out = mechanism.run(data, spec, np.random.default_rng(6))
    assert stages == [(0.75 * 0.8, 0.75 * delta)]
    shown = mechanism.preview(ctx, spec).scales
    if pure:
        # The pure variant stays pure: the mean is Laplace at (s eps, 0), never Gaussian.
        assert gaussian_means == [] and laplace_means == [(1.0, 0.25 * 0.8)]
        assert shown["center_laplace_scale"] == mean_laplace_scale(1.0, 80, 4, 0.25 * 0.8)
        assert shown["center_delta"] == 0.0 and out.extras["variant"] == "cauchy"
    else:
        assert laplace_means == [] and gaussian_means == [(1.0, 0.25 * 0.8, 0.25 * delta)]
        assert shown["center_sigma"] == mean_sigma(1.0, 80, 0.25 * 0.8, 0.25 * delta)
        assert out.extras["variant"] == "gaussian"
    assert len(out.extras["center"]) == 4


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_uncentred_and_public_centre_spend_everything_on_the_basis(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    data = np.random.default_rng(7).standard_normal((50, 3)) * 0.2
    module = gp_module if name == "gap_perturbation" else ss_module
    # The mechanisms' runs call the *_release functions (basis and usefulness count).
    real = getattr(module, f"{name}_release")
    stages: list[tuple[float, float]] = []

    def spy(data: Any, k: int, eps: float, delta: float, *rest: Any, **kw: Any) -> Any:
        stages.append((eps, delta))
        return real(data, k, eps, delta, *rest, **kw)

    monkeypatch.setattr(module, f"{name}_release", spy)
    for center in ("none", [0.1, 0.0, -0.2]):
        mechanism, _, spec = prepared(name, 50, 3, 1, 0.5, 1e-6, center=center)
        out = mechanism.run(data, spec, np.random.default_rng(8))
        assert "center" not in out.extras
    assert stages == [(0.5, 1e-6)] * 2


# ---------------------------------------------------------------------------------------------
# Utility far from the origin, refusals, totality


def test_gap_perturbation_centred_recovers_the_subspace_far_from_the_origin() -> None:
    data, basis = offset_data(20_000, 20)
    errors = {}
    for center in ("none", "private"):
        mechanism, _, spec = prepared("gap_perturbation", 20_000, 20, 2, 1.0, 1e-6, center=center)
        out = mechanism.run(data, spec, np.random.default_rng(9))
        errors[center] = 1.0 if out.basis is None else subspace_distance(out.basis, basis)
    # Uncentred the offset direction (eigenvalue n 0.36) outranks the signal; centred the gap
    # n 0.0225 = 450 passes the test (threshold about C^2 + 5 ln(1/(0.8e-6)) = 71); the
    # projector noise, sigma ~ 11 * 2 C^2 / (g_low - C^2) ~ 0.06 per entry, has spectral norm
    # ~ 2 sigma sqrt(d) ~ 0.5 against the projector's gap 1: measured error 0.24.
    assert errors["none"] > 0.9
    assert errors["private"] < 0.4


def test_smooth_sensitivity_refuses_more_than_epsilon_1_on_the_basis() -> None:
    # 1.2 total with a 0.25 share leaves 0.9 for the basis: accepted; 0.2 share leaves 0.96.
    prepared("smooth_sensitivity", 100, 4, 1, 1.2, 1e-6, center="private", center_share=0.25)
    with pytest.raises(InvalidParameter) as error:
        prepared("smooth_sensitivity", 100, 4, 1, 1.3, 1e-6, center="private", center_share=0.2)
    assert error.value.field == "epsilon" and "after the centre" in error.value.message


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_prepare_refuses_bad_public_centres(name: str) -> None:
    with pytest.raises(InvalidParameter) as error:
        prepared(name, 10, 3, 1, 0.5, 1e-6, center=[1.0, 1.0, 0.0])
    assert error.value.field == "center"
    with pytest.raises(InvalidParameter) as error:
        prepared(name, 10, 3, 1, 0.5, 1e-6, center=[0.1, 0.2])
    assert error.value.field == "center"


@pytest.mark.parametrize(
    ("name", "delta"), [(n, 1e-6) for n in MECHANISMS] + [("smooth_sensitivity", 0.0)]
)
def test_centring_is_total_on_extreme_rows(name: str, delta: float) -> None:
    rows = np.array([[1e300, -1e300, 0.0], [1e-300, 0.0, 0.0], [0.0, 0.0, 0.0]] * 3)
    for center in ("private", [0.5, 0.0, 0.0]):
        mechanism, _, spec = prepared(name, 9, 3, 2, 0.5, delta, center=center)
        out = mechanism.run(rows, spec, np.random.default_rng(10))
        assert out.basis is not None or out.no_result_reason is not None
        if out.basis is not None:
            assert np.all(np.isfinite(out.basis))


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_memory_estimate_covers_the_centred_pass(name: str) -> None:
    ctx = PublicContext(n_rows=100_000, n_cols=10, row_norm_bound=1.0)
    mechanism = MECHANISMS[name]
    plain = mechanism.parse_params({"clip_norm": 1.0})
    centred = mechanism.parse_params({"clip_norm": 1.0, "center": "private"})
    assert mechanism.memory_bytes(
        ctx, ReleaseSpec(k=2, epsilon=0.5, delta=1e-6, params=centred)
    ) > mechanism.memory_bytes(ctx, ReleaseSpec(k=2, epsilon=0.5, delta=1e-6, params=plain))


# ---------------------------------------------------------------------------------------------
# Empirical privacy audit of the pure private mean

# Worst case for l1: one row is C (1, 1)/sqrt(2) on one side and its negative on the other, so
# the means differ by 2C sqrt(2)/n in l1, split evenly; the event "both coordinates above the
# larger mean" has probability 1/4 on that side and e^{-eps}/4 on the other: the ratio is e^eps.
EPS = 1.0
N_AUDIT = 10
ROW = np.array([1.0, 1.0]) / math.sqrt(2)
BASE = np.zeros((N_AUDIT - 1, 2))
PAIR = (np.vstack([BASE, ROW]), np.vstack([BASE, -ROW]))
CORNER = ROW / N_AUDIT


def pure_mean_release(data: np.ndarray, rng: np.random.Generator) -> Any:
    return private_center_pure(data, 1.0, EPS, rng)


def in_corner(mu: np.ndarray) -> bool:
    return bool(np.all(mu > CORNER))


def test_pure_mean_audit_passes() -> None:
    result = audit(pure_mean_release, *PAIR, in_corner, 3000, 0.0, seed=11)
    assert result.eps_lower_bound <= EPS


def test_pure_mean_audit_negative_control_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    real = centring.mean_laplace_scale
    monkeypatch.setattr(centring, "mean_laplace_scale", lambda *a: real(*a) / 10)
    result = audit(pure_mean_release, *PAIR, in_corner, 3000, 0.0, seed=12)
    assert result.eps_lower_bound > EPS


@pytest.mark.slow
def test_pure_mean_audit_passes_long() -> None:
    result = audit(pure_mean_release, *PAIR, in_corner, 100_000, 0.0, seed=13)
    assert result.eps_lower_bound <= EPS
