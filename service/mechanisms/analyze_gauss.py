"""M1 ``analyze_gauss``: Gaussian noise on the clipped second-moment matrix.

Dwork, Talwar, Thakurta & Zhang, "Analyze Gauss: Optimal Bounds for Privacy-Preserving PCA",
STOC 2014, Algorithm 1 (seed 002).

Privacy: rows are clipped to the public norm ``C``, so replacing one row changes ``H = X^T X`` by
``a a^T - b b^T``, whose upper triangle (diagonal included) has l2 norm ``<= sqrt(2) C^2``.
Adding a symmetric Gaussian matrix whose upper-triangle entries have the analytic-Gaussian
``sigma`` for ``D = sqrt(2) C^2`` makes ``H_hat`` ``(eps, delta)``-DP; the top-k eigenvectors and
eigenvalues of ``H_hat`` are post-processing. Cost: exactly ``(eps, delta)``.

Centring (PCA semantics, ``center``): a private mean with a share of the budget, or a public
centre; rows are centred and clipped to ``C`` again, so the sensitivity above is unchanged and
the total cost is still exactly ``(eps, delta)`` (proof in :mod:`service.mechanisms.centring`).

Floating point: rows are clipped after a power-of-two rescaling, so clipping is right at every
finite scale; clip norms for which ``n C^2`` or the noise scale is not a comfortable double are
refused before charging; the eigensolver has a fixed public fallback (see
:mod:`service.mechanisms.linalg`). The guarantee is the real-number one (see ``noise``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from service.mechanisms.base import (
    GaussianStep,
    MechanismOutput,
    Preview,
    PrivacyStep,
    PublicContext,
    ReleaseSpec,
)
from service.mechanisms.centring import (
    DEFAULT_CENTER_SHARE,
    BudgetSplit,
    CenterParams,
    CentredGramMechanism,
    budget_split,
    center_for_run,
    center_preview,
    center_steps,
    mean_sensitivity,
    mean_sigma,
    private_center,
    with_center_multiples,
)
from service.mechanisms.linalg import (
    FloatArray,
    clipped_gram,
    clipped_gram_memory,
    eigh_memory,
    top_k_eigh,
)
from service.mechanisms.noise import (
    GRID_DIVISOR,
    analytic_gaussian_sigma,
    round_to_grid,
    symmetric_gaussian,
)

__all__ = [
    "DEFAULT_CENTER_SHARE",
    "TARGET_SUBSPACE_ERROR",
    "AnalyzeGauss",
    "AnalyzeGaussParams",
    "BudgetSplit",
    "GaussRelease",
    "analyze_gauss",
    "budget_split",
    "expected_noise_norm",
    "gap_for_error",
    "gauss_release",
    "gram_sensitivity",
    "mean_sensitivity",
    "mean_sigma",
    "noise_sigma",
    "private_center",
]


class AnalyzeGaussParams(CenterParams):
    """Params of ``analyze_gauss``: the clip norm and the centring."""


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


class AnalyzeGauss(CentredGramMechanism[AnalyzeGaussParams]):
    name: ClassVar[str] = "analyze_gauss"
    accountings: ClassVar[frozenset[str]] = frozenset({"basic", "gaussian", "zcdp"})
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

    def centred_multiples(
        self,
        ctx: PublicContext,
        k: int,
        epsilon: float,
        delta: float,
        params: AnalyzeGaussParams,
    ) -> tuple[float, float]:
        # Per unit C^2: Gram entries <= n, noise draws <= 64 sigma, eigenvalues and the trace
        # <= d times the largest entry; the smallest is the rounding grid sigma / GRID_DIVISOR.
        split = budget_split(epsilon, delta, params)
        unit_sigma = noise_sigma(1.0, split.gram_epsilon, split.gram_delta)
        low = min(1.0, unit_sigma / GRID_DIVISOR)
        high = ctx.n_cols * (ctx.n_rows + 64.0 * unit_sigma)
        return with_center_multiples(ctx, split, params, low, high)

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[AnalyzeGaussParams]) -> Preview:
        params = spec.params
        assert params.clip_norm is not None  # resolved by prepare
        split = budget_split(spec.epsilon, spec.delta, params)
        sigma = noise_sigma(params.clip_norm, split.gram_epsilon, split.gram_delta)
        norm = expected_noise_norm(sigma, ctx.n_cols)
        gap = gap_for_error(norm, TARGET_SUBSPACE_ERROR)
        centring, centring_meaning = center_preview(ctx, params, split)
        return Preview(
            scales={
                "sigma": sigma,
                "noise_spectral_norm": norm,
                "gap_for_error_0_1": gap,
                "eigenvalue_grid": sigma / GRID_DIVISOR,
                **centring,
            },
            meaning=[
                f"Each entry of the upper triangle of the clipped X^T X gets Gaussian noise of "
                f"standard deviation sigma = {sigma:.4g}.",
                f"The symmetric noise matrix has spectral norm about 2 sigma sqrt(d) = "
                f"{norm:.4g}; each released eigenvalue is within about that much of the true "
                "one (Weyl).",
                f"For a subspace error ||sin Theta|| <= 0.1 the k-th eigengap lambda_k - "
                f"lambda_(k+1) of the clipped X^T X must be at least about {gap:.4g} "
                "(Davis-Kahan with Weyl: error <= ||E|| / (gap - ||E||)).",
                *centring_meaning,
            ],
        )

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[AnalyzeGaussParams]
    ) -> list[PrivacyStep]:
        """Purely Gaussian: the private mean's step (if centred) and ``E(sigma)`` on the Gram
        matrix, sensitivity ``sqrt(2) C^2``: ``mu^2 = sum (Delta/sigma)^2`` over both, ``rho =
        mu^2/2`` (the same sigma :meth:`run` draws)."""
        params = spec.params
        assert params.clip_norm is not None  # resolved by prepare
        split = budget_split(spec.epsilon, spec.delta, params)
        gram = GaussianStep(
            gram_sensitivity(params.clip_norm),
            noise_sigma(params.clip_norm, split.gram_epsilon, split.gram_delta),
        )
        return [*center_steps(ctx, params, split), gram]

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
        center, extras = center_for_run(data, params, split, rng)
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
        # Public (a function of the clip norm and the Gram step's budget): lets a client undo the
        # upward shift of the top noisy eigenvalues (PrivatePCA's explained variance).
        extras["gram_noise_std"] = noise_sigma(
            params.clip_norm, split.gram_epsilon, split.gram_delta
        )
        return MechanismOutput(basis=release.basis, extras=extras)
