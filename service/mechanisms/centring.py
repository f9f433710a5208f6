"""Centring for the Gram mechanisms (PCA semantics): ``analyze_gauss``, ``spectrum``,
``gap_perturbation`` and ``smooth_sensitivity``.

``center = "private"``: a share ``s`` of the budget releases
``mu_hat = mean_i clip_C(x_i) + N(0, sigma_mu^2 I)``, ``sigma_mu`` the analytic-Gaussian scale
for l2 sensitivity ``2C/n`` at ``(s eps, s delta)`` (replacing one row moves the mean of rows of
norm ``<= C`` by ``(a - b)/n``, of norm ``<= 2C/n``; ``n`` is public). The Gram step then runs at
``((1 - s) eps, (1 - s) delta)`` on the rows ``clip_C(clip_C(x) - mu_hat)``: given the released
(public) ``mu_hat`` this is a fixed per-row map into the ball of radius ``C``, so the Gram
sensitivity is still ``sqrt(2) C^2``. Sequential (adaptive) composition: the total is exactly
``(eps, delta)``. Centred rows are clipped to ``C`` rather than their a-priori bound ``2C``
(which would quadruple the noise): centred rows are usually shorter than uncentred ones, so
the second clip rarely bites. A public centre (``d`` numbers of norm ``<= C``, chosen without
the data) costs nothing; all the budget goes to the Gram step.

Pure variant (``delta = 0``, only ``smooth_sensitivity``): the mean's share is ``(s eps, 0)`` and
its noise is Laplace, ``Lap(b)`` per coordinate with ``b = 2 C sqrt(d)/(n s eps)``: the l1 norm
of ``(a - b)/n`` is at most ``sqrt(d)`` times its l2 norm, so at most ``2 C sqrt(d)/n`` (attained
up to the factor by ``a = -b = C (1, .., 1)/sqrt(d)``), and the Laplace mechanism with l1
sensitivity ``D1`` and scale ``D1/eps`` is ``(eps, 0)``-DP. Sequential composition of two pure
stages is pure: the total is ``(eps, 0)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from service.mechanisms.base import (
    ClipParams,
    ClippingMechanism,
    GaussianStep,
    InvalidParameter,
    PreviewValue,
    PrivacyStep,
    PublicContext,
    PureStep,
    check_clip_scale,
    resolve_clip_norm,
)
from service.mechanisms.linalg import FloatArray, clipped_sum
from service.mechanisms.noise import GRID_DIVISOR, analytic_gaussian_sigma, laplace, round_to_grid

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]

#: The default share of ``(epsilon, delta)`` spent on the private mean.
DEFAULT_CENTER_SHARE = 0.2


class CenterParams(ClipParams):
    """Params of the Gram mechanisms that centre: the clip norm and the centring."""

    center: Literal["none", "private"] | list[FiniteFloat] = Field(
        default="none",
        description=(
            'How rows are centred before X^T X (PCA semantics). "none": not centred (the '
            'second-moment matrix). "private": on a private mean released with center_share of '
            "(epsilon, delta) (returned in extras.center; a private output). A list of d "
            "numbers of norm <= clip_norm: a public centre, chosen without looking at the data "
            "(no budget). Centred rows are clipped to clip_norm again."
        ),
    )
    center_share: float = Field(
        default=DEFAULT_CENTER_SHARE,
        gt=0,
        lt=1,
        allow_inf_nan=False,
        description=(
            'Share s of the budget spent on the private mean when center is "private": of '
            "mu^2 for analyze_gauss (its steps compose in Gaussian DP; the explained-variance "
            "estimate and a clip quantile take their own shares first), of (epsilon, delta) "
            "for the others (the Gram step gets 1 - s). Ignored otherwise."
        ),
    )

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A release records what ran: an uncentred one reads as it did before centring existed,
        # and center_share appears only where a budget was split by it. Re-parsing the record
        # restores the omitted defaults, so the run is the same.
        data: dict[str, Any] = handler(self)
        if self.center == "none":
            data.pop("center", None)
        if self.center != "private":
            data.pop("center_share", None)
        # analyze_gauss's clip quantile, likewise recorded only when used, and its opt-out
        # ("none") only where it opts out of a default (under a private centre).
        quantile = data.get("clip_quantile", 0)
        if quantile is None or (quantile == "none" and self.center != "private"):
            data.pop("clip_quantile")
        # analyze_gauss's centring route, recorded only where it applies.
        if "center_route" in data and (
            self.center != "private" or data.get("clip_quantile") in (None, "none")
        ):
            data.pop("center_route")
        return data


@dataclass(frozen=True)
class BudgetSplit:
    """``(epsilon, delta)`` of the private mean (zero when not used) and of the Gram step."""

    mean_epsilon: float
    mean_delta: float
    gram_epsilon: float
    gram_delta: float


def budget_split(epsilon: float, delta: float, params: CenterParams) -> BudgetSplit:
    """Sequential composition: mean ``s (eps, delta)``, Gram ``(1 - s) (eps, delta)``."""
    if params.center != "private":
        return BudgetSplit(0.0, 0.0, epsilon, delta)
    share = params.center_share
    return BudgetSplit(share * epsilon, share * delta, (1 - share) * epsilon, (1 - share) * delta)


def mean_sensitivity(clip_norm: float, n_rows: int) -> float:
    """l2 sensitivity of the mean of rows clipped to ``C`` under replacement (``n`` public)."""
    return 2.0 * clip_norm / n_rows


def mean_sigma(clip_norm: float, n_rows: int, epsilon: float, delta: float) -> float:
    """Per-coordinate standard deviation of the private mean's noise at ``(epsilon, delta)``."""
    return analytic_gaussian_sigma(mean_sensitivity(clip_norm, n_rows), epsilon, delta)


def mean_l1_sensitivity(clip_norm: float, n_rows: int, n_cols: int) -> float:
    """l1 sensitivity of the mean of rows clipped to ``C``: ``2 C sqrt(d)/n`` (Cauchy-Schwarz)."""
    return 2.0 * clip_norm * math.sqrt(n_cols) / n_rows


def mean_laplace_scale(clip_norm: float, n_rows: int, n_cols: int, epsilon: float) -> float:
    """Per-coordinate Laplace scale ``b = 2 C sqrt(d)/(n eps)`` of the pure private mean."""
    return mean_l1_sensitivity(clip_norm, n_rows, n_cols) / epsilon


def mean_noise_scale(clip_norm: float, n_rows: int, n_cols: int, split: BudgetSplit) -> float:
    """The private mean's per-coordinate noise scale at ``split``: the Gaussian ``sigma_mu``
    when ``split.mean_delta > 0``, else the Laplace scale of the pure variant."""
    if split.mean_delta > 0:
        return mean_sigma(clip_norm, n_rows, split.mean_epsilon, split.mean_delta)
    return mean_laplace_scale(clip_norm, n_rows, n_cols, split.mean_epsilon)


def private_center_pure(
    data: FloatArray, clip_norm: float, epsilon: float, rng: np.random.Generator
) -> FloatArray:
    """``mu_hat = mean_i clip_C(x_i) + Lap(2 C sqrt(d)/(n eps))^d``, ``(epsilon, 0)``-DP.

    Parameters
    ----------
    data : (n, d) array, ``n >= 1``
    clip_norm, epsilon : float
        ``C`` and this stage's epsilon.
    rng : numpy.random.Generator

    Returns
    -------
    (d,) array
        The noisy mean, rounded to multiples of ``b / 1000`` (it is released directly).
    """
    n, d = data.shape
    scale = mean_laplace_scale(clip_norm, n, d, epsilon)
    mean = clipped_sum(data, clip_norm) / n
    return round_to_grid(mean + laplace(scale, rng, size=d), scale / GRID_DIVISOR)


def private_center(
    data: FloatArray, clip_norm: float, epsilon: float, delta: float, rng: np.random.Generator
) -> FloatArray:
    """``mu_hat = mean_i clip_C(x_i) + N(0, sigma_mu^2 I)``, ``(epsilon, delta)``-DP.

    Parameters
    ----------
    data : (n, d) array, ``n >= 1``
    clip_norm, epsilon, delta : float
        ``C`` and this stage's share of the budget.
    rng : numpy.random.Generator

    Returns
    -------
    (d,) array
        The noisy mean, rounded to multiples of ``sigma_mu / 1000`` (it is released directly).
    """
    return private_center_sigma(
        data, clip_norm, mean_sigma(clip_norm, data.shape[0], epsilon, delta), rng
    )


def private_center_sigma(
    data: FloatArray, clip_norm: float, sigma: float, rng: np.random.Generator
) -> FloatArray:
    """``mu_hat = mean_i clip_C(x_i) + N(0, sigma^2 I)``: ``(2C/n)/sigma``-GDP; rounded to
    multiples of ``sigma / 1000`` (it is released directly)."""
    n, d = data.shape
    mean = clipped_sum(data, clip_norm) / n
    return round_to_grid(mean + rng.normal(0.0, sigma, size=d), sigma / GRID_DIVISOR)


def center_steps(ctx: PublicContext, params: CenterParams, split: BudgetSplit) -> list[PrivacyStep]:
    """The private mean's step, if any: Gaussian of sensitivity ``2C/n`` and ``sigma_mu``
    (``(2C/n)^2/(2 sigma_mu^2)``-zCDP), or the pure variant's ``(s eps)``-DP Laplace. Composed
    with the Gram step by summing ``rho`` (``mu^2`` for two Gaussians)."""
    if params.center != "private":
        return []
    assert params.clip_norm is not None  # resolved by prepare
    if split.mean_delta > 0:
        return [
            GaussianStep(
                mean_sensitivity(params.clip_norm, ctx.n_rows),
                mean_sigma(params.clip_norm, ctx.n_rows, split.mean_epsilon, split.mean_delta),
            )
        ]
    return [PureStep(split.mean_epsilon)]


def check_center_shape(ctx: PublicContext, params: CenterParams) -> None:
    """Public-fact checks of ``center`` that need no clip norm; raise :class:`InvalidParameter`."""
    if params.center == "private" and ctx.n_rows < 1:
        raise InvalidParameter("center", "a private mean needs at least one row")
    if isinstance(params.center, list) and len(params.center) != ctx.n_cols:
        raise InvalidParameter(
            "center",
            f"a public centre needs one number per column: {ctx.n_cols}, got {len(params.center)}",
        )


def with_center_multiples(
    ctx: PublicContext, split: BudgetSplit, params: CenterParams, low: float, high: float
) -> tuple[float, float]:
    """Widen a mechanism's ``(low, high)`` multiples of ``C^2`` by the private mean's.

    The mean is linear in ``C``: ``C m`` stays in ``[2^-484.5, 2^480]`` when ``C^2 m^2`` stays in
    the safe range, so its largest value (``C + 64 sigma_mu``) and its grid enter squared.
    """
    if params.center != "private":
        return low, high
    unit_mu = mean_noise_scale(1.0, max(1, ctx.n_rows), ctx.n_cols, split)
    return min(low, (unit_mu / GRID_DIVISOR) ** 2), max(high, (1.0 + 64.0 * unit_mu) ** 2)


def prepare_centred(
    ctx: PublicContext, params: CenterParams, multiples: tuple[float, float]
) -> float:
    """Resolve and check the clip norm against ``multiples``, check a public centre's norm;
    return the clip norm."""
    check_center_shape(ctx, params)
    clip_norm = resolve_clip_norm(params.clip_norm, ctx)
    check_clip_scale(clip_norm, *multiples)
    if isinstance(params.center, list):
        # A centre outside the ball of radius C is no mean of clipped rows, and bounding it
        # keeps clip_C(x) - c far from overflow. math.hypot scales, so it cannot overflow.
        norm = math.hypot(*params.center)
        if norm > clip_norm:
            raise InvalidParameter(
                "center",
                f"a public centre must have norm <= clip_norm ({clip_norm:.6g}); got {norm:.6g}",
            )
    return clip_norm


def center_for_run(
    data: FloatArray, params: CenterParams, split: BudgetSplit, rng: np.random.Generator
) -> tuple[FloatArray | None, dict[str, Any]]:
    """The centre the Gram step uses, and the extras it adds (the private mean, when drawn)."""
    assert params.clip_norm is not None  # resolved by prepare
    if params.center == "private":
        if split.mean_delta > 0:
            center = private_center(
                data, params.clip_norm, split.mean_epsilon, split.mean_delta, rng
            )
        else:
            center = private_center_pure(data, params.clip_norm, split.mean_epsilon, rng)
        return center, {"center": center.tolist()}
    if isinstance(params.center, list):
        return np.asarray(params.center, dtype=np.float64), {}
    return None, {}


def center_preview(
    ctx: PublicContext, params: CenterParams, split: BudgetSplit
) -> tuple[dict[str, PreviewValue], list[str]]:
    """The centring's preview scales and what they mean."""
    assert params.clip_norm is not None  # resolved by prepare
    kind = params.center if isinstance(params.center, str) else "public"
    scales: dict[str, PreviewValue] = {
        "center": kind,
        "gram_epsilon": split.gram_epsilon,
        "gram_delta": split.gram_delta,
    }
    meaning: list[str] = []
    if kind == "private" and split.mean_delta == 0:
        scale = mean_noise_scale(params.clip_norm, ctx.n_rows, ctx.n_cols, split)
        scales.update(
            center_laplace_scale=scale,
            center_grid=scale / GRID_DIVISOR,
            center_epsilon=split.mean_epsilon,
            center_delta=0.0,
        )
        meaning.append(
            f"The mean of the clipped rows (l1 sensitivity 2C sqrt(d)/n) gets Laplace noise of "
            f"scale {scale:.4g} per coordinate (pure DP), paid with {params.center_share:g} of "
            "epsilon; rows are centred on it and clipped to C again, and the rest uses the "
            "remainder."
        )
    elif kind == "private":
        mu_sigma = mean_sigma(params.clip_norm, ctx.n_rows, split.mean_epsilon, split.mean_delta)
        scales.update(
            center_sigma=mu_sigma,
            center_grid=mu_sigma / GRID_DIVISOR,
            center_epsilon=split.mean_epsilon,
            center_delta=split.mean_delta,
        )
        meaning.append(
            f"The mean of the clipped rows (l2 sensitivity 2C/n) gets Gaussian noise of "
            f"standard deviation {mu_sigma:.4g} per coordinate, paid with "
            f"{params.center_share:g} of the budget; rows are centred on it and clipped to C "
            "again, and X^T X uses the rest."
        )
    elif kind == "public":
        meaning.append(
            "Rows are centred on the given public centre (no budget) and clipped to C again."
        )
    return scales, meaning


CentredP = TypeVar("CentredP", bound=CenterParams)


class CentredGramMechanism(ClippingMechanism[CentredP]):
    """A Gram mechanism with ``center``: the shape checks, the clip-norm scale check widened by
    the private mean's multiples, and a public centre's norm check, shared by ``prepare``.

    Subclasses give :meth:`centred_multiples` (their own multiples of ``C^2`` at the request's
    params, see :meth:`ClippingMechanism.c2_multiples`) and may refuse further public facts in
    :meth:`check_budget` before anything else is resolved.
    """

    def centred_multiples(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: CentredP
    ) -> tuple[float, float]:
        """``(smallest, largest)`` multiple of ``C^2`` the run computes with these params."""
        raise NotImplementedError

    def check_budget(self, k: int, epsilon: float, delta: float, params: CentredP) -> None:
        """Refusals that depend on the budget and params (none by default)."""

    def check_specific(self, ctx: PublicContext, k: int, params: CentredP) -> None:
        check_center_shape(ctx, params)

    def c2_multiples(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float
    ) -> tuple[float, float]:
        return self.centred_multiples(ctx, k, epsilon, delta, self.parse_params({}))

    def prepare(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: CentredP
    ) -> CentredP:
        self.check_common(ctx, k, epsilon, delta)
        self.check_specific(ctx, k, params)
        self.check_budget(k, epsilon, delta, params)
        multiples = self.centred_multiples(ctx, k, epsilon, delta, params)
        clip_norm = prepare_centred(ctx, params, multiples)
        return params.model_copy(update={"clip_norm": clip_norm})
