"""Choosing how ``analyze_gauss`` centres (issue 24, item 2): a private mean, differences of
publicly paired rows, or no centring, decided from public facts and released values only.

Why: centring on a private mean ``mu_hat = mu + delta`` adds ``n delta delta^T`` to the
centred Gram, a rank-one term of expected size ``n d sigma_mu^2 = 4 C^2 d/(n mu_M^2)`` along a
random direction, and lengthens every centred row from ``||y||`` to about
``sqrt(||y||^2 + d sigma_mu^2)``. Where the rows' spread is small against the mean's noise
(unit-norm breast_cancer: centred norms ~0.05, ``d sigma_mu^2`` ~0.8 at eps 0.3) the centred
rows are mostly that noise and the released subspace follows it. Two alternatives need no
mean: **pairs**, ``p_j = (clip_C(x_r(2j)) - clip_C(x_r(2j+1)))/sqrt(2)`` (``j < m =
floor(n/2)``, ``r`` a permutation drawn from the run's CSPRNG before the data is read: public
randomness; the stored order would pair alike rows where the owner sorted them), whose
second moment is the covariance ``Sigma`` (``m`` rows: half the signal, no mean noise); and
**none**, the uncentred rows (the mean's direction takes a slot, the rows are longer).

The choice (:func:`choose_centring`): a probe releases, with ``CLIP_SHARE`` of ``mu^2`` (the
clip quantile's step, which it replaces), two noisy histograms on the half-octave grid
:func:`probe_edges`: the norms of ``clip_C(x_i)`` and those of ``p_j`` (clipped to ``C``).
Replacing one row moves one count of each by one down and one up (it is in one pair): l2
sensitivity 2, noise ``N(0, (2/mu_Q)^2)`` per count: ``mu_Q``-GDP. Each histogram is read
twice (:func:`read_quantiles`): a top-down ``q``-quantile for the choice (``C_u``, ``C_p``)
and a bottom-up one for the clip (the pairs' also top-down at ``VARIANCE_CLIP_QUANTILE``, the
explained-variance step's clip). Each route's signal-to-noise (signal over the Gram noise
``sqrt(2) c^2/mu``) is then

- none: ``n mu_R / C_u^2``;
- pairs: ``m mu_R / C_p^2``;
- mean: ``n mu_G / c_M^2``, ``c_M^2 = min(C^2, C_p^2 + d sigma_mu^2)``,
  ``sigma_mu = 2C/(n mu_M)``, the centred rows' expected squared norm (``C_p`` estimates
  the centred norm: ``E||p_j||^2 = E||y||^2``);

with ``mu_R^2 = mu_M^2 + mu_G^2`` (a route without a mean gives the mean's share to the Gram).
The largest wins (ties: mean, then pairs). A function of the released quantiles and public
facts only: post-processing.

Privacy: the probe is ``mu_Q``-GDP; given its output the rest is one of three blocks, each
``mu_R``-GDP (the mean ``mu_M`` then the Gram ``mu_G``, or one Gram at ``mu_R``; pairs: a
replaced row changes one ``p_j``, sensitivity ``sqrt(2) c^2`` at the clip ``c`` as for rows);
then the explained-variance step ``mu_V`` (without a mean, over paired differences: a replaced
row changes one, sensitivity ``sqrt(2) C^2`` as for rows). Adaptive composition of GDP
mechanisms with fixed parameters (Dong, Roth & Su 2022, Theorem 3.2):
``sqrt(mu_Q^2 + mu_R^2 + mu_V^2) = mu``, the same total as declared. The declared steps
(:meth:`AnalyzeGauss.privacy_steps`) list the mean route's; their ``rho`` sum equals every
route's.

Computation order (issue 32, item 5): the run computes the same statistics as separate passes
would, in fewer passes and without an ``m x d`` array of pairs: one sequential pass over the
rows (:func:`probe_pass`) gives both histograms' counts, the clipped rows' sum (the mean
route's mean, noised only if that route is taken) and each row's squared norm and clip
factor, reading each pair at its higher row with its partner gathered (nothing is gathered in
the permuted order) and taking the pair's norm from the rows' squared norms and one dot
product; the Gram pass reads those norms instead of recomputing them, merges consecutive clips
into one (:func:`~service.mechanisms.fast_rows.fast_gram_rows`: the same per-row map) and
builds pairs a chunk at a time from the known factors (:func:`paired_gram`,
:func:`paired_energy`, only on the pairs route). Only rounding changes: a pair's norm from dot
products may put a pair lying within a few ulps of a bin's edge in the neighbouring bin, which
leaves each pair's bin a function of its own two rows (the histograms' sensitivity holds
exactly); the explained-variance summands are clamped onto their simplex whatever their
rounding (:func:`probe_paired_energy`). From ``n >= 8,192`` rows (public) the mean and none
routes sum their Gram in float32 blocks and draw its noise for the stated larger sensitivity
``sqrt(2) B^2 (1 + 5.7e-3)`` (:func:`~service.mechanisms.fast_rows.single_gram_fits`), and
project for the explained variance in float32 (clamped summands: no sensitivity change).
Every draw and its order are as before; the privacy argument above holds with that scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from service.mechanisms.clip_quantile import noisy_above
from service.mechanisms.fast_rows import (
    _safe_squares,
    _scale_to,
    clip_factors,
    row_dots,
    row_norms,
    row_squares,
    row_squares_into,
    single_projections,
)
from service.mechanisms.fast_rows import (
    fast_energy as fast_energy,
)
from service.mechanisms.fast_rows import (
    fast_gram as fast_gram,
)
from service.mechanisms.fast_rows import (
    gram_chunk_rows as gram_chunk_rows,
)
from service.mechanisms.fast_rows import (
    skinny_chunk_rows as skinny_chunk_rows,
)
from service.mechanisms.linalg import (
    DEFAULT_CHUNK_ROWS,
    FloatArray,
    _clip_rows,
    gram_norm_counts,
    iter_row_chunks,
)
from service.mechanisms.linalg import (
    ROUNDING_SLACK as ROUNDING_SLACK,
)
from service.mechanisms.paired_rows import (
    _gathered as _gathered,
)
from service.mechanisms.paired_rows import (
    _pairs_by_higher_row as _pairs_by_higher_row,
)
from service.mechanisms.paired_rows import (
    pair_blocks as pair_blocks,
)
from service.mechanisms.paired_rows import (
    pair_chunks as pair_chunks,
)
from service.mechanisms.paired_rows import (
    paired_differences as paired_differences,
)
from service.mechanisms.paired_rows import (
    paired_energy as paired_energy,
)
from service.mechanisms.paired_rows import (
    paired_gram as paired_gram,
)

Route = Literal["mean", "pairs", "none"]

#: The probe's grid: ``C 2^(-j/PROBE_STEPS_PER_OCTAVE)``, ``j < PROBE_GRID_STEPS``; coarser than
#: the clip quantile's (fewer bins: less noise summed into a count above an edge).
PROBE_STEPS_PER_OCTAVE = 2
PROBE_GRID_STEPS = 24

#: The pairs' quantile the explained-variance step clips at (read top-down from the probe's
#: noisy counts, so it errs upwards): rows whose centred norm is far below ``C`` get noise at
#: their own scale instead of ``C``'s (unit-norm breast_cancer: centred norms about 0.05, so
#: the noise at C = 1 was ~400x the noise at their scale and hid the share in every run), at
#: the price of shortening the top 1% of centred rows.
VARIANCE_CLIP_QUANTILE = 0.99

#: Probe histograms' l2 sensitivity: one replaced row moves two counts in each of the two.
PROBE_SENSITIVITY = 2.0

#: Pairs whose dot products :func:`probe_pass` computes per step (their partners and own rows
#: copied into two buffers of this many rows): 256 measured fastest of 64 to 1,024 at
#: 50,000 x 100 (the buffers stay in cache with the chunk). Work only: each pair's dot product
#: is the same whatever the step.
PROBE_PAIR_PIECE = 256


def probe_edges(clip_norm: float) -> FloatArray:
    """The probe's public grid ``C 2^(-j/PROBE_STEPS_PER_OCTAVE)``, ascending, ending at ``C``."""
    exponents = -np.arange(PROBE_GRID_STEPS - 1, -1, -1, dtype=np.float64)
    return np.asarray(clip_norm * np.exp2(exponents / PROBE_STEPS_PER_OCTAVE), dtype=np.float64)


def _count(norms: FloatArray, edges: FloatArray, clip_norm: float) -> FloatArray:
    """Counts of ``min(norms, C)`` in the bins of :func:`gram_norm_counts` (bin ``j``:
    ``edges[j-1] < v <= edges[j]``, the top bin everything above ``edges[-2]``, NaN too), from
    the numbers at or below each edge: one comparison pass per edge, 6x faster than a binary
    search per norm at 50,000 norms and 24 edges; the same counts."""
    below = np.empty(edges.shape[0], dtype=np.float64)
    for j in range(edges.shape[0] - 1):
        below[j] = np.count_nonzero(norms <= edges[j])
    below[-1] = norms.shape[0]
    return np.diff(below, prepend=0.0)


@dataclass(frozen=True)
class ProbePass:
    """What one pass over the rows gives the probe and the mean route: the exact counts of the
    norms of ``clip_C(x_i)`` and of the pairs ``p_j`` (clipped to ``C``) on
    :func:`probe_edges`, and ``sum_i clip_C(x_i)``. Nothing here is released: the probe adds
    its noise to the counts (:func:`read_probe`), the mean route to the sum."""

    counts_u: FloatArray
    counts_p: FloatArray
    clipped_sum: FloatArray
    n_pairs: int
    #: Per row (original order): the factor ``clip_C`` scaled it by, and per pair ``j`` (offset
    #: 0) the norm of ``p_j``; ``None`` when a chunk took the rescaled route (extreme scales).
    #: Not released: :func:`probe_paired_energy` scores a basis on the pairs from them.
    row_factors: FloatArray | None = None
    pair_norms: FloatArray | None = None
    #: Per row (original order): ``||x_i||^2`` before the clip (``None`` as above).
    row_squares: FloatArray | None = None


def probe_pass(
    data: Any,
    clip_norm: float,
    order: npt.NDArray[np.intp],
    chunk_rows: int | None = None,
) -> ProbePass:
    """:class:`ProbePass` in one sequential pass over the rows in chunks (``chunk_rows``,
    default :func:`gram_chunk_rows`: a chunk stays in cache): each row's squared norm ``s_i``
    and clip factor ``f_i``, the clipped rows' sum, and for each pair ``(x_a, x_b)`` of
    :func:`paired_differences` (offset 0) whose higher row index falls in the chunk the dot
    product ``x_a . x_b`` (the chunk holds that row; its partner, an earlier row, is gathered).
    Every row is read once in order and once more
    as a partner at most; nothing is gathered in the permuted order. After the pass, without
    touching the rows again, the pairs' norms

        ``||p_j||^2 = ||f_a x_a - f_b x_b||^2 / 2 = (f_a^2 s_a + f_b^2 s_b - 2 f_a f_b x_a.x_b)/2``

    (clamped at 0), the two histograms' counts and the factors of every row.

    The statistics are those of :func:`gram_norm_counts` of the rows and of
    :func:`paired_differences`, and :func:`~service.mechanisms.linalg.clipped_sum`, computed
    differently: the rows' counts, factors and squared norms are the same arithmetic to the
    bit; a pair's norm is rounded differently from the norm of its materialised difference
    (absolute error a few ulps of ``f_a^2 s_a + f_b^2 s_b``, so a pair within that of a bin's
    edge may fall in the neighbouring bin). That changes no sensitivity: each pair's bin is
    a deterministic function of that pair's two rows (and public ``C``, layout), so replacing
    a row still moves one row count and one pair count, each by one down and one up (l2
    sensitivity 2 for the two histograms, as before), whatever the rounding.

    Work (issue 32 item 5): no materialised differences, no norms of them, no sort (the
    pairs are ordered by their higher row in linear time, :func:`_pairs_by_higher_row`; the
    partners of a chunk are gathered in that order, which at 50,000 x 100 costs no more than
    ascending order did), one gather of the partners and one of the chunk's own paired rows
    (in cache) per :data:`PROBE_PAIR_PIECE` pairs, one dot product per pair; the factors and
    the pairs' norms are computed once over all rows. A squared norm outside the safe range
    anywhere sends the whole pass to the gathered pass with its power-of-two rescaling
    (:func:`gathered_probe_pass`).
    """
    n, d = data.shape
    chunk = gram_chunk_rows(d) if chunk_rows is None else max(1, chunk_rows)
    edges = probe_edges(clip_norm)
    total = np.zeros(d, dtype=np.float64)
    factors = np.ones(n, dtype=np.float64)
    raw_squares = np.empty(n, dtype=np.float64)
    m = n // 2
    index = np.asarray(order)
    low_by, high_by, by, bounds = _pairs_by_higher_row(index, n, chunk)
    dots = np.empty(m, dtype=np.float64)
    limit = clip_norm * clip_norm * (1.0 + ROUNDING_SLACK)
    ones = np.ones(chunk, dtype=np.float64)
    gather = isinstance(data, np.ndarray)
    # The chunk's partners and its own paired rows are copied into two reused buffers
    # (numpy.take with out= and mode="clip": unbuffered; a fresh array of a chunk's rows per
    # call was paged in anew, and with mode="raise" take buffers out=): the same rows, 2.6 ms
    # less of 6.7 at 50,000 x 100. Indices are in range, so "clip" never clips.
    # A chunk's pairs are taken PROBE_PAIR_PIECE at a time: the two buffers then stay in the
    # core's cache with the chunk (issue 32 item 5: 11.0 -> 9.4 ms for the pairs' gathers and
    # dot products at 50,000 x 100, load 12; the same dot product per pair, so the same bits).
    direct = gather and data.dtype == np.float64
    most = max(1, min(chunk, m, PROBE_PAIR_PIECE))
    partner_rows = np.empty((most, d), dtype=np.float64) if direct else None
    own_rows = np.empty((most, d), dtype=np.float64)
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        start = 0
        for number, block in enumerate(iter_row_chunks(data, chunk)):  # a memory map reads ahead
            stop = start + block.shape[0]
            squares = row_squares_into(block, raw_squares[start:stop])
            # A NaN or overflowed square is caught after the pass (the gathered pass then).
            # One reduction decides whether any row is over the clip (clip_factors' test).
            factor = clip_factors(squares, clip_norm) if float(squares.max()) > limit else None
            if factor is None:
                # A product with ones: the same sum (up to its order) at about half the cost
                # of sum(axis=0) over rows (measured at d = 100).
                total += ones[: block.shape[0]] @ block
            else:
                factors[start:stop] = factor
                total += factor @ block  # the sum of the clipped rows
            for lo in range(int(bounds[number]), int(bounds[number + 1]), most):
                hi = min(int(bounds[number + 1]), lo + most)
                partners = low_by[lo:hi]
                if partner_rows is not None:
                    rows_a = np.take(
                        data, partners, axis=0, out=partner_rows[: hi - lo], mode="clip"
                    )
                else:
                    rows_a = np.asarray(
                        np.take(data, partners, axis=0) if gather else data[partners],
                        dtype=np.float64,
                    )
                rows_b = np.take(
                    block, high_by[lo:hi] - start, axis=0, out=own_rows[: hi - lo], mode="clip"
                )
                row_dots(rows_a, rows_b, out=dots[lo:hi])
            start = stop
        if _safe_squares(raw_squares, clip_norm, raw_squares) is None:
            return gathered_probe_pass(data, clip_norm, order, chunk)
        # 2 ||p_j||^2 = f_a^2 s_a + f_b^2 s_b - 2 f_a f_b x_a.x_b, in place in dots (memory:
        # a few arrays of m, see AnalyzeGauss.memory_bytes).
        dots *= -2.0
        if bool(np.any(factors != 1.0)):
            f_a, f_b = factors[low_by], factors[high_by]
            dots *= f_a
            dots *= f_b
            for f, rows in ((f_a, low_by), (f_b, high_by)):
                term = raw_squares[rows]
                term *= f
                term *= f
                dots += term
            del f_a, f_b, term
        else:
            dots += raw_squares[low_by]
            dots += raw_squares[high_by]
        dots *= 0.5
        np.maximum(dots, 0.0, out=dots)
        np.sqrt(dots, out=dots)
    pair_norms = np.empty(m, dtype=np.float64)
    pair_norms[by] = dots
    # Counted once over all rows and pairs (the same counts as chunk by chunk: sums of ones).
    counts_u = _count(np.sqrt(raw_squares), edges, clip_norm)
    counts_p = _count(pair_norms, edges, clip_norm)
    return ProbePass(counts_u, counts_p, total, m, factors, pair_norms, raw_squares)


def gathered_probe_pass(
    data: Any,
    clip_norm: float,
    order: npt.NDArray[np.intp],
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> ProbePass:
    """:func:`probe_pass` for rows at extreme scales: one pass in chunks of the permuted
    order, each chunk clipped with the power-of-two rescaling where its squared norms leave
    the safe range (then no per-row factors or norms are kept)."""
    n, d = data.shape
    edges = probe_edges(clip_norm)
    counts_u = np.zeros(edges.shape[0], dtype=np.float64)
    counts_p = np.zeros(edges.shape[0], dtype=np.float64)
    total = np.zeros(d, dtype=np.float64)
    step = max(2, chunk_rows - chunk_rows % 2)
    m = n // 2
    factors: FloatArray | None = np.ones(n, dtype=np.float64)
    pair_norms = np.zeros(m, dtype=np.float64)
    raw_squares = np.zeros(n, dtype=np.float64)
    with np.errstate(under="ignore"):
        # Chunks of an even number of rows (pairs never straddle two); the last row of an odd
        # n is in no pair and counts only among the rows.
        for start in range(0, n, step):
            indices = np.asarray(order[start : start + step])
            block, where = _gathered(data, indices)
            squares = _safe_squares(block, clip_norm)
            if squares is None:
                clipped = _clip_rows(block, clip_norm)
                norms = row_norms(clipped)
                factors = None
            else:
                factor = clip_factors(squares, clip_norm)
                sorted_indices = np.sort(indices)
                raw_squares[sorted_indices] = squares
                if factor is not None and factors is not None:
                    factors[sorted_indices] = factor
                # block is this pass's own gathered copy: scaled in place.
                clipped = _scale_to(block, squares, clip_norm, own=True)
                norms = np.sqrt(squares)
            counts_u += _count(norms, edges, clip_norm)
            total += clipped.sum(axis=0)
            paired = min(block.shape[0], 2 * m - start) // 2 * 2
            if paired > 0:
                diffs = (clipped[where[0:paired:2]] - clipped[where[1:paired:2]]) / math.sqrt(2.0)
                diff_norms = row_norms(diffs)
                pair_norms[start // 2 : start // 2 + paired // 2] = diff_norms
                counts_p += _count(diff_norms, edges, clip_norm)
    if factors is None:
        return ProbePass(counts_u, counts_p, total, m)
    return ProbePass(counts_u, counts_p, total, m, factors, pair_norms, raw_squares)


def _projections(data: Any, columns: FloatArray) -> FloatArray:
    """``(X B)^T``, shape ``(b, n)`` for ``B = columns`` (``d x b``, ``b`` small), in chunks of
    :func:`skinny_chunk_rows` (a memory map is read ahead): transposed, so that the per-row
    arithmetic that follows runs along contiguous rows of length ``n``, not over ``n`` rows of
    length ``b`` (at ``b`` = 10 the squared norms of ``n`` short rows cost 4x their sum down
    the columns, measured at n = 50,000)."""
    n = data.shape[0]
    out = np.empty((columns.shape[1], n), dtype=np.float64)
    transposed = np.ascontiguousarray(columns.T)
    start = 0
    for block in iter_row_chunks(data, skinny_chunk_rows(data.shape[1])):
        np.matmul(transposed, block.T, out=out[:, start : start + block.shape[0]])
        start += block.shape[0]
    return out


def probe_centred_energy(
    data: Any,
    counts: ProbePass,
    basis: FloatArray,
    center: FloatArray,
    bound: float,
    *,
    single: bool = False,
    centred_squares: FloatArray | None = None,
) -> tuple[float, float] | None:
    """:func:`fast_energy` of the rows ``clip_C(x)`` centred on ``center`` and clipped at
    ``bound`` (``min(C, row_clip)``) from the probe pass's clip factors ``a`` and squared
    norms ``s`` and one sequential pass ``X [U, c]``: ``U^T(a x - c) = a U^T x - U^T c`` and
    ``||a x - c||^2 = a^2 s - 2 a x.c + ||c||^2`` (the expansion's cancellation is a few ulps
    of ``||x||^2``, far below any noise here). The same sums up to rounding; ``None`` when
    the probe pass has no factors (extreme scales) or a sum is not finite.

    Each row's point ``(captured, residual)`` is clamped onto ``a + b = t``, ``t`` its clipped
    squared norm (``<= bound^2 (1 + ROUNDING_SLACK)`` from its own factor), so the simplex of
    the step's sensitivity holds exactly however the two were rounded (before, a row whose
    rounded projection exceeded its rounded norm added ``a > t``).

    ``centred_squares`` (the Gram pass's ``||clip_C(x) - c||^2``, all finite): read instead of
    the expansion, and ``X U`` instead of ``X [U, c]``. ``single``
    (:func:`~service.mechanisms.fast_rows.single_projections_fit`): ``U^T (a x)`` from the
    clipped rows in float32 (:func:`~service.mechanisms.fast_rows.single_projections`); only
    with ``centred_squares`` (the expansion's ``x.c`` would cancel in float32)."""
    if counts.row_factors is None or counts.row_squares is None:
        return None
    n, k = data.shape[0], basis.shape[1]
    known = centred_squares is not None and bool(np.all(np.isfinite(centred_squares)))
    scaled = bool(np.any(counts.row_factors != 1.0))  # a x is x when every a is 1
    centre_shift: FloatArray = basis.T @ center
    shift: FloatArray | None = centre_shift
    # Float32: the products U^T (a x) as sgemm gave them (n x k), each chunk's written
    # transposed with the shift U^T c subtracted into one reused k x chunk buffer as it is
    # scored (issue 32 item 5: no k x n float64 array written and read again; the same
    # float64 values, the same ufunc on the same inputs).
    products32: FloatArray | None = None
    shift32 = centre_shift[:, None]  # as subtracted from the float32 products, chunk by chunk
    if known and single:
        # U^T (a x) - U^T c: the clipped rows' projections.
        factors = counts.row_factors if scaled else None
        products32 = single_projections(data, basis, factors, counts.row_squares, single_out=True)
        products = np.empty((k, min(n, DEFAULT_CHUNK_ROWS)), dtype=np.float64)
        scaled = False
    elif known:
        products = _projections(data, basis)
    else:
        # [U, c]^T X^T: k + 1 contiguous rows of length n.
        products = _projections(data, np.concatenate([basis, center[:, None]], axis=1))
    norm_c = float(center @ center)
    captured = 0.0
    residual = 0.0
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        for start in range(0, n, DEFAULT_CHUNK_ROWS):
            stop = min(n, start + DEFAULT_CHUNK_ROWS)
            if products32 is not None:
                projected = products[:, : stop - start]
                np.subtract(products32[start:stop].T, shift32, out=projected)
            else:
                projected = products[:k, start:stop]
            a = counts.row_factors[start:stop]
            projected = projected * a if scaled else projected
            if centred_squares is not None and known:
                centred = centred_squares[start:stop].copy()
            else:
                dots = products[k, start:stop]
                squares = counts.row_squares[start:stop]
                centred = a * a * squares - 2.0 * a * dots if scaled else squares - 2.0 * dots
                centred = np.maximum(centred + norm_c, 0.0)
            if shift is not None and products32 is None:  # in place: this function's array
                projected -= shift[:, None]
            inside = np.einsum("ij,ij->j", projected, projected)
            factor = clip_factors(centred, bound)
            if factor is not None:
                factor *= factor
                inside *= factor
                centred *= factor
            kept = np.minimum(inside, centred)
            captured += float(np.sum(kept))
            residual += float(np.sum(centred - kept))
    if not (math.isfinite(captured) and math.isfinite(residual)):
        return None
    return captured, residual


def probe_paired_energy(
    data: Any,
    clip_norm: float,
    order: npt.NDArray[np.intp],
    counts: ProbePass,
    basis: FloatArray,
    row_clip: float | None = None,
    *,
    single: bool = False,
) -> tuple[float, float, int] | None:
    """:func:`paired_energy` at offset 0 from the probe pass's clip factors and pair norms and
    one sequential pass ``Z = X U`` (no gathered rows): the halved pair ``q_j = (y_a - y_b)/2``
    has ``U^T q_j = (a_a Z_a - a_b Z_b)/2`` and ``||q_j||^2 = ||p_j||^2/2``; each is clipped at
    ``min(C, row_clip)`` as :func:`fast_gram_rows` would (:func:`clip_factors`). The same
    sums up to rounding; ``None`` when the probe pass has no factors (extreme scales).

    Each pair's point ``(captured, residual)`` is clamped onto ``a + b = t``, ``t`` its
    clipped squared norm (``<= bound^2 (1 + ROUNDING_SLACK)`` from its own factor): the
    simplex of the step's sensitivity holds exactly whatever the rounding of ``U^T q_j``
    (computed from ``Z``, it cancels where ``x_a`` and ``x_b`` nearly agree) or of ``t``
    (from the probe's dot products). ``single``
    (:func:`~service.mechanisms.fast_rows.single_projections_fit`): ``Z`` of the clipped rows
    in float32 (:func:`~service.mechanisms.fast_rows.single_projections`)."""
    if counts.row_factors is None or counts.pair_norms is None:
        return None
    bound = clip_norm if row_clip is None else min(clip_norm, row_clip)
    m = counts.n_pairs
    captured = 0.0
    residual = 0.0
    with np.errstate(under="ignore"):
        scaled = bool(np.any(counts.row_factors != 1.0))  # z f is z when every f is 1
        if single:
            squares = counts.row_squares
            if squares is None:  # a ProbePass built by hand: the rows' own norms
                squares = row_squares(np.asarray(data, dtype=np.float64))
            # Kept in float32 (issue 32 item 5: 2 n k bytes fewer to write and to gather
            # from); each gathered row converts exactly to the float64 it stood for.
            projected = single_projections(
                data, basis, counts.row_factors if scaled else None, squares, single_out=True
            )
        else:
            # Z = X U, then the rows Z_i (length k) gathered per pair: numpy.take along the
            # first axis of Z (about 4x faster than fancy indexing for rows of k = 10 doubles).
            projected = np.empty((data.shape[0], basis.shape[1]), dtype=np.float64)
            start = 0
            for block in iter_row_chunks(data, skinny_chunk_rows(data.shape[1])):
                np.matmul(block, basis, out=projected[start : start + block.shape[0]])
                start += block.shape[0]
            if scaled:
                projected *= counts.row_factors[:, None]
        for first in range(0, m, DEFAULT_CHUNK_ROWS):
            last = min(m, first + DEFAULT_CHUNK_ROWS)
            a = order[2 * first : 2 * last : 2]
            b = order[2 * first + 1 : 2 * last : 2]
            halves = np.take(projected, a, axis=0).astype(np.float64, copy=False)
            halves -= np.take(projected, b, axis=0)
            halves *= 0.5
            inside = row_squares(halves)
            total = counts.pair_norms[first:last] ** 2 / 2.0
            factor = clip_factors(total, bound)
            if factor is not None:
                inside = inside * factor**2
                total = total * factor**2
            # Clamped: see the docstring.
            kept = np.minimum(inside, total)
            captured += float(np.sum(kept))
            residual += float(np.sum(total - kept))
    return captured, residual, m


@dataclass(frozen=True)
class CentringChoice:
    """The route, the released quantiles ``C_u`` (uncentred rows) and ``C_p`` (pairs), and
    each route's signal-to-noise score (public given the quantiles)."""

    route: Route
    uncentred_clip: float
    pair_clip: float
    scores: dict[str, float]


def choose_centring(
    uncentred_clip: float,
    pair_clip: float,
    n_rows: int,
    n_cols: int,
    clip_norm: float,
    mean_mu: float,
    gram_mu: float,
) -> CentringChoice:
    """The route with the largest signal-to-noise score (module docstring) from the released
    quantiles and public facts only. ``n_rows < 2``: no pairs."""
    rest = math.hypot(mean_mu, gram_mu)
    sigma_mu = 2.0 * clip_norm / (max(1, n_rows) * mean_mu)
    mean_norm2 = min(clip_norm**2, pair_clip**2 + n_cols * sigma_mu**2)
    pairs = n_rows // 2
    scores = {
        "mean": n_rows * gram_mu / mean_norm2,
        "pairs": pairs * rest / pair_clip**2 if pairs > 0 else 0.0,
        "none": n_rows * rest / uncentred_clip**2,
    }
    route: Route = "mean"
    for candidate in ("pairs", "none"):
        if scores[candidate] > scores[route]:
            route = candidate
    return CentringChoice(route, uncentred_clip, pair_clip, scores)


@dataclass(frozen=True)
class ProbeQuantiles:
    """Two readings of each noisy histogram (:func:`read_quantiles`): ``*_high`` (top-down)
    for the choice, ``*_low`` (bottom-up) for the clip."""

    uncentred_high: float
    uncentred_low: float
    pair_high: float
    pair_low: float
    #: The top-down reading of the pairs' :data:`VARIANCE_CLIP_QUANTILE` (``C``: none made).
    pair_top: float | None = None


def read_quantiles(
    noisy: FloatArray, n_rows: int, clip_norm: float, quantile: float
) -> tuple[float, float]:
    """``(high, low)`` readings of the ``q``-quantile from noisy counts on the grid of
    :func:`probe_edges`, ``low <= high``.

    ``above[j]``, the noisy number of rows above edge ``j``
    (:func:`~service.mechanisms.clip_quantile.noisy_above`: the counts moved onto their public
    total ``n`` first, so its noise is largest mid-grid, ``s sqrt(B)/2`` at most, and a few
    bins' near either end). ``high``: scanning down from ``C``, the edge above the first with
    ``above > (1 - q) n`` (where the noise is large against ``n`` it errs upwards). ``low``:
    the smallest edge with ``above <= (1 - q) n`` (the rule of ``clip_quantile``; errs
    downwards: before the projection the count above the floor carried all the bins' noise
    and README data at eps 0.1 read the pairs' floor in 29% of runs). The choice reads
    ``high`` (a clip that is too small reads as a spread that is too small); the Gram clips at
    ``low``: a clip below most norms costs little (the rows become their directions, whose
    second moment has the same top eigenvectors for elliptical data, and signal and noise
    both scale with the clip's square) while one far above them multiplies the noise.
    """
    edges = probe_edges(clip_norm)
    above = noisy_above(noisy, n_rows)
    allowed = (1.0 - quantile) * n_rows
    over = np.flatnonzero(above > allowed)
    high = interpolate(edges, above, allowed, int(over[-1]) + 1) if over.size else edges[0]
    fits = np.flatnonzero(above <= allowed)
    low = interpolate(edges, above, allowed, int(fits[0])) if fits.size else clip_norm
    return float(high), float(min(low, high))


def interpolate(edges: FloatArray, above: FloatArray, allowed: float, j: int) -> float:
    """Where between edges ``j - 1`` and ``j`` the noisy count above crosses ``allowed``, with
    the rows spread evenly in ``log`` norm within the bin: ``edge_j`` itself when ``j`` is 0 or
    past the grid, or when the noisy counts do not decrease there."""
    if j <= 0:
        return float(edges[0])
    if j >= edges.shape[0]:
        return float(edges[-1])
    drop = float(above[j - 1] - above[j])
    if drop <= 0:
        return float(edges[j])
    t = min(max((float(above[j - 1]) - allowed) / drop, 0.0), 1.0)
    return float(edges[j - 1] * (edges[j] / edges[j - 1]) ** t)


def read_probe(
    counts: ProbePass,
    n_rows: int,
    clip_norm: float,
    quantile: float,
    probe_mu: float,
    rng: np.random.Generator,
) -> ProbeQuantiles:
    """:func:`read_quantiles` of the two exact histograms of ``counts``, each count
    ``+ N(0, (2/probe_mu)^2)`` (together l2 sensitivity 2: ``probe_mu``-GDP); the rows'
    histogram's noise is drawn first."""
    std = PROBE_SENSITIVITY / probe_mu
    size = counts.counts_u.shape[0]
    noisy_u = counts.counts_u + rng.normal(0.0, std, size=size)
    noisy_p = counts.counts_p + rng.normal(0.0, std, size=size)
    u_high, u_low = read_quantiles(noisy_u, n_rows, clip_norm, quantile)
    p_high, p_low = read_quantiles(noisy_p, counts.n_pairs, clip_norm, quantile)
    # A third reading of the same noisy counts (post-processing): where nearly all pairs lie,
    # the explained-variance step's clip (issue 32 item 4).
    p_top, _ = read_quantiles(noisy_p, counts.n_pairs, clip_norm, VARIANCE_CLIP_QUANTILE)
    return ProbeQuantiles(u_high, u_low, p_high, p_low, p_top)


def probe_quantiles(
    data: Any,
    pairs: FloatArray,
    clip_norm: float,
    quantile: float,
    probe_mu: float,
    rng: np.random.Generator,
) -> ProbeQuantiles:
    """:func:`read_quantiles` of the uncentred rows' and the pairs' norms, each count
    ``+ N(0, (2/probe_mu)^2)`` (the two histograms together have l2 sensitivity 2:
    ``probe_mu``-GDP), from ``pairs`` already built (the run uses :func:`probe_pass`, which
    gives the same counts without the pairs' array)."""
    edges = probe_edges(clip_norm)
    counts = ProbePass(
        gram_norm_counts(data, clip_norm, None, edges),
        gram_norm_counts(pairs, clip_norm, None, edges),
        np.zeros(0, dtype=np.float64),
        pairs.shape[0],
    )
    return read_probe(counts, data.shape[0], clip_norm, quantile, probe_mu, rng)


def mean_route_clip(clip_norm: float, pair_clip: float, n_cols: int, sigma_mu: float) -> float:
    """The mean route's row clip: ``min(C, sqrt(C_p^2 + d sigma_mu^2))``, the centred rows'
    expected norm at the pairs' quantile (public given ``C_p``)."""
    return min(clip_norm, math.sqrt(pair_clip**2 + n_cols * sigma_mu**2))
