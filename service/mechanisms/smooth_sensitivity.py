"""M3 ``smooth_sensitivity``: output perturbation of the top-k basis with smooth sensitivity.

Gonen & Gilad-Bachrach, "Smooth Sensitivity Based Approach for Differentially Private PCA",
ALT 2018, Algorithm 1 (seed 004), generalised to rank k as ALGORITHMS.md (M3) fixes it.

Privacy: ``A(j) = min(sqrt(2k), 2C^2/(g - (2j+1)C^2))`` bounds the local sensitivity (Frobenius,
up to rotation) of the top-k basis at distance ``j``, so ``S = max_j e^{-beta j} A(j)`` is a
beta-smooth upper bound on it. Gaussian noise ``5 S sqrt(2 ln(2/delta))/eps`` with
``beta = eps/(4(D + ln(2/delta)))`` is ``(eps, delta)``-DP (Theorem 9.1); Cauchy noise
``6 S1/eps`` with ``S1 = sqrt(D) S``, ``beta = eps/(6D)`` is ``(eps, 0)``-DP (Theorem 9.2), where
``D = d k``. The Haar rotation inside the subspace is public randomness, the thin QR
post-processing.

Range of the Gaussian variant: Theorem 9 of seed 004 (Nissim, Raskhodnikova & Smith 2007,
Lemmas 2.7 and 2.10) is stated for ``epsilon, delta in (0, 1)``, and it is false far outside:
with this very smooth bound the exact privacy profile exceeds the target delta from about
``epsilon = 40``. So the Gaussian variant accepts only ``epsilon <= GAUSSIAN_MAX_EPSILON = 1``
(``epsilon = 1`` by continuity: every event's probability is continuous in ``epsilon``, so the
inequality for ``epsilon -> 1^-`` carries over) and refuses larger ones with 422 before
charging. The Cauchy variant's argument needs no such condition: per coordinate, a shift by
``a`` scales costs at most ``2 asinh(a/2) <= a`` and a change of scale by ``e^{+-beta}`` at most
``beta``, so the loss is at most ``eps/6 + D beta = eps/3`` for every ``epsilon``.

Profiles under the accountings (ALGORITHMS.md, "Accounting across releases"). The Cauchy
variant is pure ``eps_b``-DP, hence ``(eps_b^2/2)``-zCDP (Bun & Steinke 2016, Proposition 1.4:
max-divergence ``eps`` both ways bounds every Renyi divergence by ``alpha eps^2/2``) and
``mu``-GDP with ``mu = -2 Phi^-1(1/(1 + e^eps_b))`` (``service.accounting.pure_mu``). The
Gaussian variant is ``(eps, delta)``-DP through NRS's smooth-sensitivity lemmas, which give no
event of probability ``1 - delta`` on which it is pure, so it has no zCDP profile here: only
``basic`` admits it, and ``params.noise`` defaults to ``cauchy`` on a ``zcdp`` dataset (a
request in epsilon is then charged the Cauchy variant's ``rho``, and a private centre's
Gaussian step). The ``gaussian`` accounting refuses the mechanism: no fully adaptive theorem for
a GDP filter mixing pure and Gaussian steps is cited here.

Centring (``center``): a private mean with a share ``s`` of the budget, or a public centre
(:mod:`service.mechanisms.centring`). With ``delta > 0`` the mean is Gaussian at
``s (eps, delta)``; with ``delta = 0`` it is Laplace at ``(s eps, 0)`` (l1 sensitivity
``2 C sqrt(d)/n``), so the pure variant stays pure. The basis step runs at ``(1 - s)`` of the
budget on rows centred on the released mean and clipped to ``C`` again: the gap's sensitivity
``2 C^2`` and ``A(j)`` are unchanged, and sequential composition gives exactly the request.

Floating point: clipping is right at every finite scale (power-of-two rescaling), clip norms for
which ``n C^2`` is not a comfortable double are refused before charging, and the eigensolver and
QR have fixed public fallbacks (:mod:`service.mechanisms.linalg`).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from api_schemas.common import format_budget
from service.mechanisms.base import (
    InvalidParameter,
    MechanismOutput,
    Preview,
    PrivacyStep,
    PublicContext,
    PureStep,
    ReleaseSpec,
)
from service.mechanisms.centring import (
    CenterParams,
    CentredGramMechanism,
    budget_split,
    center_for_run,
    center_preview,
    center_steps,
    with_center_multiples,
)
from service.mechanisms.gap_perturbation import top_k_with_gap
from service.mechanisms.linalg import (
    FloatArray,
    clipped_gram,
    clipped_gram_memory,
    eigh_memory,
    orthonormal_basis,
)
from service.mechanisms.noise import cauchy, haar_orthogonal
from service.mechanisms.usefulness import rectangular_edge, usefulness_extras

Variant = Literal["gaussian", "cauchy"]

#: The largest epsilon the Gaussian variant accepts: Theorem 9 of seed 004 assumes
#: ``epsilon in (0, 1)`` (closed at 1 by continuity; see the module docstring).
GAUSSIAN_MAX_EPSILON = 1.0


class SmoothSensitivityParams(CenterParams):
    """Params of ``smooth_sensitivity``: the clip norm, the centring and the noise variant."""

    noise: Variant | None = Field(
        default=None,
        description=(
            "The basis noise: `gaussian` ((epsilon, delta)-DP, needs delta > 0 and epsilon <= "
            "1; admitted only by basic accounting, its smooth-sensitivity argument has no zCDP "
            "profile) or `cauchy` (pure epsilon-DP, any epsilon; any delta is then spent by the "
            "private centre only). Default: `gaussian` when delta > 0 on a basic dataset, "
            "`cauchy` otherwise (delta = 0, or a zcdp dataset)."
        ),
    )


def resolved_variant(params: SmoothSensitivityParams, delta: float) -> Variant:
    """The variant a release runs: the requested one, else Gaussian iff ``delta > 0``."""
    if params.noise is not None:
        return params.noise
    return "gaussian" if delta > 0 else "cauchy"


def local_bound(gap: float, k: int, clip_norm: float, j: FloatArray | float) -> FloatArray:
    """``A(j)``: bound on the local sensitivity of the top-k basis at distance ``j``.

    ``A(j) = min(sqrt(2k), 2C^2/(g - (2j+1)C^2))`` when ``g - (2j+1)C^2 > 0``, else ``sqrt(2k)``.
    """
    steps = np.asarray(j, dtype=np.float64)
    cap = math.sqrt(2.0 * k)
    room = gap - (2.0 * steps + 1.0) * clip_norm**2
    with np.errstate(divide="ignore"):
        bound = np.where(room > 0, 2.0 * clip_norm**2 / np.where(room > 0, room, 1.0), cap)
    return np.minimum(cap, bound)


def smooth_bound(gap: float, k: int, clip_norm: float, beta: float) -> float:
    """``S = max_{j >= 0} e^{-beta j} A(j)``, exactly, in O(1).

    ``A`` is non-decreasing and reaches its cap ``sqrt(2k)`` at the first ``J`` with
    ``g - (2J+1)C^2 <= sqrt(2/k) C^2``; beyond ``J`` the product decreases. Before ``J``,
    ``log(e^{-beta j} A(j)) = -beta j + log(2C^2) - log(g - (2j+1)C^2)`` is convex in ``j``, so
    its maximum over ``[0, J-1]`` sits at an end. The candidates are ``0``, ``J-1``, ``J`` (and a
    neighbour either side of ``J`` to absorb rounding in computing it).
    """
    c2 = clip_norm**2
    last = max(0.0, math.ceil((gap - c2 - math.sqrt(2.0 / k) * c2) / (2.0 * c2)))
    candidates = np.array(
        [0.0, *(j for j in (last - 2, last - 1, last, last + 1) if j >= 0)], dtype=np.float64
    )
    values = np.exp(-beta * candidates) * local_bound(gap, k, clip_norm, candidates)
    return float(values.max())


def gaussian_beta(epsilon: float, delta: float, dim: int) -> float:
    """``beta = eps/(4(D + ln(2/delta)))`` (seed 004, Theorem 9.1)."""
    return epsilon / (4.0 * (dim + math.log(2.0 / delta)))


def gaussian_noise_scale(smooth: float, epsilon: float, delta: float) -> float:
    """Standard deviation of each Gaussian entry: ``5 S sqrt(2 ln(2/delta))/eps``."""
    return 5.0 * smooth * math.sqrt(2.0 * math.log(2.0 / delta)) / epsilon


def cauchy_beta(epsilon: float, dim: int) -> float:
    """``beta = eps/(6D)`` (seed 004, Theorem 9.2)."""
    return epsilon / (6.0 * dim)


def cauchy_noise_scale(smooth_l1: float, epsilon: float) -> float:
    """Scale of each standard-Cauchy entry: ``6 S1/eps``."""
    return 6.0 * smooth_l1 / epsilon


def half_noise_gap(clip_norm: float, k: int, beta: float) -> float:
    """A gap below which ``S >= sqrt(2k)/2``: ``C^2 (1 + sqrt(2/k) + 2 (ln 2/beta - 1))``.

    ``A(J) = sqrt(2k)`` at the first ``J >= (g - C^2 - sqrt(2/k) C^2)/(2 C^2)`` (see
    :func:`smooth_bound`), and ``J`` is less than that plus 1, so ``S >= e^{-beta J} sqrt(2k)``
    is at least half the cap whenever ``beta J <= ln 2``, which holds below this gap.
    """
    c2 = clip_norm**2
    return c2 * (1.0 + math.sqrt(2.0 / k) + 2.0 * (math.log(2.0) / beta - 1.0))


def smooth_sensitivity(
    data: FloatArray,
    k: int,
    epsilon: float,
    delta: float,
    clip_norm: float,
    rng: np.random.Generator,
    center: FloatArray | None = None,
) -> tuple[FloatArray, Variant]:
    """Release the thin-QR basis of ``U_k R + noise``.

    Parameters
    ----------
    data : (n, d) array
        The rows; may be a read-only memory map (read in chunks, memory ``O(d^2)``).
    k : int
        Dimension of the released subspace, ``1 <= k <= d``.
    epsilon : float
        ``epsilon > 0``.
    delta : float
        ``0 < delta < 1`` for the Gaussian variant, ``0`` for the pure Cauchy variant.
    clip_norm : float
        Public row norm bound ``C``.
    rng : numpy.random.Generator
        The release's generator (also draws the Haar rotation).
    center : (d,) array, optional
        A public (or already released) centre: rows are centred on it and clipped to ``C``
        again before ``X^T X``.

    Returns
    -------
    basis : (d, k) array
        Orthonormal basis of the released subspace.
    variant : {"gaussian", "cauchy"}
        Which noise was used (a function of ``delta`` only).
    """
    basis, variant, _ = smooth_sensitivity_release(data, k, epsilon, delta, clip_norm, rng, center)
    return basis, variant


def smooth_sensitivity_release(
    data: FloatArray,
    k: int,
    epsilon: float,
    delta: float,
    clip_norm: float,
    rng: np.random.Generator,
    center: FloatArray | None = None,
) -> tuple[FloatArray, Variant, bool]:
    """:func:`smooth_sensitivity` (same parameters and draws), and whether the released
    directions stand out of the noise (:func:`noisy_basis_stands_out`, post-processing of the
    noisy matrix)."""
    gram = clipped_gram(data, clip_norm, center=center)
    d = gram.shape[0]
    dim = d * k
    vectors, gap = top_k_with_gap(gram, k)
    # The eigensolver's choice of basis inside the subspace is data-dependent; a Haar rotation
    # makes the noised matrix depend on the subspace only.
    rotated = vectors @ haar_orthogonal(k, rng)
    variant: Variant
    if delta > 0:
        variant = "gaussian"
        smooth = smooth_bound(gap, k, clip_norm, gaussian_beta(epsilon, delta, dim))
        noise = rng.standard_normal(size=(d, k)) * gaussian_noise_scale(smooth, epsilon, delta)
    else:
        variant = "cauchy"
        smooth_l1 = math.sqrt(dim) * smooth_bound(gap, k, clip_norm, cauchy_beta(epsilon, dim))
        noise = cauchy(rng, size=(d, k)) * cauchy_noise_scale(smooth_l1, epsilon)
    noisy = rotated + noise
    return orthonormal_basis(noisy), variant, noisy_basis_stands_out(noisy, variant)


#: ``median |Z|`` of a standard normal: the median absolute entry of a Gaussian matrix over it
#: estimates the entry scale (for a standard Cauchy ``median |Z|`` is 1).
GAUSSIAN_MEDIAN_ABS = 0.6744897501960817


def noisy_basis_stands_out(noisy: FloatArray, variant: Variant) -> bool:
    """Whether the noise of ``U R + noise`` (``d x k``; ``U R`` has orthonormal columns, every
    singular value 1) is below the signal: its entry scale, estimated from the noisy matrix
    alone (median absolute entry, over ``median |Z|`` of the noise law; for the Gaussian the
    signal's own entry variance ``1/d`` is removed), gives the noise's edge
    ``s (sqrt(d) + sqrt(k))``, which must be below 1 (issue 24, item 5). A function of the
    released noisy matrix only: the noise scale itself derives from the raw gap and is not
    private, so it is never read."""
    d, k = noisy.shape
    if not np.all(np.isfinite(noisy)):
        return False
    median = float(np.median(np.abs(noisy)))
    if variant == "gaussian":
        scale = math.sqrt(max(0.0, (median / GAUSSIAN_MEDIAN_ABS) ** 2 - 1.0 / d))
    else:
        scale = median
    return rectangular_edge(scale, d, k) < 1.0


class SmoothSensitivity(CentredGramMechanism[SmoothSensitivityParams]):
    name: ClassVar[str] = "smooth_sensitivity"
    title: ClassVar[str] = "Smooth-sensitivity output perturbation of the top-k basis"
    paper: ClassVar[str] = (
        "Gonen & Gilad-Bachrach, Smooth Sensitivity Based Approach for Differentially Private "
        "PCA, ALT 2018, Algorithm 1 (generalised to rank k)"
    )
    summary: ClassVar[str] = (
        "Rotates the top-k eigenvectors of the clipped X^T X by a random k x k rotation, adds "
        "noise scaled to a smooth bound on their sensitivity (driven by the k-th eigengap), and "
        "releases the thin-QR basis. Gaussian noise when delta > 0 (epsilon <= 1 only, the range "
        "its theorem proves); with delta = 0, Cauchy noise "
        "and a pure (epsilon, 0) guarantee (heavy tails: judge it by the median over releases). "
        "Assumes a row norm bound; always returns a result, useless when the gap is small. "
        "Dominated when delta > 0: then at least 9x less accurate than analyze_gauss (same "
        "params, always runs) and no better than a random subspace at d >= 50 "
        "(docs/mechanisms.md, section smooth_sensitivity); use it for delta = 0 only. auto "
        "never chooses it then, and a dry run with delta > 0 carries a warning."
    )
    cost_rule: ClassVar[str] = (
        "Charges exactly the requested (epsilon, delta); delta = 0 selects the pure Cauchy "
        "variant, charged (epsilon, 0). zcdp: the Cauchy variant (its default there), its "
        "basis epsilon_b charged epsilon_b^2/2 and a private centre's Gaussian step "
        "Delta^2/(2 sigma^2); gaussian accounting refuses it (not purely Gaussian)."
    )
    params_model: ClassVar[type[SmoothSensitivityParams]] = SmoothSensitivityParams
    allows_pure_dp: ClassVar[bool] = True
    #: zcdp charges the Cauchy variant (the default there); gaussian refuses it (a pure step
    #: is mu-GDP, but no fully adaptive theorem for a filter mixing it with Gaussian steps is
    #: cited, so the GDP filter admits only Gaussian steps).
    accountings: ClassVar[frozenset[str]] = frozenset({"basic", "zcdp"})

    def check_budget(
        self, k: int, epsilon: float, delta: float, params: SmoothSensitivityParams
    ) -> None:
        split = budget_split(epsilon, delta, params)
        variant = resolved_variant(params, delta)
        if variant == "gaussian" and delta == 0:
            raise InvalidParameter(
                "params.noise",
                "gaussian needs delta > 0 (its guarantee is (epsilon, delta)-DP); use cauchy "
                "for delta = 0",
            )
        if variant == "gaussian" and split.gram_epsilon > GAUSSIAN_MAX_EPSILON:
            spent = "" if params.center != "private" else " on the basis (after the centre)"
            raise InvalidParameter(
                "epsilon",
                f"must be <= {GAUSSIAN_MAX_EPSILON:g}{spent} for the Gaussian variant "
                f"(delta > 0), got {format_budget(split.gram_epsilon)}: its calibration (seed 004, "
                "Theorem 9) is proved only for epsilon in (0, 1], and at large epsilon it "
                "exceeds delta; use delta = 0 (the Cauchy variant), a smaller epsilon, or "
                "analyze_gauss",
            )

    def centred_multiples(
        self,
        ctx: PublicContext,
        k: int,
        epsilon: float,
        delta: float,
        params: SmoothSensitivityParams,
    ) -> tuple[float, float]:
        # Per unit C^2: eigenvalues and the gap <= n, (2j+1) <= n + 3 in A(j), and the cap's
        # threshold sqrt(2/k). The noise scales do not involve C; the private mean's do.
        split = budget_split(epsilon, delta, params)
        low, high = min(1.0, math.sqrt(2.0 / k)), ctx.n_cols * (ctx.n_rows + 4.0)
        return with_center_multiples(ctx, split, params, low, high)

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[SmoothSensitivityParams]) -> Preview:
        k, dim = spec.k, ctx.n_cols * spec.k
        cap = math.sqrt(2.0 * k)  # A(j) never exceeds it, so neither does S
        split = budget_split(spec.epsilon, spec.delta, spec.params)
        eps, delta = split.gram_epsilon, split.gram_delta
        variant = resolved_variant(spec.params, spec.delta)
        if variant == "gaussian":
            beta = gaussian_beta(eps, delta, dim)
            per_s = gaussian_noise_scale(1.0, eps, delta)
            kind = "Gaussian standard deviation"
        else:
            beta = cauchy_beta(eps, dim)
            per_s = cauchy_noise_scale(math.sqrt(dim), eps)
            kind = "Cauchy scale"
        assert spec.params.clip_norm is not None  # resolved by prepare
        centre_scales, centre_meaning = center_preview(ctx, spec.params, split)
        half_gap = half_noise_gap(spec.params.clip_norm, k, beta)
        return Preview(
            scales={
                "variant": variant,
                "beta": beta,
                "noise_per_unit_smooth_bound": per_s,
                "smooth_bound_cap": cap,
                "noise_at_cap": per_s * cap,
                "half_noise_gap": half_gap,
                **centre_scales,
            },
            meaning=[
                f"Each of the d x k entries of the rotated basis gets noise of {kind} "
                f"{per_s:.4g} S, where S = max_j exp(-{beta:.4g} j) A(j) is the beta-smooth "
                "bound on the basis's sensitivity (it depends on the eigengap, which is not "
                "shown).",
                f"S <= sqrt(2k) = {cap:.4g}, so the noise is at most {per_s * cap:.4g} per "
                "entry; at that level the basis is essentially random.",
                f"While the k-th eigengap of the clipped X^T X is below {half_gap:.4g}, S is at "
                f"least half the cap (noise >= {per_s * cap / 2:.4g}): the smoothing keeps S "
                "near the cap until the gap is of order C^2 / beta.",
                *centre_meaning,
            ],
        )

    def for_accounting(
        self, accounting: str, params: SmoothSensitivityParams
    ) -> SmoothSensitivityParams:
        """Under a filter the default variant is the pure Cauchy one (the Gaussian variant has
        no zCDP profile: NRS's smooth-sensitivity argument gives ``(eps, delta)``-DP with no
        event of probability ``1 - delta`` on which it is pure)."""
        if accounting == "basic" or params.noise is not None:
            return params
        return params.model_copy(update={"noise": "cauchy"})

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[SmoothSensitivityParams]
    ) -> list[PrivacyStep] | None:
        """The private centre's step (if any) and, for the Cauchy variant, the basis's pure
        ``eps_b``-DP step (seed 004, Theorem 9.2; ``eps_b^2/2``-zCDP by Bun & Steinke 2016,
        Proposition 1.4). The Gaussian variant declares none: only ``basic`` admits it."""
        if resolved_variant(spec.params, spec.delta) == "gaussian":
            return None
        split = budget_split(spec.epsilon, spec.delta, spec.params)
        return [*center_steps(ctx, spec.params, split), PureStep(split.gram_epsilon)]

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[SmoothSensitivityParams]) -> int:
        d, k = ctx.n_cols, spec.k
        # The Gram matrix stays alive through the eigensolver; then a few d x k arrays (the
        # eigenvectors, their rotation, the noise, the sum, its scaled copy and Q) and QR's
        # workspace.
        return max(
            clipped_gram_memory(ctx.n_rows, d, centred=spec.params.center != "none"),
            8 * d * d + eigh_memory(d, k + 1) + 8 * 2 * d * (k + 1),
            8 * d * d + 8 * (10 * d * k + 4 * k * k + 64 * d),
        )

    def run(
        self,
        data: FloatArray,
        spec: ReleaseSpec[SmoothSensitivityParams],
        rng: np.random.Generator,
    ) -> MechanismOutput:
        params = spec.params
        assert params.clip_norm is not None  # resolved by prepare
        split = budget_split(spec.epsilon, spec.delta, params)
        center, extras = center_for_run(data, params, split, rng)
        basis, variant, stands_out = smooth_sensitivity_release(
            data,
            spec.k,
            split.gram_epsilon,
            # The Cauchy variant is pure: delta (if any) is the private centre's alone.
            split.gram_delta if resolved_variant(params, spec.delta) == "gaussian" else 0.0,
            params.clip_norm,
            rng,
            center=center,
        )
        # The variant (a function of the public delta) and the private centre, if any: S and
        # the noise scale derive from the raw gap and are not private.
        extras.update(
            usefulness_extras(
                spec.k if stands_out else 0,
                spec.k,
                "the noise's edge s (sqrt(d) + sqrt(k)), s estimated from the noisy basis "
                "before orthonormalisation, against the signal's singular values 1",
            )
        )
        return MechanismOutput(basis=basis, extras={"variant": variant, **extras})
