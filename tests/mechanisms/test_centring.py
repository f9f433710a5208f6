"""analyze_gauss with ``center``: calibration of the private mean, the budget split, centred
clipping, utility on data far from the origin, refusals and the private mean's audit."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from service.mechanisms import analyze_gauss as module
from service.mechanisms import centring
from service.mechanisms.analyze_gauss import (
    AnalyzeGauss,
    AnalyzeGaussParams,
    mean_sensitivity,
    mean_sigma,
    private_center,
)
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.composition import gaussian_profile, gaussian_total_mu
from service.mechanisms.linalg import clip_rows, clipped_gram, subspace_distance
from service.mechanisms.noise import analytic_gaussian_sigma
from service.mechanisms.spectrum import Spectrum
from service.mechanisms.spectrum import noise_std as spectrum_noise_std
from tests.mechanisms.privacy_audit import audit

EPS, DELTA = 1.0, 1e-5


def prepared(
    data: np.ndarray, k: int, eps: float, delta: float, **params: Any
) -> tuple[AnalyzeGauss, PublicContext, ReleaseSpec[AnalyzeGaussParams]]:
    mechanism = AnalyzeGauss()
    ctx = PublicContext(n_rows=data.shape[0], n_cols=data.shape[1], row_norm_bound=1.0)
    resolved = mechanism.prepare(ctx, k, eps, delta, mechanism.parse_params(params))
    return mechanism, ctx, ReleaseSpec(k=k, epsilon=eps, delta=delta, params=resolved)


# ---------------------------------------------------------------------------------------------
# Calibration


@pytest.mark.parametrize(
    ("clip", "n", "eps", "delta"), [(1.0, 100, 1.0, 1e-6), (2.5, 7, 0.3, 1e-9)]
)
def test_mean_sigma_is_analytic_gaussian_for_2c_over_n(
    clip: float, n: int, eps: float, delta: float
) -> None:
    assert mean_sensitivity(clip, n) == 2 * clip / n
    assert mean_sigma(clip, n, eps, delta) == analytic_gaussian_sigma(2 * clip / n, eps, delta)


def test_2c_over_n_bounds_a_replacement_and_is_attained() -> None:
    rng = np.random.default_rng(0)
    n, clip = 5, 1.5
    worst = 0.0
    for _ in range(2000):
        rows = clip_rows(rng.standard_normal((n + 1, 3)) * 4, clip)
        change = rows[:n].mean(axis=0) - np.vstack([rows[: n - 1], rows[n:]]).mean(axis=0)
        worst = max(worst, float(np.linalg.norm(change)))
    assert worst <= 2 * clip / n + 1e-12
    # Attained by antipodal rows of norm C.
    assert np.linalg.norm((clip * np.eye(3)[0] - (-clip * np.eye(3)[0])) / n) == 2 * clip / n


@pytest.mark.parametrize("share", [0.2, 0.5])
def test_run_spends_share_on_the_mean_and_the_rest_on_the_gram(
    monkeypatch: pytest.MonkeyPatch, share: float
) -> None:
    data = np.random.default_rng(1).standard_normal((80, 4)) * 0.3 + 0.4
    # Without the default clip quantile (opted out): the mean's and the Gram's scales alone.
    mechanism, ctx, spec = prepared(
        data, 2, 0.8, 1e-6, center="private", center_share=share, clip_quantile="none"
    )
    mean_sigmas: list[float] = []
    gram_sigmas: list[float] = []
    real_center, real_noise = module.private_center_sigma, module.symmetric_gaussian

    def spy_center(*args: Any) -> Any:
        mean_sigmas.append(args[2])
        return real_center(*args)

    def spy_noise(dim: int, sigma: float, rng: np.random.Generator) -> Any:
        gram_sigmas.append(sigma)
        return real_noise(dim, sigma, rng)

    monkeypatch.setattr(module, "private_center_sigma", spy_center)
    monkeypatch.setattr(module, "symmetric_gaussian", spy_noise)
    out = mechanism.run(data, spec, np.random.default_rng(2))
    # GDP composition: the request is exactly mu-GDP; the steps' mu^2 add up to mu^2.
    mu = gaussian_total_mu(0.8, 1e-6, 0.0, 0.0)
    assert gaussian_profile(mu, 0.8) <= 1e-6 < gaussian_profile(mu * (1 + 1e-6), 0.8)
    split = module.gauss_split(0.8, 1e-6, spec.params)
    assert split.mean_mu == pytest.approx(math.sqrt(share) * mu, rel=1e-12)
    parts = split.mean_mu**2 + split.gram_mu**2 + split.variance_mu**2 + split.clip_mu**2
    assert parts == pytest.approx(mu**2, rel=1e-12)
    assert mean_sigmas == [pytest.approx(2.0 / 80 / split.mean_mu, rel=1e-12)]
    assert gram_sigmas == [pytest.approx(math.sqrt(2.0) / split.gram_mu, rel=1e-12)]
    # The preview states the same scales.
    shown = mechanism.preview(ctx, spec)
    assert shown.scales["sigma"] == gram_sigmas[0]
    assert shown.scales["center_sigma"] == mean_sigmas[0]
    assert len(out.extras["center"]) == 4 and len(out.extras["eigenvalues"]) == 2


def test_uncentred_and_public_centre_spend_everything_on_the_gram(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = np.random.default_rng(3).standard_normal((50, 3)) * 0.2
    sigmas: list[float] = []
    real = module.symmetric_gaussian

    def spy(dim: int, sigma: float, rng: np.random.Generator) -> Any:
        sigmas.append(sigma)
        return real(dim, sigma, rng)

    monkeypatch.setattr(module, "symmetric_gaussian", spy)
    # All but the explained-variance estimate's share of mu^2 goes to X^T X.
    expected = math.sqrt(2.0) / (
        math.sqrt(1 - module.VARIANCE_SHARE) * gaussian_total_mu(0.5, 1e-6, 0.0, 0.0)
    )
    for center in ("none", [0.1, 0.0, -0.2]):
        mechanism, ctx, spec = prepared(data, 1, 0.5, 1e-6, center=center)
        out = mechanism.run(data, spec, np.random.default_rng(4))
        assert "center" not in out.extras
        assert mechanism.preview(ctx, spec).scales["sigma"] == pytest.approx(expected)
    assert sigmas == [pytest.approx(expected)] * 2


def test_private_mean_noise_has_the_stated_std() -> None:
    data = np.random.default_rng(5).standard_normal((40, 2000)) * 0.01
    sigma = mean_sigma(1.0, 40, 0.5, 1e-6)
    true_mean = clip_rows(data, 1.0).mean(axis=0)
    draws = private_center(data, 1.0, 0.5, 1e-6, np.random.default_rng(6)) - true_mean
    # 2000 iid N(0, sigma^2): the sample std is within 5% of sigma with overwhelming probability.
    assert float(np.std(draws)) == pytest.approx(sigma, rel=0.05)


def test_centred_rows_are_clipped_to_c_again() -> None:
    rng = np.random.default_rng(7)
    data = rng.standard_normal((300, 5)) * 2
    center = np.full(5, 0.4)
    centred = clip_rows(clip_rows(data, 1.0) - center, 1.0)
    assert np.max(np.linalg.norm(centred, axis=1)) <= 1.0 + 1e-12
    expected = centred.T @ centred
    assert clipped_gram(data, 1.0, chunk_rows=64, center=center) == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------
# Utility: data far from the origin


def offset_data(n: int, d: int, seed: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``o + U z + e``: offset ``o`` of norm 0.6 orthogonal to the 2-dim principal
    subspace ``U`` (coordinates of std 0.15), small isotropic noise; all rows within norm 1."""
    rng = np.random.default_rng(seed)
    frame, _ = np.linalg.qr(rng.standard_normal((d, 3)))
    basis, offset = frame[:, :2], 0.6 * frame[:, 2]
    data = offset + rng.standard_normal((n, 2)) * 0.15 @ basis.T
    data += 0.01 * rng.standard_normal((n, d)) / math.sqrt(d)
    return clip_rows(data, 1.0), basis


def test_centring_recovers_the_principal_subspace_far_from_the_origin() -> None:
    data, basis = offset_data(20_000, 20)
    errors: dict[str, float] = {}
    for center in ("none", "private"):
        mechanism, _, spec = prepared(data, 2, 1.0, 1e-6, center=center)
        out = mechanism.run(data, spec, np.random.default_rng(9))
        assert out.basis is not None
        errors[center] = subspace_distance(out.basis, basis)
    # Uncentred, the offset direction (eigenvalue n 0.36) outranks the signal (n 0.0225): the
    # release misses a whole direction. Centred, the gap n 0.0225 ~ 450 dwarfs ||E|| ~ 60
    # (Davis-Kahan: error <~ 0.15); measured 0.08 (0.06 with the exact mean as a public centre).
    assert errors["none"] > 0.9
    assert errors["private"] < 0.15


def test_trace_and_eigenvalues_give_explained_variance() -> None:
    data, _ = offset_data(20_000, 20)
    mechanism, _, spec = prepared(data, 2, 1.0, 1e-6, center="private")
    out = mechanism.run(data, spec, np.random.default_rng(10))
    centred = data - data.mean(axis=0)
    true_ratio = np.linalg.eigvalsh(centred.T @ centred)[::-1][:2].sum() / np.sum(centred**2)
    ratio = sum(out.extras["eigenvalues"]) / out.extras["trace"]
    assert ratio == pytest.approx(true_ratio, abs=0.05)


# ---------------------------------------------------------------------------------------------
# Refusals and the memory estimate


@pytest.mark.parametrize(
    ("n_rows", "center", "message"),
    [(10, [0.1, 0.2], "one number per column"), (10, [1.0, 1.0, 0.0], "norm <= clip_norm")],
)
def test_prepare_refuses_bad_public_centres(n_rows: int, center: Any, message: str) -> None:
    ctx = PublicContext(n_rows=n_rows, n_cols=3, row_norm_bound=1.0)
    with pytest.raises(InvalidParameter) as error:
        AnalyzeGauss().prepare(ctx, 1, 1.0, 1e-6, AnalyzeGaussParams(center=center))
    assert error.value.field == "center" and message in error.value.message


def test_prepare_refuses_a_private_mean_of_no_rows() -> None:
    ctx = PublicContext(n_rows=0, n_cols=3, row_norm_bound=1.0)
    with pytest.raises(InvalidParameter) as error:
        AnalyzeGauss().prepare(ctx, 1, 1.0, 1e-6, AnalyzeGaussParams(center="private"))
    assert error.value.field == "center"


def test_params_refuse_bad_shares_and_modes() -> None:
    for raw in ({"center_share": 1.0}, {"center_share": 0.0}, {"center": "mean"}):
        with pytest.raises(ValueError):
            AnalyzeGauss().parse_params(raw)


def test_centring_is_total_on_extreme_rows() -> None:
    rows = np.array([[1e300, -1e300, 0.0], [1e-300, 0.0, 0.0], [0.0, 0.0, 0.0]] * 3)
    for center in ("private", [0.5, 0.0, 0.0]):
        mechanism, _, spec = prepared(rows, 2, 1.0, 1e-6, center=center)
        out = mechanism.run(rows, spec, np.random.default_rng(11))
        assert out.basis is not None and np.all(np.isfinite(out.basis))
        assert math.isfinite(out.extras["trace"])


def test_memory_estimate_covers_the_centred_pass() -> None:
    ctx = PublicContext(n_rows=100_000, n_cols=10, row_norm_bound=1.0)
    mechanism = AnalyzeGauss()
    spec = ReleaseSpec(k=2, epsilon=1.0, delta=1e-6, params=AnalyzeGaussParams(clip_norm=1.0))
    centred = ReleaseSpec(
        k=2, epsilon=1.0, delta=1e-6, params=AnalyzeGaussParams(clip_norm=1.0, center="private")
    )
    assert mechanism.memory_bytes(ctx, centred) > mechanism.memory_bytes(ctx, spec)


# ---------------------------------------------------------------------------------------------
# Empirical privacy audit of the private mean

# Worst case: one row is C e1 on one side and -C e1 on the other (the rest equal), so the means
# differ by exactly 2C/n in the first coordinate; the event is a threshold on that coordinate.
N_AUDIT = 10
BASE = np.zeros((N_AUDIT - 1, 2))
PAIR = (np.vstack([BASE, [1.0, 0.0]]), np.vstack([BASE, [-1.0, 0.0]]))


def mean_release(data: np.ndarray, rng: np.random.Generator) -> Any:
    return private_center(data, 1.0, EPS, DELTA, rng)[0]


def above(threshold: float) -> Any:
    return lambda first: bool(first > threshold)


def test_private_mean_audit_passes(runs: int = 2000, threshold: float = 0.0) -> None:
    result = audit(mean_release, *PAIR, above(threshold), runs, DELTA, seed=12)
    assert result.eps_lower_bound <= EPS


def test_private_mean_audit_negative_control_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    real = centring.mean_sigma
    monkeypatch.setattr(centring, "mean_sigma", lambda *a: real(*a) / 10)
    result = audit(mean_release, *PAIR, above(0.0), 2000, DELTA, seed=13)
    assert result.eps_lower_bound > EPS


@pytest.mark.slow
def test_private_mean_audit_passes_long() -> None:
    # Further into the tail (one noise std above the midpoint), where the privacy loss is larger.
    sigma = mean_sigma(1.0, N_AUDIT, EPS, DELTA)
    test_private_mean_audit_passes(runs=100_000, threshold=sigma)


# ---------------------------------------------------------------------------------------------
# spectrum centres the same way


def test_spectrum_splits_the_budget_and_reports_centred_eigenvalues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data, _ = offset_data(20_000, 20)
    mechanism = Spectrum()
    ctx = PublicContext(n_rows=20_000, n_cols=20, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 3, 1.0, 1e-6, mechanism.parse_params({"center": "private"}))
    spec = ReleaseSpec(k=3, epsilon=1.0, delta=1e-6, params=params)
    mean_calls: list[tuple[Any, ...]] = []
    real_center = centring.private_center

    def spy_center(*args: Any) -> Any:
        mean_calls.append(args[1:4])
        return real_center(*args)

    monkeypatch.setattr(centring, "private_center", spy_center)
    out = mechanism.run(data, spec, np.random.default_rng(14))
    assert mean_calls == [(1.0, 0.2, 0.2 * 1e-6)]
    assert out.extras["noise_std"] == spectrum_noise_std(1.0, 0.8, 0.8 * 1e-6)
    shown = mechanism.preview(ctx, spec)
    assert shown.scales["noise_std"] == out.extras["noise_std"]
    assert shown.scales["center_sigma"] == mean_sigma(1.0, 20_000, 0.2, 0.2 * 1e-6)
    # Centred, the top two eigenvalues are the signal's n 0.0225 = 450 each (not the offset's
    # n 0.36 = 7200), the third is noise-level; the noise std is about 7.
    top = out.extras["eigenvalues"]
    assert 350 < top[1] <= top[0] < 550 and top[2] < 60
    assert len(out.extras["center"]) == 20


def test_a_mean_share_that_leaves_no_gram_budget_is_refused_before_charging() -> None:
    # GDP shares of mu^2: 0.1 for the explained variance (and 0.05 for a clip quantile) come
    # first, so center_share must leave the Gram something.
    data = np.zeros((10, 3))
    for raw in (
        {"center": "private", "center_share": 0.9},
        {"center": "private", "center_share": 0.86, "clip_quantile": 0.5},
    ):
        with pytest.raises(InvalidParameter) as error:
            prepared(data, 1, 1.0, 1e-6, **raw)
        assert error.value.field == "center_share"
    prepared(data, 1, 1.0, 1e-6, center="private", center_share=0.85)
