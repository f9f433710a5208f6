"""``auto``'s Gram candidate (issue 33 item 1 with issue 32 item 3): ``spatial_sign`` in high
dimension (``d >= n^(2/3)``), ``analyze_gauss`` with its clip quantile below, the predicted
errors it compares with friendly_aggregate's, the reason it gives, and the budgets of every
path with the new candidate."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from bench.bench_auto_realistic import rows
from service.mechanisms.auto import Auto, AutoParams, Estimate, plan, predicted_error
from service.mechanisms.auto_gram import high_dimension, predicted_gram_error
from service.mechanisms.auto_guard import Choice
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.registry import MECHANISMS

AUTO = Auto()
DELTA = 1e-6


def ctx(n: int, d: int) -> PublicContext:
    return PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)


def captured_deficit(x: np.ndarray, basis: np.ndarray | None, k: int) -> float:
    best = float(np.linalg.eigvalsh(x.T @ x)[-k:].sum())
    return 1.0 if basis is None else 1.0 - float(np.sum((x @ basis) ** 2)) / best


def test_high_dimension_is_d_at_least_n_to_the_two_thirds() -> None:
    assert high_dimension(1_000, 100) and high_dimension(8_000, 400)
    assert not high_dimension(8_001, 400) and not high_dimension(20_000, 300)
    assert high_dimension(20_000, 1_000) and not high_dimension(50_000, 1_000)


@pytest.mark.parametrize("center", ["none", "private"])
def test_the_gram_candidate_follows_the_dimension(center: str) -> None:
    raw = AutoParams(clip_norm=1.0, center=center)  # type: ignore[arg-type]
    high = plan(ctx(2_000, 300), 3, 1.0, DELTA, raw)
    assert high.default.name == "spatial_sign" and high.sure is None
    assert (high.default.epsilon, high.default.delta) == (1.0, DELTA)  # everything: no estimate
    assert high.default.params.center == center  # type: ignore[attr-defined]
    assert "d = 300 >= n^(2/3) = 159" in high.reason and "spatial_sign" in high.reason
    low = plan(ctx(20_000, 50), 3, 1.0, DELTA, raw)
    assert low.default.name == "analyze_gauss"
    assert low.default.params.quantile == 0.3  # type: ignore[attr-defined]
    assert "d = 50 < n^(2/3) = 737" in low.reason


def test_friendlys_stops_run_the_gram_candidate_and_compose_to_the_request() -> None:
    # n = 20,000, d = 1,000 (high dimension) where friendly_aggregate can run: the default and
    # every stop is spatial_sign, and each path sums to the request exactly
    p = plan(ctx(20_000, 1_000), 3, 1.0, DELTA, AutoParams(clip_norm=1.0))
    assert p.sure is not None and p.default.name == "spatial_sign"
    assert p.default.epsilon + p.test_epsilon == pytest.approx(1.0, rel=1e-15)
    for path in p.paths():
        assert {c.name for c in path.choices()[1:]} == {"spatial_sign"}
        eps0 = 0.25 * path.run.epsilon
        before = path.weight_epsilon if path.agreement_stop is not None else 0.0
        if p.counted is not None and path is p.counted.path:
            before += p.counted.epsilon  # the block count, paid before friendly's search
        total = path.search_stop.epsilon + p.test_epsilon + eps0 + before
        assert total == pytest.approx(1.0, rel=1e-15)
    # zcdp: the bound auto declares covers the spatial_sign run at (1 - s) eps
    spec = ReleaseSpec(3, 1.0, DELTA, AUTO.prepare(ctx(20_000, 1_000), 3, 1.0, DELTA, AutoParams()))
    steps = AUTO.privacy_steps(ctx(20_000, 1_000), spec)
    assert steps is not None


def test_without_an_estimate_auto_declares_spatial_signs_own_steps() -> None:
    c = ctx(2_000, 300)
    params = AUTO.prepare(c, 3, 1.0, DELTA, AutoParams())
    steps = AUTO.privacy_steps(c, ReleaseSpec(3, 1.0, DELTA, params))
    sign = MECHANISMS["spatial_sign"]
    own = sign.prepare(c, 3, 1.0, DELTA, sign.parse_params({"center": "none"}))
    expected = sign.privacy_steps(c, ReleaseSpec(3, 1.0, DELTA, own))
    assert steps is not None and steps == expected


def test_the_sign_maps_prediction_is_the_fill_times_the_gram_bound() -> None:
    # the sign map fills the bound: its gap is the estimate's over the fill, at its own sigma;
    # analyze_gauss with a quantile clip is predicted at its best (every row at the quantile),
    # which still spends CLIP_SHARE of mu^2 on the quantile: the sign map is never predicted worse
    c = ctx(2_000, 300)
    sign = MECHANISMS["spatial_sign"]
    gauss = MECHANISMS["analyze_gauss"]
    s_params = sign.prepare(c, 3, 1.0, DELTA, sign.parse_params({"center": "none"}))
    g_params = gauss.prepare(c, 3, 1.0, DELTA, gauss.parse_params({"clip_quantile": 0.3}))
    at_c = gauss.prepare(c, 3, 1.0, DELTA, gauss.parse_params({}))
    for fill in (0.05, 0.3, 1.0):
        e_s = predicted_gram_error("spatial_sign", s_params, 1.0, DELTA, 10.0, fill, 300, 3)
        e_q = predicted_gram_error("analyze_gauss", g_params, 1.0, DELTA, 10.0, fill, 300, 3)
        e_c = predicted_gram_error("analyze_gauss", at_c, 1.0, DELTA, 10.0, fill, 300, 3)
        assert e_s < e_q < e_c / fill + 1e-12 or fill == 1.0
        assert e_s == pytest.approx(e_q * math.sqrt(1 - 0.05 - 0.1), rel=1e-9)
        assert e_c == pytest.approx(
            predicted_gram_error("analyze_gauss", at_c, 1.0, DELTA, 10.0, 1.0, 300, 3)
        )
    est = Estimate.of(5.0, 500.0, 3, 1.0, capacity=2_000.0)
    assert est.fill == pytest.approx(0.25)
    choice = Choice("spatial_sign", s_params, 1.0, DELTA)
    assert predicted_error(choice, est, 300, 3) == pytest.approx(
        predicted_gram_error("spatial_sign", s_params, 1.0, DELTA, est.gap, 0.25, 300, 3)
    )


def test_auto_picks_spatial_sign_on_high_dimensional_heavy_rows_and_gauss_on_low() -> None:
    # heavy-tailed rows (norms ~1/3 of the bound): in high dimension auto runs spatial_sign and
    # says why, and keeps more of the variance than analyze_gauss at the bound; in low
    # dimension it runs analyze_gauss with its clip quantile and says why
    k = 3
    x = rows("heavy_tailed", 1_500, 200, seed=3)
    c = ctx(*x.shape)
    spec = ReleaseSpec(k, 1.0, DELTA, AUTO.prepare(c, k, 1.0, DELTA, AutoParams()))
    gauss = MECHANISMS["analyze_gauss"]
    g_spec = ReleaseSpec(k, 1.0, DELTA, gauss.prepare(c, k, 1.0, DELTA, gauss.parse_params({})))
    auto_deficits, gauss_deficits = [], []
    for seed in range(3):
        out = AUTO.run(x, spec, np.random.default_rng(seed))
        assert out.extras["auto_choice"] == "spatial_sign"
        assert "high dimension (d = 200 >= n^(2/3) = 131)" in out.extras["auto_reason"]
        auto_deficits.append(captured_deficit(x, out.basis, k))
        plain: Any = gauss.run(x, g_spec, np.random.default_rng(seed))
        gauss_deficits.append(captured_deficit(x, plain.basis, k))
    assert np.mean(auto_deficits) < 0.5 * np.mean(gauss_deficits), (auto_deficits, gauss_deficits)
    low = rows("heavy_tailed", 4_000, 20, seed=4)
    c = ctx(*low.shape)
    spec = ReleaseSpec(k, 1.0, DELTA, AUTO.prepare(c, k, 1.0, DELTA, AutoParams()))
    out = AUTO.run(low, spec, np.random.default_rng(5))
    assert out.extras["auto_choice"] == "analyze_gauss"
    assert "d = 20 < n^(2/3) = 252" in " ".join(out.extras["auto_details"])


def test_a_centred_high_dimensional_request_runs_spatial_sign_with_its_centre() -> None:
    # 2,000 x 300: high dimension, and the private centre's error below the limit at eps 1
    # (n d sigma_c^2 / (sigma_g sqrt(d)) = 0.43; 1,000 x 120 would be 0.55).
    x = rows("power_law", 2_000, 300, seed=6) + 0.02
    c = ctx(*x.shape)
    params = AUTO.prepare(c, 2, 1.0, DELTA, AutoParams(center="private"))
    shown = AUTO.preview(c, ReleaseSpec(2, 1.0, DELTA, params))
    assert shown.scales["auto_choice"] == "spatial_sign"
    assert shown.scales["auto_clip_quantile"] is None
    assert any("spatial_sign centres on a private mean" in line for line in shown.meaning)
    out = AUTO.run(x, ReleaseSpec(2, 1.0, DELTA, params), np.random.default_rng(7))
    assert out.extras["auto_choice"] == "spatial_sign" and len(out.extras["center"]) == 300


def test_a_private_centre_whose_error_stands_out_of_the_noise_keeps_analyze_gauss() -> None:
    # MNIST's shape (4,000 x 784, high dimension), k = 10: the private centre's offset term
    # n d sigma_c^2 against the signs' Gram noise threshold sigma_g sqrt(d) is 0.35 at eps 1
    # (spatial_sign, 1.84x analyze_gauss measured), 0.49 at 0.7 (1.58x), 0.82 at 0.4 and 1.08
    # at eps 0.3 (analyze_gauss; the sign map kept 0.82x and 0.69x there). Limit 1/2.
    from service.mechanisms.auto_gram import centre_offset_ratio
    from service.mechanisms.centring import mean_sensitivity
    from service.mechanisms.composition import gaussian_total_mu

    raw = {"clip_norm": 1.0, "center": "private", "center_share": 0.2}
    cases = ((1.0, "spatial_sign"), (0.7, "spatial_sign"), (0.4, "analyze_gauss"))
    for eps, expected in (*cases, (0.3, "analyze_gauss")):
        p = plan(ctx(4_000, 784), 10, eps, DELTA, AutoParams(clip_norm=1.0, center="private"))  # type: ignore[arg-type]
        assert p.default.name == expected
        # The ratio is the formula's, from spatial_sign's own split (0.2 mean, 0.1 variance).
        mu = gaussian_total_mu(eps, DELTA, 0.0, 0.0)
        sigma_c = mean_sensitivity(1.0, 4_000) / (math.sqrt(0.2) * mu)
        sigma_g = math.sqrt(2.0) / (math.sqrt(0.7) * mu)
        ratio = 4_000 * 784 * sigma_c**2 / (sigma_g * math.sqrt(784))
        assert centre_offset_ratio(4_000, 784, eps, DELTA, raw) == pytest.approx(ratio, rel=1e-12)
        assert (ratio < 0.5) == (expected == "spatial_sign")
    assert "private centre's error would stand out" in p.reason
    # A public centre or none has no such error: spatial_sign at any epsilon.
    for center in ("none", [0.0] * 784):
        params = AutoParams(clip_norm=1.0, center=center)  # type: ignore[arg-type]
        assert plan(ctx(4_000, 784), 10, 0.3, DELTA, params).default.name == "spatial_sign"


# ---------------------------------------------------------------------------------------------
# The clip quantile at small n eps (clip_quantile's public floor, 30 Nov 2026)


def short_rows(n: int, d: int, seed: int) -> np.ndarray:
    """Rows of norms 0.5-0.8 of the bound 1 (the report's), random directions."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0.5, 0.8, (n, 1))


def released(n: int, eps: float, x: np.ndarray, seed: int) -> dict[str, Any]:
    params = AUTO.prepare(ctx(n, x.shape[1]), 3, eps, DELTA, AutoParams())
    out = AUTO.run(x, ReleaseSpec(3, eps, DELTA, params), np.random.default_rng(seed))
    return out.extras


@pytest.mark.parametrize(("n", "eps"), [(300, 0.2), (400, 0.1)])
def test_a_clip_below_the_resolvable_floor_is_said_to_be_possibly_noise(n: int, eps: float) -> None:
    """The report's cells: the quantile released 0.0023 and 0.00035 for rows of norms 0.5-0.8
    while the reason said "with its private clip quantile"; now it says the clip lies where the
    noise resolves no edge (public), possibly far below the rows' norms."""
    for seed in range(3):
        extras = released(n, eps, short_rows(n, 20, seed), seed)
        assert extras["auto_choice"] == "analyze_gauss" and extras["row_clip_norm"] < 0.5
        reason = str(extras["auto_reason"])
        said = f"where its noise resolves no grid edge below C at n = {n} and this budget"
        assert said in reason and "possibly a noise reading" in reason
        assert said in extras["auto_details"][-1]
        assert reason.count(". ") <= 1  # still at most two sentences


def test_a_resolved_clip_is_stated_without_the_caveat() -> None:
    """n x eps large enough for the whole grid: the clip is the quantile's, said plainly; rows
    at the bound: no clip below C, said so."""
    n = 20_000
    extras = released(n, 1.0, short_rows(n, 20, 0), 0)
    assert 0.35 <= extras["row_clip_norm"] < 1.0
    assert str(extras["auto_reason"]).endswith("released clip (row_clip_norm), below C.")
    x = short_rows(n, 20, 1)
    extras = released(n, 1.0, x / np.linalg.norm(x, axis=1, keepdims=True), 1)
    assert extras["row_clip_norm"] == 1.0
    assert "released no clip below C: the rows clipped at C" in str(extras["auto_reason"])


def test_the_floor_in_the_reason_is_the_public_one() -> None:
    """Between: the floor stated is clip_quantile's at analyze_gauss's own noise (public)."""
    from service.mechanisms.auto_explain import clip_clause
    from service.mechanisms.clip_quantile import resolvable_floor
    from service.mechanisms.gauss_calibration import AnalyzeGaussParams, gauss_split

    raw = {"clip_norm": 1.0, "clip_quantile": 0.3}
    mu = gauss_split(0.2, DELTA, AnalyzeGaussParams.model_validate(raw)).clip_mu
    floor = resolvable_floor(1.0, 4_000, 0.3, mu)
    assert 0.01 < floor < 1.0
    extras: dict[str, Any] = {
        "auto_choice": "analyze_gauss",
        "auto_params": raw,
        "auto_epsilon": 0.2,
        "auto_delta": DELTA,
        "row_clip_norm": floor / 2,
    }
    assert f"below {floor:.3g} C, the lowest grid edge" in clip_clause(extras, 4_000)
    assert clip_clause({**extras, "row_clip_norm": floor}, 4_000).endswith(", below C")
    assert clip_clause({**extras, "auto_choice": "spatial_sign"}, 4_000) == ""


@pytest.mark.parametrize("n", [2, 30, 300])
@pytest.mark.parametrize("eps", [0.05, 1.0, 50.0])
@pytest.mark.parametrize("kind", ["tiny", "huge", "zeros", "duplicates", "mixed"])
def test_extreme_values_at_small_n_end_succeeded_or_no_result(
    kind: str, eps: float, n: int
) -> None:
    d = 10
    rng = np.random.default_rng(13)
    x = rng.standard_normal((n, d))
    data = {
        "tiny": x * 1e-300,
        "huge": x * 1e300,
        "zeros": np.zeros((n, d)),
        "duplicates": np.tile(x[:1], (n, 1)),
        "mixed": x * np.where(rng.random((n, 1)) < 0.5, 1e-300, 1e300),
    }[kind]
    params = AUTO.prepare(ctx(n, d), 3, eps, DELTA, AutoParams())
    out = AUTO.run(data, ReleaseSpec(3, eps, DELTA, params), np.random.default_rng(0))
    assert out.basis is not None or out.no_result_reason is not None
    if out.basis is not None:
        assert out.basis.shape == (d, 3) and np.all(np.isfinite(out.basis))
