"""M1 ``analyze_gauss``: Gaussian noise on the clipped second-moment matrix.

Dwork, Talwar, Thakurta & Zhang, "Analyze Gauss: Optimal Bounds for Privacy-Preserving PCA",
STOC 2014, Algorithm 1 (seed 002).

Privacy: rows are clipped to the public norm ``C``, so replacing one row changes ``H = X^T X`` by
``a a^T - b b^T``, whose upper triangle (diagonal included) has l2 norm ``<= sqrt(2) C^2``.
Adding a symmetric Gaussian matrix whose upper-triangle entries have the analytic-Gaussian
``sigma`` for ``D = sqrt(2) C^2`` makes ``H_hat`` ``(eps, delta)``-DP; the top-k eigenvectors and
eigenvalues of ``H_hat`` are post-processing. Cost: exactly ``(eps, delta)``.

Centring (PCA semantics, ``center``): with ``"private"``, a share ``s`` of the budget releases
``mu_hat = mean_i clip_C(x_i) + N(0, sigma_mu^2 I)``, ``sigma_mu`` the analytic-Gaussian scale for
l2 sensitivity ``2C/n`` at ``(s eps, s delta)`` (replacing one row moves the mean of rows of norm
``<= C`` by ``(a - b)/n``, norm ``<= 2C/n``; ``n`` is public). The Gram step then runs at
``((1 - s) eps, (1 - s) delta)`` on the rows ``clip_C(clip_C(x) - mu_hat)``: given the released
(public) ``mu_hat`` this is a fixed per-row map into the ball of radius ``C``, so the Gram
sensitivity is still ``sqrt(2) C^2``. Sequential (adaptive) composition: the total is
``(s eps + (1 - s) eps, s delta + (1 - s) delta) = (eps, delta)``. We clip the centred rows to
``C`` rather than use their a-priori bound ``2C`` (which would quadruple ``sigma``): centred rows
are usually shorter than uncentred ones, so the second clip rarely bites. A public centre
(a list of ``d`` numbers of norm ``<= C``) is data-independent and costs nothing; all the budget
goes to the Gram step.

Floating point: rows are clipped after a power-of-two rescaling, so clipping is right at every
finite scale; clip norms for which ``n C^2`` or the noise scale is not a comfortable double are
refused before charging; the eigensolver has a fixed public fallback (see
:mod:`service.mechanisms.linalg`). The guarantee is the real-number one (see ``noise``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from service.mechanisms.base import (
    ClipParams,
    ClippingMechanism,
    InvalidParameter,
    MechanismOutput,
    Preview,
    PreviewValue,
    PublicContext,
    ReleaseSpec,
    check_clip_scale,
    resolve_clip_norm,
)
from service.mechanisms.linalg import (
    FloatArray,
    clipped_gram,
    clipped_gram_memory,
    clipped_sum,
    eigh_memory,
    top_k_eigh,
)
from service.mechanisms.noise import (
    GRID_DIVISOR,
    analytic_gaussian_sigma,
    round_to_grid,
    symmetric_gaussian,
)

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]

#: The default share of ``(epsilon, delta)`` spent on the private mean.
DEFAULT_CENTER_SHARE = 0.2


class AnalyzeGaussParams(ClipParams):
    """Params of ``analyze_gauss``: the clip norm and the centring."""

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
            'Share s of (epsilon, delta) spent on the private mean when center is "private"; '
            "the Gram step gets (1 - s). Ignored otherwise."
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
        return data


@dataclass(frozen=True)
class BudgetSplit:
    """``(epsilon, delta)`` of the private mean (zero when not used) and of the Gram step."""

    mean_epsilon: float
    mean_delta: float
    gram_epsilon: float
    gram_delta: float


def budget_split(epsilon: float, delta: float, params: AnalyzeGaussParams) -> BudgetSplit:
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
    n, d = data.shape
    sigma = mean_sigma(clip_norm, n, epsilon, delta)
    mean = clipped_sum(data, clip_norm) / n
    return round_to_grid(mean + rng.normal(0.0, sigma, size=d), sigma / GRID_DIVISOR)


def gram_sensitivity(clip_norm: float) -> float:
    """l2 sensitivity of the upper triangle of ``X^T X`` under replacement: ``sqrt(2) C^2``."""
    return math.sqrt(2.0) * clip_norm**2


def noise_sigma(clip_norm: float, epsilon: float, delta: float) -> float:
    """Per-entry standard deviation of ``E(sigma)`` for ``analyze_gauss``."""
    return analytic_gaussian_sigma(gram_sensitivity(clip_norm), epsilon, delta)


#: The subspace error (spectral norm of ``sin Theta``) for which previews state the gap needed.
TARGET_SUBSPACE_ERROR = 0.1


def expected_noise_norm(sigma: float, d: int) -> float:
    """``2 sigma sqrt(d)``: the spectral norm of ``E(sigma)`` for large ``d`` (semicircle law)."""
    return 2.0 * sigma * math.sqrt(d)


def gap_for_error(noise_norm: float, error: float) -> float:
    """Eigengap ``lambda_k - lambda_{k+1}`` of ``X^T X`` that keeps ``||sin Theta|| <= error``.

    Davis-Kahan with Weyl: ``||sin Theta|| <= ||E|| / (gap - ||E||)`` when ``gap > ||E||``, so
    ``gap >= ||E|| (1 + 1/error)`` suffices.
    """
    return noise_norm * (1.0 + 1.0 / error)


@dataclass(frozen=True)
class GaussRelease:
    """What the Gram step releases: basis ``(d, k)``, eigenvalues ``(k,)`` and the trace of
    ``H + E`` (the sum of all its eigenvalues), both rounded to ``sigma / 1000``."""

    basis: FloatArray
    eigenvalues: FloatArray
    trace: float


def gauss_release(
    data: FloatArray,
    k: int,
    epsilon: float,
    delta: float,
    clip_norm: float,
    rng: np.random.Generator,
    center: FloatArray | None = None,
) -> GaussRelease:
    """The top-k eigenpairs and the trace of ``H + E(sigma)``, ``H`` the Gram matrix of the
    rows clipped to ``C`` (centred on ``center`` and clipped again when given, see
    :func:`~service.mechanisms.linalg.clipped_gram`). Everything is post-processing of
    ``H + E``: ``(epsilon, delta)``-DP as a whole."""
    gram = clipped_gram(data, clip_norm, center=center)
    sigma = noise_sigma(clip_norm, epsilon, delta)
    noisy = gram + symmetric_gaussian(gram.shape[0], sigma, rng)
    values, vectors = top_k_eigh(noisy, k)
    grid = sigma / GRID_DIVISOR
    trace = float(round_to_grid(np.asarray([np.trace(noisy)]), grid)[0])
    return GaussRelease(vectors, round_to_grid(values, grid), trace)


def analyze_gauss(
    data: FloatArray,
    k: int,
    epsilon: float,
    delta: float,
    clip_norm: float,
    rng: np.random.Generator,
) -> tuple[FloatArray, FloatArray]:
    """Release the top-k eigenpairs of ``X^T X + E(sigma)`` (uncentred).

    Parameters
    ----------
    data : (n, d) array
        The rows; may be a read-only memory map (read in chunks, memory ``O(d^2)``).
    k : int
        Dimension of the released subspace, ``1 <= k <= d``.
    epsilon, delta : float
        Privacy cost, ``epsilon > 0``, ``0 < delta < 1``.
    clip_norm : float
        Public row norm bound ``C``.
    rng : numpy.random.Generator
        The release's generator.

    Returns
    -------
    basis : (d, k) array
        Orthonormal top-k eigenvectors of the noisy matrix.
    eigenvalues : (k,) array
        The matching noisy eigenvalues, descending, rounded to multiples of ``sigma / 1000``
        (the floating-point mitigation in :mod:`service.mechanisms.noise`).
    """
    release = gauss_release(data, k, epsilon, delta, clip_norm, rng)
    return release.basis, release.eigenvalues


class AnalyzeGauss(ClippingMechanism[AnalyzeGaussParams]):
    name: ClassVar[str] = "analyze_gauss"
    title: ClassVar[str] = "Analyze Gauss (Gaussian noise on X^T X)"
    paper: ClassVar[str] = (
        "Dwork, Talwar, Thakurta & Zhang, Analyze Gauss: Optimal Bounds for "
        "Privacy-Preserving PCA, STOC 2014, Algorithm 1"
    )
    summary: ClassVar[str] = (
        "Adds a symmetric Gaussian matrix calibrated to sqrt(2) C^2 to the clipped X^T X and "
        "releases its top-k eigenvectors and eigenvalues, and the noisy trace. Optional PCA "
        "centring: on a private mean (a share of the budget) or a public centre. Assumes only a "
        "row norm bound; always returns a result; error grows with d / (n eps)."
    )
    params_model: ClassVar[type[AnalyzeGaussParams]] = AnalyzeGaussParams

    def check_specific(self, ctx: PublicContext, k: int, params: AnalyzeGaussParams) -> None:
        if params.center == "private" and ctx.n_rows < 1:
            raise InvalidParameter("center", "a private mean needs at least one row")
        if isinstance(params.center, list) and len(params.center) != ctx.n_cols:
            raise InvalidParameter(
                "center",
                f"a public centre needs one number per column: {ctx.n_cols}, got "
                f"{len(params.center)}",
            )

    def c2_multiples(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float
    ) -> tuple[float, float]:
        return self._c2_multiples(ctx, epsilon, delta, AnalyzeGaussParams())

    def _c2_multiples(
        self, ctx: PublicContext, epsilon: float, delta: float, params: AnalyzeGaussParams
    ) -> tuple[float, float]:
        # Per unit C^2: Gram entries <= n, noise draws <= 64 sigma, eigenvalues and the trace
        # <= d times the largest entry; the smallest is the rounding grid sigma / GRID_DIVISOR.
        # The private mean is linear in C: C m stays in [2^-484.5, 2^480] when C^2 m^2 stays in
        # the safe range, so its largest draw (C + 64 sigma_mu) and grid enter squared.
        split = budget_split(epsilon, delta, params)
        unit_sigma = noise_sigma(1.0, split.gram_epsilon, split.gram_delta)
        low = min(1.0, unit_sigma / GRID_DIVISOR)
        high = ctx.n_cols * (ctx.n_rows + 64.0 * unit_sigma)
        if params.center == "private":
            unit_mu = mean_sigma(1.0, max(1, ctx.n_rows), split.mean_epsilon, split.mean_delta)
            low = min(low, (unit_mu / GRID_DIVISOR) ** 2)
            high = max(high, (1.0 + 64.0 * unit_mu) ** 2)
        return low, high

    def prepare(
        self,
        ctx: PublicContext,
        k: int,
        epsilon: float,
        delta: float,
        params: AnalyzeGaussParams,
    ) -> AnalyzeGaussParams:
        self.check_common(ctx, k, epsilon, delta)
        self.check_specific(ctx, k, params)
        clip_norm = resolve_clip_norm(params.clip_norm, ctx)
        check_clip_scale(clip_norm, *self._c2_multiples(ctx, epsilon, delta, params))
        if isinstance(params.center, list):
            # A centre outside the ball of radius C is no mean of clipped rows, and bounding it
            # keeps clip_C(x) - c far from overflow. math.hypot scales, so it cannot overflow.
            norm = math.hypot(*params.center)
            if norm > clip_norm:
                raise InvalidParameter(
                    "center",
                    f"a public centre must have norm <= clip_norm ({clip_norm:.6g}); "
                    f"got {norm:.6g}",
                )
        return params.model_copy(update={"clip_norm": clip_norm})

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[AnalyzeGaussParams]) -> Preview:
        params = spec.params
        assert params.clip_norm is not None  # resolved by prepare
        split = budget_split(spec.epsilon, spec.delta, params)
        sigma = noise_sigma(params.clip_norm, split.gram_epsilon, split.gram_delta)
        norm = expected_noise_norm(sigma, ctx.n_cols)
        gap = gap_for_error(norm, TARGET_SUBSPACE_ERROR)
        kind = params.center if isinstance(params.center, str) else "public"
        scales: dict[str, PreviewValue] = {
            "center": kind,
            "sigma": sigma,
            "noise_spectral_norm": norm,
            "gap_for_error_0_1": gap,
            "eigenvalue_grid": sigma / GRID_DIVISOR,
            "gram_epsilon": split.gram_epsilon,
            "gram_delta": split.gram_delta,
        }
        meaning = [
            f"Each entry of the upper triangle of the clipped X^T X gets Gaussian noise of "
            f"standard deviation sigma = {sigma:.4g}.",
            f"The symmetric noise matrix has spectral norm about 2 sigma sqrt(d) = "
            f"{norm:.4g}; each released eigenvalue is within about that much of the true one "
            "(Weyl).",
            f"For a subspace error ||sin Theta|| <= 0.1 the k-th eigengap lambda_k - "
            f"lambda_(k+1) of the clipped X^T X must be at least about {gap:.4g} "
            "(Davis-Kahan with Weyl: error <= ||E|| / (gap - ||E||)).",
        ]
        if kind == "private":
            mu_sigma = mean_sigma(
                params.clip_norm, ctx.n_rows, split.mean_epsilon, split.mean_delta
            )
            scales.update(
                center_sigma=mu_sigma,
                center_grid=mu_sigma / GRID_DIVISOR,
                center_epsilon=split.mean_epsilon,
                center_delta=split.mean_delta,
            )
            meaning.append(
                f"The mean of the clipped rows (l2 sensitivity 2C/n) gets Gaussian noise of "
                f"standard deviation {mu_sigma:.4g} per coordinate, paid with "
                f"{params.center_share:g} of the budget; rows are centred on it and clipped to "
                "C again, and X^T X above uses the rest."
            )
        elif kind == "public":
            meaning.append(
                "Rows are centred on the given public centre (no budget) and clipped to C again."
            )
        return Preview(scales=scales, meaning=meaning)

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[AnalyzeGaussParams]) -> int:
        d = ctx.n_cols
        # The Gram matrix stays alive throughout; E(sigma) builds the draw, its upper triangle,
        # the strict upper triangle and their sum (4 d^2), then H + E; then the eigensolver.
        # The private mean's pass needs less than the centred Gram pass it precedes.
        centred = spec.params.center != "none"
        return max(
            clipped_gram_memory(ctx.n_rows, d, centred=centred),
            8 * (5 * d * d),
            8 * (2 * d * d) + eigh_memory(d, spec.k),
        )

    def run(
        self, data: FloatArray, spec: ReleaseSpec[AnalyzeGaussParams], rng: np.random.Generator
    ) -> MechanismOutput:
        params = spec.params
        assert params.clip_norm is not None  # resolved by prepare
        split = budget_split(spec.epsilon, spec.delta, params)
        extras: dict[str, object] = {}
        center: FloatArray | None = None
        if params.center == "private":
            center = private_center(
                data, params.clip_norm, split.mean_epsilon, split.mean_delta, rng
            )
            extras["center"] = center.tolist()
        elif isinstance(params.center, list):
            center = np.asarray(params.center, dtype=np.float64)
        release = gauss_release(
            data,
            spec.k,
            split.gram_epsilon,
            split.gram_delta,
            params.clip_norm,
            rng,
            center=center,
        )
        extras["eigenvalues"] = release.eigenvalues.tolist()
        extras["trace"] = release.trace
        return MechanismOutput(basis=release.basis, extras=extras)
