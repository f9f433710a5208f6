"""M6 ``friendly_aggregate``: random-partition sample-and-aggregate with friendly averaging.

Tsfadia, "On Differentially Private Subspace Estimation in a Distribution-Free Setting",
NeurIPS 2024, Section 4.1 with FriendlyCore averaging (seed 001); constants as in ALGORITHMS.md M6.

Privacy: a replaced row moves one of the ``t`` points ``y_j``. The radius comes from AboveThreshold
over ``W(r_i)`` (sensitivity ``Delta_W = 1 + (t-1)/b``), ``eps0``-DP. The weighted mean moves by at
most ``r (4(t-1)/b + 6)/W``; PTR releases ``W_low``, a lower bound on ``W`` except with probability
``delta1`` (``(eps1, 0)`` for the Laplace count), and Gaussian noise for ``D = r(4(t-1)/b+6)/W_low``
is ``(eps2, delta2)``-DP on the good event, exactly as M2. Total ``(eps0+eps1+eps2, delta1+delta2)``
``= (eps, delta)``; everything after the noisy mean is post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from service.mechanisms.base import (
    InvalidParameter,
    Mechanism,
    MechanismOutput,
    MechanismParams,
    PublicContext,
    ReleaseSpec,
)
from service.mechanisms.linalg import FloatArray, top_k_eigh, top_right_singular_vectors
from service.mechanisms.noise import analytic_gaussian_sigma, laplace
from service.mechanisms.sample_aggregate import (
    partition_and_bases,
    reference_embeddings,
    reference_points,
)

Aggregator = Literal["reference_points", "projection"]

#: Default ``t`` keeps ``m = floor(n/t) >= ROWS_PER_DIMENSION * k`` rows per subset ...
ROWS_PER_DIMENSION = 10
#: ... and at most this many subsets (the pairwise step costs ``O(t^2 q d)``).
DEFAULT_T_CAP = 2000
#: Largest ``t`` accepted at all: the ``t x t`` distance matrix is 800 MB at 10,000.
MAX_T = 10_000
#: Largest ``t q d`` accepted (the stacked points, 8 bytes each: 2 GB).
MAX_POINT_FLOATS = 250_000_000
#: The projection aggregator averages ``d x d`` matrices: ``d^2`` memory, ``d^3`` for the final
#: eigendecomposition and ``d^2`` noise coordinates; above this ``d`` use ``reference_points``.
PROJECTION_MAX_D = 1000
#: Radii searched: ``r_i = r_max 2^{-i}`` for ``i = RADIUS_STEPS, ..., 1, 0`` (smallest first).
#: ``2^{-32} ~ 2.3e-10`` of ``r_max`` is far below any spread that subsets of real data show and
#: near the floating-point resolution of Gram-based distances; every extra radius is one more
#: chance for AboveThreshold to stop spuriously (the noise does not grow with the number of
#: queries, but the number of noisy comparisons does), so the grid stops there.
RADIUS_STEPS = 32
#: AboveThreshold stops at the first radius whose total weight exceeds this fraction of ``t``.
THRESHOLD_FRACTION = 0.75


class FriendlyAggregateParams(MechanismParams):
    """Params of ``friendly_aggregate``."""

    t: int | None = Field(
        default=None,
        ge=2,
        description=(
            "Number of subsets of the random partition. Default: min(floor(n/(10k)), 2000), so "
            "each subset has at least 10k rows."
        ),
    )
    q: int | None = Field(
        default=None,
        ge=1,
        description="Number of Gaussian reference points (reference_points only); default 2k.",
    )
    aggregator: Aggregator = Field(
        default="reference_points",
        description=(
            "reference_points: average P U_j U_j^T for q public Gaussian points P (any d). "
            "projection: average the d x d projectors U_j U_j^T (d <= 1000)."
        ),
    )
    radius: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Friendly-averaging radius r (distance between aggregated points). Default: chosen "
            "privately by AboveThreshold over r_max 2^-i, using a quarter of epsilon."
        ),
    )


@dataclass(frozen=True)
class BudgetSplit:
    """Fixed fractions of the request's ``(epsilon, delta)``."""

    eps0: float
    eps1: float
    eps2: float
    delta1: float
    delta2: float


@dataclass(frozen=True)
class FriendlyResult:
    """What :func:`friendly_aggregate` releases (every field is private output or public)."""

    basis: FloatArray | None
    radius: float
    #: ``i`` with ``radius = r_max 2^{-i}`` when AboveThreshold stopped; ``None`` otherwise.
    radius_exponent: int | None
    weight_low: float
    noise_sigma: float | None


# ---------------------------------------------------------------------------------------------
# Calibration (each formula of ALGORITHMS.md M6 as a function, so tests can check it)


def budget_split(epsilon: float, delta: float, radius_given: bool) -> BudgetSplit:
    """``eps0 = eps1 = eps/4, eps2 = eps/2``; ``eps0 = 0, eps1 = eps2 = eps/2`` with a radius."""
    if radius_given:
        return BudgetSplit(0.0, epsilon / 2, epsilon / 2, delta / 2, delta / 2)
    return BudgetSplit(epsilon / 4, epsilon / 4, epsilon / 2, delta / 2, delta / 2)


def ramp_width(t: int) -> float:
    """``b = t/4``: weights ramp from 0 at ``c = t/2 + 1`` friends to 1 at ``3t/4 + 1``."""
    return t / 4.0


def weight_sensitivity(t: int, b: float) -> float:
    """``Delta_W = 1 + (t-1)/b``: the replaced point's own weight moves by 1, each other by 1/b."""
    return 1.0 + (t - 1) / b


def mean_sensitivity(radius: float, t: int, b: float, weight: float) -> float:
    """``r (4(t-1)/b + 6) / W``: l2 sensitivity of the weighted mean at total weight ``W``."""
    return radius * (4.0 * (t - 1) / b + 6.0) / weight


def weight_lower_bound(noisy_weight: float, sens: float, eps1: float, delta1: float) -> float:
    """``W_low = W_hat - (Delta_W/eps1) ln(1/(2 delta1))``, so ``P[W_low > W] = delta1``."""
    return noisy_weight - (sens / eps1) * math.log(1.0 / (2.0 * delta1))


def weight_floor(sens: float) -> float:
    """PTR floor ``Delta_W + 1``: above it ``W > 0`` on both neighbours in the good event."""
    return sens + 1.0


def default_t(n: int, k: int) -> int:
    """``min(floor(n/(10k)), 2000)``."""
    return min(n // (ROWS_PER_DIMENSION * k), DEFAULT_T_CAP)


def ptr_feasible(t: int, eps1: float, delta1: float) -> bool:
    """Whether all-ones weights (``W = t``, noise-free) would clear the PTR floor."""
    sens = weight_sensitivity(t, ramp_width(t))
    return weight_lower_bound(float(t), sens, eps1, delta1) >= weight_floor(sens)


def min_feasible_t(eps1: float, delta1: float) -> int:
    """Smallest ``t`` for which :func:`ptr_feasible` holds.

    With ``b = t/4``, ``Delta_W = 5 - 4/t`` and the condition is ``t - c (5 - 4/t) - 1 >= 0`` for
    ``c = 1 + ln(1/(2 delta1))/eps1``, i.e. ``t^2 - (5c + 1) t + 4c >= 0``: start at the larger
    root and correct for rounding.
    """
    c = 1.0 + math.log(1.0 / (2.0 * delta1)) / eps1
    disc = (5.0 * c + 1.0) ** 2 - 16.0 * c
    t = max(2, math.floor(((5.0 * c + 1.0) + math.sqrt(disc)) / 2.0) - 2)
    while not ptr_feasible(t, eps1, delta1):
        t += 1
    return t


def radius_grid(r_max: float, steps: int = RADIUS_STEPS) -> FloatArray:
    """``r_max 2^{-i}`` for ``i = steps, ..., 0``: ascending, as AboveThreshold asks them."""
    return np.asarray(r_max * np.exp2(-np.arange(steps, -1, -1, dtype=np.float64)))


# ---------------------------------------------------------------------------------------------
# Friendly averaging


def gram_distances(points: FloatArray) -> FloatArray:
    """All pairwise distances ``||y_j - y_l||`` from one Gram matrix.

    Parameters
    ----------
    points : (t, p) array
        Distances are translation-invariant, so pass the points centred (e.g. at their mean):
        the Gram route loses ``~ eps_machine ||y||^2`` in each squared distance.

    Returns
    -------
    (t, t) array, symmetric, zero diagonal.
    """
    gram = points @ points.T
    sq = np.diagonal(gram).copy()
    dist2 = sq[:, None] + sq[None, :] - 2.0 * gram
    np.maximum(dist2, 0.0, out=dist2)
    np.fill_diagonal(dist2, 0.0)
    return np.asarray(np.sqrt(dist2, out=dist2), dtype=np.float64)


def projection_distances(bases: FloatArray, *, block_floats: int = 4_000_000) -> FloatArray:
    """``||U_j U_j^T - U_l U_l^T||_F = sqrt(2k - 2 ||U_j^T U_l||_F^2)`` for all pairs.

    Uses the ``(t k) x (t k)`` Gram matrix of the stacked bases in row blocks, never the
    ``t x d^2`` stacked projectors: time ``O(t^2 k^2 d)``, memory ``O(t d k + block)``.

    Parameters
    ----------
    bases : (t, d, k) array

    Returns
    -------
    (t, t) array, symmetric, zero diagonal.
    """
    t, d, k = bases.shape
    stacked = bases.transpose(1, 0, 2).reshape(d, t * k)
    overlap = np.empty((t, t), dtype=np.float64)
    per_block = max(1, block_floats // (t * k * k))
    for start in range(0, t, per_block):
        stop = min(t, start + per_block)
        cross = stacked[:, start * k : stop * k].T @ stacked
        overlap[start:stop] = np.square(cross.reshape(stop - start, k, t, k)).sum(axis=(1, 3))
    dist2 = 2.0 * k - 2.0 * overlap
    dist2 = 0.5 * (dist2 + dist2.T)
    np.maximum(dist2, 0.0, out=dist2)
    np.fill_diagonal(dist2, 0.0)
    return np.asarray(np.sqrt(dist2), dtype=np.float64)


def friend_counts(distances: FloatArray, radius: float) -> npt.NDArray[np.int64]:
    """``c_j = #{l : ||y_j - y_l|| <= r}``, the point itself included."""
    return np.asarray(np.count_nonzero(distances <= radius, axis=1), dtype=np.int64)


def friendly_weights(distances: FloatArray, radius: float, b: float) -> FloatArray:
    """``w_j = clip((c_j - t/2 - 1)/b, 0, 1)``.

    Parameters
    ----------
    distances : (t, t) array
    radius : float
    b : float
        Ramp width.

    Returns
    -------
    (t,) array of weights in ``[0, 1]``.
    """
    t = distances.shape[0]
    counts = friend_counts(distances, radius).astype(np.float64)
    return np.asarray(np.clip((counts - t / 2.0 - 1.0) / b, 0.0, 1.0), dtype=np.float64)


def above_threshold(
    answers: FloatArray,
    threshold: float,
    sensitivity: float,
    epsilon: float,
    rng: np.random.Generator,
) -> int | None:
    """AboveThreshold (sparse vector, one positive answer): index of the first noisy answer
    above the noisy threshold, or ``None``.

    Dwork & Roth, The Algorithmic Foundations of Differential Privacy (2014), Algorithm 1, for
    queries of sensitivity ``Delta``: noisy threshold ``T + Lap(2 Delta/eps)``, each query
    ``f_i + Lap(4 Delta/eps)``, halt at the first ``f_i + nu_i >= T_hat``. ``eps``-DP however many
    queries are asked. Answers are computed up front (they are cheap); that is the same
    distribution as asking them one at a time.

    Parameters
    ----------
    answers : (r,) array
        True query answers in the order asked.
    """
    noisy_threshold = threshold + float(laplace(2.0 * sensitivity / epsilon, rng))
    query_noise = laplace(4.0 * sensitivity / epsilon, rng, size=answers.shape[0])
    above = np.flatnonzero(answers + query_noise >= noisy_threshold)
    return int(above[0]) if above.size else None


def friendly_aggregate(
    data: npt.NDArray[Any],
    k: int,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    *,
    t: int,
    q: int | None = None,
    aggregator: Aggregator = "reference_points",
    radius: float | None = None,
) -> FriendlyResult:
    """Release a k-dimensional subspace by friendly averaging of ``t`` subset estimates.

    Parameters
    ----------
    data : (n, d) array
        The rows; may be a read-only memory map (read one group of subsets at a time; memory
        ``O(t q d)`` for reference points, ``O(t d k + d^2)`` for projections).
    k : int
        Subspace dimension; ``k <= floor(n/t)``.
    epsilon, delta : float
        Privacy cost, split by :func:`budget_split`.
    rng : numpy.random.Generator
        The release's generator: partition, reference points and all noise, in that order.
    t : int
        Number of subsets.
    q : int, optional
        Reference points (default ``2k``); ignored by ``projection``.
    aggregator : {"reference_points", "projection"}
    radius : float, optional
        Friendly-averaging radius; chosen by AboveThreshold when absent.

    Returns
    -------
    FriendlyResult
        ``basis`` ``(d, k)`` orthonormal, or ``None`` when the PTR test fails.
    """
    d = data.shape[1]
    split = budget_split(epsilon, delta, radius is not None)
    _, bases = partition_and_bases(data, t, k, rng)
    b = ramp_width(t)
    sens_w = weight_sensitivity(t, b)

    points: FloatArray | None = None
    centre: FloatArray | None = None
    if aggregator == "reference_points":
        ref = reference_points(2 * k if q is None else q, d, rng)
        points = reference_embeddings(bases, ref)
        centre = points.mean(axis=0)
        points -= centre
        distances = gram_distances(points)
        r_max = float(np.linalg.norm(ref))
    else:
        distances = projection_distances(bases)
        r_max = math.sqrt(2.0 * k)

    radius_exponent: int | None = None
    if radius is None:
        radii = radius_grid(r_max)
        totals = np.array([friendly_weights(distances, r, b).sum() for r in radii])
        radius_index = above_threshold(totals, THRESHOLD_FRACTION * t, sens_w, split.eps0, rng)
        if radius_index is not None:
            radius = float(radii[radius_index])
            radius_exponent = RADIUS_STEPS - radius_index
        else:
            radius = r_max

    weights = friendly_weights(distances, radius, b)
    total = float(weights.sum())
    noisy_total = total + float(laplace(sens_w / split.eps1, rng))
    w_low = weight_lower_bound(noisy_total, sens_w, split.eps1, split.delta1)
    if w_low < weight_floor(sens_w):
        return FriendlyResult(None, radius, radius_exponent, w_low, None)

    sigma = analytic_gaussian_sigma(mean_sensitivity(radius, t, b, w_low), split.eps2, split.delta2)
    if points is not None and centre is not None:
        mean = weights @ points / total + centre
        noisy = mean + rng.normal(0.0, sigma, size=mean.shape)
        basis = top_right_singular_vectors(noisy.reshape(-1, d), k)
    else:
        # sum_j w_j U_j U_j^T / W as one (d x tk) @ (tk x d) product over the used subsets
        used = weights > 0
        stacked = bases[used].transpose(1, 0, 2).reshape(d, -1)
        scale = np.repeat(weights[used] / total, k)
        mean_proj = (stacked * scale) @ stacked.T
        noisy = mean_proj + rng.normal(0.0, sigma, size=(d, d))
        _, basis = top_k_eigh(0.5 * (noisy + noisy.T), k)
    return FriendlyResult(basis, radius, radius_exponent, w_low, sigma)


# ---------------------------------------------------------------------------------------------
# The service's mechanism


class FriendlyAggregate(Mechanism[FriendlyAggregateParams]):
    name: ClassVar[str] = "friendly_aggregate"
    title: ClassVar[str] = "Friendly aggregation of subset subspaces (sample and aggregate)"
    paper: ClassVar[str] = (
        "Tsfadia, On Differentially Private Subspace Estimation in a Distribution-Free "
        "Setting, NeurIPS 2024, Section 4.1 (random-partition sample-and-aggregate with "
        "FriendlyCore averaging)"
    )
    summary: ClassVar[str] = (
        "Splits the rows into t random subsets, computes each subset's top-k subspace, and "
        "privately averages those that agree (friendly averaging with a privately chosen "
        "radius and a propose-test-release check). Needs no row norm bound. When the data lies "
        "within ~1e-4 of a k-dimensional subspace it is 10-1000 times more accurate than "
        "analyze_gauss in any d; farther from low rank it loses. May return no result when "
        "the subsets do not agree or n is small for the budget."
    )
    params_model: ClassVar[type[FriendlyAggregateParams]] = FriendlyAggregateParams

    def prepare(
        self,
        ctx: PublicContext,
        k: int,
        epsilon: float,
        delta: float,
        params: FriendlyAggregateParams,
    ) -> FriendlyAggregateParams:
        self.check_common(ctx, k, epsilon, delta)
        n, d = ctx.n_rows, ctx.n_cols
        split = budget_split(epsilon, delta, params.radius is not None)

        if params.aggregator == "projection":
            if params.q is not None:
                raise InvalidParameter("q", "q applies only to aggregator 'reference_points'")
            if d > PROJECTION_MAX_D:
                raise InvalidParameter(
                    "aggregator",
                    f"'projection' averages d x d projectors; with d = {d} > {PROJECTION_MAX_D} "
                    "its d^2 memory, d^3 eigendecomposition and d^2 noise coordinates are too "
                    "costly: use 'reference_points' (error does not grow with d^2)",
                )
        q = params.q if params.q is not None else 2 * k
        if params.aggregator == "reference_points" and q < k:
            raise InvalidParameter("q", f"must be >= k = {k} (the q x d average has rank <= q)")

        t_min = min_feasible_t(split.eps1, split.delta1)
        budget = f"epsilon = {epsilon:g}, delta = {delta:g}"
        if params.t is None:
            t = default_t(n, k)
            if t < t_min:
                rows = ROWS_PER_DIMENSION * k
                if t_min <= DEFAULT_T_CAP:
                    need = f"n >= {t_min * rows} rows (t = {t_min} subsets of {rows})"
                else:
                    need = (
                        f"t = {t_min} subsets, above the default cap {DEFAULT_T_CAP}: pass t "
                        f"explicitly (needs n >= {t_min * k}) or raise epsilon"
                    )
                raise InvalidParameter(
                    "t",
                    f"n = {n} rows give the default t = {t} subsets of {rows} rows, but at "
                    f"{budget} the propose-test-release check needs t >= {t_min} even if every "
                    f"subset agreed; needs {need}, or a larger epsilon or delta",
                )
        else:
            t = params.t
            if t < t_min:
                raise InvalidParameter(
                    "t",
                    f"t = {t} is too small for {budget}: the propose-test-release check needs "
                    f"t >= {t_min} even if every subset agreed (and n >= {t_min * k})",
                )
        if n // t < k:
            raise InvalidParameter(
                "t",
                f"t = {t} subsets of n = {n} rows have {n // t} rows each, fewer than k = {k}; "
                f"needs t <= {n // k}",
            )
        if t > MAX_T:
            raise InvalidParameter("t", f"must be <= {MAX_T} (t x t pairwise distances)")
        if params.aggregator == "reference_points" and t * q * d > MAX_POINT_FLOATS:
            raise InvalidParameter(
                "t",
                f"t q d = {t * q * d} exceeds {MAX_POINT_FLOATS} (memory of the stacked "
                "points); lower t or q",
            )
        if params.aggregator == "projection":
            return params.model_copy(update={"t": t})
        return params.model_copy(update={"t": t, "q": q})

    def run(
        self,
        data: FloatArray,
        spec: ReleaseSpec[FriendlyAggregateParams],
        rng: np.random.Generator,
    ) -> MechanismOutput:
        params = spec.params
        assert params.t is not None  # resolved by prepare
        result = friendly_aggregate(
            data,
            spec.k,
            spec.epsilon,
            spec.delta,
            rng,
            t=params.t,
            q=params.q,
            aggregator=params.aggregator,
            radius=params.radius,
        )
        # Raw noisy doubles (W_low, and sigma, which is a function of it) are not returned: see
        # the floating-point note in noise.py. The radius is a point of the public grid.
        extras: dict[str, Any] = {
            "t": params.t,
            "aggregator": params.aggregator,
            "radius": result.radius,
            "radius_searched": params.radius is None,
            "radius_exponent": result.radius_exponent,
        }
        if params.q is not None:
            extras["q"] = params.q
        if result.basis is None:
            sens = weight_sensitivity(params.t, ramp_width(params.t))
            return MechanismOutput.no_result(
                f"the subsets' subspaces do not agree enough at radius {result.radius:.3g}: the "
                f"noisy lower bound on the total weight is below the floor {weight_floor(sens):.2f}"
                f" (data not close enough to a {spec.k}-dimensional subspace, or too few rows "
                "for this budget)",
                **extras,
            )
        return MechanismOutput(basis=result.basis, extras=extras)
