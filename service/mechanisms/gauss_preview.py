"""What a dry run of ``analyze_gauss`` says before anything is spent: the noise scales, the
forecast of the share kept (from public facts, or from an earlier release's released figures),
and the default's choice against the alternative (issue 24 item 6, issue 32 items 1 and 4).
It reads public facts and values already released to the caller only: no row, no budget."""

from __future__ import annotations

import math
from typing import Any

from service.mechanisms.base import Preview, PublicContext, ReleaseSpec
from service.mechanisms.centring import mean_sensitivity
from service.mechanisms.centring_choice import PROBE_STEPS_PER_OCTAVE
from service.mechanisms.explained_variance import HIDDEN_WIDTH, expected_noise_norm
from service.mechanisms.forecast_figures import ReleasedFigures
from service.mechanisms.gauss_calibration import (
    DEFAULT_PRIVATE_CENTRE_QUANTILE,
    TARGET_SUBSPACE_ERROR,
    AnalyzeGaussParams,
    chooses_centring,
    gap_for_error,
    gauss_split,
    gram_sensitivity,
)
from service.mechanisms.gauss_forecast import recoverable_forecast
from service.mechanisms.gauss_release_forecast import (
    PROBE_RISK,
    NewRelease,
    RangeForecast,
    probe_risk,
    range_from_release,
)
from service.mechanisms.noise import GRID_DIVISOR

#: What the forecast from a release met in bench/bench_honest_point.py (issue 32 item 4).
FROM_RELEASE_MEASURED = (
    "Measured (bench/bench_honest_point.py --cross, 16 runs per pair of settings eps 0.3 / 1, "
    "k 2 / 10): where a point is given, mean |point - kept| 0.01-0.08 on digits and MNIST; "
    "the range covered what the release kept in 95% of runs on digits, 92% on breast_cancer "
    "and 90% on MNIST (averaged over the pairs); at eps 0.3 breast_cancer keeps 0.03-0.62 "
    "from run to run."
)


def gauss_preview(ctx: PublicContext, spec: ReleaseSpec[AnalyzeGaussParams]) -> Preview:
    """:meth:`AnalyzeGauss.preview`: the noise scales, the forecast from public facts and, under
    a private centre, what was chosen and what the alternative would give."""
    params = spec.params
    assert params.clip_norm is not None  # resolved by prepare
    split = gauss_split(spec.epsilon, spec.delta, params)
    clip = params.clip_norm
    sigma = gram_sensitivity(clip) / split.gram_mu
    norm_ = expected_noise_norm(sigma, ctx.n_cols)
    gap = gap_for_error(norm_, TARGET_SUBSPACE_ERROR)
    forecast = recoverable_forecast(sigma, ctx.n_rows, ctx.n_cols, spec.k, clip)
    scales: dict[str, Any] = {
        "sigma": sigma,
        "noise_spectral_norm": norm_,
        "gap_for_error_0_1": gap,
        "eigenvalue_grid": sigma / GRID_DIVISOR,
        "total_mu": split.total_mu,
        "gram_mu": split.gram_mu,
        "variance_noise_std": gram_sensitivity(clip) / split.variance_mu,
        "smallest_recoverable_eigenvalue_share": forecast.threshold_share,
        "forecast_power_law_captured_share": forecast.power_law_share,
        "forecast_rows_for_k_components": forecast.rows_needed,
        # Scalars (a preview's scales are): the range public facts allow.
        "forecast_captured_share_low": forecast.share_range[0],
        "forecast_captured_share_high": forecast.share_range[1],
        "forecast_depends_on_spectrum": forecast.depends_on_spectrum,
        # A point forecast only where public facts determine it: the range's middle is within
        # DETERMINED_WIDTH / 2 = 0.1 of any share inside it; elsewhere none (null).
        "forecast_captured_share": (
            None if forecast.depends_on_spectrum else sum(forecast.share_range) / 2.0
        ),
        "center": params.center if isinstance(params.center, str) else "public",
    }
    meaning = [
        f"The release is {split.total_mu:.4g}-GDP (exactly the requested (epsilon, delta)); "
        f"X^T X gets mu = {split.gram_mu:.4g} of it, the explained-variance estimate "
        f"{split.variance_mu:.4g}.",
        f"Each entry of the upper triangle of the clipped X^T X gets Gaussian noise of "
        f"standard deviation sigma = {sigma:.4g}"
        + (
            " (at most: rows are clipped at a private quantile below C)."
            if params.quantile
            else "."
        ),
        f"The symmetric noise matrix has spectral norm about 2 sigma sqrt(d) = "
        f"{norm_:.4g}; each released eigenvalue is within about that much of the true "
        "one (Weyl).",
        (
            f"For a subspace error ||sin Theta|| <= 0.1 the k-th eigengap lambda_k - "
            f"lambda_(k+1) of the clipped X^T X must be at least about {gap:.4g} "
            "(Davis-Kahan with Weyl: error <= ||E|| / (gap - ||E||))."
            if spec.k < ctx.n_cols
            # k = d: d orthonormal vectors span R^d whatever the noise; no gap is needed (there
            # is no lambda_(d+1)), and saying one is would contradict the forecast below.
            else f"With k = d = {ctx.n_cols} the released subspace is the whole space: its "
            "subspace error is 0 whatever the noise and no eigengap is needed; the noise "
            "decides only the order of the components within it."
        ),
        forecast.meaning,
    ]
    if params.center == "private":
        mu_sigma = mean_sensitivity(clip, ctx.n_rows) / split.mean_mu
        bias = ctx.n_rows * ctx.n_cols * mu_sigma**2
        scales.update(
            center_sigma=mu_sigma,
            center_grid=mu_sigma / GRID_DIVISOR,
            center_mu=split.mean_mu,
            center_rank_one_bias=bias,
        )
        meaning.append(
            f"The mean of the clipped rows (l2 sensitivity 2C/n) gets Gaussian noise of "
            f"standard deviation {mu_sigma:.4g} per coordinate (mu = {split.mean_mu:.4g}); "
            f"centring on it adds n ||mu - mu_hat||^2, about {bias:.4g}, along one random "
            "direction of the centred X^T X; rows are clipped to C again."
        )
    elif isinstance(params.center, list):
        meaning.append(
            "Rows are centred on the given public centre (no budget) and clipped to C again."
        )
    if chooses_centring(params):
        meaning.append(
            f"The centring is chosen at run time (extras.centring): a probe (mu = "
            f"{split.clip_mu:.4g}) releases the {params.quantile:g}-quantiles of the "
            "norms of the rows and of the differences of publicly paired rows; from them "
            "and public facts, the route with the largest signal-to-noise runs: the "
            "private mean above, differences of paired rows (no mean, n/2 rows, the mean's "
            "share goes to X^T X), or no centring. Only the mean route releases a centre."
        )
    if params.quantile is not None:
        scales.update(clip_quantile=params.quantile, clip_mu=split.clip_mu)
        meaning.append(
            f"A noisy histogram of the row norms (mu = {split.clip_mu:.4g}) picks the clip "
            f"norm near their {params.quantile:g}-quantile on the grid C 2^(-j/4); the "
            "noise above scales with its square."
        )
    if params.center == "private":
        meaning.append(default_choice_sentence(ctx, spec, scales))
    return Preview(scales=scales, meaning=meaning)


def release_forecast(
    ctx: PublicContext,
    spec: ReleaseSpec[AnalyzeGaussParams],
    earlier: ReleaseSpec[AnalyzeGaussParams],
    extras: dict[str, Any],
) -> tuple[ReleasedFigures, RangeForecast, float] | None:
    """The earlier release's figures, the forecast of what this request keeps from them
    (:func:`~service.mechanisms.gauss_release_forecast.range_from_release`) and the ratio of the two
    Gram noises (earlier over this request's ``mu``, public; the same clip rule and centring
    route assumed). Post-processing of values already released to the caller and of public
    facts (both requests' ``(epsilon, delta, C)``, ``n``, ``d``): no budget, no row. ``None``
    when the extras lack the figures."""
    # The Gram clip when the extras name none: the request's C (default: the public bound).
    clip = earlier.params.clip_norm or ctx.row_norm_bound or 0.0
    mean_noise = 0.0
    if earlier.params.center == "private" and clip > 0:
        before = gauss_split(earlier.epsilon, earlier.delta, earlier.params)
        if before.mean_mu > 0:
            mean_noise = mean_sensitivity(clip, max(1, ctx.n_rows)) / before.mean_mu
    figures = ReleasedFigures.from_extras(extras, ctx.n_cols, ctx.n_rows, clip, mean_noise)
    if figures is None:
        return None
    route = extras.get("centring")
    ratio = gram_mu_of(earlier, route) / gram_mu_of(spec, route)
    split = gauss_split(spec.epsilon, spec.delta, spec.params)
    new_mean_noise = 0.0
    if route == "mean" and spec.params.center == "private" and split.mean_mu > 0:
        new_mean_noise = mean_sensitivity(spec.params.clip_norm or clip, max(1, ctx.n_rows))
        new_mean_noise /= split.mean_mu
    risk = 0.0
    if chooses_centring(spec.params) and spec.params.quantile is not None:
        risk = probe_risk(ctx.n_rows, spec.params.quantile, split.clip_mu, PROBE_STEPS_PER_OCTAVE)
    new = NewRelease(spec.k, ratio, new_mean_noise, risk)
    return figures, range_from_release(figures, new), ratio


#: Said of a range that bounds the expected share only (``RangeForecast.covers_spread``).
SPREAD_NOT_COVERED = (
    "in expectation: above d = 256 the range leaves out a single release's own spread, "
    "which can fall outside it"
)


def forecast_from(
    ctx: PublicContext,
    spec: ReleaseSpec[AnalyzeGaussParams],
    earlier: ReleaseSpec[AnalyzeGaussParams],
    extras: dict[str, Any],
) -> tuple[dict[str, Any], list[str]] | None:
    """The forecast of what this request keeps from an earlier release's released figures
    (issue 32 item 4; :func:`release_forecast`): post-processing of values already released
    to the caller (and of the total ``c + r`` of a hidden release's noisy sums, drawn under its
    budget and stored, though :func:`~service.mechanisms.explained_variance.shown_variance_extras`
    does not show them), so it costs nothing and leaks nothing new. Scales: the range
    ``forecast_from_release_captured_share_low`` / ``_high``, the point
    ``forecast_from_release_captured_share`` only where it is within half of
    :data:`~service.mechanisms.gauss_forecast.DETERMINED_WIDTH` (0.1) of both ends of that
    range (:attr:`~service.mechanisms.gauss_release_forecast.RangeForecast.point`), the probe
    is not at risk and the earlier share was measured, not hidden by its noise (``null``
    elsewhere, with ``forecast_from_release_determined`` false: the released figures do not
    determine the share), ``forecast_from_release_unseen_share`` (the variance the
    earlier release did not resolve), ``forecast_from_release_range_covers_spread`` (false
    where the range bounds the expected share only, ``d > 256``: a single release can fall
    outside it), ``forecast_from_release_probe_risk``
    (:func:`~service.mechanisms.gauss_release_forecast.probe_risk`), the basis and the hidden flag.
    ``None`` when the extras lack the figures."""
    found = release_forecast(ctx, spec, earlier, extras)
    if found is None:
        return None
    figures, forecast, ratio = found
    low, high = figures.interval
    # The earlier release's own rule (HIDDEN_WIDTH, its point's 0.05), not one of the
    # forecast's: whether it measured its share is the release's fact. The forecast's own
    # target, within 0.1, is its point rule (RangeForecast.point, DETERMINED_WIDTH).
    hidden = bool(extras.get("explained_variance_hidden_by_noise")) or high - low >= HIDDEN_WIDTH
    basis = "measured share" if figures.measured else "spectrum"
    # A point only from a measured share: read off a hidden release's spectrum it missed a
    # fresh release by 0.12-0.34 on average (breast_cancer eps 1), 2-5x the release's own
    # run-to-run spread (issue 32 item 4, re-measured 29 Nov 2026); the range stays.
    # A whole-space release whose split the noise hid measured only its total (1): a smaller
    # k's share read off its spectrum is the same unmeasured reading, so no point either.
    unsplit = figures.split_hidden and spec.k < figures.n_cols
    point = None if hidden or unsplit else forecast.point
    scales: dict[str, Any] = {
        "forecast_from_release_captured_share": point,
        "forecast_from_release_captured_share_low": forecast.low,
        "forecast_from_release_captured_share_high": forecast.high,
        "forecast_from_release_determined": point is not None,
        "forecast_from_release_unseen_share": forecast.unseen,
        "forecast_from_release_probe_risk": forecast.probe_risk,
        "forecast_from_release_range_covers_spread": forecast.covers_spread,
        "forecast_from_release_hidden_by_noise": hidden,
        "forecast_from_release_basis": basis,
    }
    if figures.measured:
        how = "its stated shares"
    elif figures.split_hidden and not hidden:
        how = (
            "its eigenvalues and trace (its components spanned the whole space, and how their "
            "total of 1 split among them was hidden by its noise), corrected for the clip's "
            f"flattening ({figures.clipped_share:.2f} of n C2^2 filled)"
        )
    else:
        how = (
            "its eigenvalues and trace (its stated share was hidden by its noise), corrected "
            f"for the clip's flattening ({figures.clipped_share:.2f} of n C2^2 filled)"
        )
    what = (
        f"Forecast from the earlier release's released figures (no budget), from {how} "
        f"carried to this request's noise ({1 / ratio:.3g}x the earlier one's): "
    )
    spread = "" if forecast.covers_spread else f" ({SPREAD_NOT_COVERED})"
    if point is not None:
        what += (
            f"this request keeps about {point:.3g} of the centred variance (range "
            f"{forecast.low:.3g} to {forecast.high:.3g}{spread})."
        )
    else:
        what += (
            f"this request keeps between {forecast.low:.3g} and {forecast.high:.3g} of the "
            f"centred variance{spread}; the released figures do not determine it more "
            "closely, so no single figure is given (forecast_from_release_captured_share is "
            "null)"
        )
        if forecast.unseen > 0.05:
            what += (
                f": {forecast.unseen:.2g} of the variance lies where the earlier release did "
                "not resolve it (below its noise's edge or beyond its k), and this request "
                "could keep anywhere from a random subspace's share of it to as much as its "
                "components hold"
            )
        if forecast.probe_risk >= PROBE_RISK:
            what += (
                f"; and this request's centring probe reads its route from its count noise "
                f"alone with a chance of about {forecast.probe_risk:.2g} (public: n and its "
                "budget), taking no centring or a clip near C, when the release keeps about "
                "nothing: the outcome is not predictable at these settings"
            )
        what += "."
    what += f" {FROM_RELEASE_MEASURED}"
    if hidden:
        what += (
            " The earlier release's explained variance was hidden by its noise, so this "
            "forecast is not a measurement either and gives no single figure: read off such a "
            "release's spectrum, a point missed fresh releases by 0.12-0.34 on average "
            "(breast_cancer at eps 1, whose releases vary by 0.04-0.07 by themselves), and a "
            "release at these settings varies by itself (breast_cancer at eps 0.3 keeps "
            "0.07-0.62 from run to run)."
        )
    return scales, [what]


def default_choice_sentence(
    ctx: PublicContext, spec: ReleaseSpec[AnalyzeGaussParams], scales: dict[str, Any]
) -> str:
    """What a private-centre request runs by default and what the other setting would give
    (issue 32, item 1), from public facts: the forecast of the other choice of clip quantile
    at its own budget split; adds ``clip_quantile_source``, ``alternative`` and
    ``alternative_sigma`` / ``alternative_forecast_power_law_captured_share`` to ``scales``."""
    params = spec.params
    clip = params.clip_norm
    assert clip is not None  # resolved by prepare
    quantile = params.quantile
    chosen = f"clip_quantile {quantile:g}" if quantile is not None else 'clip_quantile "none"'
    other_quantile: float | str = DEFAULT_PRIVATE_CENTRE_QUANTILE
    if quantile is not None:
        other_quantile = "none"
    other = params.model_copy(update={"clip_quantile": other_quantile})
    other_split = gauss_split(spec.epsilon, spec.delta, other)
    other_sigma = gram_sensitivity(clip) / other_split.gram_mu
    forecast = recoverable_forecast(other_sigma, ctx.n_rows, ctx.n_cols, spec.k, clip)
    default = quantile == DEFAULT_PRIVATE_CENTRE_QUANTILE
    scales.update(
        clip_quantile_source="default" if default else "request",
        alternative=f"clip_quantile {other_quantile}",
        alternative_sigma=other_sigma,
        alternative_forecast_power_law_captured_share=forecast.power_law_share,
    )
    measured = (
        "Measured at eps 1, k = 10 (centred share kept, unit rows): digits 0.54 with the "
        "default quantile against 0.33 without, breast_cancer 0.86 against 0.34."
    )
    if quantile is None:
        return (
            f"This request opted out of the default clip quantile ({chosen}): rows are clipped "
            f"at C and the centring is the private mean. With clip_quantile "
            f"{DEFAULT_PRIVATE_CENTRE_QUANTILE:g} (the default under a private centre) sigma at "
            f"C would be {other_sigma:.4g} (a share of the budget goes to the quantile), "
            "shrinking by (C2/C)^2 at the released quantile C2, and the centring route would "
            f"be chosen from the probe. {measured}"
        )
    return (
        f"Chosen {'by default' if default else 'by the request'}: {chosen} with the centring "
        f'route chosen at run time. The alternative, clip_quantile "none" (clip at C, '
        f"private mean), has sigma {other_sigma:.4g} and the power-law forecast "
        f"{forecast.power_law_share:.3g} at C; the chosen clip's sigma is the one above times "
        f"(C2/C)^2, so it keeps more wherever the (centred) rows are mostly shorter than C. "
        f"{measured}"
    )


def gram_mu_of(spec: ReleaseSpec[AnalyzeGaussParams], route: object) -> float:
    """The ``mu`` of the Gram step a release at ``spec`` runs on ``route`` (the mean route and
    the routes without a choice: ``gram_mu``; pairs and none: the mean's share too)."""
    split = gauss_split(spec.epsilon, spec.delta, spec.params)
    if route in ("pairs", "none"):
        return math.hypot(split.mean_mu, split.gram_mu)
    return split.gram_mu
