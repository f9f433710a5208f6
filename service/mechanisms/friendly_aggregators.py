"""The two aggregators of M6 ``friendly_aggregate`` and the release they compose.

ALGORITHMS.md M6 with Tsfadia, NeurIPS 2024, Section 4.1 (friendly averaging of subset
estimates): ``reference_points`` averages the points ``y_j = P U_j U_j^T`` (``q`` public Gaussian
reference points, any ``d``) and releases the top-k right singular vectors of the noisy ``q x d``
mean; ``projection`` averages the projectors ``U_j U_j^T`` (``d <= 1000``) and releases the top-k
eigenvectors of the symmetrised noisy ``d x d`` mean. :func:`friendly_aggregate` is the whole
release: partition and bases (``sample_aggregate``), radius search (``friendly_radius``), weights
(``friendly_weights``), test (``friendly_ptr``) and noisy mean, drawing from one generator in
that order.

Privacy argument: the weighted mean ``mu = sum_j w_j y_j / W`` moves by at most
``D = r (4(t-1)/b + 6)/W`` (``friendly_weights``); after the test (``friendly_ptr``) the noise is
calibrated for ``D`` at ``W_low`` and the radius inflated by the public rounding allowance
(:func:`~service.mechanisms.friendly_weights.calibrated_sensitivity`), ``(eps2, delta2)``-DP (basic)
or ``mean_mu``-GDP (F3) on the test's good event. Everything after the noisy mean (singular
vectors, eigenvectors, :func:`components_above_noise`) is post-processing. The whole release is
``(eps, delta)``-DP by the composition stated in ``friendly_ptr``.

What remains in floating point: the samplers are the textbook ones on doubles (see
``noise.py``), so the result is the idealised guarantee for the computed points, not a proof for
floating-point noise. With ``W = 0`` passing the test (probability ``<= delta1``) the mean is the
public zero vector, and a noisy estimate LAPACK cannot decompose gets the public fallback basis:
both never raise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from service.mechanisms.friendly_ptr import (
    AnySplit,
    noisy_weight_lower_bound,
    release_split,
    split_mean_sigma,
    split_search_threshold,
    weight_floor,
)
from service.mechanisms.friendly_radius import (
    radius_floor,
    radius_grid,
    radius_steps,
    search_radius,
)
from service.mechanisms.friendly_weights import (
    MEAN_CHUNK_FLOATS,
    Aggregator,
    block_rows,
    calibrated_sensitivity,
    count_friends,
    distance_workers,
    projection_block,
    ramp_width,
    reference_distance_block,
    total_weight,
    weight_sensitivity,
    weights_from_counts,
)
from service.mechanisms.linalg import FloatArray, top_k_eigh
from service.mechanisms.sample_aggregate import (
    partition_and_bases,
    reference_embeddings,
    reference_points,
)
from service.mechanisms.subset_top_k import (
    fallback_basis,
    power_of_two_exponents,
    safe_top_right_singular_vectors,
)


@dataclass(frozen=True)
class FriendlyResult:
    """What :func:`friendly_aggregate` releases (every field is private output or public)."""

    basis: FloatArray | None
    radius: float
    #: ``i`` with ``radius = r_max 2^{-i}`` when AboveThreshold stopped; ``None`` otherwise.
    radius_exponent: int | None
    weight_low: float
    noise_sigma: float | None
    #: How many of the noisy mean's top-k singular values (projections: eigenvalues) stand
    #: out (:func:`components_above_noise`; post-processing of the noisy mean).
    components_above_noise: int = 0


# ---------------------------------------------------------------------------------------------
def weighted_mean(points: FloatArray, weights: FloatArray, total: float) -> FloatArray:
    """``mu = sum_j w_j y_j / W``, accumulated as ``y_a + sum_j w_j (y_j - y_a) / W``.

    ``y_a`` is the first point of positive weight; every positive-weight point is within
    ``2r`` of it, so the rounding of the sum is ``O(t eps_machine r)`` plus one rounding of
    ``y_a`` (``eps_machine r_max``), not ``O(t eps_machine r_max)``. Memory: one chunk of points.
    With ``W = 0`` (possible only in PTR's bad event) the mean is the public zero vector.

    Parameters
    ----------
    points : (t, p) array
    weights : (t,) array
    total : float

    Returns
    -------
    (p,) array
    """
    used = np.flatnonzero(weights > 0)
    if used.size == 0 or not total > 0:
        return np.zeros(points.shape[1], dtype=np.float64)
    anchor = points[used[0]]
    acc = np.zeros(points.shape[1], dtype=np.float64)
    chunk = max(1, MEAN_CHUNK_FLOATS // points.shape[1])
    for start in range(0, used.size, chunk):
        idx = used[start : start + chunk]
        acc += weights[idx] @ (points[idx] - anchor)
    return np.asarray(anchor + acc / total, dtype=np.float64)


def projection_mean(bases: FloatArray, weights: FloatArray, total: float) -> FloatArray:
    """``sum_j w_j U_j U_j^T / W`` over the subsets of positive weight (zero when ``W = 0``).

    One symmetric rank-``tk`` update ``B B^T`` with ``B = [sqrt(w_j / W) U_j]`` (``d x tk``):
    numpy hands ``B @ B.T`` of one buffer to BLAS syrk, which computes one triangle, half the
    work of the general product ``(S diag(w/W)) S^T``. Taking ``sqrt`` and squaring again
    changes each weight by at most 2 ulps, far inside :func:`projection_mean_rounding`.

    Parameters
    ----------
    bases : (t, d, k) array
    weights : (t,) array of non-negative weights
    total : float
        ``W = sum_j w_j``.

    Returns
    -------
    (d, d) symmetric array
    """
    _, d, k = bases.shape
    used = weights > 0
    if not used.any() or not total > 0:
        return np.zeros((d, d), dtype=np.float64)
    root = np.sqrt(np.repeat(weights[used] / total, k))
    factor = bases[used].transpose(1, 0, 2).reshape(d, -1) * root  # (d, k * used)
    return np.asarray(factor @ factor.T, dtype=np.float64)


def safe_top_k_eigh(matrix: FloatArray, k: int) -> FloatArray:
    """Top-k eigenvectors of a symmetric matrix, or :func:`fallback_basis` if LAPACK fails or
    returns non-finite vectors (total on every input; the matrix is scaled by a power of two)."""
    d = matrix.shape[0]
    if not np.all(np.isfinite(matrix)):
        return fallback_basis(d, k)
    scaled = np.ldexp(matrix, -power_of_two_exponents(matrix[None])[0])
    try:
        _, vectors = top_k_eigh(scaled, k)
    except (np.linalg.LinAlgError, ValueError):
        return fallback_basis(d, k)
    if not np.all(np.isfinite(vectors)):
        return fallback_basis(d, k)
    return vectors


def safe_top_eigenpairs(matrix: FloatArray, k: int, count: int) -> tuple[FloatArray, FloatArray]:
    """The top ``count >= k`` eigenvalues (descending) and the top-k eigenvectors of a symmetric
    matrix, from one decomposition; total like :func:`safe_top_k_eigh` (the public fallback:
    values 0, the first ``k`` standard basis vectors, when the matrix is not finite or LAPACK
    fails).

    Returns
    -------
    values : (count,) array
    basis : (d, k) array
    """
    d = matrix.shape[0]
    if not np.all(np.isfinite(matrix)):
        return np.zeros(count), fallback_basis(d, k)
    # top_k_eigh scales by a power of two itself and returns the unscaled eigenvalues.
    values, vectors = top_k_eigh(matrix, count)
    if not (np.all(np.isfinite(vectors)) and np.all(np.isfinite(values))):
        return np.zeros(count), fallback_basis(d, k)
    return values, np.ascontiguousarray(vectors[:, :k])


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
    state = friendly_search(
        data, k, epsilon, delta, rng, t=t, q=q, aggregator=aggregator, radius=radius
    )
    return friendly_continue(state, rng)


@dataclass(frozen=True)
class FriendlySearch:
    """The state of :func:`friendly_aggregate` after its radius search (or given radius).

    Holds private intermediate values (bases, points, weights): only ``radius`` and
    ``radius_exponent`` are released (the search's ``(eps0, 0)``-DP output, or
    public when the radius is given); the rest must go through :func:`friendly_continue`.
    """

    split: AnySplit
    t: int
    k: int
    d: int
    aggregator: Aggregator
    bases: FloatArray
    points: FloatArray | None
    radius: float
    #: ``i`` with ``radius = r_max 2^{-i}`` when AboveThreshold stopped; ``None`` otherwise.
    radius_exponent: int | None
    weights: FloatArray


def friendly_search(
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
    units: npt.NDArray[np.int64] | None = None,
) -> FriendlySearch:
    """The first phase of :func:`friendly_aggregate` (same parameters): the partition, the
    subset bases, the reference points and the radius search with ``eps0`` (or the weights at
    the given radius), drawing from ``rng`` exactly as :func:`friendly_aggregate` does.
    ``units`` (the person of each row): the partition is of people, so one person changes one
    subset's basis as one row did (:func:`.sample_aggregate.random_partition`)."""
    d = data.shape[1]
    split = release_split(epsilon, delta, radius is not None, t=t)
    _, bases = partition_and_bases(data, t, k, rng, units)
    b = ramp_width(t)

    points: FloatArray | None = None
    if aggregator == "reference_points":
        ref = reference_points(2 * k if q is None else q, d, rng)
        points = reference_embeddings(bases, ref)
        r_max = float(np.linalg.norm(ref))
        block = reference_distance_block(points)
        rows, workers = block_rows(t), distance_workers()
    else:
        block, rows = projection_block(bases)
        r_max = math.sqrt(2.0 * k)
        workers = 1
    steps = radius_steps(aggregator)

    radius_exponent: int | None = None
    if radius is None:
        radii = radius_grid(r_max, steps)
        stop, weights_by_radius = search_radius(
            block,
            t,
            radii,
            split.eps0,
            rng,
            rows=rows,
            workers=workers,
            threshold=split_search_threshold(t, split),
        )
        radius_index = steps if stop is None else stop  # none above: r = r_max
        radius_exponent = None if stop is None else steps - stop
        radius = float(radii[radius_index])
        weights = weights_by_radius[:, radius_index].copy()
    else:
        radius = max(radius, radius_floor(r_max, aggregator))
        counts = count_friends(block, t, np.array([radius]), rows=rows, workers=workers)
        weights = weights_from_counts(counts[:, 0], t, b)

    return FriendlySearch(
        split, t, k, d, aggregator, bases, points, radius, radius_exponent, weights
    )


def friendly_continue(state: FriendlySearch, rng: np.random.Generator) -> FriendlyResult:
    """The second phase of :func:`friendly_aggregate`: the PTR test (``eps1, delta1``) and the
    noisy mean (``eps2, delta2``) at the searched radius."""
    split, t, d, k = state.split, state.t, state.d, state.k
    radius, radius_exponent, weights = state.radius, state.radius_exponent, state.weights
    points, bases, aggregator = state.points, state.bases, state.aggregator
    b = ramp_width(t)
    sens_w = weight_sensitivity(t, b)
    total = total_weight(weights)
    w_low = noisy_weight_lower_bound(total, sens_w, split, rng)
    if w_low < weight_floor(sens_w):
        return FriendlyResult(None, radius, radius_exponent, w_low, None)

    sens_mean = calibrated_sensitivity(radius, t, b, w_low, aggregator, d, k)
    sigma = split_mean_sigma(sens_mean, split)
    if points is not None:
        mean = weighted_mean(points, weights, total)
        noisy = mean + rng.normal(0.0, sigma, size=mean.shape)
        matrix = noisy.reshape(-1, d)
        basis = safe_top_right_singular_vectors(matrix, k)
        values = _top_values(matrix, k + 1, symmetric=False)
    else:
        noisy = projection_mean(bases, weights, total) + rng.normal(0.0, sigma, size=(d, d))
        # One eigendecomposition gives the basis and the k+1 values (post-processing of the
        # noisy mean; before, a full eigvalsh repeated it for the values: 0.14 s at d = 1,000).
        values, basis = safe_top_eigenpairs(0.5 * (noisy + noisy.T), k, min(k + 1, d))
    q = 0 if points is None else points.shape[1] // d
    above = components_above_noise(values, k, noise_norm(aggregator, sigma, d, q))
    return FriendlyResult(basis, radius, radius_exponent, w_low, sigma, above)


def noise_norm(aggregator: Aggregator, sigma: float, d: int, q: int) -> float:
    """Spectral norm of the mean's noise: ``sigma (sqrt(q) + sqrt(d))`` for the ``q x d``
    reference-point matrix, ``2 sigma sqrt(d)`` for the symmetrised ``d x d`` projection."""
    if aggregator == "projection":
        return 2.0 * sigma * math.sqrt(d)
    return sigma * (math.sqrt(q) + math.sqrt(d))


def components_above_noise(values: FloatArray, k: int, noise: float) -> int:
    """How many of the top-k singular values (eigenvalues) of the noisy mean stand out (issue 24,
    item 5): above the noise's spectral norm and above twice the ``(k+1)``-th. Subsets that
    agree average to a rank-k matrix plus noise (a clear gap after the k-th value); subsets
    whose subspaces do not agree average to about ``k/d`` times the reference points, whose
    singular values decay slowly (no gap), so their top-k directions are random-like."""
    beyond = float(values[k]) if values.shape[0] > k else 0.0
    return int(np.count_nonzero(values[:k] > max(noise, 2.0 * beyond)))


def _top_values(matrix: FloatArray, k: int, symmetric: bool) -> FloatArray:
    """Top-k singular values (or eigenvalues) of a noisy matrix, zeros where it cannot be
    decomposed (a non-finite or failing input: no claim that anything stands out)."""
    if not np.all(np.isfinite(matrix)):
        return np.zeros(k)
    try:
        if symmetric:
            return np.asarray(np.linalg.eigvalsh(matrix)[::-1][:k], dtype=np.float64)
        return np.asarray(np.linalg.svd(matrix, compute_uv=False)[:k], dtype=np.float64)
    except np.linalg.LinAlgError:
        return np.zeros(k)
