"""M7 ``spectrum``: noisy top eigenvalues of the clipped ``X^T X``, and a suggested ``k``.

Tsfadia, "On Differentially Private Subspace Estimation in a Distribution-Free Setting",
NeurIPS 2024, Section 2.1 (seed 001): privately choosing ``k``.

Privacy: replacing one clipped row changes ``H = X^T X`` by ``G = a a^T - b b^T``, so by
Hoffman-Wielandt the vector of eigenvalues (and so its top-``m`` part) moves by at most
``||G||_F <= sqrt(2) C^2`` in l2. Adding iid Gaussian noise with the analytic ``sigma`` for
``D = sqrt(2) C^2`` makes the vector ``(eps, delta)``-DP. Clamping at zero, sorting, rounding to a
public grid, square roots (singular values for display) and the suggested ``k`` are
post-processing. Cost: exactly ``(eps, delta)``.

Per person (a dataset with ``privacy_unit_column``, :mod:`service.privacy_unit`): the worker
scales each person's clipped rows together so that ``||G_p||_F <= C^2``; two PSD matrices of
Frobenius norm ``<= C^2`` differ by ``<= sqrt(2) C^2``, so replacing a whole person moves the
eigenvalue vector by at most ``sqrt(2) C^2`` too, and this calibration is per person. A public
centre is applied before the bound; a private centre is one vector per person
(:mod:`service.privacy_unit_centre`: sensitivity ``2C/P``, always the mean route).

Centring (``center``, PCA semantics): as for ``analyze_gauss`` (:mod:`service.mechanisms.centring`):
the eigenvalues are those of the Gram matrix of ``clip_C(clip_C(x) - c)``, rows of norm ``<= C``,
so the sensitivity is unchanged; a private ``c`` spends ``center_share`` of the budget and the
eigenvalues the rest.

A private centre ``mu_hat = mu + e`` adds ``n e e^T`` to the centred Gram: a rank-one term of
expected size ``B = n d s^2`` (``s^2`` the variance of a coordinate of the mean's noise) along a
random direction. Where ``B`` exceeds the eigenvalues' noise ``sigma``, that term is released as
an invented top eigenvalue (unit-norm digits at eps 0.3: 450-640 against a true 85, suggesting
k = 1-2). There the Gram step reads **pairs** instead (``center_route``, chosen from public
facts only: ``n, d, C``, the budget and whether the rows can be read in pairs): the paired
differences ``p_j = clip_C((clip_C(x_r(2j)) - clip_C(x_r(2j+1)))/sqrt(2))``, ``j < m =
floor(n/2)``, for a permutation ``r`` drawn from the run's CSPRNG before the data is read
(public randomness). Over the pairing, ``E sum_j p_j p_j^T = m/(n-1) S`` with ``S`` the centred
scatter matrix (before the clip of ``p_j``, which a pair of rows within a half-space never
meets), so the released values are the pairs' noisy eigenvalues times ``(n - 1)/m``: no mean
noise in them, twice the noise. Privacy is unchanged: a replaced row changes one ``p_j``, of
norm ``<= C`` before and after, so the eigenvalue vector has the same l2 sensitivity
``sqrt(2) C^2`` and gets the same noise at the same ``(1 - s)`` share; the mean is still
released with its share ``s`` (``extras.center``, for projecting rows). The route, the factor
``(n - 1)/m`` and everything scaled by it are post-processing. Rows read only in one pass (a
dataset registered by reference) keep the mean route.

Why eigenvalues and not singular values (Mirsky, sensitivity ``2C``): an error ``e`` on
``lambda_i = s_i^2`` is an error of about ``e / (2 s_i)`` on ``s_i``, so the relative error on
``s_i`` is about ``0.35 C / s_i`` times the singular-value route's: far smaller once ``s_i >> C``.

Floating point: clipping is right at every finite scale (power-of-two rescaling); clip norms for
which ``n C^2`` or the noise scale is not a comfortable double are refused before charging; the
eigensolver has a fixed public fallback (:mod:`service.mechanisms.linalg`).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt

from service.mechanisms.base import (
    GaussianStep,
    InvalidParameter,
    MechanismOutput,
    Preview,
    PrivacyStep,
    PublicContext,
    ReleaseSpec,
)
from service.mechanisms.centring import (
    BudgetSplit,
    CenterParams,
    CentredGramMechanism,
    budget_split,
    center_for_run,
    center_preview,
    center_steps,
    check_center_shape,
    mean_noise_scale,
    with_center_multiples,
)
from service.mechanisms.linalg import (
    FloatArray,
    RowSource,
    clip_rows,
    clipped_gram,
    clipped_gram_memory,
    eigenvalues_desc,
    eigh_memory,
)
from service.mechanisms.noise import GRID_DIVISOR, analytic_gaussian_sigma, round_to_grid

#: A released eigenvalue counts as "clearly above the noise" when it exceeds ``threshold =
#: z sigma`` with ``z`` chosen so that, if every true eigenvalue were 0, all ``m`` noisy values
#: stay below it with probability ``1 - FALSE_SIGNAL`` (union bound over ``m``): ``z = 3.7`` for
#: ``m = 1``, 4.4 for ``m = 50``.
FALSE_SIGNAL = 1e-3

#: A "large multiplicative drop" between consecutive eigenvalues: 4, i.e. singular values
#: falling by half.
DROP_RATIO = 4.0


class SpectrumParams(CenterParams):
    """Params of ``spectrum``: the clip norm and the centring (``k`` is the number of values)."""


def spectrum_sensitivity(clip_norm: float) -> float:
    """l2 sensitivity of the eigenvalue vector of ``X^T X`` under replacement: ``sqrt(2) C^2``."""
    return math.sqrt(2.0) * clip_norm**2


def noise_std(clip_norm: float, epsilon: float, delta: float) -> float:
    """Per-eigenvalue standard deviation: analytic Gaussian ``sigma`` for ``D = sqrt(2) C^2``."""
    return analytic_gaussian_sigma(spectrum_sensitivity(clip_norm), epsilon, delta)


def signal_threshold(std: float, m: int) -> float:
    """``z sigma`` with ``P[max of m N(0, sigma^2) > z sigma] <= FALSE_SIGNAL`` (union bound)."""
    return NormalDist().inv_cdf(1.0 - FALSE_SIGNAL / m) * std


def suggest_k(values: FloatArray, threshold: float) -> int:
    """The first large multiplicative drop among the values clearly above the noise.

    Only ``i`` with ``lambda_i > threshold`` are candidates. Each value is floored at the
    threshold; the suggestion is the first candidate ``i`` with
    ``lambda_i >= DROP_RATIO * max(lambda_{i+1}, threshold)``. Without such a drop it is the
    number of candidates, at least 1 (``m`` if all are significant: ask for more values, the
    drop may lie beyond them).

    Parameters
    ----------
    values : (m,) array
        Released eigenvalues, descending.
    threshold : float
        :func:`signal_threshold` of their noise.
    """
    floored = np.maximum(values, threshold)
    significant = int(np.count_nonzero(values > threshold))
    for i in range(significant):
        following = floored[i + 1] if i + 1 < len(floored) else threshold
        if floored[i] >= DROP_RATIO * following:
            return i + 1
    return max(1, significant)


def spectrum(
    data: FloatArray,
    m: int,
    epsilon: float,
    delta: float,
    clip_norm: float,
    rng: np.random.Generator,
    center: FloatArray | None = None,
    scale: float = 1.0,
    gram: FloatArray | None = None,
) -> tuple[FloatArray, int, float]:
    """Release the top-``m`` eigenvalues of the clipped ``X^T X`` with Gaussian noise.

    Parameters
    ----------
    data : (n, d) array
        The rows; may be a read-only memory map (read in chunks, memory ``O(d^2)``).
    m : int
        Number of values, ``1 <= m <= min(n, d)``.
    epsilon, delta : float
        Privacy cost, ``epsilon > 0``, ``0 < delta < 1``.
    clip_norm : float
        Public row norm bound ``C``.
    rng : numpy.random.Generator
        The release's generator.
    center : (d,) array, optional
        A public (or already released) centre: rows become ``clip_C(clip_C(x) - center)``.
    scale : float
        Public factor applied to the noisy values (post-processing): ``(n - 1)/m`` on the
        pairs route.
    gram : (d, d) array, optional
        The Gram matrix of rows of norm ``<= C`` already computed (the pairs'); ``data`` and
        ``center`` are then not read.

    Returns
    -------
    values : (m,) array
        Noisy eigenvalues, clamped at 0, sorted descending, times ``scale``, rounded to
        multiples of ``scale std / GRID_DIVISOR``.
    suggested_k : int
        See :func:`suggest_k`.
    std : float
        Per-eigenvalue noise standard deviation of the released values, ``scale`` times the
        noise's (public: depends on ``C, eps, delta`` and ``scale`` only).
    """
    if gram is None:
        gram = clipped_gram(data, clip_norm, center=center)
    eigenvalues = eigenvalues_desc(gram)[:m]
    std = noise_std(clip_norm, epsilon, delta)
    noisy = eigenvalues + rng.normal(0.0, std, size=m)
    # True eigenvalues of a PSD matrix are non-negative and sorted, so clamping and sorting
    # never increase the largest per-value error.
    released_std = scale * std
    released = round_to_grid(
        scale * np.sort(np.maximum(noisy, 0.0))[::-1], released_std / GRID_DIVISOR
    )
    return released, suggest_k(released, signal_threshold(released_std, m)), released_std


Route = Literal["mean", "pairs"]


def center_route(n: int, d: int, params: SpectrumParams, split: BudgetSplit, pairs: bool) -> Route:
    """``"pairs"`` where a private mean's rank-one term (:func:`rank_one_bias`) would exceed the
    eigenvalues' noise ``sigma`` (it would read as a component), the rows can be read in pairs
    (``pairs``: an array, not a one-pass source) and ``n >= 2``; ``"mean"`` otherwise (also
    without a private centre). Public facts only. At the mean route's edge, ``B = sigma``, its
    top value errs by about ``B + sigma = 2 sigma``, the pairs route's by ``2 sigma``."""
    if params.center != "private" or params.clip_norm is None or not pairs or n < 2:
        return "mean"
    sigma = noise_std(params.clip_norm, split.gram_epsilon, split.gram_delta)
    return "pairs" if rank_one_bias(n, d, params, split) > sigma else "mean"


def pairs_scale(n: int) -> float:
    """``(n - 1)/m``, ``m = floor(n/2)``: the pairs' Gram times it estimates the centred one."""
    return (n - 1) / (n // 2)


def paired_gram(
    data: FloatArray, clip_norm: float, order: npt.NDArray[np.intp], chunk_rows: int = 8192
) -> FloatArray:
    """``sum_j p_j p_j^T`` of the paired differences (module docstring), each ``p_j`` clipped
    to ``C``, for the permutation ``order`` of the rows; in chunks of rows (memory
    ``O(chunk d + d^2)``, a memory map is read in ascending order within a chunk)."""
    n, d = data.shape
    gram = np.zeros((d, d), dtype=np.float64)
    chosen = np.asarray(order)[: 2 * (n // 2)]
    step = chunk_rows + chunk_rows % 2  # even: a pair never straddles two chunks
    for start in range(0, chosen.shape[0], step):
        wanted = chosen[start : start + step]
        rows = np.sort(wanted)
        block = np.asarray(data[rows], dtype=np.float64)[np.searchsorted(rows, wanted)]
        clipped = clip_rows(block, clip_norm)
        with np.errstate(under="ignore"):
            pairs = (clipped[0::2] - clipped[1::2]) / math.sqrt(2.0)
        gram += clipped_gram(pairs, clip_norm)
    return gram


def rank_one_bias(n: int, d: int, params: SpectrumParams, split: BudgetSplit) -> float:
    """``n d s^2``: the expected size of the rank-one term ``n (mu_hat - mu)(mu_hat - mu)^T``
    that centring on a private mean with per-coordinate noise ``s`` adds to the centred
    ``X^T X`` (issue 24, item 2); 0 without a private mean. Public."""
    if params.center != "private" or params.clip_norm is None:
        return 0.0
    noise = mean_noise_scale(params.clip_norm, n, d, split)
    # Laplace noise of scale b has variance 2 b^2 per coordinate.
    variance = noise**2 if split.mean_delta > 0 else 2.0 * noise**2
    return n * d * variance


def without_rank_one(values: FloatArray, bias: float) -> FloatArray:
    """The released eigenvalues with the expected rank-one term removed from the largest (where
    it sits once it exceeds the others: the direction of the mean's noise is one of the top
    eigenvectors), re-sorted: post-processing, used only to suggest k, so that the mean's noise
    does not read as a dominant component."""
    adjusted = np.asarray(values, dtype=np.float64).copy()
    if adjusted.size:
        adjusted[0] = max(0.0, adjusted[0] - bias)
    return np.sort(adjusted)[::-1]


def spectrum_output(
    values: FloatArray,
    suggested: int,
    std: float,
    k: int,
    bias: float,
    extras: dict[str, Any],
) -> MechanismOutput:
    """The release of noisy eigenvalues ``values`` (shape ``(d,)``) with their ``noise_std``:
    with a private mean's rank-one ``bias`` (> 0: the expected ``n d sigma_mean^2`` its noise
    adds to the top eigenvalue), ``suggested_k`` is read with that removed (post-processing)."""
    if bias > 0:
        extras = {**extras, "center_rank_one_bias": bias}
        suggested = suggest_k(without_rank_one(values, bias), signal_threshold(std, k))
    return MechanismOutput(
        basis=None,
        extras={
            **extras,
            "eigenvalues": values.tolist(),
            "singular_values": np.sqrt(values).tolist(),
            "suggested_k": suggested,
            "noise_std": std,
            "signal_threshold": signal_threshold(std, k),
            "grid": std / GRID_DIVISOR,
        },
    )


class Spectrum(CentredGramMechanism[SpectrumParams]):
    name: ClassVar[str] = "spectrum"
    accountings: ClassVar[frozenset[str]] = frozenset({"basic", "gaussian", "zcdp"})
    title: ClassVar[str] = "Noisy eigenvalues of X^T X, for choosing k"
    paper: ClassVar[str] = (
        "Tsfadia, On Differentially Private Subspace Estimation in a Distribution-Free "
        "Setting, NeurIPS 2024, Section 2.1"
    )
    summary: ClassVar[str] = (
        "Releases the top-k eigenvalues of the clipped X^T X (k = how many, at most min(n, d)) "
        "with Gaussian noise for l2 sensitivity sqrt(2) C^2, their square roots as singular "
        "values for display, the noise_std, and a suggested_k (first large drop among values "
        "clearly above the noise). No basis. Spend a small budget here to pick k before a "
        "subspace release."
    )
    params_model: ClassVar[type[SpectrumParams]] = SpectrumParams
    releases_basis: ClassVar[bool] = False

    def check_specific(self, ctx: PublicContext, k: int, params: SpectrumParams) -> None:
        limit = min(ctx.n_rows, ctx.n_cols)
        if k > limit:
            raise InvalidParameter(
                "k",
                f"must be <= min(n, d) = {limit} (the number of eigenvalues); "
                f"got {k}, {k - limit} too many",
            )
        check_center_shape(ctx, params)

    def centred_multiples(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: SpectrumParams
    ) -> tuple[float, float]:
        # Per unit C^2: eigenvalues <= trace <= n, noise draws <= 64 sigma; the smallest is the
        # rounding grid sigma / GRID_DIVISOR.
        split = budget_split(epsilon, delta, params)
        unit_sigma = noise_std(1.0, split.gram_epsilon, split.gram_delta)
        low, high = min(1.0, unit_sigma / GRID_DIVISOR), ctx.n_rows + 64.0 * unit_sigma
        return with_center_multiples(ctx, split, params, low, high)

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[SpectrumParams]) -> Preview:
        assert spec.params.clip_norm is not None  # resolved by prepare
        split = budget_split(spec.epsilon, spec.delta, spec.params)
        std = noise_std(spec.params.clip_norm, split.gram_epsilon, split.gram_delta)
        route = center_route(ctx.n_rows, ctx.n_cols, spec.params, split, pairs=True)
        route_meaning: list[str] = []
        if route == "pairs":
            std *= pairs_scale(ctx.n_rows)
            route_meaning.append(
                "The private mean's noise would add a rank-one term larger than the "
                "eigenvalues' noise (it would read as a component): the eigenvalues are read "
                f"from paired differences of randomly paired rows instead, times "
                f"{pairs_scale(ctx.n_rows):.4g} (twice the noise, no mean noise in them); the "
                "mean is still released."
            )
        threshold = signal_threshold(std, spec.k)
        centring, centring_meaning = center_preview(ctx, spec.params, split)
        if spec.params.center == "private":
            centring["center_route"] = route
        return Preview(
            scales={
                "noise_std": std,
                "signal_threshold": threshold,
                "grid": std / GRID_DIVISOR,
                **centring,
            },
            meaning=[
                f"Each of the {spec.k} eigenvalues of the clipped X^T X gets Gaussian noise of "
                f"standard deviation {std:.4g} (singular values: about {std:.4g} / (2 s)).",
                f"suggested_k counts only eigenvalues above {threshold:.4g} (if all were 0, all "
                f"{spec.k} noisy values would stay below it with probability 0.999).",
                *centring_meaning,
                *route_meaning,
            ],
        )

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[SpectrumParams]) -> int:
        d = ctx.n_cols
        # The Gram matrix stays alive through the eigensolver (no eigenvectors); then O(m).
        centred = spec.params.center != "none"
        # The pairs route's chunk: the gathered block and its clipped copy, then the pairs' Gram
        # (its own d x d beside the running sum).
        pairs = 8 * (2 * min(ctx.n_rows, 8192) * d + d * d) + clipped_gram_memory(ctx.n_rows, d)
        return max(
            clipped_gram_memory(ctx.n_rows, d, centred=centred),
            pairs if centred else 0,
            8 * d * d + eigh_memory(d, 0),
        )

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[SpectrumParams]
    ) -> list[PrivacyStep]:
        """Purely Gaussian: the private mean's step (if centred) and the eigenvalue vector's
        noise, l2 sensitivity ``sqrt(2) C^2`` (Hoffman-Wielandt)."""
        assert spec.params.clip_norm is not None  # resolved by prepare
        split = budget_split(spec.epsilon, spec.delta, spec.params)
        values = GaussianStep(
            spectrum_sensitivity(spec.params.clip_norm),
            noise_std(spec.params.clip_norm, split.gram_epsilon, split.gram_delta),
        )
        return [*center_steps(ctx, spec.params, split), values]

    def run(
        self, data: FloatArray, spec: ReleaseSpec[SpectrumParams], rng: np.random.Generator
    ) -> MechanismOutput:
        assert spec.params.clip_norm is not None  # resolved by prepare
        split = budget_split(spec.epsilon, spec.delta, spec.params)
        n, d = data.shape
        route = center_route(n, d, spec.params, split, pairs=not isinstance(data, RowSource))
        center, centre_extras = center_for_run(data, spec.params, split, rng)
        gram: FloatArray | None = None
        scale = 1.0
        if route == "pairs":
            # Public randomness, drawn before the Gram step reads the data: the pairing.
            gram = paired_gram(data, spec.params.clip_norm, rng.permutation(n))
            scale = pairs_scale(n)
        values, suggested, std = spectrum(
            data,
            spec.k,
            split.gram_epsilon,
            split.gram_delta,
            spec.params.clip_norm,
            rng,
            center=center,
            scale=scale,
            gram=gram,
        )
        if spec.params.center == "private":
            centre_extras["center_route"] = route
        bias = rank_one_bias(n, d, spec.params, split) if route == "mean" else 0.0
        return spectrum_output(values, suggested, std, spec.k, bias, centre_extras)
