"""Step 1 shared by ``histogram_aggregate`` (M5) and ``friendly_aggregate`` (M6).

Random partition into ``t`` subsets of ``m = floor(n/t)`` rows, the top-k right singular vectors
``U_j`` of each subset, public Gaussian reference points ``p_1..p_q ~ N(0, I_d)``, and the points
``y_j = (U_j U_j^T p_1, ..., U_j U_j^T p_q)`` in ``R^{qd}`` (Singhal & Steinke, NeurIPS 2021,
Algorithm 2; Tsfadia, NeurIPS 2024, Section 4.1).

Privacy: nothing here is private by itself. The partition and the reference points are public
randomness drawn from the release's generator, and replacing one row of the data changes the rows
of exactly one subset, hence exactly one ``U_j`` and one ``y_j``; the aggregators rely on that.

Memory: the data is read one group of subsets at a time by fancy-indexing (a memory map stays a
memory map), so beyond the data itself memory is ``O(t d k)`` for the bases and ``O(t q d)`` for
the points, never ``O(n d)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from service.mechanisms.linalg import FloatArray

IntArray = npt.NDArray[np.int64]

#: Rows read per group of subsets: 8192 rows of d = 1000 doubles is 64 MB.
GROUP_ROWS = 8192


def random_partition(n: int, t: int, rng: np.random.Generator) -> IntArray:
    """A uniformly random partition of ``t * m`` of the ``n`` row indices, ``m = floor(n/t)``.

    Returns
    -------
    (t, m) int array
        Row ``j`` holds the indices of subset ``j``, sorted (so a memory map is read in order).
        The ``n - t m`` leftover rows are in no subset.
    """
    if not 1 <= t <= n:
        raise ValueError(f"need 1 <= t <= n, got t={t}, n={n}")
    m = n // t
    perm = rng.permutation(n)[: t * m].reshape(t, m)
    return np.sort(perm, axis=1).astype(np.int64)


def _top_k_right_singular(blocks: FloatArray, k: int) -> FloatArray:
    """Top-k right singular vectors of each ``m x d`` block, via the smaller Gram matrix.

    For ``m <= d`` the eigenvectors ``v`` of ``X X^T`` (``m x m``) give ``u = X^T v / s``; for
    ``m > d`` those of ``X^T X`` are the vectors themselves. Both are batched LAPACK calls; the
    Gram route is several times faster than a batched SVD of ``m x d`` blocks with ``m << d``.
    Its accuracy on the top-k directions is ``~ eps_machine s_1^2 / (s_k^2 - s_{k+1}^2)``; blocks
    whose k-th singular value is too small for it (rank-deficient subsets) fall back to an SVD.

    Parameters
    ----------
    blocks : (g, m, d) array
    k : int, ``k <= min(m, d)``

    Returns
    -------
    (g, d, k) array with orthonormal columns, in order of decreasing singular value.
    """
    g, m, d = blocks.shape
    if m > d:
        gram = np.matmul(blocks.transpose(0, 2, 1), blocks)
        _, vectors = np.linalg.eigh(gram)
        return np.ascontiguousarray(vectors[:, :, ::-1][:, :, :k])
    gram = np.matmul(blocks, blocks.transpose(0, 2, 1))
    values, vectors = np.linalg.eigh(gram)
    top_values = values[:, ::-1][:, :k]
    top_vectors = vectors[:, :, ::-1][:, :, :k]
    # The Gram route squares the condition number: with s_k^2 >= 1e-8 s_1^2 the columns of
    # X^T v / s are orthonormal to ~1e-8 at worst; below that, take the SVD.
    floor = 1e-8 * np.maximum(values[:, -1], np.finfo(np.float64).tiny)
    good = top_values[:, -1] > floor
    bases = np.empty((g, d, k), dtype=np.float64)
    if good.any():
        scale = np.sqrt(top_values[good])
        lifted = np.matmul(blocks[good].transpose(0, 2, 1), top_vectors[good])
        bases[good] = lifted / scale[:, None, :]
    for j in np.flatnonzero(~good):
        _, _, vt = np.linalg.svd(blocks[j], full_matrices=False)
        bases[j] = vt[:k].T
    return bases


def subset_bases(
    data: npt.NDArray[Any], partition: IntArray, k: int, *, group_rows: int = GROUP_ROWS
) -> FloatArray:
    """``U_j``: the top-k right singular vectors of each subset's rows (no clipping needed).

    Parameters
    ----------
    data : (n, d) array
        The rows; may be a read-only memory map, read one group of subsets at a time.
    partition : (t, m) int array
        From :func:`random_partition`; ``m >= k``.
    k : int
        Subspace dimension.
    group_rows : int
        Rows read at once (memory ``O(group_rows d)``).

    Returns
    -------
    (t, d, k) array
        ``U_j`` for each subset, orthonormal columns.
    """
    t, m = partition.shape
    d = data.shape[1]
    if not 1 <= k <= min(m, d):
        raise ValueError(f"need 1 <= k <= min(m, d) = {min(m, d)}, got k={k}")
    per_group = max(1, group_rows // m)
    bases = np.empty((t, d, k), dtype=np.float64)
    for start in range(0, t, per_group):
        idx = partition[start : start + per_group]
        rows = np.asarray(data[idx.ravel()], dtype=np.float64).reshape(idx.shape[0], m, d)
        bases[start : start + idx.shape[0]] = _top_k_right_singular(rows, k)
    return bases


def reference_points(q: int, d: int, rng: np.random.Generator) -> FloatArray:
    """``P``: ``q`` public reference points ``p_i ~ N(0, I_d)`` as a ``(q, d)`` array."""
    return np.asarray(rng.standard_normal((q, d)), dtype=np.float64)


def reference_embeddings(bases: FloatArray, points: FloatArray) -> FloatArray:
    """``y_j = vec(P U_j U_j^T)``: each reference point projected onto ``span(U_j)``.

    Parameters
    ----------
    bases : (t, d, k) array
    points : (q, d) array

    Returns
    -------
    (t, q * d) array
        Row ``j`` is the ``q x d`` matrix ``P U_j U_j^T`` flattened row-major (its ``i``-th block
        of ``d`` is ``U_j U_j^T p_i``).
    """
    t, d, _ = bases.shape
    coords = np.matmul(points, bases)  # (t, q, k): the points' coordinates in each U_j
    projected = np.matmul(coords, bases.transpose(0, 2, 1))
    return np.asarray(projected.reshape(t, points.shape[0] * d), dtype=np.float64)


def partition_and_bases(
    data: npt.NDArray[Any], t: int, k: int, rng: np.random.Generator
) -> tuple[IntArray, FloatArray]:
    """Step 1 up to the bases: draw the partition from ``rng``, then compute every ``U_j``.

    Draw order (fixed, so seeded runs are reproducible): partition, then whatever the caller draws
    next (reference points come after this call).

    Returns
    -------
    partition : (t, m) int array
    bases : (t, d, k) array
    """
    partition = random_partition(data.shape[0], t, rng)
    return partition, subset_bases(data, partition, k)
