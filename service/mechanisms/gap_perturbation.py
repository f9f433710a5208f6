"""M2 ``gap_perturbation``: propose-test-release on the eigengap, then noise on the projector.

Dwork, Talwar, Thakurta & Zhang, "Analyze Gauss: Optimal Bounds for Privacy-Preserving PCA",
STOC 2014, Algorithm 2 (seed 002).

Privacy: the gap ``g = lambda_k - lambda_{k+1}`` of the clipped ``X^T X`` moves by at most
``2 C^2`` when a row is replaced, so ``g + Lap(2 C^2/eps1)`` is ``eps1``-DP and its lower bound
``g_low`` exceeds ``g`` with probability ``delta1``. Outside that event, Davis-Kahan with Weyl
bounds ``||P(X) - P(X')||_F`` by ``s = 2 C^2/(g_low - C^2)``, so ``E(sigma)`` for
``(s, eps2, delta2)`` makes ``P + E`` private; a failed test is a private output too.
Cost: ``(eps, delta)`` with ``eps1 = eps2 = eps/2``, ``delta1 = delta2 = delta/2``.

Floating point: clipping is right at every finite scale (power-of-two rescaling); clip norms
for which ``n C^2`` or the Laplace scale is not a comfortable double are refused before charging,
which also keeps ``s`` finite (``g_low - C^2``, when positive, is at least an ulp of ``C^2``, so
``s <= 2^54``); the eigensolver has a fixed public fallback (:mod:`service.mechanisms.linalg`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from service.mechanisms.base import (
    ClipParams,
    ClippingMechanism,
    MechanismOutput,
    PublicContext,
    ReleaseSpec,
)
from service.mechanisms.linalg import (
    FloatArray,
    clipped_gram,
    clipped_gram_memory,
    eigh_memory,
    projector,
    top_k_eigh,
)
from service.mechanisms.noise import analytic_gaussian_sigma, laplace, symmetric_gaussian

#: The reason a failed propose-test-release reports (public wording, no data-derived number).
GAP_TOO_SMALL = "eigengap too small for this budget"


class GapPerturbationParams(ClipParams):
    """Params of ``gap_perturbation``: only the clip norm."""


def top_k_with_gap(gram: FloatArray, k: int) -> tuple[FloatArray, float]:
    """Top-k eigenvectors of a PSD matrix and its eigengap ``lambda_k - lambda_{k+1}``.

    Parameters
    ----------
    gram : (d, d) array
        Symmetric positive semi-definite (``X^T X`` of clipped rows).
    k : int
        ``1 <= k <= d``. For ``k = d`` the missing ``lambda_{d+1}`` is taken as 0 (the
        eigenvalue of ``X^T X`` embedded in one more dimension), which keeps every bound valid.

    Returns
    -------
    vectors : (d, k) array
        Orthonormal eigenvectors of the ``k`` largest eigenvalues.
    gap : float
        ``lambda_k - lambda_{k+1}`` (non-private).
    """
    d = gram.shape[0]
    values, vectors = top_k_eigh(gram, min(k + 1, d))
    next_value = float(values[k]) if k < d else 0.0
    return vectors[:, :k].copy(), float(values[k - 1]) - next_value


@dataclass(frozen=True)
class GapTest:
    """Outcome of the PTR step: the noisy lower bound on the gap (private, ``eps1``-DP)."""

    gap_low: float
    passed: bool


def gap_test(
    gap: float, clip_norm: float, epsilon1: float, delta1: float, rng: np.random.Generator
) -> GapTest:
    """``g_low = g + Lap(2 C^2/eps1) - (2 C^2/eps1) ln(1/(2 delta1))``; pass iff ``g_low > C^2``.

    ``P[Lap(b) > b ln(1/(2 delta1))] = delta1``, hence ``P[g_low > g] = delta1``.
    """
    scale = 2.0 * clip_norm**2 / epsilon1
    noisy_gap = gap + float(laplace(scale, rng))
    gap_low = noisy_gap - scale * math.log(1.0 / (2.0 * delta1))
    return GapTest(gap_low=gap_low, passed=gap_low > clip_norm**2)


def projector_sensitivity(gap_low: float, clip_norm: float) -> float:
    """``s = 2 C^2/(g_low - C^2)``: Frobenius sensitivity of the projector when ``g >= g_low``."""
    return 2.0 * clip_norm**2 / (gap_low - clip_norm**2)


def gap_perturbation(
    data: FloatArray,
    k: int,
    epsilon: float,
    delta: float,
    clip_norm: float,
    rng: np.random.Generator,
) -> FloatArray | None:
    """Release a basis of the top-k eigenvectors of ``U_k U_k^T + E(sigma)``, or ``None``.

    Parameters
    ----------
    data : (n, d) array
        The rows; may be a read-only memory map (read in chunks, memory ``O(d^2)``).
    k : int
        Dimension of the released subspace, ``1 <= k <= d``.
    epsilon, delta : float
        Total privacy cost, ``epsilon > 0``, ``0 < delta < 1``; each half goes to the test and
        to the release.
    clip_norm : float
        Public row norm bound ``C``.
    rng : numpy.random.Generator
        The release's generator.

    Returns
    -------
    basis : (d, k) array or None
        Orthonormal basis of the released subspace; ``None`` when the gap test fails.
    """
    epsilon1 = epsilon2 = epsilon / 2.0
    delta1 = delta2 = delta / 2.0
    gram = clipped_gram(data, clip_norm)
    vectors, gap = top_k_with_gap(gram, k)
    test = gap_test(gap, clip_norm, epsilon1, delta1, rng)
    if not test.passed:
        return None
    sigma = analytic_gaussian_sigma(
        projector_sensitivity(test.gap_low, clip_norm), epsilon2, delta2
    )
    noisy = projector(vectors) + symmetric_gaussian(gram.shape[0], sigma, rng)
    _, basis = top_k_eigh(noisy, k)
    return basis


class GapPerturbation(ClippingMechanism[GapPerturbationParams]):
    name: ClassVar[str] = "gap_perturbation"
    title: ClassVar[str] = "Subspace perturbation with propose-test-release on the eigengap"
    paper: ClassVar[str] = (
        "Dwork, Talwar, Thakurta & Zhang, Analyze Gauss: Optimal Bounds for "
        "Privacy-Preserving PCA, STOC 2014, Algorithm 2"
    )
    summary: ClassVar[str] = (
        "Tests privately (eps/2, Laplace) that the k-th eigengap of the clipped X^T X exceeds "
        "C^2, then adds Gaussian noise (eps/2, delta/2) scaled to 2C^2/(gap - C^2) to the top-k "
        "projector. Assumes a row norm bound and a large eigengap (about C^2 (1 + 4 ln(1/delta)"
        "/eps) or more); very accurate when the gap is large. Otherwise ends with no_result, "
        "which is charged."
    )
    params_model: ClassVar[type[GapPerturbationParams]] = GapPerturbationParams

    def c2_multiples(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float
    ) -> tuple[float, float]:
        # Per unit C^2: eigenvalues <= d n; the Laplace scale b = 4/eps, its draws (<= 64 b) and
        # the shift b ln(1/delta) that makes g_low.
        scale = 4.0 / epsilon
        return min(1.0, scale), ctx.n_cols * ctx.n_rows + scale * (64.0 + math.log(1.0 / delta))

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[GapPerturbationParams]) -> int:
        d, k = ctx.n_cols, spec.k
        # The Gram matrix stays alive throughout; then the projector beside E(sigma)'s four
        # d x d arrays and their sum (measured: just over 6 d^2; 7 leaves room); then the noisy
        # matrix and its eigensolver.
        return max(
            clipped_gram_memory(ctx.n_rows, d),
            8 * d * d + eigh_memory(d, k + 1) + 8 * 2 * d * (k + 1),
            8 * (7 * d * d),
            8 * (2 * d * d) + eigh_memory(d, k),
        )

    def run(
        self,
        data: FloatArray,
        spec: ReleaseSpec[GapPerturbationParams],
        rng: np.random.Generator,
    ) -> MechanismOutput:
        assert spec.params.clip_norm is not None  # resolved by prepare
        basis = gap_perturbation(data, spec.k, spec.epsilon, spec.delta, spec.params.clip_norm, rng)
        # Extras stay empty: the gap, g_low and the noise scale (a function of g_low) would be
        # raw Laplace-noised doubles, exactly the floating-point leak the docs warn about.
        if basis is None:
            return MechanismOutput.no_result(GAP_TOO_SMALL)
        return MechanismOutput(basis=basis)
