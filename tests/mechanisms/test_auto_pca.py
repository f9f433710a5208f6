"""``auto`` centres when asked for PCA (issue 32, item 1; issue 31's digits figure): with
``center: "private"`` it runs analyze_gauss with the service's default clip quantile (one
source of truth, ``DEFAULT_PRIVATE_CENTRE_QUANTILE``) and the centring route chosen at run
time, and its dry run says so; wherever else it runs analyze_gauss it uses the same quantile;
without ``center`` it stays uncentred (the subspace of X^T X) and its dry run says how to ask
for PCA."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.mechanisms.analyze_gauss import DEFAULT_PRIVATE_CENTRE_QUANTILE, AnalyzeGauss
from service.mechanisms.auto import Auto, plan
from service.mechanisms.base import PublicContext, ReleaseSpec
from tests.mechanisms.test_pca_defaults import digits_train

AUTO = Auto()
GAUSS = AnalyzeGauss()
Q = DEFAULT_PRIVATE_CENTRE_QUANTILE


def prepared(ctx: PublicContext, raw: dict[str, Any], k: int, eps: float, delta: float) -> Any:
    return AUTO.prepare(ctx, k, eps, delta, AUTO.parse_params(raw))


@pytest.mark.parametrize(
    ("n", "d", "k", "eps", "raw"),
    [
        (1_347, 64, 10, 1.0, {"center": "private"}),  # digits-sized PCA
        (1_347, 64, 10, 1.0, {"center": [0.0] * 64}),  # a public centre
        (1_347, 64, 10, 1.0, {}),  # uncentred, no aggregator: analyze_gauss
        (50_000, 10, 3, 1.0, {}),  # the estimate, friendly's paths and their stops
        (5_000, 10, 3, 1.0, {}),  # the same at a smaller n
        (50_000, 10, 3, 0.1, {}),  # and at a small budget
    ],
)
def test_every_analyze_gauss_auto_can_run_uses_the_default_quantile(
    n: int, d: int, k: int, eps: float, raw: dict[str, Any]
) -> None:
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = prepared(ctx, raw, k, eps, 1e-6)
    the_plan = plan(ctx, k, eps, 1e-6, params)
    gauss = [c for c in the_plan.choices() if c.name == "analyze_gauss"]
    assert gauss, "every plan with delta > 0 has an analyze_gauss choice"
    for choice in gauss:
        assert choice.params.model_dump(mode="json")["clip_quantile"] == Q


def test_a_private_centre_runs_analyze_gauss_default_settings_and_the_dry_run_says_so() -> None:
    rows = digits_train(0)
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = prepared(ctx, {"center": "private"}, 10, 1.0, 1e-6)
    shown = AUTO.preview(ctx, ReleaseSpec(10, 1.0, 1e-6, params))
    assert shown.scales["auto_choice"] == "analyze_gauss"
    assert shown.scales["auto_centring"] == "private"
    assert shown.scales["auto_clip_quantile"] == Q
    reason = str(shown.scales["auto_reason"])
    assert "PCA requested" in reason and f"{Q:g}-quantile" in reason
    assert "centring route" in reason and len(reason) < 400
    # analyze_gauss's own lines say the quantile is the default one, and what the alternative
    # ("none") would have given
    assert shown.scales["analyze_gauss.clip_quantile_source"] == "default"
    assert shown.scales["analyze_gauss.alternative"] == "clip_quantile none"
    # The release: the same run as analyze_gauss's own default request (same draws).
    out = AUTO.run(rows, ReleaseSpec(10, 1.0, 1e-6, params), np.random.default_rng(3))
    assert out.extras["auto_params"]["clip_quantile"] == Q
    assert out.extras["auto_params"]["center_route"] == "auto"
    assert out.extras["centring"] in ("mean", "pairs", "none")
    gauss_params = GAUSS.prepare(ctx, 10, 1.0, 1e-6, GAUSS.parse_params({"center": "private"}))
    alone = GAUSS.run(rows, ReleaseSpec(10, 1.0, 1e-6, gauss_params), np.random.default_rng(3))
    assert out.basis is not None and alone.basis is not None
    np.testing.assert_array_equal(out.basis, alone.basis)


@pytest.mark.parametrize(
    ("raw", "delta", "said"),
    [
        ({"center": [0.0] * 64}, 1e-6, "public centre"),
        ({"center": "private"}, 0.0, "smooth_sensitivity centres on a private mean"),
        ({"center": [0.0] * 64}, 0.0, "smooth_sensitivity centres on the given public centre"),
    ],
)
def test_the_dry_run_says_how_auto_centres(raw: dict[str, Any], delta: float, said: str) -> None:
    ctx = PublicContext(n_rows=1_347, n_cols=64, row_norm_bound=1.0)
    params = prepared(ctx, raw, 10, 1.0, delta)
    shown = AUTO.preview(ctx, ReleaseSpec(10, 1.0, delta, params))
    expected = "public" if isinstance(raw["center"], list) else "private"
    assert shown.scales["auto_centring"] == expected
    assert any(said in line for line in [str(shown.scales["auto_reason"]), *shown.meaning])
    assert shown.scales["auto_clip_quantile"] == (Q if delta > 0 else None)


def test_without_center_auto_stays_uncentred_and_says_how_to_ask_for_pca() -> None:
    # Deliberate: auto's default is the subspace of X^T X, as every mechanism's (the aggregators
    # it may choose estimate only that); PCA users get centring by asking, as PrivatePCA does.
    ctx = PublicContext(n_rows=1_347, n_cols=64, row_norm_bound=1.0)
    params = prepared(ctx, {}, 10, 1.0, 1e-6)
    assert params.center == "none"
    shown = AUTO.preview(ctx, ReleaseSpec(10, 1.0, 1e-6, params))
    assert shown.scales["auto_centring"] == "none"
    assert any('Not centred (center "none"' in line for line in shown.meaning)
    assert any('for PCA send "params": {"center": "private"}' in line for line in shown.meaning)


def test_auto_keeps_half_of_digits_centred_variance_with_a_private_centre() -> None:
    # Issue 31's done-when at the mechanism level (the request's (epsilon, delta) calibrates the
    # run identically under basic and zcdp; tests/api/test_auto_pca_http.py goes through both):
    # k = 10, eps 1, center "private" keeps at least 0.48 of digits' centred variance (0.314
    # on a zcdp dataset before auto ran as itself there; 0.533 with auto's former quantile 0.5).
    kept = []
    for seed in range(5):
        rows = digits_train(seed)
        n, d = rows.shape
        ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
        params = prepared(ctx, {"center": "private"}, 10, 1.0, 1e-6)
        out = AUTO.run(rows, ReleaseSpec(10, 1.0, 1e-6, params), np.random.default_rng(seed))
        assert out.basis is not None and out.extras["auto_choice"] == "analyze_gauss"
        centred = rows - rows.mean(axis=0)
        kept.append(float(np.sum((centred @ out.basis) ** 2) / np.sum(centred**2)))
    assert np.mean(kept) >= 0.48


def mnist_preview(eps: float, raw: dict[str, Any], n_units: int | None = None) -> Any:
    """auto's dry run on an MNIST-shaped dataset (4,000 x 784: d >= n^(2/3))."""
    ctx = PublicContext(n_rows=4_000, n_cols=784, row_norm_bound=1.0, n_units=n_units)
    params = prepared(ctx, raw, 10, eps, 1e-6)
    return ctx, AUTO.preview(ctx, ReleaseSpec(10, eps, 1e-6, params))


def test_in_high_dimension_the_dry_run_says_what_analyze_gauss_would_have_used_and_kept() -> None:
    # Issue 32 item 1: "the dry run says what it chose and what the alternative would have
    # kept". PrivatePCA's request on MNIST runs spatial_sign; its dry run named no alternative.
    ctx, shown = mnist_preview(1.0, {"center": "private"})
    assert shown.scales["auto_choice"] == "spatial_sign"
    assert shown.scales["auto_alternative"] == "analyze_gauss"
    # The alternative's figures are analyze_gauss's own dry run of the request PrivatePCA sends
    # with mechanism="analyze_gauss" (its recommended settings), and the chosen one's are
    # spatial_sign's.
    gauss_params = GAUSS.prepare(ctx, 10, 1.0, 1e-6, GAUSS.parse_params({"center": "private"}))
    alone = GAUSS.preview(ctx, ReleaseSpec(10, 1.0, 1e-6, gauss_params)).scales
    assert shown.scales["auto_alternative_sigma"] == pytest.approx(alone["sigma"], rel=1e-12)
    assert shown.scales["auto_alternative_forecast_power_law_captured_share"] == pytest.approx(
        alone["forecast_power_law_captured_share"], rel=1e-12
    )
    assert shown.scales["auto_chosen_sigma"] == pytest.approx(
        shown.scales["spatial_sign.gram_noise_std"], rel=1e-12
    )
    line = next(m for m in shown.meaning if m.startswith("The alternative, analyze_gauss"))
    assert f"{alone['sigma']:.4g}" in line and "Measured at eps 1" in line
    assert "0.082 with analyze_gauss" in line


def test_where_the_centre_rules_the_sign_map_out_the_dry_run_states_it_as_the_alternative() -> None:
    _, shown = mnist_preview(0.3, {"center": "private"})
    assert shown.scales["auto_choice"] == "analyze_gauss"
    assert shown.scales["auto_alternative"] == "spatial_sign"
    sigma = shown.scales["auto_alternative_sigma"]
    assert isinstance(sigma, float) and sigma < float(shown.scales["auto_chosen_sigma"])
    assert any(m.startswith("The alternative, spatial_sign") for m in shown.meaning)


@pytest.mark.parametrize(
    ("shape", "raw", "n_units"),
    [
        ((1_347, 64), {"center": "private"}, None),  # low dimension: analyze_gauss's own lines
        ((4_000, 784), {}, None),  # uncentred: not a PCA request
        ((4_000, 784), {"center": "private"}, 2_000),  # person level: no spatial_sign run
    ],
)
def test_no_gram_alternative_where_dimension_does_not_decide(
    shape: tuple[int, int], raw: dict[str, Any], n_units: int | None
) -> None:
    ctx = PublicContext(n_rows=shape[0], n_cols=shape[1], row_norm_bound=1.0, n_units=n_units)
    params = prepared(ctx, raw, 10, 1.0, 1e-6)
    shown = AUTO.preview(ctx, ReleaseSpec(10, 1.0, 1e-6, params))
    assert "auto_alternative" not in shown.scales
    assert not any(m.startswith("The alternative, ") for m in shown.meaning)
