"""Clipping rows and the Gram and energy passes over an array, fast (issue 32 item 5, issue
35): the per-row maps of :mod:`service.mechanisms.linalg` (``clip_C``, centring, a second clip)
computed from each row's squared norm with one multiplication where that norm is in the safe
range, falling back to the power-of-two rescaling of ``linalg`` where it is not. The same
per-row maps, so the same sensitivities; only rounding differs from ``linalg``'s (a row scaled
to the bound may exceed it by a few ulps: see :func:`_scale_to`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.mechanisms.linalg import (
    DEFAULT_CHUNK_ROWS,
    SAFE_SQUARED_NORMS,
    FloatArray,
    RowSource,
    _scaled_rows,
    gram_rows,
    iter_row_chunks,
)

#: A row whose computed squared norm exceeds the clip's square by at most this relative amount
#: is kept unscaled (:func:`_scale_to`): the sum of ``d`` squares is computed to about
#: ``d 2^-53`` relative, so a row scaled to norm ``C`` can read as ``C^2 (1 + 1e-14)``.
ROUNDING_SLACK = 2.0**-40

_vecdot = getattr(np, "vecdot", None)


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
    with np.errstate(over="ignore"):
        # bound^2 may overflow to inf (no row is then over) or underflow to 0 (every non-zero
        # row is over, scaled by bound/||y|| as before).
        over = squares > (bound * bound) * (1.0 + ROUNDING_SLACK)
    if not bool(np.any(over)):
        return None
    with np.errstate(divide="ignore", over="ignore"):
        # A zero (or underflowed) row is never over; bound/||y|| < 1 for the rows that are.
        return np.asarray(np.where(over, bound / np.sqrt(np.where(over, squares, 1.0)), 1.0))


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
    """Rows per chunk of the Gram pass: at small ``d`` the pass is memory-bound, and a chunk of
    about 1 MB is still in cache when ``X^T X`` reads it after its norms (measured at 50,000 x
    100: 1,024 rows 0.019 s against 0.021 s for 8,192); at large ``d`` it is compute-bound and
    larger blocks make the rank-k update faster."""
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
) -> FloatArray:
    """:func:`~service.mechanisms.linalg.clipped_gram` of an array with :func:`fast_gram_rows`
    (a :class:`~service.mechanisms.linalg.RowSource` computes its own).

    Uncentred, a chunk whose rows all lie within the clip (up to :data:`ROUNDING_SLACK`) and
    the safe range goes to ``X^T X`` as it is, after one pass for its norms and two
    reductions (the common case of a declared bound: issue 35 puts the whole release within
    1.2x of the bare ``X^T X``); any other chunk is clipped row by row, reusing its norms.
    ``squares``: every row's squared norm (:func:`row_squares`, e.g. the probe pass's), read
    instead of computed."""
    if isinstance(data, RowSource):
        return data.clipped_gram(clip_norm, center, row_clip)
    d = data.shape[1]
    bound = clip_norm if row_clip is None else min(clip_norm, row_clip)
    if center is None and squares is not None:
        known = _gram_of_known(data, squares, bound)
        if known is not None:
            return known
    gram = np.zeros((d, d), dtype=np.float64)
    low, high = SAFE_SQUARED_NORMS
    buffer: FloatArray | None = None
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
            start = stop
            if center is None:
                known = row_squares(block) if known is None else known
                if known.max() <= limit and (tiny_kept or known.min() >= low):
                    gram += block.T @ block
                    continue
                rows = fast_gram_rows(block, clip_norm, center, row_clip, known)
            else:
                if buffer is None:
                    # The first chunk is the largest (see _gram_of_known).
                    buffer = np.empty((block.shape[0], d), dtype=np.float64)
                centred = _centred_rows(block, clip_norm, center, bound, known, buffer)
                if centred is None:
                    centred = gram_rows(block, clip_norm, center, row_clip)
                rows = centred
            gram += rows.T @ rows
    return gram


def _centred_rows(
    block: FloatArray,
    clip_norm: float,
    center: FloatArray,
    bound: float,
    squares: FloatArray | None,
    buffer: FloatArray,
) -> FloatArray | None:
    """:func:`fast_gram_rows` with a ``center`` (``clip_bound(clip_C(x) - c)``), written into
    ``buffer`` (reused by every chunk: no fresh arrays per chunk): the same operations in the
    same order, so the same rows to the bit. ``None`` where ``fast_gram_rows`` would take the
    rescaled route (the caller then calls ``gram_rows``)."""
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
    return _scale_to(rows, centred, bound, own=True)


def _gram_of_known(data: Any, squares: FloatArray, bound: float) -> FloatArray | None:
    """:func:`fast_gram` of the uncentred rows clipped at ``bound`` from their known squared
    norms: the factors computed once for all rows, each chunk with a factor below 1 scaled
    into one reused buffer (the same products as :func:`_scale_to`'s copy; no allocation per
    chunk). ``None`` when a squared norm is outside the safe range (the caller's loop then
    takes the rescaled route)."""
    if _safe_squares(squares, bound, squares) is None:
        return None
    factors = clip_factors(squares, bound)
    d = data.shape[1]
    chunk = gram_chunk_rows(d)
    gram = np.zeros((d, d), dtype=np.float64)
    buffer: FloatArray | None = None
    start = 0
    with np.errstate(under="ignore"):
        for block in iter_row_chunks(data, chunk):
            stop = start + block.shape[0]
            factor = None if factors is None else factors[start:stop]
            start = stop
            if factor is None or bool(np.all(factor == 1.0)):
                gram += block.T @ block
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
