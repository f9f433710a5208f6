"""M1 ``analyze_gauss``: Gaussian noise on the clipped second-moment matrix.

Dwork, Talwar, Thakurta & Zhang, "Analyze Gauss: Optimal Bounds for Privacy-Preserving PCA",
STOC 2014, Algorithm 1 (seed 002).

Privacy: rows are clipped to the public norm ``C``, so replacing one row changes ``H = X^T X`` by
``a a^T - b b^T``, whose upper triangle (diagonal included) has l2 norm ``<= sqrt(2) C^2``.
Adding a symmetric Gaussian matrix whose upper-triangle entries have the analytic-Gaussian
``sigma`` for ``D = sqrt(2) C^2`` makes ``H_hat`` ``(eps, delta)``-DP; the top-k eigenvectors and
eigenvalues of ``H_hat`` are post-processing. Cost: exactly ``(eps, delta)``.

Every step of a release is a Gaussian mechanism, so the steps share the budget in Gaussian
differential privacy (Dong, Roth & Su 2022): the request's ``(eps, delta)`` is exactly ``mu``-GDP
for the ``mu`` with ``delta_G(mu, eps) = delta`` (the analytic Gaussian's curve, rounded down),
and steps of ``mu_1, .., mu_m`` with ``sum mu_j^2 <= mu^2`` compose to it. Without centring or a
clip quantile the Gram step gets ``mu_G^2 = (1 - VARIANCE_SHARE) mu^2``:

- Centring (``center``): a private mean of the rows clipped to ``C`` (l2 sensitivity ``2C/n``)
  with ``center_share mu^2``, or a public centre (free); rows are centred and clipped to ``C``
  again, a fixed per-row map given the released centre (see :mod:`service.mechanisms.centring`).
- Clip quantile (``clip_quantile``, issue 24 item 3): a noisy histogram of the Gram rows' norms
  (sensitivity ``sqrt(2)``) with ``CLIP_SHARE mu^2`` releases ``C2 <= C``
  (:mod:`service.mechanisms.clip_quantile`); the rows are then clipped to ``C2`` too and the
  Gram's sensitivity is ``sqrt(2) C2^2``.
- Explained variance (issue 24 item 1): after the basis ``U`` is chosen, the vector
  ``(sum_i ||U^T y_i||^2, sum_i ||(I - U U^T) y_i||^2)`` over the rows ``y_i`` clipped to ``C``
  (centred as above, not clipped to ``C2``) gets fresh noise with ``VARIANCE_SHARE mu^2``: each
  row adds a point of the simplex ``{a, b >= 0, a + b <= C^2}``, whose l2 diameter is
  ``sqrt(2) C^2``. Being fresh noise, independent of ``U``, it is unbiased for what ``U``
  captures (the eigenvalues of ``H + E`` are not: the top ones are inflated by the noise they
  were selected on); the ratio and its 90% interval are post-processing with the public scales.
  When the centring is chosen by the probe, the rows of this step are clipped at
  ``C_E = min(C, ..)`` from the probe's released 0.99-quantile of the pairs' norms (a further
  reading of its noisy counts: post-processing) where that lies below ``C/sqrt(2)``; the
  simplex is then ``a + b <= C_E^2`` and the noise ``sqrt(2) C_E^2 / mu_V``: the same ``mu_V``
  (:func:`variance_clip_norm`).

Cost: exactly ``(eps, delta)``; Gaussian profile ``mu``-GDP with ``mu`` as above (zCDP
``rho = mu^2/2``), steps as listed.

Floating point: rows are clipped after a power-of-two rescaling, so clipping is right at every
finite scale; clip norms for which ``n C^2`` or the noise scale is not a comfortable double are
refused before charging; the eigensolver has a fixed public fallback (see
:mod:`service.mechanisms.linalg`). The guarantee is the real-number one (see ``noise``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

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
    CentredGramMechanism,
    budget_split,
    mean_sensitivity,
    mean_sigma,
    private_center,
    private_center_sigma,
)
from service.mechanisms.centring_choice import (
    PROBE_SENSITIVITY,
    choose_centring,
    fast_energy,
    fast_gram,
    gram_chunk_rows,
    mean_route_clip,
    paired_energy,
    paired_gram,
    probe_centred_energy,
    probe_paired_energy,
    probe_pass,
    read_probe,
)
from service.mechanisms.clip_quantile import clip_from_counts, count_noise_std, quantile_edges
from service.mechanisms.explained_variance import (
    HIDDEN_WARNING_CODE,
    HIDDEN_WIDTH,
    INTERVAL_COVERAGE,
    ExplainedVariance,
    expected_noise_norm,
    explained_variance,
    ratio_point,
    spiked_debias,
    variance_extras,
)
from service.mechanisms.fast_rows import (
    SINGLE_GRAM_SLACK,
    single_centring_fits,
    single_gram_fits,
    single_projections_fit,
)
from service.mechanisms.gauss_calibration import (
    CLIP_SHARE,
    DEFAULT_PRIVATE_CENTRE_QUANTILE,
    TARGET_SUBSPACE_ERROR,
    VARIANCE_SHARE,
    AnalyzeGaussParams,
    GaussSplit,
    chooses_centring,
    gap_for_error,
    gauss_split,
    gram_sensitivity,
    noise_sigma,
    with_default_quantile,
)
from service.mechanisms.gauss_forecast import (
    Forecast,
    recoverable_forecast,
)
from service.mechanisms.gauss_release import GaussRelease
from service.mechanisms.linalg import (
    DEFAULT_CHUNK_ROWS,
    FloatArray,
    RowSource,
    clipped_gram_memory,
    eigh_memory,
    gram_norm_counts,
    top_k_eigh,
)
from service.mechanisms.noise import (
    GRID_DIVISOR,
    round_to_grid,
    symmetric_gaussian,
)

__all__ = [
    "CLIP_SHARE",
    "DEFAULT_CENTER_SHARE",
    "DEFAULT_PRIVATE_CENTRE_QUANTILE",
    "HIDDEN_WARNING_CODE",
    "HIDDEN_WIDTH",
    "INTERVAL_COVERAGE",
    "TARGET_SUBSPACE_ERROR",
    "VARIANCE_SHARE",
    "AnalyzeGauss",
    "AnalyzeGaussParams",
    "BudgetSplit",
    "ExplainedVariance",
    "Forecast",
    "GaussRelease",
    "GaussSplit",
    "analyze_gauss",
    "budget_split",
    "chooses_centring",
    "expected_noise_norm",
    "explained_variance",
    "gap_for_error",
    "gauss_release",
    "gauss_split",
    "gram_sensitivity",
    "mean_sensitivity",
    "mean_sigma",
    "noise_sigma",
    "private_center",
    "ratio_point",
    "recoverable_forecast",
    "spiked_debias",
    "variance_extras",
    "with_default_quantile",
]


def gauss_release(
    data: FloatArray,
    k: int,
    epsilon: float,
    delta: float,
    clip_norm: float,
    rng: np.random.Generator,
    center: FloatArray | None = None,
    *,
    sigma: float | None = None,
    row_clip: float | None = None,
    with_energy: bool = False,
) -> GaussRelease:
    """The top-k eigenpairs and the trace of ``H + E(sigma)``, ``H`` the Gram matrix of the
    rows clipped to ``C`` (centred on ``center`` and clipped again when given, then clipped to
    ``row_clip`` when given, see :func:`~service.mechanisms.centring_choice.fast_gram_rows`).
    ``sigma`` defaults to the analytic-Gaussian scale at ``(epsilon, delta)`` for
    ``sqrt(2) C^2``; a caller giving it is responsible for its calibration. Everything is
    post-processing of ``H + E``; ``with_energy`` adds ``exact_energy`` (from ``H``, not
    released)."""
    gram = fast_gram(data, clip_norm, center=center, row_clip=row_clip)
    if sigma is None:
        sigma = noise_sigma(clip_norm, epsilon, delta)
    release = release_of_gram(gram, k, sigma, rng)
    if not with_energy:
        return release
    energy = gram_energy(gram, release.basis)
    return GaussRelease(release.basis, release.eigenvalues, release.trace, energy)


def gram_energy(gram: FloatArray, basis: FloatArray) -> tuple[float, float]:
    """``(tr(U^T H U), tr(H) - tr(U^T H U))`` for the exact Gram ``H = sum_i y_i y_i^T``: the
    sums ``sum_i ||U^T y_i||^2`` and ``sum_i ||(I - U U^T) y_i||^2`` of
    :func:`~service.mechanisms.linalg.captured_energy` over the same rows (equal in exact
    arithmetic; ``O(d^2 k)`` instead of a pass over the rows)."""
    captured = max(float(np.sum(basis * (gram @ basis))), 0.0)
    return captured, max(float(np.trace(gram)) - captured, 0.0)


def release_of_gram(
    gram: FloatArray, k: int, sigma: float, rng: np.random.Generator
) -> GaussRelease:
    """:func:`gauss_release` from the exact Gram matrix: ``E(sigma)`` added, the top-k
    eigenpairs and the trace of ``H + E`` (the caller calibrated ``sigma`` to ``H``)."""
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

    def prepare(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: AnalyzeGaussParams
    ) -> AnalyzeGaussParams:
        # The default quantile first: the checks below and the budget split see what runs.
        return super().prepare(ctx, k, epsilon, delta, with_default_quantile(params))

    def check_budget(
        self, k: int, epsilon: float, delta: float, params: AnalyzeGaussParams
    ) -> None:
        if params.center == "private" or params.quantile is not None:
            gauss_split(epsilon, delta, params)  # refuses a share that leaves no Gram budget

    def centred_multiples(
        self,
        ctx: PublicContext,
        k: int,
        epsilon: float,
        delta: float,
        params: AnalyzeGaussParams,
    ) -> tuple[float, float]:
        # Per unit C^2: Gram entries <= n, noise draws <= 64 sigma, eigenvalues and the trace
        # <= d times the largest entry; the smallest is the rounding grid sigma / GRID_DIVISOR,
        # times the smallest row clip of the quantile grid (squared). The private mean is
        # linear in C: its largest value and grid enter squared.
        split = gauss_split(epsilon, delta, params)
        unit_sigma = gram_sensitivity(1.0) / split.gram_mu
        unit_variance = gram_sensitivity(1.0) / split.variance_mu
        smallest_clip = float(quantile_edges(1.0)[0]) ** 2 if params.quantile else 1.0
        low = min(1.0, smallest_clip * unit_sigma / GRID_DIVISOR, unit_variance / GRID_DIVISOR)
        high = ctx.n_cols * (ctx.n_rows + 64.0 * max(unit_sigma, unit_variance))
        if params.center == "private":
            unit_mu = mean_sensitivity(1.0, max(1, ctx.n_rows)) / split.mean_mu
            low = min(low, (unit_mu / GRID_DIVISOR) ** 2)
            high = max(high, (1.0 + 64.0 * unit_mu) ** 2)
        return low, high

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[AnalyzeGaussParams]) -> Preview:
        # Imported here: gauss_preview builds on this module's calibration.
        from service.mechanisms.gauss_preview import gauss_preview

        return gauss_preview(ctx, spec)

    def forecast_from(
        self,
        ctx: PublicContext,
        spec: ReleaseSpec[AnalyzeGaussParams],
        earlier: ReleaseSpec[AnalyzeGaussParams],
        extras: dict[str, Any],
    ) -> tuple[dict[str, Any], list[str]] | None:
        """:func:`service.mechanisms.gauss_preview.forecast_from`."""
        from service.mechanisms.gauss_preview import forecast_from

        return forecast_from(ctx, spec, earlier, extras)

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[AnalyzeGaussParams]
    ) -> list[PrivacyStep]:
        """Purely Gaussian, the steps :meth:`run` draws, in its order, each with its l2
        sensitivity and noise: with a private centre and a clip quantile, the centring probe's
        counts (``2``, :mod:`~service.mechanisms.centring_choice`) first; the private mean (if
        centred; ``2C/n``), the clip quantile's counts (if asked without a private centre;
        ``sqrt(2)``), ``E(sigma)`` on the Gram matrix (``sqrt(2) C^2``; with a
        released ``C2`` both scale by ``(C2/C)^2``, the ratio stays) and the explained-variance
        sums (``sqrt(2) C^2``). ``Delta_j/sigma_j = mu_j`` with ``sum mu_j^2 = total_mu^2``
        (:func:`gauss_split`); ``rho = total_mu^2 / 2``."""
        params = spec.params
        clip = params.clip_norm
        assert clip is not None  # resolved by prepare
        split = gauss_split(spec.epsilon, spec.delta, params)
        gram = gram_sensitivity(clip)
        steps: list[PrivacyStep] = []
        if chooses_centring(params):
            # The probe (two histograms, uncentred rows and pairs: sensitivity 2) runs first;
            # the mean route's mean and Gram follow (the other routes' single Gram at
            # sqrt(mean_mu^2 + gram_mu^2) has the same rho, see centring_choice).
            steps.append(GaussianStep(PROBE_SENSITIVITY, PROBE_SENSITIVITY / split.clip_mu))
        if split.mean_mu > 0:
            mean = mean_sensitivity(clip, max(1, ctx.n_rows))
            steps.append(GaussianStep(mean, mean / split.mean_mu))
        if split.clip_mu > 0 and not chooses_centring(params):
            steps.append(GaussianStep(math.sqrt(2.0), count_noise_std(split.clip_mu)))
        steps.append(GaussianStep(gram, gram / split.gram_mu))
        steps.append(GaussianStep(gram, gram / split.variance_mu))
        return steps

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[AnalyzeGaussParams]) -> int:
        d = ctx.n_cols
        # The Gram matrix stays alive throughout; E(sigma) builds the draw, its upper triangle,
        # the strict upper triangle and their sum (4 d^2), then H + E; then the eigensolver.
        # The private mean's pass and the row norms (8 n bytes) precede the Gram pass.
        centred = spec.params.center != "none"
        norms = 8 * ctx.n_rows if spec.params.quantile is not None else 0
        if chooses_centring(spec.params):
            # No array of pairs: every pass reads a chunk at a time. The probe's pass holds the
            # chunk, its pairs' rows and partners (at most 6 c d), a d-vector and, per pair,
            # at most seven arrays of n/2 (the pairing's index arrays and order, the dot
            # products, their factors and squared norms while the pairs' norms are formed;
            # before, while the pairs are ordered, at most 25 n bytes: _pairs_by_higher_row).
            # The Gram and explained-variance passes are clipped_gram's at most.
            chunk = min(max(1, ctx.n_rows), DEFAULT_CHUNK_ROWS)
            probe = 8 * (6 * chunk * d + 3 * d * d) + 16 * chunk * 8 + 32 * ctx.n_rows
            # Kept from the probe to the explained-variance step: per row its clip factor,
            # squared norm and (per pair) norm; that step's n x (k + 1) products (n x k for
            # pairs) and a chunk's vectors (probe_centred_energy, probe_paired_energy).
            n, k = max(1, ctx.n_rows), spec.k
            # ... and on the mean route the Gram pass's centred squared norms (8 n). Float32
            # (single_gram_fits, single_projections_fit): a float32 chunk in the Gram pass,
            # and a chunk and its products in the explained-variance pass.
            # The explained-variance step's float32 products (4 n k) are written to its n x k
            # result at the end (an upper bound: since issue 32 item 5's eighth pass both
            # float32 routes keep only the 4 n k and a k x chunk buffer); the float32 pass
            # repeats the centre on every row of its chunk (4 chunk d).
            kept = 8 * 4 * n
            single = 4 * gram_chunk_rows(d) * (d + k)
            energy = 8 * n * (k + 1) + 4 * n * k + 8 * chunk * (4 * k + 8) + single
            return kept + max(
                probe,
                clipped_gram_memory(ctx.n_rows, d, centred=True)
                + single
                + 4 * gram_chunk_rows(d) * d,
                8 * (5 * d * d),
                8 * (2 * d * d) + eigh_memory(d, spec.k),
                energy + 8 * chunk * (k + 1),
            )
        # Uncentred without a quantile, the Gram pass is the only pass over the rows and reads
        # them in gram_chunk_rows(d) chunks; any other pass reads the default chunk.
        plain = not centred and spec.params.quantile is None
        chunk = gram_chunk_rows(d) if plain else DEFAULT_CHUNK_ROWS
        return max(
            clipped_gram_memory(ctx.n_rows, d, chunk, centred=centred) + norms,
            8 * (5 * d * d),
            8 * (2 * d * d) + eigh_memory(d, spec.k),
        )

    def run(
        self, data: FloatArray, spec: ReleaseSpec[AnalyzeGaussParams], rng: np.random.Generator
    ) -> MechanismOutput:
        params = spec.params
        clip = params.clip_norm
        assert clip is not None  # resolved by prepare
        n = data.shape[0]
        split = gauss_split(spec.epsilon, spec.delta, params)
        if chooses_centring(params) and n >= 2 and not isinstance(data, RowSource):
            return chosen_centring_run(data, spec, split, rng)
        extras: dict[str, Any] = {}
        center: FloatArray | None = None
        mean_noise = 0.0
        if chooses_centring(params):
            # Reference data (or a single row): the mean route, its clip from the centred rows'
            # histogram, drawn at the probe's noise (2/mu_Q per count: sensitivity sqrt(2) <= 2).
            extras["centring"] = "mean"
        if params.center == "private":
            mean_noise = mean_sensitivity(clip, n) / split.mean_mu
            center = private_center_sigma(data, clip, mean_noise, rng)
            extras["center"] = center.tolist()
        elif isinstance(params.center, list):
            center = np.asarray(params.center, dtype=np.float64)
        row_clip: float | None = None
        if params.quantile is not None:
            counts = gram_norm_counts(data, clip, center, quantile_edges(clip))
            count_mu = split.clip_mu / math.sqrt(2.0) if chooses_centring(params) else split.clip_mu
            row_clip = clip_from_counts(counts, n, clip, params.quantile, count_mu, rng)
            extras["row_clip_norm"] = row_clip
        effective = clip if row_clip is None else row_clip
        sigma = gram_sensitivity(effective) / split.gram_mu
        # Without a row clip below C the explained-variance rows are the Gram's: their sums
        # come from H (no second pass over the rows).
        release = gauss_release(
            data,
            spec.k,
            0.0,
            0.0,
            clip,
            rng,
            center=center,
            sigma=sigma,
            row_clip=row_clip,
            with_energy=row_clip is None,
        )
        extras["eigenvalues"] = release.eigenvalues.tolist()
        extras["trace"] = release.trace
        # Public (a function of the clip norms and the Gram step's mu): lets a client undo the
        # upward shift of the top noisy eigenvalues.
        extras["gram_noise_std"] = sigma
        variance_noise = gram_sensitivity(clip) / split.variance_mu
        noise = (variance_noise, sigma, mean_noise)
        energy = None
        if release.exact_energy is not None:
            energy = (*release.exact_energy, n)
        extras.update(
            variance_extras(
                data, release, clip, center, noise, rng, 1.0, energy, gram_clip=row_clip
            )
        )
        return MechanismOutput(basis=release.basis, extras=extras)


def variance_clip_norm(
    clip_norm: float,
    pair_top: float | None,
    n_cols: int,
    mean_noise: float,
    factor: float = 1.0,
) -> float:
    """The explained-variance step's row clip after the probe: ``C`` when the probe made no
    reading or read it in its top bin (then at least 1% of the pairs lie beyond ``C/sqrt(2)``),
    else
    ``min(C, factor sqrt(C_top^2 + d sigma_mu^2))``: the centred rows' norm at the pairs'
    :data:`~service.mechanisms.centring_choice.VARIANCE_CLIP_QUANTILE` (with the mean's
    noise on the mean route, as :func:`~service.mechanisms.centring_choice.mean_route_clip`).
    Public given the probe's output."""
    # A reading in the probe's top bin (above C/sqrt(2)) says nothing about where the pairs
    # end: their norms were clipped to C for the histogram, so that bin holds every pair
    # beyond it too (spiked unit rows: a reading of 0.996 C, the halved pairs clipped at
    # 0.70 C, the share 0.035 low and 3 of 10 intervals missing it).
    if pair_top is None or pair_top > clip_norm * math.sqrt(0.5):
        return clip_norm
    return min(clip_norm, factor * math.sqrt(pair_top**2 + n_cols * mean_noise**2))


def chosen_centring_run(
    data: FloatArray,
    spec: ReleaseSpec[AnalyzeGaussParams],
    split: GaussSplit,
    rng: np.random.Generator,
) -> MechanismOutput:
    """``analyze_gauss`` with the centring chosen by the probe: the mean route (private mean,
    rows centred on it, clipped at :func:`mean_route_clip`), pairs (the Gram of the ``m``
    paired differences clipped at ``C_p``, eigenvalues, trace and sums scaled by ``n/m``) or
    none (the uncentred rows clipped at ``C_u``). ``n >= 2`` rows in an array.

    Extras: ``centring`` (the route), ``centring_scores``, ``uncentred_clip_norm`` and
    ``pair_clip_norm`` (the probe's released quantiles), ``row_clip_norm`` (the clip the Gram
    used), ``center`` on the mean route only (the client subtracts it; the other routes
    release no centre and the client subtracts none).
    """
    params = spec.params
    clip = params.clip_norm
    quantile = params.quantile
    assert clip is not None and quantile is not None  # resolved by prepare; chooses_centring
    n, d = data.shape
    # Public randomness, drawn before anything reads the data: which rows are paired.
    order = rng.permutation(n)
    # One pass over the rows (in chunks of the permuted order) gives both probe histograms and
    # the clipped rows' sum for the mean: no m x d array of pairs, no separate mean pass.
    counts = probe_pass(data, clip, order)
    probe = read_probe(counts, n, clip, quantile, split.clip_mu, rng)
    choice = choose_centring(
        probe.uncentred_high, probe.pair_high, n, d, clip, split.mean_mu, split.gram_mu
    )
    rest_mu = math.hypot(split.mean_mu, split.gram_mu)
    extras: dict[str, Any] = {
        "centring": choice.route,
        "centring_scores": choice.scores,
        "probe_quantiles": {
            "uncentred": [probe.uncentred_low, probe.uncentred_high],
            "pairs": [probe.pair_low, probe.pair_high],
        },
    }
    center: FloatArray | None = None
    mean_noise = 0.0
    scale = 1.0
    # Float32 where public facts allow it (issue 32 item 5): the Gram of the mean and none
    # routes, its noise calibrated to the float32 sum's larger sensitivity (single_gram_fits).
    single = False
    centred_squares: FloatArray | None = None
    if choice.route == "mean":
        mean_noise = mean_sensitivity(clip, n) / split.mean_mu
        # private_center_sigma's release from the pass's sum (the same mean up to the order
        # of its terms, the same noise).
        mean = counts.clipped_sum / n
        center = round_to_grid(
            mean + rng.normal(0.0, mean_noise, size=d), mean_noise / GRID_DIVISOR
        )
        extras["center"] = center.tolist()
        row_clip = mean_route_clip(clip, probe.pair_low, d, mean_noise)
        gram_mu = split.gram_mu
        single = single_gram_fits(n, row_clip)
        centred_squares = np.empty(n, dtype=np.float64)
        gram = fast_gram(
            data,
            clip,
            center,
            row_clip,
            counts.row_squares,
            single=single,
            centred_squares=centred_squares,
            single_centring=single and single_centring_fits(d, clip, center, probe.pair_low),
        )
    elif choice.route == "pairs":
        scale = n / counts.n_pairs
        row_clip = probe.pair_low
        gram_mu = rest_mu
        gram = paired_gram(data, clip, order, row_clip, 0, counts.row_factors)
    else:
        row_clip = probe.uncentred_low
        gram_mu = rest_mu
        single = single_gram_fits(n, row_clip)
        gram = fast_gram(data, clip, None, row_clip, counts.row_squares, single=single)
    extras["row_clip_norm"] = row_clip
    sigma = gram_sensitivity(row_clip) / gram_mu
    if single:
        sigma *= 1.0 + SINGLE_GRAM_SLACK
    release = release_of_gram(gram, spec.k, sigma, rng)
    # Scaled by n/m for pairs (post-processing): the figures estimate the centred n-row Gram.
    release = GaussRelease(release.basis, release.eigenvalues * scale, release.trace * scale)
    extras["eigenvalues"] = release.eigenvalues.tolist()
    extras["trace"] = release.trace
    extras["gram_noise_std"] = sigma * scale
    if choice.route == "mean":
        variance_clip = variance_clip_norm(clip, probe.pair_top, d, mean_noise)
    else:
        # Halved pairs p_j/sqrt(2) (below): their norms are the probe's pairs' over sqrt(2).
        variance_clip = variance_clip_norm(clip, probe.pair_top, 0, 0.0, math.sqrt(0.5))
    extras["variance_clip_norm"] = variance_clip
    # The step's rows lie in the ball of radius variance_clip (public after the probe): its
    # sensitivity is sqrt(2) variance_clip^2 and the noise keeps the ratio mu_V.
    variance_noise = gram_sensitivity(variance_clip) / split.variance_mu
    noise = (variance_noise, sigma * scale, mean_noise)
    if choice.route == "mean":
        # From the probe's factors and norms and one pass X [U, c] (the same sums).
        assert center is not None
        fits = single_projections_fit(n, d, spec.k, clip, probe.pair_low)
        sums = probe_centred_energy(
            data,
            counts,
            release.basis,
            center,
            variance_clip,
            single=fits,
            centred_squares=centred_squares,
        )
        if sums is None:
            sums = fast_energy(data, release.basis, clip, center, variance_clip)
        energy = (*sums, n)
        extras.update(
            variance_extras(
                data, release, clip, center, noise, rng, 1.0, energy, gram_clip=row_clip
            )
        )
    else:
        # Without a mean the sums are over paired differences, so they estimate the centred
        # rows' (what the caller asked for), also when the route is "none". After the pairs
        # route the other pairing (x_(2j+1), x_(2j+2)): see paired_differences.
        # Halved, (x_a - x_b)/2 (norm <= C), so the clip at C never bites: the sqrt(2)-scaled
        # differences reach sqrt(2) C, and clipping them at C shrank exactly the pairs that
        # differ most, biasing the share down (spiked rows, n = 3,500, eps 1: stated
        # 0.55-0.58 with 90% intervals missing the true 0.62 in 15 of 20 runs). Their second
        # moment is Sigma/2, hence the factor 2 in the scale. The clip at the pairs' 0.99
        # quantile shortens about 1% of them.
        offset = 1 if choice.route == "pairs" and n >= 3 else 0
        found = None
        if offset == 0:
            # The probe's own pairs: scored from its clip factors and pair norms and one
            # sequential pass X U, not a second gathered pass (the same sums up to rounding).
            # Halved pairs: their norms are about the probe's pairs' over sqrt(2).
            fits = single_projections_fit(n, d, spec.k, clip, probe.pair_low * math.sqrt(0.5))
            found = probe_paired_energy(
                data, clip, order, counts, release.basis, variance_clip, single=fits
            )
        energy = found or paired_energy(
            data, clip, order, offset, release.basis, variance_clip, factors=counts.row_factors
        )
        score_scale = 2.0 * n / energy[2]
        extras.update(variance_extras(data, release, clip, None, noise, rng, score_scale, energy))
    return MechanismOutput(basis=release.basis, extras=extras)
