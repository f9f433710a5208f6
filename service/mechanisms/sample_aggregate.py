"""Step 1 shared by ``histogram_aggregate`` (M5) and ``friendly_aggregate`` (M6).

Random partition into ``t`` subsets of ``m = floor(n/t)`` rows, the top-k right singular vectors
``U_j`` of each subset, public Gaussian reference points ``p_1..p_q ~ N(0, I_d)``, and the points
``y_j = (U_j U_j^T p_1, ..., U_j U_j^T p_q)`` in ``R^{qd}`` (Singhal & Steinke, NeurIPS 2021,
Algorithm 2; Tsfadia, NeurIPS 2024, Section 4.1).

Privacy: nothing here is private by itself. The partition and the reference points are public
randomness drawn from the release's generator, and replacing one row of the data changes the rows
of exactly one subset, hence exactly one ``U_j`` and one ``y_j``; the aggregators rely on that.
On a person-level dataset the partition is of people (:func:`random_partition` with ``groups``),
and replacing one person changes one subset in the same way.

Memory and I/O: the data is read in sequential passes (:func:`subset_bases`): each pass gathers
the rows of as many subsets as fit :data:`PASS_BYTES` in one ascending sweep (a memory map stays a
memory map and is read front to back, never at random, so a dataset larger than memory does not
thrash the page cache); beyond the data itself memory is ``O(t d k)`` for the bases, the pass
buffer, and ``O(t q d)`` for the points, never ``O(n d)``; :func:`subset_bases_bytes` bounds it
from public facts.

Floating point and totality: each subset's rows are scaled by a power of two of their own
before any Gram matrix or SVD, so the computed ``U_j`` is a function of subset ``j``'s rows only
(one row changes the rounding of one ``U_j``), and a subset that LAPACK cannot decompose gets a
fixed public basis (the first ``k`` standard basis vectors) instead of an exception. Entries
anywhere in the finite doubles (1e-300 to 1e300, zero and duplicate rows) never raise. The
decomposition of the gathered subsets is :mod:`service.mechanisms.subset_top_k`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from service.mechanisms.linalg import FloatArray, ReadAhead, RowSource
from service.mechanisms.subset_top_k import (
    CACHE_BYTES,
    iteration_width,
    sketch_route,
    top_k_right_singular,
)

IntArray = npt.NDArray[np.int64]

#: Rows decomposed per group of subsets: 8192 rows of d = 1000 doubles is 64 MB.
GROUP_ROWS = 8192
#: Bytes of rows gathered per sequential pass over the data (:func:`subset_bases`): a dataset of
#: ``B`` bytes is read front to back about ``B / PASS_BYTES`` times, never at random.
PASS_BYTES = 512 << 20
#: Wanted rows per read-ahead step in :func:`gather_rows` (0: no hints). A pass wants about one
#: row in ``size / PASS_BYTES`` spread over the whole file; without a hint each page fault reads
#: a window around itself and waits for it. Hinting the next 512 wanted rows' own pages (not the
#: span between them) keeps many reads in flight and reads only what is wanted: a cold 1/8
#: gather of 500,000 x 1,000 took 1.6 s instead of 3-4 s (the span between them: 3.8-4.1 s).
READ_AHEAD_ROWS = 512


def random_partition(
    n: int, t: int, rng: np.random.Generator, groups: IntArray | None = None
) -> IntArray:
    """A uniformly random partition of ``t * m`` of the ``n`` row indices, ``m = floor(n/t)``;
    with ``groups``, a random partition of the *people* (privacy unit, issue 34).

    Without ``groups`` (the unit is the row): ``t`` subsets of ``m`` distinct rows; the
    ``n - t m`` leftover rows are in no subset.

    With ``groups`` (row ``i`` belongs to person ``groups[i]``; any integer labels): the ``P``
    people are permuted uniformly (``rng.permutation(P)``) and person ``p`` goes to subset
    ``perm[p] mod t``, so every subset gets ``floor(P/t)`` or ``ceil(P/t)`` people and all
    rows of a person are in one subset. Subset sizes in *rows* then vary with the data, but
    the mechanisms use ``m`` (the rows per subset of the memory bound, the histogram's width
    rule, the preview) as public, so each subset is brought to exactly ``m`` rows by a rule
    that reads that subset alone: its rows in a uniformly random order (the order
    ``rng.permutation(n)`` induces on them), the first ``m`` kept if it has more, repeated
    cyclically if fewer (a subset always has a row: ``t <= P`` is required). Public: ``t``,
    ``m`` (from the public ``n``) and ``P``.

    Argument: a uniform permutation's restrictions to disjoint sets are independent uniform
    orders, so given which people form each subset the ``t`` subsets' row lists are
    independent, each a function of its own people's rows and its own randomness. Replace one
    person ``p`` by ``p'`` (any row counts): couple the people permutations so ``p'`` takes
    ``p``'s position; every other person stays in the same subset, so the other subsets' row
    lists have the same law and only the subset ``j`` holding ``p`` or ``p'`` differs. That is
    what one replaced row did at row level (one ``U_j``, one point ``y_j``), so each
    aggregator's argument holds unchanged, now for one person; mixing over the coupled
    randomness keeps its ``(eps, delta)``. The labels' order (order of first appearance in
    the file) does not matter: the permutation is uniform.

    Parameters
    ----------
    n : int
        Rows; with ``groups``, ``groups.shape == (n,)``.
    t : int
        Subsets: ``1 <= t <= n``, and ``t <= P`` with ``groups``.
    rng : numpy.random.Generator
    groups : (n,) int array, optional
        The person of each row.

    Returns
    -------
    (t, m) int array
        Row ``j`` holds the indices of subset ``j``, sorted (so a memory map is read in order);
        with ``groups`` an index may repeat within its subset (cyclic padding).
    """
    if not 1 <= t <= n:
        raise ValueError(f"need 1 <= t <= n, got t={t}, n={n}")
    m = n // t
    if groups is None:
        perm = rng.permutation(n)[: t * m].reshape(t, m)
        return np.sort(perm, axis=1).astype(np.int64)
    if groups.shape != (n,):
        raise ValueError("one group label per row is needed")
    _, person = np.unique(groups, return_inverse=True)
    n_people = int(person.max()) + 1
    if t > n_people:
        raise ValueError(f"need t <= the number of people, got t={t}, people={n_people}")
    subset_of_person = rng.permutation(n_people) % t
    order = rng.permutation(n)  # a uniformly random order of the rows
    subset_in_order = subset_of_person[person.reshape(n)[order]]
    rows_by_subset = order[np.argsort(subset_in_order, kind="stable")]
    counts = np.bincount(subset_in_order, minlength=t)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    # Slot s of subset j: its (s mod count_j)-th row in the random order (trim or pad to m).
    slots = starts[:, None] + np.arange(m)[None, :] % counts[:, None]
    return np.sort(rows_by_subset[slots], axis=1).astype(np.int64)


def gather_rows(
    data: npt.NDArray[Any], rows: IntArray, out: FloatArray, chunk_rows: int = GROUP_ROWS
) -> None:
    """``out[i] = data[rows[i]]``, reading ``data`` in one ascending sweep.

    The rows are fetched in increasing row order (at most ``chunk_rows`` at a time), so a
    memory-mapped file is read front to back once, skipping only the rows not asked for: the
    kernel's read-ahead serves it, and a file larger than memory is never read at random.

    Parameters
    ----------
    data : (n, d) array or memory map
    rows : (r,) int array of row indices (any order, no repeats needed)
    out : (r, d) float64 array, written in place
    chunk_rows : int
        Rows fetched per step (temporary memory ``O(chunk_rows d)``).
    """
    order = np.argsort(rows, kind="stable")
    fetched = np.empty((min(chunk_rows, order.shape[0]), out.shape[1]), dtype=np.float64)
    ahead = ReadAhead(data) if READ_AHEAD_ROWS > 0 else None
    step = READ_AHEAD_ROWS if ahead is not None else chunk_rows
    try:
        for start in range(0, order.shape[0], chunk_rows):
            slots = order[start : start + chunk_rows]
            chunk = fetched[: slots.shape[0]]
            wanted = rows[slots]  # ascending
            for first in range(0, wanted.shape[0], step):
                if ahead is not None:
                    # The next ``step`` wanted rows (the next chunk's first ones at the end of
                    # this chunk): requested now, read while these are copied.
                    ahead.rows(rows[order[start + first + step : start + first + 2 * step]])
                # mode="clip" (the indices are valid) lets numpy write into ``chunk`` unbuffered.
                np.take(
                    data,
                    wanted[first : first + step],
                    axis=0,
                    out=chunk[first : first + step],
                    mode="clip",
                )
            out[slots] = chunk
    finally:
        if ahead is not None:
            ahead.close()


def take_rows(
    data: npt.NDArray[Any], rows: IntArray, out: FloatArray, chunk_rows: int = GROUP_ROWS
) -> None:
    """``out[i] = data[rows[i]]`` in the given order (one copy, no sort): for data that one pass
    covers, where the ascending sweep of :func:`gather_rows` would only add a second copy."""
    for start in range(0, rows.shape[0], chunk_rows):
        stop = min(rows.shape[0], start + chunk_rows)
        np.take(data, rows[start:stop], axis=0, out=out[start:stop], mode="clip")


def pass_subsets(t: int, m: int, d: int, per_group: int, pass_bytes: int) -> int:
    """Subsets gathered per sequential pass: whole groups of ``per_group`` subsets whose rows
    (``m d`` doubles per subset) fit ``pass_bytes``, at least one group, at most all ``t``."""
    groups = max(1, pass_bytes // max(1, 8 * per_group * m * d))
    return min(t, groups * per_group)


def subset_bases(
    data: npt.NDArray[Any],
    partition: IntArray,
    k: int,
    *,
    group_rows: int = GROUP_ROWS,
    pass_bytes: int | None = None,
) -> FloatArray:
    """``U_j``: the top-k right singular vectors of each subset's rows (no clipping needed).

    Sequential passes: the subsets are taken in passes of :func:`pass_subsets` subsets whose
    rows fit ``pass_bytes``; each pass gathers its rows in one ascending sweep over the data
    (:func:`gather_rows`) into a buffer laid out subset by subset, and the subsets are then
    decomposed from that buffer in groups of ``group_rows // m``. The partition is uniformly
    random, so every subset has rows all over the file; gathering group by group (as before)
    read the file at random once per group, and a file larger than the page cache then thrashed.
    Now it is read front to back ``ceil(t m d 8 / pass_bytes)`` times at most. (When one pass
    holds every subset, the data fits the pass budget: each group's rows are then simply taken
    in subset order into one reused group buffer, as cheap as before.) Which rows form
    subset ``j``, their order, and the batches LAPACK sees are unchanged, so every ``U_j`` is
    the same, bit for bit, whatever ``pass_bytes``.

    Parameters
    ----------
    data : (n, d) array
        The rows; may be a read-only memory map.
    partition : (t, m) int array
        From :func:`random_partition`; ``m >= k``.
    k : int
        Subspace dimension.
    group_rows : int
        Rows decomposed at once (memory ``O(group_rows d)`` for the decompositions).
    pass_bytes : int, optional
        Bytes of rows gathered per pass (the buffer; at least one group is always gathered);
        default :data:`PASS_BYTES`.

    Returns
    -------
    (t, d, k) array
        ``U_j`` for each subset, orthonormal columns. A :class:`RowSource` computes them itself
        (the same groups, so the same ``U_j``).
    """
    if isinstance(data, RowSource):
        return data.subset_bases(partition, k)
    t, m = partition.shape
    d = data.shape[1]
    if not 1 <= k <= min(m, d):
        raise ValueError(f"need 1 <= k <= min(m, d) = {min(m, d)}, got k={k}")
    per_group = max(1, group_rows // m)
    per_pass = pass_subsets(t, m, d, per_group, PASS_BYTES if pass_bytes is None else pass_bytes)
    bases = np.empty((t, d, k), dtype=np.float64)
    if per_pass >= t:
        # The data fits one pass: take each group's rows in subset order into one reused group
        # buffer (no sort, no second copy; the ascending sweep pays off only over several
        # passes), then decompose it in place. On the sketch route a group is one batch of
        # CACHE_BYTES of rows, decomposed while the copy is still in cache (the same blocks,
        # so the same bits).
        if sketch_route(m, d, k):
            per_group = min(per_group, max(1, CACHE_BYTES // (8 * m * d)))
        buffer = np.empty((min(t, per_group) * m, d), dtype=np.float64)
        for start in range(0, t, per_group):
            stop = min(t, start + per_group)
            rows = buffer[: (stop - start) * m]
            take_rows(data, partition[start:stop].ravel(), rows)
            block = rows.reshape(stop - start, m, d)
            bases[start:stop] = top_k_right_singular(block, k, overwrite=True)
        return bases
    buffer = np.empty((per_pass * m, d), dtype=np.float64)
    for first in range(0, t, per_pass):
        last = min(t, first + per_pass)
        rows = buffer[: (last - first) * m]
        gather_rows(data, partition[first:last].ravel(), rows)
        for start in range(first, last, per_group):
            stop = min(last, start + per_group)
            block = rows[(start - first) * m : (stop - first) * m].reshape(stop - start, m, d)
            bases[start:stop] = top_k_right_singular(block, k, overwrite=True)
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
    data: npt.NDArray[Any],
    t: int,
    k: int,
    rng: np.random.Generator,
    groups: IntArray | None = None,
) -> tuple[IntArray, FloatArray]:
    """Step 1 up to the bases: draw the partition from ``rng``, then compute every ``U_j``.
    With ``groups`` (the person of each row) the partition is of people
    (:func:`random_partition`).

    Draw order (fixed, so seeded runs are reproducible): partition, then whatever the caller draws
    next (reference points come after this call).

    Returns
    -------
    partition : (t, m) int array
    bases : (t, d, k) array
    """
    partition = random_partition(data.shape[0], t, rng, groups)
    return partition, subset_bases(data, partition, k)


def group_shape(t: int, m: int, group_rows: int = GROUP_ROWS) -> int:
    """Subsets read at once by :func:`subset_bases`: ``min(t, max(1, group_rows // m))``."""
    return min(t, max(1, group_rows // m))


def subset_bases_bytes(
    t: int, m: int, d: int, k: int, group_rows: int = GROUP_ROWS, pass_bytes: int | None = None
) -> int:
    """Peak bytes of :func:`subset_bases`, from its own allocations (public facts only).

    The bases (``t d k``), the pass buffer (``p m d`` for ``p`` subsets per pass; one group's
    ``g m d`` when one pass holds all ``t``), the gather's sort order and one fetched chunk
    (``r + GROUP_ROWS d`` for the ``r = p m`` rows of a pass, and its index arrays), plus, per
    group of ``g`` subsets of ``m`` rows: a scaled copy of its rows (``g m d``; the pass
    buffer is now scaled in place, so this is slack), the Gram matrices, their eigenvectors,
    LAPACK's copy and a contiguous copy of the top eigenvectors (``4 g s^2``, ``s = min(m,
    d)``), the eigenvalues, and the lifted vectors (``3 g d k``: the product, the good blocks'
    copy and the division's result); an SVD fallback of one block is smaller than the group's
    rows. The subspace iteration runs before the dense route, not with it: the Grams, a copy of
    those still iterating and its ``s x b`` arrays (``8 g s b``: iterate, basis, product,
    rotated basis, residual and temporaries), at most ``2 g s^2 + 8 g s b``; the dense route on
    ``g'`` left-over blocks holds the Grams and ``3 g' s^2`` (their copy, eigenvectors and
    LAPACK's copy), inside the ``4 g s^2`` above; so only ``8 g s b - 2 g s^2`` more, when
    positive. The Grams, their decompositions and the lifted vectors are held for one batch of
    :func:`top_k_right_singular` at a time (``c`` blocks, :data:`CACHE_BYTES` of Grams), so
    those terms count ``c = min(g, CACHE_BYTES / (8 s^2))`` blocks, not ``g``. Doubles, 8 bytes
    each.
    """
    g = group_shape(t, m, group_rows)
    per_pass = PASS_BYTES if pass_bytes is None else pass_bytes
    p = pass_subsets(t, m, d, max(1, group_rows // m), per_pass)
    s = min(m, d)
    if sketch_route(m, d, k):
        return 8 * _sketch_floats(t, m, d, k, g, p)
    if p >= t:  # one pass: one reused group buffer, no sort
        buffer, gather = g * m * d, GROUP_ROWS
    else:
        buffer, gather = p * m * d, 2 * p * m + GROUP_ROWS * d + 2 * GROUP_ROWS
    c = min(g, max(1, CACHE_BYTES // (8 * s * s)))
    width = iteration_width(s, k)
    iteration = max(0, 8 * c * s * width - 2 * c * s * s) if width else 0
    floats = t * d * k + buffer + gather + g * m * d + 4 * c * s * s + c * s + 3 * c * d * k
    floats += iteration
    return 8 * floats


def _sketch_floats(t: int, m: int, d: int, k: int, g: int, p: int) -> int:
    """Doubles :func:`subset_bases` holds on the sketch route (``subset_top_k._sketch_top_k``):
    the bases (``t d k``); the rows, one batch of ``c = CACHE_BYTES / (8 m d)`` subsets
    (``c m d``) when one pass holds all ``t`` (decomposed in place), else the pass buffer
    (``p m d``) with the gather's order and chunk; per batch the iterates ``X Omega`` and
    ``X Q`` (``c m b`` each, twice for the first product's reshape), ``Z^T``, ``Q`` and
    LAPACK's copies of it (``5 c d b``), the ``b x b`` matrices and their eigenvectors
    (``3 c b^2``), the vectors (``2 c d k``); and an SVD of one block that falls back
    (its scaled copy, the factors and LAPACK's work, ``4 m d + s^2``)."""
    s = min(m, d)
    b = iteration_width(s, k)
    c = min(g, max(1, CACHE_BYTES // (8 * m * d)))
    if p >= t:
        rows, gather = c * m * d, GROUP_ROWS
    else:
        rows, gather = p * m * d, 2 * p * m + GROUP_ROWS * d + 2 * GROUP_ROWS
    batch = 4 * c * m * b + 5 * c * d * b + 3 * c * b * b + 2 * c * d * k
    return t * d * k + rows + gather + batch + 4 * m * d + s * s


def embeddings_bytes(t: int, q: int, d: int, k: int) -> int:
    """Bytes :func:`reference_embeddings` allocates: the coordinates (``t q k``), the projected
    points (``t q d``) and the reference points (``q d``)."""
    return 8 * (t * q * k + t * q * d + q * d)


def allowance(counted: int) -> int:
    """A counted peak plus 25% and 1 MiB for what the count does not list (small index
    arrays, copies numpy and LAPACK make inside a call); measured peaks were 1.0-1.6 times
    the bare count."""
    return int(1.25 * counted) + (1 << 20)
