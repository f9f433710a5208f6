"""The top-k right singular vectors of each block of a stack, each a function of its own block
(step 1 of ``histogram_aggregate`` and ``friendly_aggregate``: ``U_j`` of subset ``j``; the
partition and the passes over the data are in :mod:`service.mechanisms.sample_aggregate`).

Each block is scaled by a power of two of its own (:func:`power_of_two_exponents`) before its
Gram matrix is formed (:func:`scale_and_gram`), so no Gram of rows anywhere in the finite doubles
overflows and the rounding of ``U_j`` depends on block ``j`` alone. Blocks with
``min(m, d) >= KEEP_MIN_RATIO (k + 2)`` take one fixed round of randomized subspace iteration
on their scaled rows instead (:func:`_sketch_top_k`, :data:`SKETCH_ROUTE`: no Gram, the same
work for any data). Elsewhere the top-k eigenvectors of
each Gram come from a certified subspace iteration (:func:`_subspace_iteration`) or a dense
``eigh`` (:func:`_gram_top_k`); a block either route cannot decompose is decomposed alone by SVD
(:func:`safe_top_right_singular_vectors`) and, failing that, gets the fixed public basis
(:func:`fallback_basis`). Every BLAS and LAPACK call is per matrix (a stacked call decomposes
each matrix on its own), so how the blocks are batched changes no bit, and which route a block
takes is a function of that block alone: the per-subset property both aggregators' privacy
arguments rest on (one replaced row changes one ``U_j``). Nothing raises on finite input
(ALGORITHMS.md, "Totality").
"""

from __future__ import annotations

import contextlib
import functools
import math

import numpy as np
import numpy.typing as npt

from service.mechanisms.linalg import FloatArray


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
#: Bytes of Grams formed and decomposed at once (:func:`top_k_right_singular`): about half of
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
        # Only min(rate, 1) is used: clip |theta_b / theta_k| at 1 before squaring, the same
        # value, so that a theta_k rounding to 0 (a subset of rank below k) overflows nothing;
        # the quotient itself may be huge there (any sign), hence the errstate.
        with np.errstate(over="ignore"):
            ratio_b = theta[:, -1] / np.maximum(theta[:, k - 1], np.finfo(np.float64).tiny)
        rate = np.square(np.minimum(np.abs(ratio_b), 1.0))
        reachable = bound * np.power(rate, rounds_left) <= allowed * gap
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
    together fit :data:`CACHE_BYTES` (the batches :func:`top_k_right_singular` hands over at
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


def _scale_normal(blocks: FloatArray, scaled: FloatArray, exponents: npt.NDArray[np.int64]) -> bool:
    """Each block times its ``2^-e`` in one batched multiplication into ``scaled`` (may be
    ``blocks``) when every ``2^-e`` is a normal double (an exact power of two: the correctly
    rounded value :func:`scale_by_power_of_two`'s ``ldexp`` gives; ``e = 0`` multiplies by 1,
    the identity); ``False``, nothing written, otherwise (rows of 1e-300 or 1e300 and beyond,
    or no blocks): the caller scales block by block."""
    if (
        not exponents.size
        or exponents.min() < _NORMAL_SCALE.start
        or exponents.max() >= _NORMAL_SCALE.stop
    ):
        return False
    if exponents.any():
        np.multiply(blocks, np.ldexp(1.0, -exponents)[:, None, None], out=scaled)
    elif scaled is not blocks:
        scaled[...] = blocks
    return True


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
    if not _scale_normal(blocks, scaled, power_of_two_exponents(blocks)):
        return False
    if blocks.shape[1] >= blocks.shape[2]:
        np.matmul(scaled.transpose(0, 2, 1), scaled, out=gram)
    else:
        np.matmul(scaled, scaled.transpose(0, 2, 1), out=gram)
    return True


#: The route of the subset bases where a block's top-k is found by iteration and its Ritz vectors
#: are kept (``s >= KEEP_MIN_RATIO * b``): ``True`` (issue 35 item 1, eighth pass), a fixed
#: count of products with the block's own rows (:func:`_sketch_top_k`, no Gram matrix, no
#: certificate, the same work whatever the data); ``False``, the certified iteration on the
#: Gram (:func:`_gram_top_k`, the route of before, kept for the same-process comparison in
#: docs/benchmarks.md, "Aggregator speed, 30 Nov 2026").
SKETCH_ROUTE = True


def sketch_route(m: int, d: int, k: int) -> bool:
    """Whether :func:`top_k_right_singular` takes :func:`_sketch_top_k` for ``m x d`` blocks
    (public sizes only): where the Gram route kept uncertified Ritz vectors, ``3 b <= s`` and
    ``s >= KEEP_MIN_RATIO * b`` (``b = k + 2``, ``s = min(m, d)``)."""
    width = iteration_width(min(m, d), k)
    return SKETCH_ROUTE and width > 0 and min(m, d) >= KEEP_MIN_RATIO * width


def scale_blocks(blocks: FloatArray, scaled: FloatArray) -> None:
    """Each block times ``2^-e`` of its own (:func:`power_of_two_exponents`) into ``scaled``
    (may be ``blocks``): the scaling of :func:`scale_and_gram`, bit for bit, without the Gram
    (a batched multiplication where every ``2^-e`` is a normal double, else
    :func:`scale_by_power_of_two` block by block, ``ldexp`` where it must)."""
    exponents = power_of_two_exponents(blocks)
    if _scale_normal(blocks, scaled, exponents):
        return
    for j in range(blocks.shape[0]):
        scale_by_power_of_two(blocks[j], int(exponents[j]), scaled[j])


def _sketch_top_k(
    scaled: FloatArray, k: int, width: int
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """Top-k right singular pairs of each scaled ``m x d`` block by one fixed round of
    randomized subspace iteration on the rows themselves (Halko, Martinsson & Tropp 2011,
    Algorithm 4.3 with ``q = 2`` products by ``X^T X``, then Rayleigh-Ritz).

    ``Z = (X^T X)^2 Omega`` (``Omega`` = :func:`public_start` ``(d, b)``, a public constant)
    as four products with ``X`` (``X Omega``, ``X^T``, ``X``, ``X^T``), ``Q = qr(Z)``
    (Householder, orthonormal to rounding whatever the rank of ``Z``), ``B = X Q`` and
    ``B^T B = Q^T X^T X Q = W diag(theta) W^T``; the result is ``V = Q W_k`` and ``theta_k``
    (the squared singular values' Ritz estimates), descending.

    In exact arithmetic ``span(Z)`` and the Ritz pairs are those of the Gram route's first round
    (:func:`_subspace_iteration`: ``Q = orth(G^2 Omega)``, ``G = X^T X``, the same ``Omega``
    for ``m >= d``), which certified every "near" and stopped every "power" block of
    bench_aggregator_speed at 50,000 x 100 (so the bases of before were these, to 1e-12); the
    Gram (``m d^2`` multiply-adds, ``d^2 b`` per product after it) is never formed, five
    products of ``m d b`` replace it, and for ``m < d`` no lift ``X^T v / s`` is needed (so
    no ``s_k^2 >= 1e-8 s_1^2`` condition and no SVD for rank-deficient subsets). Accuracy: the
    subspace is within ``~ (s_{b+1} / s_k)^4`` (times the start's spread, ``O(sqrt(d b))``)
    of the block's exact top-k where it has a gap after ``k``, far inside the spread of the
    subsets' own subspaces around the data's (``~ s_{k+1} / s_k``), which is what the
    aggregators' radii measure; without a gap it is the Rayleigh-Ritz approximation from
    ``span((X^T X)^2 Omega)``, as the Gram route's kept Ritz vectors were.

    Privacy and totality: every product, the QR and the ``eigh`` are per block (the first
    product, over the stacked rows, computes each row's entries from that row and ``Omega``
    alone), the start is public and the count is fixed, so ``V_j`` is a function of subset
    ``j`` alone, and the work, the memory and the calls are the same for any data of the same
    shape. The scaled entries are below 1 in magnitude, so nothing overflows (``|Z| <= m^2 d^2
    max|Omega|``). A block whose ``eigh`` fails (:func:`eigh_each`) or whose vectors are not
    finite is reported for the caller's SVD.

    Parameters
    ----------
    scaled : (g, m, d) array, entries in (-1, 1)
    k, width : int, ``k < width <= min(m, d)``

    Returns
    -------
    vectors : (g, d, k) array
    good : (g,) bool array, finite Ritz values and vectors
    """
    g, m, d = scaled.shape
    start_t = public_start(d, width).T  # (b, d), a transposed view
    # The iterates are kept transposed (``b x d``, ``Z^T = W^T X``): BLAS forms the wide
    # product faster than the narrow one (as on the Gram route).
    left = np.matmul(scaled.reshape(g * m, d), start_t.T).reshape(g, m, width)  # X Omega
    right_t = np.matmul(left.transpose(0, 2, 1), scaled)  # (X^T X Omega)^T
    left = np.matmul(scaled, right_t.transpose(0, 2, 1))
    right_t = np.matmul(left.transpose(0, 2, 1), scaled)  # ((X^T X)^2 Omega)^T
    basis, _ = np.linalg.qr(right_t.transpose(0, 2, 1))  # (g, d, b)
    image = np.matmul(scaled, basis)  # B = X Q
    theta, rotation = eigh_each(np.matmul(image.transpose(0, 2, 1), image))
    vectors = np.matmul(basis, rotation[:, :, : -k - 1 : -1])
    good = np.isfinite(theta).all(axis=1) & np.isfinite(vectors).all(axis=(1, 2))
    return np.asarray(vectors, dtype=np.float64), np.asarray(good, dtype=np.bool_)


def _sketch_batch(blocks: FloatArray, scaled: FloatArray, k: int, bases: FloatArray) -> None:
    """:func:`top_k_right_singular` of one batch on the sketch route, into ``bases``."""
    scale_blocks(blocks, scaled)
    try:
        vectors, good = _sketch_top_k(scaled, k, iteration_width(min(blocks.shape[1:]), k))
        bases[:] = vectors
    except np.linalg.LinAlgError:  # not expected (eigh_each marks failures), kept total
        good = np.zeros(blocks.shape[0], dtype=bool)
    for j in np.flatnonzero(~good):
        bases[j] = safe_top_right_singular_vectors(scaled[j], k)


def top_k_right_singular(blocks: FloatArray, k: int, *, overwrite: bool = False) -> FloatArray:
    """Top-k right singular vectors of each ``m x d`` block: by :func:`_sketch_top_k` on the
    rows where :func:`sketch_route` says so, else via the smaller Gram matrix (below).

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
    if sketch_route(m, d, k):
        # CACHE_BYTES of rows at a time (the rows are read five times, the Grams never formed).
        step = max(1, CACHE_BYTES // (8 * m * d))
        for start in range(0, g, step):
            stop = min(g, start + step)
            part = blocks[start:stop]
            _sketch_batch(part, part if overwrite else scaled[start:stop], k, bases[start:stop])
        return bases
    step = max(1, CACHE_BYTES // (8 * s * s))
    for start in range(0, g, step):
        stop = min(g, start + step)
        part = blocks[start:stop]
        _top_k_batch(part, part if overwrite else scaled[start:stop], k, bases[start:stop])
    return bases


def _top_k_batch(blocks: FloatArray, scaled: FloatArray, k: int, bases: FloatArray) -> None:
    """:func:`top_k_right_singular` of one batch of blocks, into ``bases`` (``(g, d, k)``);
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
