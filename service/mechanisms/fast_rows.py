"""Clipping rows and the Gram and energy passes over an array, fast (issue 32 item 5, issue
35): the per-row maps of :mod:`service.mechanisms.linalg` (``clip_C``, centring, a second clip)
computed from each row's squared norm with one multiplication where that norm is in the safe
range, falling back to the power-of-two rescaling of ``linalg`` where it is not. The same
per-row maps, so the same sensitivities; only rounding differs from ``linalg``'s (a row scaled
to the bound may exceed it by a few ulps: see :func:`_scale_to`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from service.mechanisms.linalg import (
    DEFAULT_CHUNK_ROWS,
    SAFE_SQUARED_NORMS,
    FloatArray,
    RowSource,
    _scaled_rows,
    gram_rows,
    iter_row_chunks,
)
from service.mechanisms.linalg import (
    ROUNDING_SLACK as ROUNDING_SLACK,
)

_vecdot = getattr(np, "vecdot", None)

#: Single precision (issue 32 item 5): the chosen-centring run's Gram and its
#: explained-variance projections are computed in float32 where public facts say it is safe
#: and it pays: at least this many rows (below it the passes take a few ms in float64).
SINGLE_MIN_ROWS = 8192
#: Rows per float32 rank-k update: the rounding bound below grows with its square.
SINGLE_BLOCK_ROWS = 256
#: Clips (``B``) for which float32 neither overflows (``SINGLE_BLOCK_ROWS B^2`` far below
#: ``3.4e38``) nor loses more than ``2^-149`` absolute to underflow (``2^-110`` of ``B^2``).
SINGLE_SCALES = (2.0**-40, 2.0**40)
_UNIT_ROUNDOFF_32 = 2.0**-24


def single_gamma(terms: int) -> float:
    """``gamma_j = j u/(1 - j u)``, ``u = 2^-24`` (Higham, Accuracy and Stability of Numerical
    Algorithms, Lemma 3.1): a float32 sum of ``j - 1`` products, computed in any order, with
    or without fused multiply-adds, and its inputs' rounding to float32 counted as one more
    factor each, is ``sum_l a_l b_l (1 + theta_l)`` with ``|theta_l| <= gamma_(j+2)``."""
    return terms * _UNIT_ROUNDOFF_32 / (1.0 - terms * _UNIT_ROUNDOFF_32)


#: The float32 Gram's sensitivity is ``sqrt(2) B^2 (1 + SINGLE_GRAM_SLACK)`` (5.7e-3 at 256
#: rows; see :func:`single_gram_fits`): its noise is drawn that much larger.
SINGLE_GRAM_SLACK = math.sqrt(2.0) * single_gamma(SINGLE_BLOCK_ROWS + 8) * SINGLE_BLOCK_ROWS

#: Rows whose squared norm is above this are scaled in float64 before their rounding to
#: float32 (their entries may exceed float32's range; ``2^200`` leaves every entry of the
#: others below ``2^100``).
_SINGLE_CAST_SQUARES = 2.0**200


def tame_rows(squares: FloatArray, factors: FloatArray | None) -> bool:
    """Whether :func:`round_scaled` scales every one of these rows in float32 (no squared norm
    above ``2^200``, none NaN, no factor below ``2^-100``): tested once over all rows, so that
    a pass over their chunks can skip the per-chunk test (``tame=True``: the same float32
    rows, issue 32 item 5)."""
    if not bool(np.all(squares <= _SINGLE_CAST_SQUARES)):
        return False
    return factors is None or bool(np.all(factors >= 2.0**-100))


def round_scaled(
    rows: FloatArray,
    factors: FloatArray | None,
    squares: FloatArray,
    out: FloatArray,
    *,
    factors32: npt.NDArray[np.float32] | None = None,
    tame: bool = False,
) -> FloatArray:
    """``f_i y_i`` rounded to float32 in ``out`` (float32, at least as many rows), each row
    from itself alone: rounded to float32, then multiplied by its float32 factor (a cast and
    a float32 product: 1.6x faster than numpy's buffered float64 product cast to float32);
    a row whose squared norm ``squares`` is above ``2^200`` (or not finite), or whose factor
    is below ``2^-100``, is multiplied in float64 first. Either way each entry is
    ``f_i y_ij (1 + e)``, ``|e| <= gamma_3`` (:func:`single_gamma`), plus at most ``2^-149``
    lost to underflow.

    ``tame`` (:func:`tame_rows` held for these rows, e.g. tested once over all rows): no row
    is tested here; ``factors32``: ``factors`` already rounded to float32 (the same values
    as rounding them here). Either way the same float32 rows."""
    rounded = out[: rows.shape[0]]
    if tame:
        # No entry can overflow (|y_ij| <= 2^100) and numpy ignores underflow by default.
        np.copyto(rounded, rows, casting="same_kind")
        if factors is not None:
            rounded *= (factors.astype(np.float32) if factors32 is None else factors32)[:, None]
        return rounded
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        # A wild row's entries may overflow here: it is replaced below.
        np.copyto(rounded, rows, casting="same_kind")
        if factors is not None:
            rounded *= (factors.astype(np.float32) if factors32 is None else factors32)[:, None]
        # And a factor that float32 holds only as a subnormal (below 2^-126) would lose bits.
        plain = squares <= _SINGLE_CAST_SQUARES
        if factors is not None:
            plain &= factors >= 2.0**-100
    if not bool(plain.all()):  # a reduction first: flatnonzero costs 15 us a chunk
        wild = np.flatnonzero(~plain)
        scaled = rows[wild] if factors is None else rows[wild] * factors[wild, None]
        rounded[wild] = scaled
    return rounded


def single_gram_fits(n_rows: int, bound: float) -> bool:
    """Whether :func:`fast_gram` (``single=True``) may add the rows' Gram in float32 blocks:
    from public facts only (``n``, the rows' clip ``B``), never from the rows.

    Why the sensitivity grows by :data:`SINGLE_GRAM_SLACK` only: the rows ``y`` (each of norm
    ``<= B``, the float64 rows as before) are rounded to float32 (each entry to
    ``y (1 + e)``, ``|e| <= gamma_3``: :func:`round_scaled`) and added as ``R^T R`` per block
    of ``b = SINGLE_BLOCK_ROWS`` rows at public positions, each block's float32 matrix then
    added in float64. A block's computed matrix is ``S + E`` with
    ``|E_ij| <= gamma_(b+6) sum_l |y_li| |y_lj|`` (:func:`single_gamma`; ``gamma_(b+8)``
    covers underflow's ``2^-149`` per entry at ``B >= 2^-40``), so
    ``||E||_F <= gamma_(b+8) sum_l ||y_l||^2 <= gamma_(b+8) b B^2``. Replacing one row
    changes one block's rows; every other block's float32 matrix is the same bits (the same
    inputs and a deterministic kernel: OpenBLAS computes each entry in a fixed order for a
    fixed thread count). The computed Gram therefore moves by at most
    ``sqrt(2) B^2 + 2 gamma_(b+8) b B^2 = sqrt(2) B^2 (1 + SINGLE_GRAM_SLACK)`` in Frobenius
    norm (the upper triangle's l2 norm is at most that), up to the float64 accumulation's
    rounding, which the float64 Gram has too."""
    low, high = SINGLE_SCALES
    return n_rows >= SINGLE_MIN_ROWS and low <= bound <= high


#: Float32 centring (:func:`single_centring_fits`) up to this many columns: the float32
#: norms' rounding ``gamma_d`` then stays inside :data:`SINGLE_GRAM_SLACK`'s margin.
SINGLE_CENTRING_MAX_COLS = 2048


def single_centring_fits(n_cols: int, clip_norm: float, center: FloatArray, scale: float) -> bool:
    """Whether the mean route's Gram pass may also centre in float32 (``fl32(x) - fl32(c)``,
    the norms measured on those float32 rows): public facts only (``d``, ``C``, the released
    centre and the probe's released quantile ``scale`` of the centred norms).

    Privacy: each row is a deterministic map of itself (and public values), and is clipped
    by its own measured norm ``t`` (float32 sum of ``d`` squares: ``t = T (1 + theta)``,
    ``|theta| <= gamma_d``), so the row added has norm at most ``B (1 + eta)``,
    ``1 + eta = ((1 + ROUNDING_SLACK)/(1 - gamma_d))^(1/2) (1 + gamma_2)``; with its exact
    float32 entries the block sum's error is ``gamma_b``, and
    ``(1 + eta)^2 (1 + sqrt(2) gamma_b b) - 1`` stays below :data:`SINGLE_GRAM_SLACK`
    (``sqrt(2) gamma_(b+8) b``) for ``d <= 2,048``.
    Precision: an entry's rounding is about ``2^-24 (2 C + s)``, ``s`` the centred norm;
    used where ``C <= 64 s`` (8e-6 of a centred row at most)."""
    low, high = SINGLE_SCALES
    if n_cols > SINGLE_CENTRING_MAX_COLS or not low <= clip_norm <= high or not scale > 0.0:
        return False
    return float(np.max(np.abs(center), initial=0.0)) <= high and clip_norm <= 64.0 * scale


def single_projections_fit(
    n_rows: int, n_cols: int, k: int, clip_norm: float, scale: float
) -> bool:
    """Whether the explained-variance step may project the clipped rows in float32: public
    facts only. A projection ``U^T y`` (``||y|| <= C``) is computed to ``gamma_(d+2) C`` per
    coordinate, so a summand of norm about ``scale`` (the probe's released quantile of the
    centred norms) has its captured part to about ``2 sqrt(k) gamma_(d+2) C/scale`` relative;
    float32 is used where that is at most ``2^-10`` (where the rows' common part is more than
    about 25x their spread at d = 100 the cancellation would cost precision: float64 then).
    Privacy does not depend on it: each summand is clamped onto its simplex whatever its
    rounding, and depends on its own rows only."""
    low, high = SINGLE_SCALES
    if n_rows < SINGLE_MIN_ROWS or not low <= clip_norm <= high or not scale > 0.0:
        return False
    error = 2.0 * math.sqrt(k) * single_gamma(n_cols + 2) * clip_norm
    return error <= 2.0**-10 * scale


def single_projections(
    data: Any,
    columns: FloatArray,
    factors: FloatArray | None,
    squares: FloatArray,
    *,
    transposed: bool = False,
    shift: FloatArray | None = None,
    single_out: bool = False,
) -> FloatArray:
    """``Y B`` for the clipped rows ``y_i = f_i x_i`` (``factors`` ``f``, ``None``: all 1) and
    ``B = columns`` (``d x b``, ``b`` small), in float32 per chunk (each chunk scaled and
    rounded to float32 in one step, then ``sgemm``), returned in float64: shape ``(n, b)``,
    or ``(b, n)`` when ``transposed``. Each row's products depend on that row only. About 2x
    faster than float64 at 50,000 x 100, b = 10 (the product's cost is the cast chunk's
    reading). ``shift`` (shape ``(b,)``, with ``transposed``): subtracted from each row's
    products in float64 as they are written (the same values as subtracting afterwards).

    Transposed, the float32 products of all rows are kept (``4 n b`` bytes) and written to
    the ``(b, n)`` result in one step at the end: the same values as writing each chunk's
    transposed (``n/chunk`` strided writes of ``b`` short rows: 0.85 ms against 0.35 ms at
    50,000 x 100, b = 10). ``single_out`` (not ``transposed``): the float32 products
    themselves, shape ``(n, b)`` (half the bytes of the float64 result, which holds the same
    values: each converts exactly to float64)."""
    n, d = data.shape
    b = columns.shape[1]
    chunk = gram_chunk_rows(d)
    single_out = single_out and not transposed
    out = np.empty((0, b) if single_out else (b, n) if transposed else (n, b), dtype=np.float64)
    rows32 = np.empty((min(chunk, max(n, 1)), d), dtype=np.float32)
    # The rows' own squared norms (squares) decide how each is rounded (round_scaled).
    # Y B row by row in either layout (the transposed layout is written from it: 1.2x faster
    # than B^T Y^T at d = 100, b = 10).
    basis32 = np.ascontiguousarray(columns, dtype=np.float32)
    products = np.empty((n if transposed or single_out else rows32.shape[0], b), np.float32)
    # Which rows round_scaled must treat apart, and the factors in float32: once for all rows
    # (the same float32 rows as chunk by chunk).
    tame = tame_rows(squares, factors)
    factors32 = None if factors is None else factors.astype(np.float32)
    start = 0
    with np.errstate(under="ignore"):
        for block in iter_row_chunks(data, chunk):
            stop = start + block.shape[0]
            factor = None if factors is None else factors[start:stop]
            rows = round_scaled(
                block,
                factor,
                squares[start:stop],
                rows32,
                factors32=None if factors32 is None else factors32[start:stop],
                tame=tame,
            )
            if transposed or single_out:
                np.matmul(rows, basis32, out=products[start:stop])
            else:
                part = products[: block.shape[0]]
                np.matmul(rows, basis32, out=part)
                out[start:stop] = part
            start = stop
    if single_out:
        return products
    if transposed and shift is not None:
        np.subtract(products.T, shift[:, None], out=out)
    elif transposed:
        out[...] = products.T
    return out


def row_squares(rows: FloatArray) -> FloatArray:
    """``||y_i||^2`` of each row, shape ``(n,)``, in one pass without temporaries
    (``numpy.vecdot`` where numpy has it, about 1.6x faster than ``einsum`` at d = 100; the
    same sums up to their rounding)."""
    if _vecdot is not None:
        return np.asarray(_vecdot(rows, rows), dtype=np.float64)
    return np.asarray(np.einsum("ij,ij->i", rows, rows), dtype=np.float64)


def row_squares_into(rows: FloatArray, out: FloatArray) -> FloatArray:
    """:func:`row_squares` written into ``out`` (the same sums)."""
    if _vecdot is not None:
        return np.asarray(_vecdot(rows, rows, out=out), dtype=np.float64)
    return np.asarray(np.einsum("ij,ij->i", rows, rows, out=out), dtype=np.float64)


def row_dots(first: FloatArray, second: FloatArray, out: FloatArray | None = None) -> FloatArray:
    """``x_i . y_i`` of each pair of rows, shape ``(n,)`` (:func:`row_squares`'s kernel on two
    arrays), written into ``out`` when given."""
    if _vecdot is not None:
        return np.asarray(_vecdot(first, second, out=out), dtype=np.float64)
    return np.asarray(np.einsum("ij,ij->i", first, second, out=out), dtype=np.float64)


def row_norms(rows: FloatArray) -> FloatArray:
    """``||y_i||`` of each row: from one ``einsum`` pass where the squared norm is in
    :data:`~service.mechanisms.linalg.SAFE_SQUARED_NORMS` (no term overflowed, none that
    underflowed matters), after the power-of-two rescaling of
    :func:`~service.mechanisms.linalg.gram_row_norms` for the other rows: right at every
    finite scale."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        squares = row_squares(rows)
    low, high = SAFE_SQUARED_NORMS
    norms = np.sqrt(np.where((squares >= low) & (squares <= high), squares, 0.0))
    unsafe = np.flatnonzero(~((squares >= low) & (squares <= high)))
    if unsafe.size:
        _, scaled_norms, exponent = _scaled_rows(rows[unsafe])
        with np.errstate(over="ignore", under="ignore"):
            norms[unsafe] = np.ldexp(scaled_norms, exponent)
    return norms


def _safe_squares(
    rows: FloatArray, bound: float, squares: FloatArray | None = None
) -> FloatArray | None:
    """``||y_i||^2`` of every row when each is either in ``SAFE_SQUARED_NORMS`` (its square
    root is then the norm to a few ulps) or below it while ``bound^2`` is well above it (the
    row is then shorter than ``bound`` whatever underflowed, so it is kept: a zero row, or a
    tiny one); else None (the caller takes the rescaled route)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        if squares is None:
            squares = row_squares(rows)
        tiny_kept = bound * bound >= 4.0 * SAFE_SQUARED_NORMS[0]
    low, high = SAFE_SQUARED_NORMS
    if bool(np.all((squares <= high) & ((squares >= low) | tiny_kept))):
        return squares
    return None


def clip_factors(squares: FloatArray, bound: float) -> FloatArray | None:
    """The factors :func:`_scale_to` multiplies the rows by (``bound/||y||`` for the rows over
    ``bound`` beyond :data:`ROUNDING_SLACK`, else 1), or ``None`` when no row is over."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        # bound^2 may overflow to inf (no row is then over) or underflow to 0 (every non-zero
        # row is over, scaled by bound/||y|| as before).
        over = squares > (bound * bound) * (1.0 + ROUNDING_SLACK)
        if not bool(over.any()):
            return None
        # A zero (or underflowed) row is never over; bound/||y|| < 1 for the rows that are.
        # In place in one array (the same values as where(over, bound/sqrt(s), 1)).
        factor = np.sqrt(squares)
        np.divide(bound, factor, out=factor)
        factor[~over] = 1.0
        return factor


def _scale_to(
    rows: FloatArray, squares: FloatArray, bound: float, *, own: bool = False
) -> FloatArray:
    """``y min(1, bound/||y||)`` per row from its safe squared norm: one multiplication, where
    :func:`~service.mechanisms.linalg.gram_rows` rescales by a power of two first (needed
    only outside the safe range). A row whose computed squared norm exceeds ``bound^2`` by at
    most the relative :data:`ROUNDING_SLACK` is kept as it is (rows scaled to norm ``bound``
    by the owner land a few ulps either side of it, and scaling half of them by
    ``1 - 1e-16`` cost a copy of every block), and a scaled row may exceed ``bound`` by a few
    ulps: the sensitivity holds for ``bound (1 + 1e-12)``, a change of the privacy loss far
    below anything the calibration resolves. ``rows`` itself when no row is scaled (callers
    must not write into the result); scaled in place when the caller ``own``s ``rows``."""
    factor = clip_factors(squares, bound)
    if factor is None:
        return rows
    if own:
        rows *= factor[:, None]
        return rows
    return rows * factor[:, None]


def fast_gram_rows(
    block: FloatArray,
    clip_norm: float,
    center: FloatArray | None = None,
    row_clip: float | None = None,
    squares: FloatArray | None = None,
) -> FloatArray:
    """:func:`~service.mechanisms.linalg.gram_rows` with the clips merged: ``clip_C``, then
    (with a ``center``) ``clip_b(clip_C(x) - c)``, else ``clip_b(x)``, ``b = min(C, C2)``.
    The same per-row map (clipping to ``C`` and then to ``C2 <= C`` is clipping to ``C2``;
    rounding aside), so the same sensitivity; one pass per clip instead of two, without the
    power-of-two rescaling of the rows that need clipping. Falls back to ``gram_rows`` for a
    block with a squared norm outside the safe range. ``squares``: the block's squared row
    norms when the caller has them (:func:`row_squares`)."""
    bound = clip_norm if row_clip is None else min(clip_norm, row_clip)
    squares = _safe_squares(block, min(bound, clip_norm), squares)
    if squares is None:
        return gram_rows(block, clip_norm, center, row_clip)
    if center is None:
        return _scale_to(block, squares, bound)
    centred = _scale_to(block, squares, clip_norm) - center
    squares = _safe_squares(centred, bound)
    if squares is None:
        return gram_rows(block, clip_norm, center, row_clip)
    return _scale_to(centred, squares, bound, own=True)


def gram_chunk_rows(n_cols: int) -> int:
    """Rows per chunk of the Gram pass: at small ``d`` the pass is memory-bound, and a chunk
    of about 1 MB is still in cache when its norms are read after its ``X^T X`` (measured at
    50,000 x 100: 1,024 rows 0.019 s against 0.021 s for 8,192); at large ``d`` it is
    compute-bound and larger blocks make the rank-k update faster. The chunks also fix the
    order of the Gram's sums: another size changes the released bits."""
    return 1024 if n_cols < 256 else DEFAULT_CHUNK_ROWS


def skinny_chunk_rows(n_cols: int) -> int:
    """Rows per chunk of a skinny product ``X B`` (``B`` a basis, ``d x k``, ``k`` small): at
    small ``d`` 256 rows (measured at 50,000 x 100, k = 10: 6.0 ms against 7.3 ms for 8,192
    rows and 7.8 ms for 1,024), else the default chunk."""
    return 256 if n_cols < 256 else DEFAULT_CHUNK_ROWS


def fast_gram(
    data: Any,
    clip_norm: float,
    center: FloatArray | None = None,
    row_clip: float | None = None,
    squares: FloatArray | None = None,
    *,
    single: bool = False,
    centred_squares: FloatArray | None = None,
    single_centring: bool = False,
) -> FloatArray:
    """:func:`~service.mechanisms.linalg.clipped_gram` of an array with :func:`fast_gram_rows`
    (a :class:`~service.mechanisms.linalg.RowSource` computes its own).

    Uncentred, a chunk whose rows all lie within the clip (up to :data:`ROUNDING_SLACK`) and
    the safe range goes to ``X^T X`` as it is, with one pass for its norms (after its product,
    in float64) and two reductions (the common case of a declared bound: issue 35 puts the
    whole release within 1.2x of the bare ``X^T X``); any other chunk is clipped row by row,
    reusing its norms.
    ``squares``: every row's squared norm (:func:`row_squares`, e.g. the probe pass's), read
    instead of computed.

    ``single`` (the caller checked :func:`single_gram_fits` and calibrates its noise to the
    larger sensitivity): the same rows, rounded to float32 and added in blocks of
    :data:`SINGLE_BLOCK_ROWS` rows. ``centred_squares`` (shape ``(n,)``, with a ``center``):
    filled with each row's ``||clip_C(x) - c||^2`` as the pass computes it (NaN where a chunk
    took the rescaled route), for the explained-variance step. ``single_centring`` (with
    ``single``, a ``center`` and ``squares``; :func:`single_centring_fits`): the centring too
    in float32 (:func:`_centred_gram_single`)."""
    if isinstance(data, RowSource):
        return data.clipped_gram(clip_norm, center, row_clip)
    d = data.shape[1]
    bound = clip_norm if row_clip is None else min(clip_norm, row_clip)
    single_rows = (
        np.empty((min(gram_chunk_rows(d), max(1, data.shape[0])), d), dtype=np.float32)
        if single
        else None
    )
    if squares is not None:
        if center is None:
            known = _gram_of_known(data, squares, bound, single_rows)
        elif single_centring and single_rows is not None:
            known = _centred_gram_single(
                data, squares, clip_norm, center, bound, single_rows, centred_squares
            )
        else:
            known = _centred_gram_of_known(
                data, squares, clip_norm, center, bound, single_rows, centred_squares
            )
        if known is not None:
            return known
    gram = np.zeros((d, d), dtype=np.float64)
    low, high = SAFE_SQUARED_NORMS
    buffer: FloatArray | None = None
    # Uncentred in float64 without known norms, each chunk's X^T X is computed first, into one
    # reused matrix, and its norms after, while its rows are still in cache (1.15x a bare
    # X^T X at 50,000 x 100 against 1.21x for the norms first and a fresh product per chunk;
    # issue 35): a chunk within the clip adds that product, the same values as
    # ``block.T @ block``. After the first chunk that needs clipping the norms come first
    # again (no product is computed twice on rows that are mostly over the clip).
    product = np.empty((d, d), dtype=np.float64) if center is None and single_rows is None else None
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        # Kept as they are: squared norms in [low, limit] (or below low when bound^2 is well
        # above it, see _safe_squares). A NaN or inf square fails the test: clipped route.
        limit = min(high, bound * bound * (1.0 + ROUNDING_SLACK))
        tiny_kept = bound * bound >= 4.0 * low
        start = 0
        for block in iter_row_chunks(data, gram_chunk_rows(d)):
            stop = start + block.shape[0]
            if not block.size:
                continue
            known = None if squares is None else squares[start:stop]
            first = start
            start = stop
            if center is None:
                if known is None and product is not None:
                    np.matmul(block.T, block, out=product)
                    known = row_squares(block)
                    if known.max() <= limit and (tiny_kept or known.min() >= low):
                        gram += product
                        continue
                    product = None
                known = row_squares(block) if known is None else known
                if known.max() <= limit and (tiny_kept or known.min() >= low):
                    _add_gram(gram, block, single_rows)
                    continue
                if single_rows is not None and _safe_squares(block, bound, known) is not None:
                    # As _gram_of_known: the same float32 rows.
                    factor = clip_factors(known, bound)
                    _add_single(gram, round_scaled(block, factor, known, single_rows))
                    continue
                rows = fast_gram_rows(block, clip_norm, center, row_clip, known)
            else:
                if buffer is None:
                    # The first chunk is the largest (see _gram_of_known).
                    buffer = np.empty((block.shape[0], d), dtype=np.float64)
                out = None if centred_squares is None else centred_squares[first:stop]
                centred = _centred_rows(
                    block, clip_norm, center, bound, known, buffer, out, single_rows
                )
                if centred is None:
                    centred = gram_rows(block, clip_norm, center, row_clip)
                    if out is not None:
                        out.fill(np.nan)
                elif centred.dtype == np.float32:
                    _add_single(gram, centred)
                    continue
                rows = centred
            _add_gram(gram, rows, single_rows)
    return gram


def _add_gram(gram: FloatArray, rows: FloatArray, single_rows: FloatArray | None) -> None:
    """``gram += rows^T rows``: in float64, or (``single_rows``, a float32 buffer of at least
    as many rows) rounded to float32 and added in blocks of :data:`SINGLE_BLOCK_ROWS` rows
    (:func:`single_gram_fits`)."""
    if single_rows is None:
        gram += rows.T @ rows
        return
    rounded = single_rows[: rows.shape[0]]
    np.copyto(rounded, rows, casting="same_kind")
    _add_single(gram, rounded)


def _add_single(gram: FloatArray, rounded: FloatArray) -> None:
    """``gram += R^T R`` for float32 rows ``R``, one float32 product per block of
    :data:`SINGLE_BLOCK_ROWS` rows (blocks at public positions: chunks start at multiples of
    it), each added to the float64 ``gram``."""
    for start in range(0, rounded.shape[0], SINGLE_BLOCK_ROWS):
        part = rounded[start : start + SINGLE_BLOCK_ROWS]
        gram += part.T @ part


def _centred_rows(
    block: FloatArray,
    clip_norm: float,
    center: FloatArray,
    bound: float,
    squares: FloatArray | None,
    buffer: FloatArray,
    centred_out: FloatArray | None = None,
    single_rows: FloatArray | None = None,
) -> FloatArray | None:
    """:func:`fast_gram_rows` with a ``center`` (``clip_bound(clip_C(x) - c)``), written into
    ``buffer`` (reused by every chunk: no fresh arrays per chunk): the same operations in the
    same order, so the same rows to the bit. ``None`` where ``fast_gram_rows`` would take the
    rescaled route (the caller then calls ``gram_rows``). ``centred_out``: the centred rows'
    squared norms are written there. ``single_rows`` (a float32 buffer): the rows are scaled
    and rounded to float32 there in one step and returned from it (the same float32 rows as
    rounding the float64 result)."""
    squares = _safe_squares(block, min(bound, clip_norm), squares)
    if squares is None:
        return None
    rows = buffer[: block.shape[0]]
    factor = clip_factors(squares, clip_norm)
    if factor is None:
        np.subtract(block, center, out=rows)
    else:
        np.multiply(block, factor[:, None], out=rows)
        rows -= center
    centred = _safe_squares(rows, bound)
    if centred is None:
        return None
    if centred_out is not None:
        centred_out[...] = centred
    if single_rows is not None:
        return round_scaled(rows, clip_factors(centred, bound), centred, single_rows)
    return _scale_to(rows, centred, bound, own=True)


def _centred_gram_of_known(
    data: Any,
    squares: FloatArray,
    clip_norm: float,
    center: FloatArray,
    bound: float,
    single_rows: FloatArray | None,
    centred_out: FloatArray | None,
) -> FloatArray | None:
    """:func:`fast_gram` with a ``center`` from the rows' known squared norms: the rows'
    factors to ``C`` and the safe-range test computed once over all rows instead of per
    chunk, each chunk's centred rows and their squared norms written into reused arrays (the
    norms straight into ``centred_out``), a chunk scaled to ``bound`` (and rounded to float32
    with ``single_rows``) in one step. The same operations on each row as
    :func:`_centred_rows`, so the same rows to the bit. ``None`` when a squared norm is
    outside the safe range (the caller's loop then takes the rescaled route per chunk)."""
    if _safe_squares(squares, min(bound, clip_norm), squares) is None:
        return None
    n, d = data.shape
    factors = clip_factors(squares, clip_norm)
    chunk = gram_chunk_rows(d)
    gram = np.zeros((d, d), dtype=np.float64)
    buffer = np.empty((min(chunk, max(1, n)), d), dtype=np.float64)
    centred_all = np.empty(n, dtype=np.float64) if centred_out is None else centred_out
    low, high = SAFE_SQUARED_NORMS
    start = 0
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        limit = bound * bound * (1.0 + ROUNDING_SLACK)
        tiny_kept = bound * bound >= 4.0 * low
        for block in iter_row_chunks(data, chunk):
            stop = start + block.shape[0]
            rows = buffer[: block.shape[0]]
            factor = None if factors is None else factors[start:stop]
            if factor is None or bool(np.all(factor == 1.0)):
                np.subtract(block, center, out=rows)
            else:
                np.multiply(block, factor[:, None], out=rows)
                rows -= center
            centred = row_squares_into(rows, centred_all[start:stop])
            top = float(centred.max())
            if not (top <= high and (tiny_kept or float(centred.min()) >= low)):
                # Outside the safe range (or NaN): the rescaled route, as _centred_rows.
                rows = gram_rows(block, clip_norm, center, bound)
                centred_all[start:stop] = np.nan
                _add_gram(gram, rows, single_rows)
                start = stop
                continue
            start = stop
            scale = clip_factors(centred, bound) if top > limit else None
            if single_rows is not None:
                _add_single(gram, round_scaled(rows, scale, centred, single_rows))
                continue
            if scale is not None:
                rows *= scale[:, None]
            gram += rows.T @ rows
    return gram


def _centred_gram_single(
    data: Any,
    squares: FloatArray,
    clip_norm: float,
    center: FloatArray,
    bound: float,
    single_rows: FloatArray,
    centred_out: FloatArray | None,
) -> FloatArray | None:
    """:func:`_centred_gram_of_known` with the centring in float32: each row is
    ``r = fl32(x) a - fl32(c)`` (``a`` its factor to ``C``; a row whose squared norm is above
    ``2^100`` or whose factor is below ``2^-100`` is clipped and centred in float64 and then
    rounded), its squared norm ``t`` measured on ``r`` (float32, written into
    ``centred_out``), and ``r`` scaled to ``bound`` by ``t`` (a factor below ``2^-100``
    applied in float64). Each row from itself alone; the argument is
    :func:`single_centring_fits`'. ``None`` as :func:`_centred_gram_of_known`.

    Work: which rows take the float64 route is decided once over all rows; per chunk the
    scale is ``fl32(min(bound/sqrt(t), 1))`` in reused buffers, the same float32 factor as
    :func:`clip_factors`' (a row kept by its
    :data:`ROUNDING_SLACK` has ``bound/sqrt(t) >= 1 - 2^-41``, which rounds to 1 in float32),
    so the same rows to the bit."""
    if _safe_squares(squares, min(bound, clip_norm), squares) is None:
        return None
    n, d = data.shape
    factors = clip_factors(squares, clip_norm)
    chunk = gram_chunk_rows(d)
    gram = np.zeros((d, d), dtype=np.float64)
    centred_all = np.empty(n, dtype=np.float64) if centred_out is None else centred_out
    center32 = center.astype(np.float32)
    # The rows computed in float64 (public thresholds on each row's own norm and factor),
    # found once (a transient n-byte mask; usually none).
    tame = squares <= 2.0**100
    if factors is not None:
        tame &= factors >= 2.0**-100
    wild_all = np.flatnonzero(~tame)
    del tame
    most = single_rows.shape[0]
    centres = np.tile(center32, (most, 1))
    norms32 = np.empty(most, dtype=np.float32)
    scale64 = np.empty(most, dtype=np.float64)
    scale32 = np.empty(most, dtype=np.float32)
    start = 0
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        limit = bound * bound * (1.0 + ROUNDING_SLACK)
        for block in iter_row_chunks(data, chunk):
            size = block.shape[0]
            stop = start + size
            rows = single_rows[:size]
            np.copyto(rows, block, casting="same_kind")
            factor = None if factors is None else factors[start:stop]
            if factor is not None and bool(np.all(factor == 1.0)):
                factor = None
            if factor is not None:
                rows *= factor.astype(np.float32)[:, None]
            # The centre repeated on every row of a chunk: one contiguous subtraction (the same
            # float32 differences; broadcasting it row by row costs 2x, 100 floats per call).
            np.subtract(rows, centres[:size], out=rows)
            if wild_all.size:
                lo, hi = np.searchsorted(wild_all, (start, stop))
                if hi > lo:
                    wild = wild_all[lo:hi] - start
                    exact = block[wild] if factor is None else block[wild] * factor[wild, None]
                    rows[wild] = exact - center
            centred = centred_all[start:stop]
            if _vecdot is not None:
                centred[...] = _vecdot(rows, rows, out=norms32[:size])
            else:
                centred[...] = (rows * rows).sum(1)
            start = stop
            if float(centred.max()) > limit:
                # clip_factors' factors, rounded to float32 (see the docstring).
                scale = scale64[:size]
                np.sqrt(centred, out=scale)
                np.divide(bound, scale, out=scale)
                np.fmin(scale, 1.0, out=scale)
                tiny = np.flatnonzero(scale < 2.0**-100) if scale.min() < 2.0**-100 else None
                kept = None if tiny is None else rows[tiny].astype(np.float64) * scale[tiny, None]
                np.copyto(scale32[:size], scale, casting="same_kind")
                rows *= scale32[:size, None]
                if tiny is not None:
                    rows[tiny] = kept
            _add_single(gram, rows)
    return gram


def _gram_of_known(
    data: Any,
    squares: FloatArray,
    bound: float,
    single_rows: FloatArray | None = None,
) -> FloatArray | None:
    """:func:`fast_gram` of the uncentred rows clipped at ``bound`` from their known squared
    norms: the factors computed once for all rows, each chunk with a factor below 1 scaled
    into one reused buffer (the same products as :func:`_scale_to`'s copy; no allocation per
    chunk). ``None`` when a squared norm is outside the safe range (the caller's loop then
    takes the rescaled route). ``single_rows``: as :func:`_add_gram` (a scaled chunk is
    scaled and rounded to float32 in one step: the same float32 rows)."""
    if _safe_squares(squares, bound, squares) is None:
        return None
    factors = clip_factors(squares, bound)
    d = data.shape[1]
    chunk = gram_chunk_rows(d)
    gram = np.zeros((d, d), dtype=np.float64)
    buffer: FloatArray | None = None
    # round_scaled's per-row test and the float32 factors, once for all rows (the same rows).
    tame = single_rows is not None and tame_rows(squares, factors)
    factors32 = None if factors is None or single_rows is None else factors.astype(np.float32)
    start = 0
    with np.errstate(under="ignore"):
        for block in iter_row_chunks(data, chunk):
            stop = start + block.shape[0]
            factor = None if factors is None else factors[start:stop]
            start = stop
            if factor is None or bool(np.all(factor == 1.0)):
                _add_gram(gram, block, single_rows)
                continue
            if single_rows is not None:
                first = start - len(factor)
                rounded = round_scaled(
                    block,
                    factor,
                    squares[first:start],
                    single_rows,
                    factors32=None if factors32 is None else factors32[first:start],
                    tame=tame,
                )
                _add_single(gram, rounded)
                continue
            if buffer is None:
                # The first chunk is the largest: no buffer beyond the rows (a buffer of a full
                # chunk for fewer rows is a fresh mapping, paged in on every call: 1.6x slower
                # at 3,500 x 784).
                buffer = np.empty((block.shape[0], d), dtype=np.float64)
            rows = buffer[: block.shape[0]]
            np.multiply(block, factor[:, None], out=rows)
            gram += rows.T @ rows
    return gram


def fast_energy(
    data: Any,
    basis: FloatArray,
    clip_norm: float,
    center: FloatArray | None,
    row_clip: float | None = None,
) -> tuple[float, float]:
    """:func:`~service.mechanisms.linalg.captured_energy` with :func:`fast_gram_rows` (rows
    clipped to ``C``, centred, clipped to ``min(C, row_clip)``)."""
    if isinstance(data, RowSource):
        return data.captured_energy(basis, clip_norm, center)
    captured = 0.0
    residual = 0.0
    with np.errstate(under="ignore"):
        for block in iter_row_chunks(data):
            if block.size:
                c, r = _energy(fast_gram_rows(block, clip_norm, center, row_clip), basis)
                captured += c
                residual += r
    return captured, residual


def _energy(rows: FloatArray, basis: FloatArray) -> tuple[float, float]:
    projected = rows @ basis
    inside = np.einsum("ij,ij->i", projected, projected)
    total = np.einsum("ij,ij->i", rows, rows)
    return float(np.sum(inside)), float(np.sum(np.maximum(total - inside, 0.0)))
