"""M2 ``gap_perturbation``: propose-test-release on the eigengap, then noise on the projector.

Dwork, Talwar, Thakurta & Zhang, "Analyze Gauss: Optimal Bounds for Privacy-Preserving PCA",
STOC 2014, Algorithm 2 (seed 002).

Privacy: the gap ``g = lambda_k - lambda_{k+1}`` of the clipped ``X^T X`` moves by at most
``2 C^2`` when a row is replaced, so ``g + Lap(2 C^2/eps1)`` is ``eps1``-DP and its lower bound
``g_low`` exceeds ``g`` with probability ``delta1``. Outside that event, Davis-Kahan with Weyl
bounds ``||P(X) - P(X')||_F`` by ``s = 2 C^2/(g_low - C^2)``, so ``E(sigma)`` for
``(s, eps2, delta2)`` makes ``P + E`` private; a failed test is a private output too.
Cost: ``(eps, delta)`` with ``eps1 = eps2 = eps/2``, ``delta1 = delta2 = delta/2``.

Centring (``center``): a private mean with a share ``s`` of ``(eps, delta)`` (Gaussian, see
:mod:`service.mechanisms.centring`) or a public centre; the test and the release then split
``(1 - s)(eps, delta)`` in halves. Centred rows are clipped to ``C`` again, so the gap's
sensitivity ``2 C^2`` and the Davis-Kahan bound are unchanged given the (released) centre, and
sequential composition gives exactly ``(eps, delta)``.

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
    GaussianStep,
    MechanismOutput,
    Preview,
    PrivacyStep,
    PublicContext,
    ReleaseSpec,
    laplace_test_step,
)
from service.mechanisms.centring import (
    CenterParams,
    CentredGramMechanism,
    center_for_run,
    center_preview,
    center_steps,
    with_center_multiples,
)
from service.mechanisms.centring import budget_split as center_split
from service.mechanisms.linalg import (
    FloatArray,
    clipped_gram,
    clipped_gram_memory,
    eigh_memory,
    projector,
    top_k_eigh,
)
from service.mechanisms.noise import analytic_gaussian_sigma, laplace, symmetric_gaussian
from service.mechanisms.usefulness import count_above, usefulness_extras, wigner_edge

#: The reason a failed propose-test-release reports (public wording, no data-derived number).
GAP_TOO_SMALL = "eigengap too small for this budget"


class GapPerturbationParams(CenterParams):
    """Params of ``gap_perturbation``: the clip norm and the centring."""


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


@dataclass(frozen=True)
class Split:
    """``eps1 = eps2 = eps/2`` (test, release), ``delta1 = delta2 = delta/2``."""

    epsilon1: float
    epsilon2: float
    delta1: float
    delta2: float


def budget_split(epsilon: float, delta: float) -> Split:
    """Half of ``(eps, delta)`` to the gap test, half to the projector noise."""
    return Split(epsilon / 2.0, epsilon / 2.0, delta / 2.0, delta / 2.0)


def gap_noise_scale(clip_norm: float, epsilon1: float) -> float:
    """Laplace scale ``b = 2 C^2/eps1`` of the noisy gap (its sensitivity is ``2 C^2``)."""
    return 2.0 * clip_norm**2 / epsilon1


def gap_shift(scale: float, delta1: float) -> float:
    """``b ln(1/(2 delta1))``, subtracted so that ``P[g_low > g] = delta1``."""
    return scale * math.log(1.0 / (2.0 * delta1))


def gap_test(
    gap: float, clip_norm: float, epsilon1: float, delta1: float, rng: np.random.Generator
) -> GapTest:
    """``g_low = g + Lap(2 C^2/eps1) - (2 C^2/eps1) ln(1/(2 delta1))``; pass iff ``g_low > C^2``.

    ``P[Lap(b) > b ln(1/(2 delta1))] = delta1``, hence ``P[g_low > g] = delta1``.
    """
    scale = gap_noise_scale(clip_norm, epsilon1)
    noisy_gap = gap + float(laplace(scale, rng))
    gap_low = noisy_gap - gap_shift(scale, delta1)
    return GapTest(gap_low=gap_low, passed=gap_low > clip_norm**2)


def projector_sensitivity(gap_low: float, clip_norm: float) -> float:
    """``s = 2 C^2/(g_low - C^2)``: Frobenius sensitivity of the projector when ``g >= g_low``."""
    return 2.0 * clip_norm**2 / (gap_low - clip_norm**2)


def projector_sigma(gap_low: float, clip_norm: float, epsilon2: float, delta2: float) -> float:
    """Per-entry ``sigma`` of the projector noise: the analytic Gaussian for
    ``s = 2 C^2/(g_low - C^2)`` (linear in ``s``)."""
    return analytic_gaussian_sigma(projector_sensitivity(gap_low, clip_norm), epsilon2, delta2)


def gap_perturbation(
    data: FloatArray,
    k: int,
    epsilon: float,
    delta: float,
    clip_norm: float,
    rng: np.random.Generator,
    center: FloatArray | None = None,
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
    center : (d,) array, optional
        A public (or already released) centre: rows are centred on it and clipped to ``C``
        again before ``X^T X``.

    Returns
    -------
    basis : (d, k) array or None
        Orthonormal basis of the released subspace; ``None`` when the gap test fails.
    """
    release = gap_perturbation_release(data, k, epsilon, delta, clip_norm, rng, center)
    return None if release is None else release.basis


@dataclass(frozen=True)
class GapRelease:
    """A passed test's release: the basis and how many of its directions stand out of the
    projector's noise (:func:`~service.mechanisms.usefulness.count_above`)."""

    basis: FloatArray
    components_above_noise: int


def gap_perturbation_release(
    data: FloatArray,
    k: int,
    epsilon: float,
    delta: float,
    clip_norm: float,
    rng: np.random.Generator,
    center: FloatArray | None = None,
) -> GapRelease | None:
    """:func:`gap_perturbation` (same parameters and draws), also counting the released
    directions whose noisy eigenvalue of ``P + E(sigma)`` is above the noise's edge
    ``2 sigma sqrt(d)``: the projector's eigenvalues are 1, so with ``2 sigma sqrt(d)`` near 1 or
    above the top-k eigenvectors are random-like (issue 24, item 5). ``sigma`` is a function of
    the released ``g_low``, the eigenvalues of the released ``P + E``: post-processing."""
    split = budget_split(epsilon, delta)
    gram = clipped_gram(data, clip_norm, center=center)
    vectors, gap = top_k_with_gap(gram, k)
    test = gap_test(gap, clip_norm, split.epsilon1, split.delta1, rng)
    if not test.passed:
        return None
    sigma = projector_sigma(test.gap_low, clip_norm, split.epsilon2, split.delta2)
    noisy = projector(vectors) + symmetric_gaussian(gram.shape[0], sigma, rng)
    values, basis = top_k_eigh(noisy, k)
    above = count_above(values, k, wigner_edge(sigma, gram.shape[0]))
    return GapRelease(basis, above)


class GapPerturbation(CentredGramMechanism[GapPerturbationParams]):
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
        "/eps) or more); otherwise ends with no_result, which is charged. Dominated "
        "everywhere: never more accurate than analyze_gauss (about 3x, at least 2.8x, worse "
        "wherever both run; docs/mechanisms.md, section gap_perturbation), which takes the "
        "same params and always runs. Kept for reproducing the paper; never chosen by auto, "
        "and a dry run carries a warning."
    )
    params_model: ClassVar[type[GapPerturbationParams]] = GapPerturbationParams
    accountings: ClassVar[frozenset[str]] = frozenset({"basic", "zcdp"})

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[GapPerturbationParams]
    ) -> list[PrivacyStep] | None:
        """The private mean's step (if centred); the gap test through the event ``g_low <=
        min(g, g')``, one set of outputs for both neighbours, on which the projector's
        sensitivity bound holds on both sides (:func:`~service.mechanisms.base.laplace_test_step`:
        ``e^eps1 delta1``-approximately, ``eps1 + ln(1/(1 - e^eps1 delta1))`` pure); the
        projector's Gaussian noise, ``sigma/s`` the analytic-Gaussian ratio at ``(eps2,
        delta2)``. ``None`` (basic only) when ``e^eps1 delta1 >= 1/2``."""
        centring = center_split(spec.epsilon, spec.delta, spec.params)
        split = budget_split(centring.gram_epsilon, centring.gram_delta)
        test = laplace_test_step(split.epsilon1, split.delta1)
        if test is None:
            return None
        return [
            *center_steps(ctx, spec.params, centring),
            test,
            GaussianStep(1.0, analytic_gaussian_sigma(1.0, split.epsilon2, split.delta2)),
        ]

    def centred_multiples(
        self,
        ctx: PublicContext,
        k: int,
        epsilon: float,
        delta: float,
        params: GapPerturbationParams,
    ) -> tuple[float, float]:
        # Per unit C^2: eigenvalues <= d n; the Laplace scale b = 4/eps, its draws (<= 64 b) and
        # the shift b ln(1/delta) that makes g_low (eps, delta: the Gram step's share).
        split = center_split(epsilon, delta, params)
        scale = 4.0 / split.gram_epsilon
        low = min(1.0, scale)
        high = ctx.n_cols * ctx.n_rows + scale * (64.0 + math.log(1.0 / split.gram_delta))
        return with_center_multiples(ctx, split, params, low, high)

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[GapPerturbationParams]) -> Preview:
        assert spec.params.clip_norm is not None  # resolved by prepare
        c2 = spec.params.clip_norm**2
        centring = center_split(spec.epsilon, spec.delta, spec.params)
        centre_scales, centre_meaning = center_preview(ctx, spec.params, centring)
        split = budget_split(centring.gram_epsilon, centring.gram_delta)
        scale = gap_noise_scale(spec.params.clip_norm, split.epsilon1)
        shift = gap_shift(scale, split.delta1)
        # P[Lap(b) < -b ln 10] = 0.05: a gap this far above the median threshold passes w.p. 0.95.
        sure = c2 + shift + scale * math.log(10.0)
        # sigma is linear in s = 2 C^2 / (g_low - C^2); at g_low = 2 C^2, s = 2.
        sigma_per_s = analytic_gaussian_sigma(1.0, split.epsilon2, split.delta2)
        return Preview(
            scales={
                "gap_noise_scale": scale,
                "gap_shift": shift,
                "no_result_gap": c2 + shift,
                "gap_for_95_percent_pass": sure,
                "projector_sigma_per_unit_sensitivity": sigma_per_s,
                **centre_scales,
            },
            meaning=[
                f"Gap test (epsilon/2): g_low = gap + Laplace({scale:.4g}) - {shift:.4g}; the "
                f"release ends in no_result (charged) when g_low <= C^2 = {c2:.4g}.",
                f"So a k-th eigengap lambda_k - lambda_(k+1) of the clipped X^T X below about "
                f"{c2 + shift:.4g} fails more often than not; a gap of {sure:.4g} passes with "
                "probability 0.95.",
                f"When it passes, Gaussian noise of sigma = {sigma_per_s:.4g} * 2 C^2 / "
                "(g_low - C^2) is added to each entry of the top-k projector: the larger the "
                "gap, the smaller the noise.",
                *centre_meaning,
            ],
        )

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[GapPerturbationParams]) -> int:
        d, k = ctx.n_cols, spec.k
        # The Gram matrix stays alive throughout; then the projector beside E(sigma)'s four
        # d x d arrays and their sum (measured: just over 6 d^2; 7 leaves room); then the noisy
        # matrix and its eigensolver. The private mean's pass needs less than the centred Gram.
        return max(
            clipped_gram_memory(ctx.n_rows, d, centred=spec.params.center != "none"),
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
        params = spec.params
        assert params.clip_norm is not None  # resolved by prepare
        split = center_split(spec.epsilon, spec.delta, params)
        center, extras = center_for_run(data, params, split, rng)
        release = gap_perturbation_release(
            data,
            spec.k,
            split.gram_epsilon,
            split.gram_delta,
            params.clip_norm,
            rng,
            center=center,
        )
        # Beyond the private centre (rounded to its grid) and the usefulness check, no extras:
        # the gap, g_low and the noise scale (a function of g_low) would be raw Laplace-noised
        # doubles, exactly the floating-point leak the docs warn about.
        if release is None:
            return MechanismOutput.no_result(GAP_TOO_SMALL, **extras)
        # An integer and a fixed sentence (post-processing of P + E and g_low): no raw double.
        extras.update(
            usefulness_extras(
                release.components_above_noise,
                spec.k,
                "noisy eigenvalues of the projector plus noise against the noise's edge "
                "2 sigma sqrt(d), sigma set by the noisy gap",
            )
        )
        return MechanismOutput(basis=release.basis, extras=extras)
