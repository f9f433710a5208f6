"""The packed projectors of M6 ``friendly_aggregate``'s projection aggregator: each ``U_j U_j^T``
as the ``d (d + 1) / 2`` entries of its upper triangle (off-diagonal ones times ``sqrt 2``), so
``<p_j, p_l> = ||U_j^T U_l||_F^2`` costs ``d (d + 1) / 2`` multiply-adds a pair instead of the
``k^2 d`` of the cross products (``friendly_weights.packed_projection_block`` and the exact tiles
of ``CentredProjectionBlock``; in single precision, ``friendly_screen``). Nothing here is
released or draws randomness; each row is a function of its own basis alone. Split from
``friendly_weights`` (which re-exports every name) to keep that module under 800 lines.
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
import numpy.typing as npt

#: Double, or single for the screen's packed rows (``friendly_screen``).
_Real = TypeVar("_Real", np.float32, np.float64)

#: Entries of one batch's temporaries (times 4) while packed rows are built, as
#: ``friendly_weights.BLOCK_FLOATS`` (the batches change no bit: a row is a function of its
#: basis alone).
PACK_BATCH_FLOATS = 1 << 20


#: Largest sum length of one product in the packed route (:func:`packed_projection_block`),
#: in units of ``k d``: its rounding proof needs chunks of at most ``k d`` terms.
PACKED_CHUNK_KD = 1


#: Largest packed projectors (``t d (d + 1) / 2`` floats, 32 MB) the packed route holds.
PACKED_FLOATS = 1 << 22


def packed_projections(t: int, d: int, k: int) -> bool:
    """Whether the projector distances take the packed route (:func:`packed_projection_block`):
    when its ``d (d + 1) / 2`` multiply-adds a pair are fewer than the cross products' ``k^2 d``,
    that is ``d + 1 < 2 k^2`` (at ``k = 10``: ``d <= 198``), and the ``t`` packed projectors fit
    :data:`PACKED_FLOATS` (public facts only)."""
    return d + 1 < 2 * k * k and t * packed_length(d) <= PACKED_FLOATS


def packed_length(d: int) -> int:
    """Entries of a packed projector: the upper triangle with its diagonal, ``d (d + 1) / 2``."""
    return d * (d + 1) // 2


def packed_chunks(d: int, k: int) -> tuple[int, int]:
    """``(n, c)``: the packed projectors' ``L = d (d + 1) / 2`` entries are summed in ``n`` chunks
    of ``c`` (the last zero-padded): as few chunks as keep ``c <= PACKED_CHUNK_KD k d`` (what the
    rounding proof of :func:`packed_projection_block` needs), and then the shortest ``c``, so
    the padding is under ``n`` entries (chunks of exactly ``k d`` padded 5,050 entries to 6,000
    at ``d = 100``, ``k = 10``: 19% more products). Public sizes only."""
    length = packed_length(d)
    n_chunks = -(-length // max(1, PACKED_CHUNK_KD * k * d))
    return n_chunks, -(-length // n_chunks)


def packed_projector_rows(
    bases: npt.NDArray[_Real], n_chunks: int, chunk: int, out: npt.NDArray[_Real] | None = None
) -> npt.NDArray[_Real]:
    """``p_j``: the ``L = d (d + 1) / 2`` entries of the upper triangle of ``U_j U_j^T`` with its
    diagonal, off-diagonal entries times ``sqrt 2``, so ``<p_j, p_l> = <U_j U_j^T, U_l U_l^T>_F
    = ||U_j^T U_l||_F^2``; shape ``(t, n_chunks chunk)``, zero-padded after the ``L`` entries.

    The entries are laid out in the packed form of a symmetric matrix (as LAPACK's rectangular
    full packed format; the order of the entries is a public constant and irrelevant to the inner
    products): with ``U = [U_1; U_2]`` split after ``a = ceil(d/2)`` rows (``h = d - a``),
    first the ``a x h`` block ``U_1 U_2^T`` (every entry off the diagonal), then an
    ``(h + 1) x a`` array holding the lower triangle of ``U_1 U_1^T`` and the upper triangle of
    ``U_2 U_2^T``, each with its diagonal, side by side without overlap. Three products of the
    halves and one masked copy, instead of the whole ``d x d`` projector and a gather of its
    triangle by an index array (half the time at ``d = 100``). Each entry is, as before, one
    length-``k`` dot product of two rows of ``U_j`` (times ``sqrt 2`` off the diagonal), and
    row ``j`` is a function of ``U_j`` alone. Built a few bases at a time (temporaries of at
    most ``PACK_BATCH_FLOATS / 4`` entries). ``out``, if given: a zeroed ``(t, n_chunks chunk)``
    array to fill. Single-precision bases give single rows (the screen's, ``friendly_screen``,
    whose bound counts each entry's roundings; the weights are then rounded to single too)."""
    t, d, _ = bases.shape
    length = packed_length(d)
    half = d // 2
    first = d - half
    if out is None:
        out = np.zeros((t, n_chunks * chunk), dtype=bases.dtype)
    # Where each triangle sits in the (half + 1) x first array: even d, the lower triangle of
    # U_1 U_1^T one row down and the upper one of U_2 U_2^T from row 0 (below / on and above
    # the diagonal); odd d, the first on and below the diagonal, the second right of it.
    row = 1 + half - first
    col = first - half
    upper = np.triu(np.ones((half, half), dtype=bool))
    weight = np.full((half + 1, first), math.sqrt(2.0), dtype=out.dtype)
    weight[np.arange(first) + row, np.arange(first)] = 1.0  # the diagonal of U_1 U_1^T
    weight[np.arange(half), np.arange(half) + col] = 1.0  # the diagonal of U_2 U_2^T
    step = max(1, PACK_BATCH_FLOATS // (4 * d * d))
    for start in range(0, t, step):
        stop = min(t, start + step)
        part = bases[start:stop]
        top, bottom = part[:, :first], part[:, first:]
        cross = out[start:stop, : first * half].reshape(stop - start, first, half)
        np.matmul(top, bottom.transpose(0, 2, 1), out=cross)
        cross *= math.sqrt(2.0)
        tri = out[start:stop, first * half : length].reshape(stop - start, half + 1, first)
        # All of U_1 U_1^T, then the upper triangle of U_2 U_2^T over its upper triangle.
        np.matmul(top, top.transpose(0, 2, 1), out=tri[:, row : row + first])
        np.copyto(tri[:, :half, col:], np.matmul(bottom, bottom.transpose(0, 2, 1)), where=upper)
        tri *= weight
    return out
