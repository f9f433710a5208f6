"""The dry run's forecast from an earlier ``spatial_sign`` release (issue 32 item 4; what
``auto`` runs for PCA in high dimension, e.g. MNIST).

A centred ``spatial_sign`` release states the share of the centred variance its components
keep (analyze_gauss's explained-variance figures, a fresh estimate after the basis was chosen)
with a 90% interval. A new request with the very same settings (``k``, budget, params) keeps,
in expectation, what the earlier one kept: the earlier stated share is then the forecast and
its interval the range, a point only where that interval is at most
:data:`~service.mechanisms.gauss_forecast.DETERMINED_WIDTH` wide and not hidden by noise.
Across settings nothing carries the released figures (eigenvalues of the rows' signs' Gram, not
of their covariance) to another noise or ``k``: the dry run says so instead of a figure.
Post-processing of values already released to the caller: no row, no budget.
"""

from __future__ import annotations

import math
from typing import Any

from service.mechanisms.base import ReleaseSpec
from service.mechanisms.explained_variance import HIDDEN_WIDTH
from service.mechanisms.gauss_forecast import DETERMINED_WIDTH


def same_settings(spec: ReleaseSpec[Any], earlier: ReleaseSpec[Any]) -> bool:
    """The same ``k``, budget and params (the budget compared as floats to a rounding)."""
    return (
        spec.k == earlier.k
        and math.isclose(spec.epsilon, earlier.epsilon, rel_tol=1e-9)
        and math.isclose(spec.delta, earlier.delta, rel_tol=1e-9)
        and spec.params == earlier.params
    )


def forecast_from(
    spec: ReleaseSpec[Any], earlier: ReleaseSpec[Any], extras: dict[str, Any]
) -> tuple[dict[str, Any], list[str]] | None:
    """The scales and sentence of ``?forecast_from=`` for a ``spatial_sign`` release (the same
    keys as analyze_gauss's: ``forecast_from_release_captured_share`` and its ``_low`` /
    ``_high``, ``_determined``, ``_hidden_by_noise``, ``_basis``); ``None`` when the extras
    carry no explained variance (an uncentred release)."""
    try:
        stated = extras["explained_variance_ratio"]
        low, high = (float(x) for x in extras["explained_variance_ratio_interval"])
        # A hidden share states no point (null), nor a whole-space release whose split the
        # noise hid (its total is exactly 1, its interval [1, 1]); the range and the flag carry.
        withheld = (
            extras.get("explained_variance_hidden_by_noise") is True
            or extras.get("explained_variance_split_hidden_by_noise") is True
        )
        share = low if stated is None and withheld else sum(float(x) for x in stated)
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(x) for x in (share, low, high)):
        return None
    # The earlier release's own rule (its point's 0.05); the forecast's target, within 0.1, is
    # DETERMINED_WIDTH below, already narrower than HIDDEN_WIDTH.
    hidden = bool(extras.get("explained_variance_hidden_by_noise")) or high - low >= HIDDEN_WIDTH
    if not same_settings(spec, earlier):
        scales: dict[str, Any] = {
            "forecast_from_release_captured_share": None,
            "forecast_from_release_captured_share_low": None,
            "forecast_from_release_captured_share_high": None,
            "forecast_from_release_determined": False,
            "forecast_from_release_hidden_by_noise": hidden,
            "forecast_from_release_basis": "none: other settings",
        }
        return scales, [
            "No forecast from the earlier release: it ran spatial_sign at other settings, and "
            "its figures (the eigenvalues of the rows' signs' Gram) do not carry to another "
            "noise or k; a release at the very same settings forecasts one at those settings."
        ]
    point = min(max(share, low), high)
    determined = not hidden and high - low <= DETERMINED_WIDTH
    scales = {
        "forecast_from_release_captured_share": point if determined else None,
        "forecast_from_release_captured_share_low": low,
        "forecast_from_release_captured_share_high": high,
        "forecast_from_release_determined": determined,
        "forecast_from_release_hidden_by_noise": hidden,
        "forecast_from_release_basis": "measured share",
    }
    what = (
        "Forecast from the earlier release's released figures (no budget): it ran spatial_sign "
        "at these very settings, so this request keeps in expectation what it kept"
    )
    if determined:
        what += (
            f": about {point:.3g} of the centred variance (its stated share; range {low:.3g} "
            f"to {high:.3g}, its 90% interval). A single release varies about that by its own "
            "run-to-run spread."
        )
    else:
        what += (
            f", stated between {low:.3g} and {high:.3g} (its 90% interval); that interval is "
            "too wide to determine the share, so no single figure is given"
            + (" (the earlier release's share was hidden by its noise)." if hidden else ".")
        )
    return scales, [what]
