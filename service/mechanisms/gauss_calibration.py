"""The calibration of ``analyze_gauss`` (seed 002, Algorithm 1; ALGORITHMS.md M1): its
parameters, the budget split between its steps, the Gram sensitivity and noise scale, and the
eigengap a target subspace error needs. Public facts only; imported by the mechanism and by its
dry run (:mod:`service.mechanisms.gauss_preview`), which must not import the mechanism."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from service.mechanisms.base import (
    InvalidParameter,
)
from service.mechanisms.centring import (
    CenterParams,
)
from service.mechanisms.composition import gaussian_total_mu
from service.mechanisms.noise import (
    analytic_gaussian_sigma,
)

#: Share of ``mu^2`` of the fresh explained-variance estimate (every release).
VARIANCE_SHARE = 0.1

#: Share of ``mu^2`` of the private clip quantile (when ``clip_quantile`` is set).
CLIP_SHARE = 0.05

#: The clip quantile a request with ``center: "private"`` gets when it sets none (issue 32,
#: item 1). Measured (``bench/bench_default_quantile.py``, in the history at 0b18334; k = 10,
#: 20 seeds, captured share of the centred variance, q from 0.1 to 0.7 and "none"): 0.3 has
#: the best mean over digits, breast_cancer and two synthetic power-law sets at eps 0.3 and 1
#: (0.530 against 0.521 for 0.5) and is within 0.02 of the best q in every cell; "none" keeps
#: 0.09-0.34.
DEFAULT_PRIVATE_CENTRE_QUANTILE = 0.3


class AnalyzeGaussParams(CenterParams):
    """Params of ``analyze_gauss``: the clip norm, the centring and the clip quantile."""

    center_route: Literal["auto", "mean"] = Field(
        default="auto",
        description=(
            'With center "private" and a clip_quantile: "auto" chooses the private mean, '
            "differences of publicly paired rows or no centring from a probe of the row "
            'norms (extras.centring; only the mean route releases a centre); "mean" always '
            "centres on the private mean (as before the choice existed). Data registered by "
            "reference always take the mean route."
        ),
    )

    clip_quantile: float | str | None = Field(
        default=None,
        description=(
            "When set (e.g. 0.3), the rows X^T X is computed from (after centring) are clipped "
            "at a private q-quantile of their norms, an edge of a public grid C 2^(-j/4) below "
            "clip_norm, released in extras.row_clip_norm; it costs a small share of the "
            "budget and saves noise when most rows are much shorter than clip_norm (raw "
            'features, centred rows). Omitted: with center "private" the service uses '
            f"{DEFAULT_PRIVATE_CENTRE_QUANTILE:g} (the best measured value, recorded in the "
            "release's params; the centring route is then chosen too, see center_route), "
            'otherwise none. "none" (or null with center "private"): clip at clip_norm only.'
        ),
    )

    @field_validator("clip_quantile")
    @classmethod
    def _quantile_or_none(cls, value: float | str | None) -> float | str | None:
        # One message at params.clip_quantile whatever was wrong (a union would name a branch).
        if isinstance(value, str) and value != "none":
            raise ValueError('expected a number in (0, 1], "none" or null')
        if isinstance(value, float) and not (0.0 < value <= 1.0):
            raise ValueError('must be a number in (0, 1] (or "none" or null)')
        return value

    @model_validator(mode="before")
    @classmethod
    def _explicit_opt_out(cls, raw: Any) -> Any:
        # An explicit null under a private centre is the analyst's opt-out from the default
        # quantile; it is recorded as "none" so that re-parsing the stored params (the worker
        # does) runs what was asked, not the default.
        if (
            isinstance(raw, dict)
            and raw.get("center") == "private"
            and "clip_quantile" in raw
            and raw["clip_quantile"] is None
        ):
            return {**raw, "clip_quantile": "none"}
        return raw

    @property
    def quantile(self) -> float | None:
        """The clip quantile the run uses: None when unset or opted out ("none")."""
        return self.clip_quantile if isinstance(self.clip_quantile, float) else None


def with_default_quantile(params: AnalyzeGaussParams) -> AnalyzeGaussParams:
    """``params`` with the default clip quantile filled in under a private centre (issue 32,
    item 1): a function of the request's params only, resolved at ``prepare`` so the stored
    params say what ran; a stored request without it (from before the default) re-parses to
    no quantile, as it was charged."""
    if params.center == "private" and params.clip_quantile is None:
        return params.model_copy(update={"clip_quantile": DEFAULT_PRIVATE_CENTRE_QUANTILE})
    return params


@dataclass(frozen=True)
class GaussSplit:
    """The GDP parameters of a release's steps (``mean_mu``/``clip_mu`` 0 when unused);
    ``mean_mu^2 + clip_mu^2 + variance_mu^2 + gram_mu^2 = total_mu^2``."""

    total_mu: float
    mean_mu: float
    clip_mu: float
    variance_mu: float
    gram_mu: float


def gauss_split(epsilon: float, delta: float, params: AnalyzeGaussParams) -> GaussSplit:
    """The request's ``mu`` (largest with ``delta_G(mu, eps) <= delta``) shared as documented
    in the module."""
    total = gaussian_total_mu(epsilon, delta, 0.0, 0.0)
    mean = params.center_share if params.center == "private" else 0.0
    clip = CLIP_SHARE if params.quantile is not None else 0.0
    gram = 1.0 - mean - clip - VARIANCE_SHARE
    if gram <= 0:
        raise InvalidParameter(
            "center_share",
            f"must leave a share for X^T X: at most {1 - clip - VARIANCE_SHARE:g} here",
        )
    return GaussSplit(
        total,
        math.sqrt(mean) * total,
        math.sqrt(clip) * total,
        math.sqrt(VARIANCE_SHARE) * total,
        math.sqrt(gram) * total,
    )


def gram_sensitivity(clip_norm: float) -> float:
    """l2 sensitivity of the upper triangle of ``X^T X`` under replacement: ``sqrt(2) C^2``."""
    return math.sqrt(2.0) * clip_norm**2


def noise_sigma(clip_norm: float, epsilon: float, delta: float) -> float:
    """Per-entry standard deviation of ``E(sigma)`` for ``analyze_gauss``."""
    return analytic_gaussian_sigma(gram_sensitivity(clip_norm), epsilon, delta)


#: The subspace error (spectral norm of ``sin Theta``) for which previews state the gap needed.
TARGET_SUBSPACE_ERROR = 0.1


def gap_for_error(noise_norm: float, error: float) -> float:
    """Eigengap ``lambda_k - lambda_{k+1}`` of ``X^T X`` that keeps ``||sin Theta|| <= error``.

    Davis-Kahan with Weyl: ``||sin Theta|| <= ||E|| / (gap - ||E||)`` when ``gap > ||E||``, so
    ``gap >= ||E|| (1 + 1/error)`` suffices.
    """
    return noise_norm * (1.0 + 1.0 / error)


def chooses_centring(params: AnalyzeGaussParams) -> bool:
    """Whether a release chooses its centring (:mod:`service.mechanisms.centring_choice`):
    a private centre with a clip quantile (the probe is the quantile's step)."""
    return (
        params.center == "private" and params.quantile is not None and params.center_route == "auto"
    )
