"""``analyze_gauss`` near its floor (issue 35) and its explained-variance clip (issue 32 item 4):
the shortcuts compute the same statistics as the passes they replace, and the noise stays
calibrated to the rows actually used. Speed is measured in ``bench/bench_pca_speed.py``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from service.mechanisms import analyze_gauss as module
from service.mechanisms import centring_choice as cc
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.fast_rows import fast_gram_rows, row_squares
from service.mechanisms.linalg import captured_energy, clipped_gram

Rows = np.ndarray[Any, Any]


def unit_rows(n: int, d: int, seed: int) -> Rows:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) * (1.0 / np.arange(1, d + 1))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("center", [None, "public"])
def test_the_energy_read_off_the_gram_is_the_rows_energy(center: str | None) -> None:
    rows = unit_rows(500, 12, 1) * 1.7  # every row above C = 1: all clipped
    c = np.full(12, 0.05) if center else None
    gram = clipped_gram(rows, 1.0, center=c)
    basis = np.linalg.qr(np.random.default_rng(2).standard_normal((12, 3)))[0]
    assert module.gram_energy(gram, basis) == pytest.approx(
        captured_energy(rows, basis, 1.0, c), rel=1e-10
    )


def test_rows_a_rounding_above_the_clip_are_kept_and_longer_ones_clipped() -> None:
    rows = unit_rows(3000, 40, 3)
    rows[::3] *= 1.0 + 1e-15  # as an owner's unit scaling leaves them
    rows[1::7] *= 2.0  # genuinely above C
    got = cc.fast_gram(rows, 1.0)
    np.testing.assert_allclose(got, clipped_gram(rows, 1.0), rtol=1e-12, atol=1e-12)
    # The kept rows are not scaled: the chunk without any long row goes in as it is.
    clean = unit_rows(1500, 40, 4) * (1.0 + 1e-15)
    step = cc.gram_chunk_rows(40)
    expected = np.zeros((40, 40))
    for start in range(0, clean.shape[0], step):
        block = clean[start : start + step]
        expected += block.T @ block
    np.testing.assert_array_equal(cc.fast_gram(clean, 1.0), expected)
    assert cc.ROUNDING_SLACK < 1e-11


def norms_first_gram(rows: Rows, clip: float) -> Rows:
    """The uncentred Gram pass as it was before issue 35's reordering: each chunk's norms
    first, then the chunk as it is (all within the clip) or clipped row by row."""
    d = rows.shape[1]
    step = cc.gram_chunk_rows(d)
    gram = np.zeros((d, d))
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for start in range(0, rows.shape[0], step):
            block = rows[start : start + step]
            known = row_squares(block)
            if known.max() <= clip * clip * (1.0 + cc.ROUNDING_SLACK):
                gram += block.T @ block
                continue
            clipped = fast_gram_rows(block, clip, None, None, known)
            gram += clipped.T @ clipped
    return gram


@pytest.mark.parametrize("kind", ["within", "over_early", "over_late", "extreme"])
def test_the_product_first_gram_pass_releases_the_same_bits(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 35: each chunk's X^T X is computed before its norms (while its rows are in
    # cache), and after a chunk that needs clipping the norms come first again. The Gram, and
    # so the release on a fixed seed, is the norms-first pass's to the last bit.
    rows = unit_rows(5000, 40, 21) * 0.9
    rows[::3] *= (1.0 + 1e-15) / 0.9  # rows at the bound, as an owner's scaling leaves them
    if kind == "over_early":
        rows[1500] *= 2.0  # the second chunk is clipped; the later ones go norms-first
    elif kind == "over_late":
        rows[-10:] *= 3.0  # only the last chunk
    elif kind == "extreme":
        rows[2100] *= 1e200  # a square beyond the safe range: the rescaled route
    expected = norms_first_gram(rows, 1.0)
    np.testing.assert_array_equal(cc.fast_gram(rows, 1.0), expected)

    mechanism = module.AnalyzeGauss()
    ctx = PublicContext(n_rows=5000, n_cols=40, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 3, 1.0, 1e-6, mechanism.parse_params({}))
    spec = ReleaseSpec(3, 1.0, 1e-6, params)
    now = mechanism.run(rows, spec, np.random.default_rng(22))
    monkeypatch.setattr(module, "fast_gram", lambda data, clip, **_: norms_first_gram(data, clip))
    before = mechanism.run(rows, spec, np.random.default_rng(22))
    np.testing.assert_array_equal(now.basis, before.basis)
    assert now.extras == before.extras


def test_the_noise_draw_is_symmetric_with_the_scale_on_each_upper_entry() -> None:
    rng = np.random.default_rng(5)
    draws = np.stack([module.symmetric_gaussian(5, 3.0, rng) for _ in range(4000)])
    np.testing.assert_array_equal(draws, np.swapaxes(draws, 1, 2))
    upper = draws[:, *np.triu_indices(5)]
    assert np.std(upper, axis=0) == pytest.approx(np.full(15, 3.0), rel=0.06)
    # Distinct entries are independent.
    assert abs(np.corrcoef(upper[:, 0], upper[:, 1])[0, 1]) < 0.06


def test_the_variance_clip_comes_from_the_probe_only_below_its_top_bin() -> None:
    assert module.variance_clip_norm(1.0, None, 10, 0.0) == 1.0
    assert module.variance_clip_norm(1.0, 0.9, 10, 0.0) == 1.0  # in the top bin
    assert module.variance_clip_norm(1.0, 0.2, 0, 0.0) == pytest.approx(0.2)
    assert module.variance_clip_norm(1.0, 0.2, 100, 0.01) == pytest.approx(math.sqrt(0.05))
    assert module.variance_clip_norm(1.0, 0.2, 0, 0.0, math.sqrt(0.5)) == pytest.approx(
        0.2 * math.sqrt(0.5)
    )


def test_the_variance_noise_follows_the_released_variance_clip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Short centred rows (a large offset, a small spread): the probe reads their 0.99-quantile
    # far below C, the explained-variance rows are clipped there and the noise is calibrated
    # to it, mu_V unchanged.
    rng = np.random.default_rng(6)
    n, d = 4000, 20
    rows = 0.8 * np.ones(d) / np.sqrt(d) + 0.02 * rng.standard_normal((n, d)) / np.sqrt(d)
    mechanism = module.AnalyzeGauss()
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 2, 1.0, 1e-6, mechanism.parse_params({"center": "private"}))
    spec = ReleaseSpec(2, 1.0, 1e-6, params)
    seen: list[float] = []
    real = module.paired_energy

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "paired_energy", spy)
    out = mechanism.run(rows, spec, np.random.default_rng(7))
    clip = out.extras["variance_clip_norm"]
    assert clip < 0.5
    split = module.gauss_split(1.0, 1e-6, params)
    route = out.extras["centring"]
    # Scored on the m halved pairs at offset 1 after the pairs route, 0 after none.
    scale = 1.0 if route == "mean" else 2.0 * n / ((n - (route == "pairs")) // 2)
    expected = module.gram_sensitivity(clip) / split.variance_mu * scale
    assert out.extras["variance_noise_std"] == pytest.approx(expected, rel=1e-12)
    if out.extras["centring"] != "mean":
        assert seen == [clip]


@pytest.mark.parametrize("row_clip", [None, 0.3])
def test_the_probe_pairs_energy_is_the_gathered_pass_energy(row_clip: float | None) -> None:
    rows = unit_rows(3001, 30, 8)
    rows[::4] *= 2.5  # rows above C: clip factors below 1
    rows[2] = 0.0
    order = np.random.default_rng(9).permutation(rows.shape[0])
    counts = cc.probe_pass(rows, 1.0, order, chunk_rows=512)
    basis = np.linalg.qr(np.random.default_rng(10).standard_normal((30, 4)))[0]
    found = cc.probe_paired_energy(rows, 1.0, order, counts, basis, row_clip)
    assert found is not None
    expected = cc.paired_energy(rows, 1.0, order, 0, basis, row_clip)
    assert found[2] == expected[2] == 1500
    assert found[:2] == pytest.approx(expected[:2], rel=1e-9)


def test_the_probe_pairs_energy_defers_at_extreme_scales() -> None:
    rows = unit_rows(400, 10, 11)
    rows[::3] *= 1e200  # squares beyond the safe range: the rescaled route
    order = np.random.default_rng(12).permutation(400)
    counts = cc.probe_pass(rows, 1.0, order)
    basis = np.eye(10, 2)
    assert cc.probe_paired_energy(rows, 1.0, order, counts, basis) is None


@pytest.mark.parametrize("bound", [1.0, 0.05])
def test_the_probe_centred_energy_is_the_pass_energy(bound: float) -> None:
    rng = np.random.default_rng(13)
    rows = 0.6 * np.ones(25) / 5.0 + 0.05 * rng.standard_normal((2000, 25))
    rows[::6] *= 3.0  # above C: clipped before centring
    order = rng.permutation(2000)
    counts = cc.probe_pass(rows, 1.0, order, chunk_rows=512)
    center = rows.mean(axis=0) * 0.97
    basis = np.linalg.qr(rng.standard_normal((25, 3)))[0]
    found = cc.probe_centred_energy(rows, counts, basis, center, bound)
    assert found is not None
    expected = cc.fast_energy(rows, basis, 1.0, center, bound)
    assert found == pytest.approx(expected, rel=1e-9)


def test_the_public_facts_forecast_says_when_it_depends_on_the_spectrum() -> None:
    # Issue 32 item 4: public facts bound the share kept between a flat spectrum and one
    # direction; where that range is wide the dry run says the share depends on the
    # spectrum, and the 1/i figure lies inside the range.
    from service.mechanisms.gauss_forecast import DETERMINED_WIDTH, spectrum_bounds

    mechanism = module.AnalyzeGauss()

    def scales_of(n: int, d: int, k: int, eps: float) -> dict[str, Any]:
        ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
        raw = mechanism.parse_params({"center": "private"})
        params = mechanism.prepare(ctx, k, eps, 1e-6, raw)
        return mechanism.preview(ctx, ReleaseSpec(k, eps, 1e-6, params)).scales

    digits = scales_of(1797, 64, 10, 1.0)
    low, high = digits["forecast_captured_share_low"], digits["forecast_captured_share_high"]
    assert low <= digits["forecast_power_law_captured_share"] <= high
    assert digits["forecast_depends_on_spectrum"] is True
    # Measured on digits at these facts: 0.595 kept; inside the range.
    assert low <= 0.595 <= high
    hopeless = scales_of(50, 784, 10, 0.1)
    # Far too few rows for the noise: nothing stands out whatever the spectrum; the release
    # keeps what a random subspace keeps, k/d.
    assert hopeless["forecast_captured_share_low"] == pytest.approx(10 / 784)
    assert hopeless["forecast_captured_share_high"] == pytest.approx(10 / 784)
    assert hopeless["forecast_depends_on_spectrum"] is False
    # A point forecast only where the range determines it (its middle), none elsewhere.
    assert hopeless["forecast_captured_share"] == pytest.approx(10 / 784)
    assert digits["forecast_captured_share"] is None
    wine = scales_of(178, 13, 10, 0.3)  # measured there: 0.90-0.915 kept
    assert wine["forecast_depends_on_spectrum"] is False
    middle = wine["forecast_captured_share"]
    assert wine["forecast_captured_share_low"] <= middle <= wine["forecast_captured_share_high"]
    assert abs(middle - 0.9) <= DETERMINED_WIDTH / 2
    # The bounds: a flat spectrum keeps k/d, one direction (nearly) everything with enough
    # rows, more with more rows.
    flat, one = spectrum_bounds(1.0, 10**9, 20, 2, 1.0)
    assert flat == pytest.approx(0.1) and one == pytest.approx(1.0)
    assert spectrum_bounds(1.0, 30, 20, 2, 1.0)[1] < spectrum_bounds(1.0, 10**4, 20, 2, 1.0)[1]
    assert one - flat > DETERMINED_WIDTH
