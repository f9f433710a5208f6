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
anywhere in the finite doubles (1e-300 to 1e300, zero and duplicate rows) never raise.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from service.mechanisms.linalg import FloatArray, ReadAhead, RowSource

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


def power_of_two_exponents(blocks: FloatArray) -> npt.NDArray[np.int64]:
    """Per block, ``e`` with ``max |entry| = f 2^e``, ``f in [0.5, 1)`` (``0``: a zero block).

    Multiplying block ``j`` by ``2^{-e_j}`` is exact (up to underflow of entries below
    ``2^{-1074}`` times the block's largest one) and puts every entry in ``(-1, 1)``, so no Gram
    matrix or SVD of the scaled block can overflow, whatever the scale of the rows.

    Parameters
    ----------
    blocks : (g, m, d) array of finite values

    Returns
    -------
    (g,) int array
    """
    # max(max, -min) rather than max(abs(.)): no temporary of the blocks' size
    peaks = np.maximum(np.max(blocks, axis=(1, 2)), -np.min(blocks, axis=(1, 2)))
    _, exponents = np.frexp(peaks)
    return np.asarray(exponents, dtype=np.int64)


def fallback_basis(d: int, k: int) -> FloatArray:
    """The fixed public basis ``(e_1, ..., e_k)`` used for a block LAPACK cannot decompose."""
    return np.asarray(np.eye(d, k), dtype=np.float64)


def _is_orthonormal(basis: FloatArray, tol: float = 1e-6) -> bool:
    """Finite with ``||U^T U - I||_max <= tol`` (shape ``(d, k)``)."""
    if not np.all(np.isfinite(basis)):
        return False
    gram = basis.T @ basis
    return bool(np.max(np.abs(gram - np.eye(basis.shape[1]))) <= tol)


def safe_top_right_singular_vectors(matrix: FloatArray, k: int) -> FloatArray:
    """Top-k right singular vectors of one ``r x d`` matrix; total on every finite input.

    The matrix is scaled by a power of two first (singular vectors are scale free); if LAPACK
    still fails to converge, or returns non-finite or non-orthonormal vectors, the result is
    :func:`fallback_basis`. The scale and the fallback depend on this matrix only.

    Parameters
    ----------
    matrix : (r, d) array, finite or not
    k : int, ``k <= d``

    Returns
    -------
    (d, k) array with orthonormal columns.
    """
    d = matrix.shape[1]
    if not np.all(np.isfinite(matrix)):
        return fallback_basis(d, k)
    scaled = np.ldexp(matrix, -power_of_two_exponents(matrix[None])[0])
    try:
        _, _, vt = np.linalg.svd(scaled, full_matrices=False)
    except np.linalg.LinAlgError:
        return fallback_basis(d, k)
    if vt.shape[0] < k:
        return fallback_basis(d, k)
    basis = np.ascontiguousarray(vt[:k].T, dtype=np.float64)
    return basis if _is_orthonormal(basis) else fallback_basis(d, k)


#: Subspace iteration (:func:`_gram_top_k`): the basis it certifies is within this
#: ``||sin Theta||_F`` of the Gram's exact top-k eigenspace (after the lift, of the block's top-k
#: right singular subspace); far below both aggregators' radius floors (``1.5e-8 r_max``).
ITERATION_TOLERANCE = 1e-10
#: Orthonormalisations (each after two products with the Gram) at most before a block stops.
MAX_ITERATIONS = 3
#: What a block the iteration cannot certify gets: its last Ritz vectors (``True``, issue 35
#: item 1, seventh pass) or the dense ``eigh`` of its Gram (``False``, the route of before, kept
#: for the same-process comparison in docs/benchmarks.md). Those blocks have no usable gap after
#: ``k`` (rows with a flat spectrum, where the subsets disagree and the aggregators' outputs are
#: poor either way); the dense ``eigh`` of 500 ``100 x 100`` Grams was 22x ``X^T X`` at
#: 50,000 x 100. Either is a deterministic function of the block alone.
KEEP_UNCERTIFIED = True
#: Ritz vectors are kept only where the dense ``eigh`` is far costlier than the iteration,
#: ``s >= KEEP_MIN_RATIO * b`` (a public size: at k = 10, ``b = 12``, from ``s = 96``; at
#: k = 3 from ``s = 40``). Below it a dense ``eigh`` of the small Gram is cheap and exact, as
#: before.
KEEP_MIN_RATIO = 8
#: Bytes of Grams formed and decomposed at once (:func:`_top_k_right_singular`): about half of
#: a core's 2 MB L2 cache on the bench machine, 13 Grams of ``100 x 100``.
CACHE_BYTES = 1 << 20


def iteration_width(s: int, k: int) -> int:
    """Columns ``b`` of the iterated block for an ``s x s`` Gram and top ``k`` (``0``: decompose
    it densely). ``b = k + 2`` columns: oversampling speeds convergence (``lambda_{b+1} /
    lambda_k`` per product) and tightens the certificate's bound on ``lambda_{k+1}``, while the
    products, the QR and the ``b x b`` Rayleigh-Ritz eigendecomposition, the costly steps at
    ``s = 100``, grow with it. Near a k-dimensional subspace (where the aggregators are useful)
    the gap after ``k`` converges in one round with any ``b > k``; at 50,000 x 100 and x 1,000
    ("near" rows of bench_aggregator_speed) ``b = 12`` certified every block as ``b = 15``
    did (``b = 10`` missed 8 of 500 at d = 1,000) and the iteration took 2.7x against 3.7x
    ``X^T X`` at d = 100. Iterating pays only when ``b`` is well below ``s`` (a dense
    eigendecomposition of a small Gram is cheap and exact)."""
    width = k + 2
    return width if 3 * width <= s else 0


@functools.lru_cache(maxsize=32)
def public_start(s: int, width: int) -> FloatArray:
    """The fixed ``s x b`` Gaussian start of the subspace iteration: a public constant (its own
    fixed seed, never the release's generator), so each ``U_j`` stays a function of subset
    ``j``'s rows alone and the release's draws are unchanged."""
    start = np.random.default_rng(0x5AB5_7A27).standard_normal((s, width))
    start.flags.writeable = False
    return start


def _subspace_iteration(
    gram: FloatArray, k: int, width: int, lift: bool
) -> tuple[npt.NDArray[np.bool_], FloatArray, FloatArray]:
    """Top-k eigenpairs of each PSD ``s x s`` Gram by subspace iteration with Rayleigh-Ritz,
    each block's result *certified* or not.

    ``Q = orth(G^{2i} Omega)`` (``Omega`` = :func:`public_start`), Ritz pairs ``(theta, V = Q W)``
    from ``Q^T G Q = W diag(theta) W^T``. Certificate (Davis-Kahan sin-theta theorem): with
    ``R = G V_k - V_k Theta_k`` and ``delta = theta_k - lambda_{k+1}`` > 0,
    ``||sin Theta(V_k, top-k eigenspace)||_F <= ||R||_F / delta``. ``lambda_{k+1}`` is bounded
    above without knowing it: Ritz values interlace (``theta_i <= lambda_i``, Poincare) and
    ``G`` is PSD, so ``lambda_{k+1}^2 <= ||G||_F^2 - sum_{i<=k} theta_i^2 -
    sum_{k+1<i<=b} theta_i^2`` (plus an allowance for the rounding of these sums). A block is
    certified when that bound is at most :data:`ITERATION_TOLERANCE` (times
    ``sqrt(theta_k/theta_1)`` when the caller lifts ``X^T v / s``, which amplifies an error by at
    most ``s_1/s_k``). Rows near a k-dimensional subspace (where the aggregators are useful)
    certify in 1-2 rounds; rows without a gap after ``k`` do not. A block stops iterating when
    it certifies, after :data:`MAX_ITERATIONS` rounds, or earlier when the bound, shrinking at
    the Ritz values' estimate of the rate, cannot get there (a heuristic for speed: which
    blocks stop is a function of each block alone). A block that stopped without a
    certificate is *settled* with its last Ritz pairs when :data:`KEEP_UNCERTIFIED` and
    ``s >= KEEP_MIN_RATIO * b`` (they are
    then the Rayleigh-Ritz approximation from ``span(G^{2i} Omega)``, not the exact top-k),
    else left to the caller's dense eigendecomposition. Ritz pairs with a non-finite value are
    never settled (the caller's dense route, then the SVD, decide them).

    Everything is per block (batched LAPACK and BLAS decompose each matrix on its own, and the
    start is a constant), so a settled ``V_j`` is a function of subset ``j`` alone. Its columns
    are orthonormal (``V = Q W``, ``Q`` from a QR, ``W`` from an ``eigh``) and, lifted, so are
    ``X^T v_i / sqrt(theta_i)``: ``V^T G V = W^T (Q^T G Q) W = diag(theta)`` up to rounding.

    Parameters
    ----------
    gram : (g, s, s) array, PSD, entries at most ``m`` in magnitude
    k, width : int, ``k < width <= s``
    lift : bool

    Returns
    -------
    settled : (g,) bool array, certified (or, with :data:`KEEP_UNCERTIFIED`, stopped with
        finite Ritz values)
    values : (g, k) array, descending (meaningful where settled)
    vectors : (g, s, k) array (meaningful where settled)
    """
    g, s, _ = gram.shape
    eps = float(np.finfo(np.float64).eps)
    norm_sq = np.einsum("gij,gij->g", gram, gram)
    norm = np.sqrt(norm_sq)
    settled = np.zeros(g, dtype=bool)
    values = np.zeros((g, k), dtype=np.float64)
    vectors = np.zeros((g, s, k), dtype=np.float64)
    active = np.arange(g)
    keep_ritz = KEEP_UNCERTIFIED and s >= KEEP_MIN_RATIO * width
    # Two products per orthonormalisation (G^2 Omega, then G^2 Q): the entries of a scaled
    # Gram are at most m, so two products cannot overflow, and each QR and Rayleigh-Ritz step
    # (the costly part at b << s) then gains the ratio lambda_{b+1}^2 / lambda_k^2.
    # The iterates are kept transposed, ``b x s`` (``Q^T G`` rather than ``G Q``): a Gram is
    # exactly symmetric (a mirrored ``syrk``), so ``Q^T G = (G Q)^T``, and BLAS forms the wide
    # ``b x s`` product of a small Gram 15-25% faster than the narrow ``s x b`` one.
    here = gram
    iterate_t = np.matmul(np.matmul(public_start(s, width).T, gram), gram)
    # Rounding allowances: of ||G||_F^2 and the Ritz values' squares (relative to ||G||_F^2),
    # and of the computed residual (relative to ||G||_F).
    tail_slack = 8.0 * (s * s + width * s) * eps
    residual_slack = 4.0 * s * eps * math.sqrt(k)
    for iteration in range(MAX_ITERATIONS):
        basis, _ = np.linalg.qr(iterate_t.transpose(0, 2, 1))
        product_t = np.matmul(basis.transpose(0, 2, 1), here)  # (G Q)^T
        ritz = np.matmul(product_t, basis)
        theta, rotation = eigh_each(0.5 * (ritz + ritz.transpose(0, 2, 1)))
        theta, rotation = theta[:, ::-1], rotation[:, :, ::-1]
        top = rotation[:, :, :k]
        candidate = np.matmul(basis, top)
        residual = np.matmul(product_t.transpose(0, 2, 1), top) - candidate * theta[:, None, :k]
        res = np.sqrt(np.einsum("gij,gij->g", residual, residual))
        squares = np.square(theta)
        tail_sq = (
            norm_sq[active]
            - squares[:, :k].sum(axis=1)
            - squares[:, k + 1 :].sum(axis=1)
            + tail_slack * norm_sq[active]
        )
        gap = theta[:, k - 1] - np.sqrt(np.maximum(tail_sq, 0.0))
        allowed = np.full(active.shape[0], ITERATION_TOLERANCE)
        if lift:
            ratio = theta[:, k - 1] / np.maximum(theta[:, 0], np.finfo(np.float64).tiny)
            allowed *= np.sqrt(np.clip(ratio, 0.0, 1.0))
        bound = res + residual_slack * norm[active]
        ok = (gap > 0) & np.isfinite(res) & (bound <= allowed * np.where(gap > 0, gap, 0.0))
        # Give up early on blocks that cannot certify in the rounds left: no certifiable gap,
        # or a bound that, shrinking by the Ritz estimate (theta_b / theta_k)^2 of the
        # convergence factor per round, would still be too large at the last round (a
        # heuristic for speed only).
        rounds_left = MAX_ITERATIONS - 1 - iteration
        rate = np.square(theta[:, -1] / np.maximum(theta[:, k - 1], np.finfo(np.float64).tiny))
        reachable = bound * np.power(np.minimum(rate, 1.0), rounds_left) <= allowed * gap
        keep = ~ok & (gap > 0) & reachable
        # A block that stops here without a certificate keeps its Ritz pairs (the dense
        # ``eigh`` of its Gram cost 5-10 times the whole iteration at s = 100).
        stopped = ~keep & np.isfinite(theta[:, :k]).all(axis=1) & np.isfinite(res)
        settle = ok | stopped if keep_ritz else ok
        done = active[settle]
        settled[done] = True
        values[done] = theta[settle, :k]
        vectors[done] = candidate[settle]
        active = active[keep]
        if active.size == 0:
            break
        here = here[keep]
        iterate_t = np.matmul(product_t[keep], here)
    return settled, values, vectors


def eigh_each(stack: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``np.linalg.eigh`` of a stack of symmetric matrices, where a matrix LAPACK cannot
    decompose gets NaN eigenvalues instead of an exception for the whole stack.

    A batched ``eigh`` decomposes each matrix on its own but raises ``LinAlgError`` if any one
    fails; the callers then sent every block of the batch to the SVD route, so a block's route
    (and the rounding of its ``U_j``) depended on its batch-mates. On that exception each matrix
    is decomposed alone (the same LAPACK call, so the same bits as in the stack) and only the
    failing ones are marked (NaN values, zero vectors): the certificate then fails (iteration)
    or ``finite`` is false (dense route), and that block alone goes to the SVD.

    Parameters
    ----------
    stack : (g, s, s) array

    Returns
    -------
    values : (g, s) array, ascending (NaN rows for failed matrices)
    vectors : (g, s, s) array
    """
    try:
        values, vectors = np.linalg.eigh(stack)
    except np.linalg.LinAlgError:
        g, s, _ = stack.shape
        values = np.full((g, s), np.nan, dtype=np.float64)
        vectors = np.zeros((g, s, s), dtype=np.float64)
        for j in range(g):
            # A failure leaves NaN values: this matrix alone leaves the route.
            with contextlib.suppress(np.linalg.LinAlgError):
                values[j], vectors[j] = np.linalg.eigh(stack[j])
    return np.asarray(values, dtype=np.float64), np.asarray(vectors, dtype=np.float64)


def _gram_top_k(
    gram: FloatArray, k: int, lift: bool
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """Top-k eigenpairs (descending) of each ``s x s`` Gram: subspace iteration
    (:func:`_subspace_iteration`) where ``s`` is large enough, a dense batched ``eigh`` for the
    blocks it did not settle (all of them when ``s`` is small: the route, bit for bit, of
    before).

    Returns ``(values (g, k), vectors (g, s, k), finite (g,))``; ``finite`` says every
    eigenvalue the route computed is finite.
    """
    g, s, _ = gram.shape
    values = np.zeros((g, k), dtype=np.float64)
    vectors = np.zeros((g, s, k), dtype=np.float64)
    finite = np.ones(g, dtype=bool)
    dense = np.ones(g, dtype=bool)
    width = iteration_width(s, k)
    if width:
        settled, values, vectors = _subspace_iteration(gram, k, width, lift)
        dense = ~settled
    if dense.all():
        all_values, all_vectors = eigh_each(gram)
    elif dense.any():
        all_values, all_vectors = eigh_each(gram[dense])
    else:
        return values, vectors, finite
    values[dense] = all_values[:, ::-1][:, :k]
    vectors[dense] = all_vectors[:, :, ::-1][:, :, :k]
    finite[dense] = np.isfinite(all_values).all(axis=1)
    return values, vectors, finite


#: Exponents ``e`` for which ``2^-e`` is a normal double: scaling by it is one multiplication.
_NORMAL_SCALE = range(-1023, 1023)


def scale_by_power_of_two(block: FloatArray, exponent: int, out: FloatArray) -> None:
    """``out = ldexp(block, -exponent)``, bit for bit, by the cheapest exact route.

    ``ldexp`` and a multiplication by ``2^-e`` both return the correctly rounded value of
    ``x 2^-e`` (exact unless it is subnormal), so they agree bit for bit whenever ``2^-e`` is
    itself a normal double; a multiplication costs a fraction of numpy's ``ldexp`` (which
    was 1.8 times a bare ``X^T X`` at 50,000 x 100). ``e = 0`` (rows within ``[0.5, 1)``
    in their largest entry, and a zero block) is the identity; exponents beyond the normal
    range keep ``ldexp``.
    """
    if exponent == 0:
        if out is not block:
            out[...] = block
    elif exponent in _NORMAL_SCALE:
        np.multiply(block, 2.0**-exponent, out=out)
    else:
        np.ldexp(block, -exponent, out=out)


def scale_and_gram(blocks: FloatArray, scaled: FloatArray) -> FloatArray:
    """Each block scaled by its own power of two (:func:`power_of_two_exponents`) into
    ``scaled`` (may be ``blocks`` itself), and its Gram matrix: ``X X^T`` (``m x m``) for
    ``m < d``, else ``X^T X`` (at ``m = d`` both are ``d x d`` and ``X^T X`` needs no lift).

    Each block is scaled and multiplied while it is in cache (one read of the rows from memory
    instead of three), and each Gram is numpy's product of the block with its own transpose:
    the same BLAS call per block, and the same bits, as the batched ``matmul`` of before
    (checked by tests/mechanisms/test_aggregator_speed_equivalence.py). Blocks whose rows
    together fit :data:`CACHE_BYTES` (the batches :func:`_top_k_right_singular` hands over at
    d = 100) are handled a batch at a time, a few numpy calls for the batch instead of six per
    block (:func:`_scale_and_gram_batch`); larger blocks one at a time (a third faster at
    d = 1,000 than the whole batch at once). The exponent is that of
    :func:`power_of_two_exponents` either way (a maximum is exact in any order), so the scaled
    rows and their Gram are a function of the block alone, as before.

    Returns
    -------
    (g, s, s) array, ``s = min(m, d)``.
    """
    g, m, d = blocks.shape
    s = min(m, d)
    gram = np.empty((g, s, s), dtype=np.float64)
    if (
        g > 1
        and m * d > 0
        and 8 * g * m * d <= CACHE_BYTES
        and _scale_and_gram_batch(blocks, scaled, gram)
    ):
        return gram
    for j in range(g):
        block = blocks[j]
        peak = max(float(block.max()), -float(block.min())) if block.size else 0.0
        scale_by_power_of_two(block, math.frexp(peak)[1], scaled[j])
        rows = scaled[j]
        if m >= d:
            np.matmul(rows.T, rows, out=gram[j])
        else:
            np.matmul(rows, rows.T, out=gram[j])
    return gram


def _scale_and_gram_batch(blocks: FloatArray, scaled: FloatArray, gram: FloatArray) -> bool:
    """:func:`scale_and_gram` of a batch that fits the cache, in a few calls for the whole
    batch; ``False`` (nothing written) when an exponent is outside the normal range (rows of
    1e-300 or 1e300 and beyond: the per-block route, with ``ldexp`` where it must).

    The same bits as the per-block route: the exponents are :func:`power_of_two_exponents`'s
    (the per-block peak ``max(max, -min)`` is the same maximum, exact in any order); a block
    is multiplied by ``2^-e``, a normal double, which is ``ldexp``'s correctly rounded value
    (:func:`scale_by_power_of_two`; ``e = 0`` multiplies by 1, the identity on every double);
    and the batched ``matmul`` calls the same BLAS product per block as the two-dimensional one
    (issue 35, fourth pass). At 50,000 x 100 the per-block route made about 3,000 numpy calls
    per release (peaks, scaling, products) for 500 blocks of ``100 x 100``."""
    exponents = power_of_two_exponents(blocks)
    if exponents.min() < _NORMAL_SCALE.start or exponents.max() >= _NORMAL_SCALE.stop:
        return False
    if exponents.any():
        factors = np.ldexp(1.0, -exponents)  # exact powers of two, normal doubles
        np.multiply(blocks, factors[:, None, None], out=scaled)
    elif scaled is not blocks:
        scaled[...] = blocks
    if blocks.shape[1] >= blocks.shape[2]:
        np.matmul(scaled.transpose(0, 2, 1), scaled, out=gram)
    else:
        np.matmul(scaled, scaled.transpose(0, 2, 1), out=gram)
    return True


def _top_k_right_singular(blocks: FloatArray, k: int, *, overwrite: bool = False) -> FloatArray:
    """Top-k right singular vectors of each ``m x d`` block, via the smaller Gram matrix.

    Each block is first scaled by its own power of two (:func:`power_of_two_exponents`): the
    scale of block ``j`` depends on block ``j`` only, so one row can change the rounding of its
    own subset's ``U_j`` and of no other, and no entry of a scaled Gram matrix exceeds
    ``min(m, d)`` in magnitude (rows of 1e300 or 1e-300 are as good as rows of 1).

    For ``m < d`` the eigenvectors ``v`` of ``X X^T`` (``m x m``) give ``u = X^T v / s``; for
    ``m >= d`` those of ``X^T X`` are the vectors themselves (at ``m = d``, where the two Grams
    are the same size, this saves the lift, an ``m x d`` by ``m x k`` product per block, and
    its rounding: 0.5-0.7x ``X^T X`` at 50,000 x 100 with ``t = 500``). The top-k eigenpairs of
    the Gram come from :func:`_gram_top_k`: a subspace iteration (a few ``s x s`` by ``s x b``
    products instead of a full ``s x s`` eigendecomposition, 5-10x less work at ``s = 100``)
    where the Gram is large, within :data:`ITERATION_TOLERANCE` of the exact top-k subspace
    where it certifies, else its last Ritz vectors (:data:`KEEP_UNCERTIFIED`); a batched dense
    ``eigh`` where the Gram is small. Both are batched LAPACK calls (a
    batched call decomposes each matrix on its own). The Gram route's accuracy on the top-k
    directions is ``~ eps_machine s_1^2 / (s_k^2 - s_{k+1}^2)``; blocks whose k-th singular
    value is too small for it (rank-deficient subsets, zero or duplicate rows) fall back to an
    SVD of the block.

    Totality: a block whose ``eigh`` fails (:func:`eigh_each` marks it alone; before, a failure
    in a batched call sent every block of the batch to the SVD) or whose result is not finite is
    decomposed on its own by SVD; a block whose SVD fails or gives non-finite or non-orthonormal
    vectors gets the fixed public basis :func:`fallback_basis` (the first ``k`` standard basis
    vectors). Which blocks fall back, and which take the iteration, depends on each block
    alone, so the route is a per-subset function like ``U_j`` itself and never raises.

    Parameters
    ----------
    blocks : (g, m, d) array of finite values
    k : int, ``k <= min(m, d)``
    overwrite : bool
        Scale ``blocks`` in place (they are then left scaled).

    Returns
    -------
    (g, d, k) array with orthonormal columns, in order of decreasing singular value.
    """
    g, m, d = blocks.shape
    s = min(m, d)
    # In place when the caller's blocks are scratch (subset_bases' pass buffer): no allocation
    # of their size, the same values.
    scaled = blocks if overwrite else np.empty_like(blocks)
    bases = np.empty((g, d, k), dtype=np.float64)
    # A few blocks at a time (CACHE_BYTES of Grams), so each batch's Grams are still in cache
    # when the iteration passes over them (three products, the norms, the residual): the bases
    # took 4.0x against 4.4x ``X^T X`` at 50,000 x 100 (the group's 81 Grams, 6.5 MB, were
    # read from memory at each pass). Every call is per matrix (a batched BLAS or LAPACK call
    # decomposes each matrix on its own), so the batches change no bit.
    step = max(1, CACHE_BYTES // (8 * s * s))
    for start in range(0, g, step):
        stop = min(g, start + step)
        part = blocks[start:stop]
        _top_k_batch(part, part if overwrite else scaled[start:stop], k, bases[start:stop])
    return bases


def _top_k_batch(blocks: FloatArray, scaled: FloatArray, k: int, bases: FloatArray) -> None:
    """:func:`_top_k_right_singular` of one batch of blocks, into ``bases`` (``(g, d, k)``);
    ``scaled`` receives the rows each Gram was formed from (may be ``blocks``)."""
    g, m, d = blocks.shape
    gram = scale_and_gram(blocks, scaled)
    try:
        if m >= d:
            _, top_vectors, finite = _gram_top_k(gram, k, lift=False)
            bases[:] = top_vectors
            # Eigenvectors of the d x d Gram are the singular vectors themselves: only a
            # non-finite or degenerate result needs the SVD route.
            good = finite & np.all(np.isfinite(bases), axis=(1, 2))
        else:
            top_values, top_vectors, finite = _gram_top_k(gram, k, lift=True)
            # The Gram route squares the condition number: with s_k^2 >= 1e-8 s_1^2 the columns
            # of X^T v / s are orthonormal to ~1e-8 at worst; below that, take the SVD.
            floor = 1e-8 * np.maximum(top_values[:, 0], np.finfo(np.float64).tiny)
            good = finite & (top_values[:, -1] > floor)
            if good.any():
                # All blocks at once (no copy of the good ones); only good ones are kept.
                lifted = np.matmul(scaled.transpose(0, 2, 1), top_vectors)
                scale = np.sqrt(top_values[good])
                bases[good] = lifted[good] / scale[:, None, :]
    except np.linalg.LinAlgError:
        good = np.zeros(g, dtype=bool)
    for j in np.flatnonzero(~good):
        bases[j] = safe_top_right_singular_vectors(scaled[j], k)


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
        # passes), then decompose it in place.
        buffer = np.empty((min(t, per_group) * m, d), dtype=np.float64)
        for start in range(0, t, per_group):
            stop = min(t, start + per_group)
            rows = buffer[: (stop - start) * m]
            take_rows(data, partition[start:stop].ravel(), rows)
            block = rows.reshape(stop - start, m, d)
            bases[start:stop] = _top_k_right_singular(block, k, overwrite=True)
        return bases
    buffer = np.empty((per_pass * m, d), dtype=np.float64)
    for first in range(0, t, per_pass):
        last = min(t, first + per_pass)
        rows = buffer[: (last - first) * m]
        gather_rows(data, partition[first:last].ravel(), rows)
        for start in range(first, last, per_group):
            stop = min(last, start + per_group)
            block = rows[(start - first) * m : (stop - first) * m].reshape(stop - start, m, d)
            bases[start:stop] = _top_k_right_singular(block, k, overwrite=True)
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
    :func:`_top_k_right_singular` at a time (``c`` blocks, :data:`CACHE_BYTES` of Grams), so
    those terms count ``c = min(g, CACHE_BYTES / (8 s^2))`` blocks, not ``g``. Doubles, 8 bytes
    each.
    """
    g = group_shape(t, m, group_rows)
    per_pass = PASS_BYTES if pass_bytes is None else pass_bytes
    p = pass_subsets(t, m, d, max(1, group_rows // m), per_pass)
    s = min(m, d)
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


def embeddings_bytes(t: int, q: int, d: int, k: int) -> int:
    """Bytes :func:`reference_embeddings` allocates: the coordinates (``t q k``), the projected
    points (``t q d``) and the reference points (``q d``)."""
    return 8 * (t * q * k + t * q * d + q * d)


def allowance(counted: int) -> int:
    """A counted peak plus 25% and 1 MiB for what the count does not list (small index
    arrays, copies numpy and LAPACK make inside a call); measured peaks were 1.0-1.6 times
    the bare count."""
    return int(1.25 * counted) + (1 << 20)
