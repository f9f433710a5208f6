"""``spatial_sign``: Analyze Gauss on the spatial signs of the centred rows (high dimension).

Spherical PCA (Locantore et al., "Robust principal component analysis for functional data",
Test 8, 1999; Visuri, Koivunen & Oja, "Sign and rank covariance matrices", JSPI 91, 2000):
the principal directions are estimated from the *spatial signs* ``u_i = (x_i - c)/||x_i - c||``
of the centred rows instead of the rows themselves. For an elliptical distribution the sign
covariance ``E[u u^T]`` has the same eigenvectors as the covariance, in the same order; in high
dimension the centred norms concentrate (``||x_i - c||^2 ~ tr Sigma``) so the signs are nearly
the rows rescaled by one constant, and the sign covariance nearly ``Sigma / tr Sigma``.

Why it helps a private release: the Gaussian noise of Analyze Gauss (Dwork, Talwar, Thakurta &
Zhang, STOC 2014) is calibrated to the norm bound ``C`` every row *may* have, while its signal
is what the rows *do* have. Centred rows are shorter than ``C`` (unit MNIST rows centred have
norms 0.71-0.87), so the Gram matrix of the centred rows uses ``(0.79)^2 = 0.62`` of the range
the noise pays for. Scaling every centred row to norm exactly ``C`` fills it: the signal grows
by ``C^2 / E||x - c||^2`` at the same noise, which in high dimension (``d`` near or above
``n^(2/3)``, where the noise edge ``2 sigma sqrt(d)`` sits among the top eigenvalues) moves
several components above the noise edge. Measured (``bench/bench_highdim.py``): MNIST 4,000 x
784, k = 10, eps 1: 0.19 of the centred variance kept against 0.09-0.10 for ``analyze_gauss``.
It costs where the rows are far from elliptical in low dimension (short rows near the centre
get the same weight as long ones), which is why it is a mechanism of its own, not a default.

Algorithm (``mu`` the request's GDP parameter, the largest with ``delta_G(mu, eps) <= delta``;
``s`` = ``center_share``, ``v`` = ``VARIANCE_SHARE`` (0.1, analyze_gauss's) with a centre
(``center`` other than ``"none"``: a PCA request), else ``0``):

1. Centre ``c``: ``"private"`` releases ``c = mean_i clip_C(x_i) + N(0, sigma_c^2 I)``,
   ``sigma_c = (2C/n)/mu_c``, ``mu_c = sqrt(s) mu``; a public list is used as given (free);
   ``"none"``: ``c = 0``.
2. Signs: ``y_i = C (clip_C(x_i) - c)/||clip_C(x_i) - c||`` (``0`` where the difference is
   ``0``), computed after a power-of-two rescaling so that no norm over- or underflows.
3. ``H = sum_i y_i y_i^T``; release the top-k eigenvectors and eigenvalues of ``H + E(sigma)``,
   ``E`` symmetric with iid ``N(0, sigma^2)`` upper triangle, ``sigma = sqrt(2) C^2 / mu_g``,
   ``mu_g = sqrt(1 - s - v) mu`` (``s = 0`` without a private centre).
4. Explained variance (with a centre; issue 32 item 1): analyze_gauss's estimate
   (:func:`~service.mechanisms.explained_variance.variance_extras`) for the released ``U``:
   the vector ``(sum_i ||U^T z_i||^2, sum_i ||(I - U U^T) z_i||^2)`` over the *rows*
   ``z_i = clip_C(clip_C(x_i) - c)`` (not the signs: the figure is the share of the rows'
   centred variance that ``U`` keeps) gets fresh ``N(0, s_V^2 I_2)``, ``s_V = sqrt(2) C^2 /
   mu_V``, ``mu_V = sqrt(v) mu``; ratio, 90% interval (the private centre's bias allowed for)
   and the hidden-by-noise flag are post-processing of it and public scales.

Privacy. Step 1: replacing one row moves the mean of rows of norm ``<= C`` by at most ``2C/n``
in l2 (``n`` public): ``mu_c``-GDP. Step 3: given the released (hence public) ``c``, step 2 is
a fixed map of each row alone into the sphere of radius ``C`` (or 0), so replacing one row
changes ``H`` by ``y y^T - y' y'^T``, whose upper triangle (diagonal included) has l2 norm
``<= sqrt(2) C^2`` (``sum_{i<=j} (y_i y_j)^2 <= ||y||^4``, and the cross term
``(y . y')^2 >= 0`` only lowers the difference): ``E(sigma)`` makes it ``mu_g``-GDP; the
eigenpairs are post-processing. Step 4: given the released ``c`` and ``U`` (public), each row
adds a point ``(a, b)`` with ``a, b >= 0``, ``a + b = ||z_i||^2 <= C^2``; two such points lie at
most ``sqrt(2) C^2`` apart in l2 (the simplex's diameter), so fresh noise of ``s_V`` is
``mu_V``-GDP (as analyze_gauss's same step, ALGORITHMS.md M1 and its module). Adaptive
composition of Gaussian mechanisms (Dong, Roth & Su 2022, Corollary 2):
``sqrt(mu_c^2 + mu_g^2 + mu_V^2) = mu``-GDP, i.e. exactly the request's ``(eps, delta)``; zCDP
``rho = mu^2 / 2``. Every step is Gaussian, so ``basic``, ``gaussian`` and ``zcdp``
accountings all charge it; :meth:`SpatialSign.privacy_steps` lists the (up to three) steps
:meth:`SpatialSign.run` draws, from public facts. Nothing is iterated and no parameter is read
from the data: the number of steps, their noise and ``C`` are fixed before the run.

Floating point: as ``analyze_gauss`` (clip norms for which ``n C^2``, the noise or its grid
is not a comfortable double are refused before charging; the eigensolver has a fixed public
fallback). Eigenvalues are rounded to ``sigma / 1000``; the centre to ``sigma_c / 1000``; the
noisy sums to ``s_V / 1000``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from service.mechanisms.base import (
    GaussianStep,
    InvalidParameter,
    MechanismOutput,
    Preview,
    PreviewValue,
    PrivacyStep,
    PublicContext,
    ReleaseSpec,
)
from service.mechanisms.centring import (
    CenterParams,
    CentredGramMechanism,
    FiniteFloat,
    mean_sensitivity,
    private_center_sigma,
)
from service.mechanisms.composition import gaussian_total_mu
from service.mechanisms.explained_variance import variance_extras
from service.mechanisms.gauss_calibration import VARIANCE_SHARE
from service.mechanisms.gauss_release import GaussRelease
from service.mechanisms.linalg import (
    DEFAULT_CHUNK_ROWS,
    FloatArray,
    captured_energy,
    clip_rows,
    eigh_memory,
    iter_row_chunks,
    top_k_eigh,
)
from service.mechanisms.noise import GRID_DIVISOR, round_to_grid, symmetric_gaussian

__all__ = [
    "SpatialSign",
    "SpatialSignParams",
    "SpatialSignSplit",
    "gram_sensitivity",
    "private_center_sigma",
    "sign_gram",
    "sign_variance_extras",
    "spatial_sign_split",
    "spatial_signs",
    "symmetric_gaussian",
]


class SpatialSignParams(CenterParams):
    """Params of ``spatial_sign``: the clip norm and the centring (default ``"private"``: a
    sign about the origin of uncentred data points mostly along the mean, and PCA is about
    centred variance)."""

    center: Literal["none", "private"] | list[FiniteFloat] = Field(
        default="private",
        description=(
            '"private" (default): the signs are taken about a private mean released with '
            "center_share of mu^2 (extras.center). A list of d numbers of norm <= clip_norm: a "
            'public centre chosen without the data (no budget). "none": about the origin. '
            "With a centre (private or public) the release also estimates the explained "
            "variance of the centred rows with 0.1 of mu^2, as analyze_gauss does."
        ),
    )

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Records what ran: "none" is kept (the default is "private"), center_share only where
        # it split the budget. Re-parsing the record runs the same release.
        data: dict[str, Any] = handler(self)
        if self.center != "private":
            data.pop("center_share", None)
        return data


def gram_sensitivity(clip_norm: float) -> float:
    """l2 sensitivity of the upper triangle of ``sum_i y_i y_i^T`` for ``||y_i|| <= C`` under
    replacement: ``sqrt(2) C^2``."""
    return math.sqrt(2.0) * clip_norm**2


@dataclass(frozen=True)
class SpatialSignSplit:
    """The GDP parameters of the steps: ``mean_mu^2 + gram_mu^2 + variance_mu^2 =
    total_mu^2`` (``mean_mu = 0`` without a private centre, ``variance_mu = 0`` without a
    centre)."""

    total_mu: float
    mean_mu: float
    gram_mu: float
    variance_mu: float = 0.0


def spatial_sign_split(epsilon: float, delta: float, params: SpatialSignParams) -> SpatialSignSplit:
    """The request's ``mu`` (the largest with ``delta_G(mu, eps) <= delta``) shared in ``mu^2``:
    ``center_share`` to the private mean (``center: "private"``), ``VARIANCE_SHARE`` to the
    explained-variance sums (any centre: a PCA request), the rest to the signs' Gram matrix.
    Raises :class:`InvalidParameter` when ``center_share`` leaves the Gram nothing."""
    total = gaussian_total_mu(epsilon, delta, 0.0, 0.0)
    if params.center == "none":
        return SpatialSignSplit(total, 0.0, total)
    share = params.center_share if params.center == "private" else 0.0
    gram = 1.0 - share - VARIANCE_SHARE
    if gram <= 0:
        raise InvalidParameter(
            "center_share",
            f"must leave a share for the signs' X^T X: below {1 - VARIANCE_SHARE:g} here (the "
            f"explained-variance estimate takes {VARIANCE_SHARE:g} of mu^2)",
        )
    return SpatialSignSplit(
        total,
        math.sqrt(share) * total,
        math.sqrt(gram) * total,
        math.sqrt(VARIANCE_SHARE) * total,
    )


def spatial_signs(block: FloatArray, clip_norm: float, center: FloatArray | None) -> FloatArray:
    """``C (clip_C(x) - c)/||clip_C(x) - c||`` per row (``0`` where the difference is ``0``).

    Parameters
    ----------
    block : (m, d) array of finite rows
    clip_norm : float
        ``C``.
    center : (d,) array or None
        A public (or released) centre of norm ``<= C``; ``None``: ``0``.

    Returns
    -------
    (m, d) array
        Rows of norm ``C`` (up to rounding, never above ``C (1 + 1e-15)``) or exactly ``0``.
    """
    rows = clip_rows(block, clip_norm)
    if center is not None:
        rows = rows - center
    # Divide by the largest magnitude first: the norm of the rescaled row is in [1, sqrt(d)],
    # so no square over- or underflows whatever the scale of the row (1e-300 or 1e300).
    peak = np.max(np.abs(rows), axis=1, keepdims=True) if rows.size else np.zeros((0, 1))
    safe_peak = np.where(peak > 0, peak, 1.0)
    scaled = rows / safe_peak
    norms = np.linalg.norm(scaled, axis=1, keepdims=True)
    safe_norms = np.where(norms > 0, norms, 1.0)
    signs = np.where(peak > 0, scaled / safe_norms, 0.0)
    return np.asarray(signs * clip_norm, dtype=np.float64)


def sign_gram(
    data: FloatArray,
    clip_norm: float,
    center: FloatArray | None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> FloatArray:
    """``sum_i y_i y_i^T`` of the spatial signs (:func:`spatial_signs`), in row chunks.

    Parameters
    ----------
    data : (n, d) array
    clip_norm : float
    center : (d,) array or None

    Returns
    -------
    (d, d) array
        Symmetric, entries at most ``n C^2`` in magnitude.
    """
    d = data.shape[1]
    gram = np.zeros((d, d), dtype=np.float64)
    with np.errstate(under="ignore"):
        for block in iter_row_chunks(data, chunk_rows):
            if block.size == 0:
                continue
            signs = spatial_signs(block, clip_norm, center)
            gram += signs.T @ signs
    return gram


class SpatialSign(CentredGramMechanism[SpatialSignParams]):
    name: ClassVar[str] = "spatial_sign"
    accountings: ClassVar[frozenset[str]] = frozenset({"basic", "gaussian", "zcdp"})
    title: ClassVar[str] = "Spatial-sign Analyze Gauss (high dimension)"
    paper: ClassVar[str] = (
        "Locantore et al., Robust principal component analysis for functional data, Test 1999 "
        "(spherical PCA), released with the Gaussian noise of Dwork, Talwar, Thakurta & Zhang, "
        "STOC 2014"
    )
    summary: ClassVar[str] = (
        "Centres the rows (private mean by default), scales each centred row to norm C (its "
        "spatial sign) and releases the top-k eigenvectors of their Gram matrix plus a "
        "symmetric Gaussian matrix calibrated to sqrt(2) C^2. Every row then uses the whole "
        "norm range the noise pays for: in high dimension (d near or above n^(2/3)) it keeps "
        "up to twice the centred variance analyze_gauss keeps. With a centre it also releases "
        "analyze_gauss's explained-variance estimate for its basis (0.1 of mu^2). Assumes only "
        "a row norm bound; always returns a result."
    )
    params_model: ClassVar[type[SpatialSignParams]] = SpatialSignParams

    def check_budget(self, k: int, epsilon: float, delta: float, params: SpatialSignParams) -> None:
        spatial_sign_split(epsilon, delta, params)

    def centred_multiples(
        self,
        ctx: PublicContext,
        k: int,
        epsilon: float,
        delta: float,
        params: SpatialSignParams,
    ) -> tuple[float, float]:
        # Per unit C^2: Gram entries <= n, noise draws <= 64 sigma, eigenvalues <= d times the
        # largest entry; the smallest is the eigenvalues' grid sigma / GRID_DIVISOR. The
        # private mean is linear in C: its largest value and its grid enter squared.
        split = spatial_sign_split(epsilon, delta, params)
        unit_sigma = gram_sensitivity(1.0) / split.gram_mu
        low = min(1.0, unit_sigma / GRID_DIVISOR)
        high = ctx.n_cols * (ctx.n_rows + 64.0 * unit_sigma)
        if split.variance_mu > 0:
            # The explained-variance sums: <= n C^2 each, noise and its grid per unit C^2.
            unit_variance = gram_sensitivity(1.0) / split.variance_mu
            low = min(low, unit_variance / GRID_DIVISOR)
            high = max(high, ctx.n_cols * (ctx.n_rows + 64.0 * unit_variance))
        if params.center == "private":
            unit_mean = mean_sensitivity(1.0, max(1, ctx.n_rows)) / split.mean_mu
            low = min(low, (unit_mean / GRID_DIVISOR) ** 2)
            high = max(high, (1.0 + 64.0 * unit_mean) ** 2)
        return low, high

    def prepare(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: SpatialSignParams
    ) -> SpatialSignParams:
        if params.center == "private" and ctx.n_rows < 1:
            raise InvalidParameter("center", "a private mean needs at least one row")
        return super().prepare(ctx, k, epsilon, delta, params)

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[SpatialSignParams]
    ) -> list[PrivacyStep]:
        """The steps :meth:`run` draws, in order: the private mean (if ``center`` is
        ``"private"``; l2 sensitivity ``2C/n``, noise ``(2C/n)/mu_c``), ``E(sigma)`` on the
        signs' Gram matrix (``sqrt(2) C^2``, noise ``sqrt(2) C^2 / mu_g``) and, with a centre,
        the explained-variance sums (``sqrt(2) C^2``, noise ``sqrt(2) C^2 / mu_V``);
        ``mu_c^2 + mu_g^2 + mu_V^2 = mu^2``, so ``rho = mu^2 / 2``."""
        params = spec.params
        clip = params.clip_norm
        assert clip is not None  # resolved by prepare
        split = spatial_sign_split(spec.epsilon, spec.delta, params)
        steps: list[PrivacyStep] = []
        if split.mean_mu > 0:
            mean = mean_sensitivity(clip, max(1, ctx.n_rows))
            steps.append(GaussianStep(mean, mean / split.mean_mu))
        gram = gram_sensitivity(clip)
        steps.append(GaussianStep(gram, gram / split.gram_mu))
        if split.variance_mu > 0:
            steps.append(GaussianStep(gram, gram / split.variance_mu))
        return steps

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[SpatialSignParams]) -> int:
        d = ctx.n_cols
        chunk = min(max(1, ctx.n_rows), DEFAULT_CHUNK_ROWS)
        # The Gram pass holds the accumulator, the chunk read and up to eight same-shape
        # temporaries of it alive at once (clip, centre, |.|, rescale, norm division, np.where,
        # the scaling by C, and the clip's own copy), plus per-row vectors; E(sigma) builds the
        # draw, its triangles and their sum (4 d^2) beside the Gram matrix; then H + E and the
        # eigensolver. The private mean's pass (clipped_sum) and the explained-variance pass
        # (captured_energy: a chunk's clipped rows and their k coordinates) are smaller than
        # the Gram pass.
        gram_pass = 8 * (d * d + 9 * chunk * d + 8 * chunk)
        return max(gram_pass, 8 * (5 * d * d), 8 * (2 * d * d) + eigh_memory(d, spec.k))

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[SpatialSignParams]) -> Preview:
        params = spec.params
        clip = params.clip_norm
        assert clip is not None  # resolved by prepare
        split = spatial_sign_split(spec.epsilon, spec.delta, params)
        sigma = gram_sensitivity(clip) / split.gram_mu
        edge = 2.0 * sigma * math.sqrt(ctx.n_cols)
        scales: dict[str, PreviewValue] = {
            "total_mu": split.total_mu,
            "gram_mu": split.gram_mu,
            "gram_noise_std": sigma,
            "eigenvalue_grid": sigma / GRID_DIVISOR,
            "noise_edge": edge,
            "center": params.center if isinstance(params.center, str) else "public",
        }
        meaning = [
            f"Each centred row is scaled to norm C = {clip:.6g} (its spatial sign); their "
            f"X^T X gets a symmetric Gaussian matrix of standard deviation {sigma:.4g} per "
            f"entry (sensitivity sqrt(2) C^2, mu_g = {split.gram_mu:.4g}).",
            f"The noise's spectrum reaches about {edge:.4g} (2 sigma sqrt(d)); a direction is "
            f"recovered when its sign-Gram eigenvalue, about n C^2 times its share of the "
            f"variance, exceeds about {edge / 2.0:.4g} (sigma sqrt(d)).",
        ]
        if split.variance_mu > 0:
            variance_sigma = gram_sensitivity(clip) / split.variance_mu
            scales.update(variance_mu=split.variance_mu, variance_noise_std=variance_sigma)
            # No figure from public facts (issue 32 item 4): the share kept depends on the
            # rows' spectrum, and the signs' spectrum is not the centred rows'. Said, not
            # left out silently; a release at the same settings forecasts one (forecast_from).
            scales.update(forecast_captured_share=None, forecast_depends_on_spectrum=True)
            meaning.append(
                "No forecast of the share kept from public facts: it depends on the rows' "
                "spectrum (forecast_captured_share is null). A dry run with ?forecast_from= an "
                "earlier release at these very settings states what that one measured."
            )
            meaning.append(
                f"Explained variance: after the basis is chosen, the centred rows' captured and "
                f"residual sums of squares (of the rows, not their signs) get fresh Gaussian "
                f"noise of standard deviation {variance_sigma:.4g} each ({VARIANCE_SHARE:g} of "
                "mu^2); the ratio, its 90% interval and the hidden-by-noise flag come from them."
            )
        if split.mean_mu > 0:
            mean_sigma = mean_sensitivity(clip, max(1, ctx.n_rows)) / split.mean_mu
            scales.update(
                center_sigma=mean_sigma,
                center_grid=mean_sigma / GRID_DIVISOR,
                mean_mu=split.mean_mu,
            )
            meaning.insert(
                0,
                f"The mean of the clipped rows (l2 sensitivity 2C/n) gets Gaussian noise of "
                f"standard deviation {mean_sigma:.4g} per coordinate ({params.center_share:g} "
                "of mu^2); rows are centred on it.",
            )
        return Preview(scales=scales, meaning=meaning)

    def run(
        self, data: FloatArray, spec: ReleaseSpec[SpatialSignParams], rng: np.random.Generator
    ) -> MechanismOutput:
        """Draw the steps of :meth:`privacy_steps` on ``data`` (``n x d``).

        Returns
        -------
        MechanismOutput
            ``basis`` ``(d, k)`` orthonormal; extras ``eigenvalues`` ``(k,)`` of ``H + E``
            (rounded to ``sigma / 1000``), ``gram_noise_std`` (public), ``center`` ``(d,)``
            when private; with a centre, analyze_gauss's explained-variance extras
            (:func:`~service.mechanisms.explained_variance.variance_extras`:
            ``explained_sum_of_squares``, ``explained_variance_ratio`` and its ``_interval``,
            ``explained_variance_hidden_by_noise``, ``components_above_noise``, ...).
        """
        params = spec.params
        clip = params.clip_norm
        assert clip is not None  # resolved by prepare
        split = spatial_sign_split(spec.epsilon, spec.delta, params)
        extras: dict[str, Any] = {}
        center: FloatArray | None = None
        mean_noise = 0.0
        if params.center == "private":
            n = data.shape[0]
            mean_noise = mean_sensitivity(clip, n) / split.mean_mu
            center = private_center_sigma(data, clip, mean_noise, rng)
            extras["center"] = center.tolist()
        elif isinstance(params.center, list):
            center = np.asarray(params.center, dtype=np.float64)
        sigma = gram_sensitivity(clip) / split.gram_mu
        noisy = sign_gram(data, clip, center) + symmetric_gaussian(data.shape[1], sigma, rng)
        values, vectors = top_k_eigh(noisy, spec.k)
        eigenvalues = round_to_grid(values, sigma / GRID_DIVISOR)
        extras["eigenvalues"] = eigenvalues.tolist()
        extras["gram_noise_std"] = sigma
        if split.variance_mu > 0:
            extras.update(
                sign_variance_extras(
                    data, vectors, eigenvalues, clip, center, split, mean_noise, rng
                )
            )
        return MechanismOutput(basis=vectors, extras=extras)


def sign_variance_extras(
    data: FloatArray,
    basis: FloatArray,
    eigenvalues: FloatArray,
    clip_norm: float,
    center: FloatArray | None,
    split: SpatialSignSplit,
    mean_noise: float,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Step 4: analyze_gauss's explained-variance estimate for the released ``basis``, over the
    rows ``clip_C(clip_C(x) - c)`` (the share of the centred rows' variance, not the signs').

    The sums are :func:`~service.mechanisms.linalg.captured_energy` of those rows (one pass,
    ``n x k`` products) with fresh noise ``sqrt(2) C^2 / mu_V``; everything else is
    :func:`~service.mechanisms.explained_variance.variance_extras`'s post-processing, with the
    signs' Gram noise ``sigma`` as the edge below which a component does not stand out (the
    released eigenvalues are the signs' Gram's) and ``mean_noise`` (0 for a public centre)
    for the private centre's bias. That bias ``n ||delta||^2`` is assigned to the captured sum
    when its rank-one term stands above the edge in the signs' units (``sign_norm``: there it
    weighs ``||delta||^2 / ||z_i||^2`` per row, far more than in the rows' units on a tight
    cluster), and the released direction that term takes is not counted as the data's: it
    moves the point estimate and the count only, the interval allows any split of the bias.
    """
    sigma = gram_sensitivity(clip_norm) / split.gram_mu
    variance_noise = gram_sensitivity(clip_norm) / split.variance_mu
    sums = captured_energy(data, basis, clip_norm, center)
    # The trace is not released (nor read by variance_extras); 0 keeps GaussRelease's shape.
    release = GaussRelease(basis, eigenvalues, 0.0)
    noise = (variance_noise, sigma, mean_noise)
    return variance_extras(
        data, release, clip_norm, center, noise, rng, 1.0, (*sums, data.shape[0]), clip_norm
    )
