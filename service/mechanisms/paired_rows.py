"""Publicly paired rows (issue 24, item 2): the differences ``p_j = (clip_C(x_r(2j+o)) -
clip_C(x_r(2j+o+1)))/sqrt(2)`` that the pairs route of :mod:`service.mechanisms.centring_choice`
centres with, and their Gram and explained-variance sums, a chunk at a time.

Privacy: ``r`` is a permutation drawn from the run's CSPRNG before the data is read (public
randomness), so replacing one row changes exactly one ``p_j`` whatever ``r`` is, and
``||p_j|| <= sqrt(2) C``; the Gram step clips each ``p_j`` to ``C`` (and below), so its
sensitivity is ``sqrt(2) c^2`` at the clip ``c``, as for rows. Everything here is a per-pair
map followed by a sum: no parameter is read off the data.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from service.mechanisms.fast_rows import _energy, fast_gram_rows
from service.mechanisms.linalg import DEFAULT_CHUNK_ROWS, FloatArray


def paired_differences(
    data: Any, clip_norm: float, offset: int = 0, order: npt.NDArray[np.intp] | None = None
) -> FloatArray:
    """``p_j = (clip_C(x_(r(2j+o))) - clip_C(x_(r(2j+o+1))))/sqrt(2)``, ``o = offset`` (0 or 1),
    ``j < m = floor((n - o)/2)``, shape ``(m, d)``, each of norm ``<= sqrt(2) C`` (the Gram
    step clips them to ``C`` and below), with ``r = order`` (shape ``(n,)``, a permutation of
    the row indices; the identity when None). A row changes one ``p_j`` whatever ``r`` is.

    The caller passes a permutation drawn from the run's CSPRNG, independent of the data: the
    rows' stored order is the owner's (sorted by label, by time, by site...) and pairing
    neighbours in it would pair alike rows, whose differences miss the variance between them.

    The Gram step uses ``o = 0``; the explained-variance step ``o = 1``: its pairs share no
    cross term ``x_a x_b^T`` with the Gram's, so the basis, fitted to the Gram's pairs, is not
    also scored on them (on the same pairs the captured share is biased upwards against the
    rows' centred share, by what the basis fitted of that pairing's own fluctuation)."""
    n, d = data.shape
    m = (n - offset) // 2
    out = np.empty((max(m, 0), d), dtype=np.float64)
    for first, diffs in pair_chunks(data, clip_norm, offset, order):
        out[first : first + diffs.shape[0]] = diffs
    return out


def _gathered(data: Any, indices: npt.NDArray[np.intp]) -> tuple[FloatArray, npt.NDArray[np.intp]]:
    """``(block, where)``: the rows ``indices`` read in ascending order (a memory map reads
    forward), and where each of ``indices`` sits in ``block`` (``block[where]`` is the rows
    in the order of ``indices``)."""
    rows = np.sort(indices)
    block = np.asarray(data[rows], dtype=np.float64)
    where = np.searchsorted(rows, indices)
    return block, where


def pair_chunks(
    data: Any,
    clip_norm: float,
    offset: int = 0,
    order: npt.NDArray[np.intp] | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> Any:
    """Yield ``(first, p)``: consecutive blocks of the paired differences of
    :func:`paired_differences` (``p`` holds ``p_first, p_first+1, ..``), computed a chunk of
    rows at a time: memory ``O(chunk d)``, never the ``m x d`` array."""
    n = data.shape[0]
    m = (n - offset) // 2
    if m <= 0:
        return
    index = np.arange(n) if order is None else np.asarray(order)
    chosen = index[offset : offset + 2 * m]
    # Chunks of an even number of rows: pairs never straddle two chunks.
    step = max(2, chunk_rows - chunk_rows % 2)
    with np.errstate(under="ignore"):
        for start in range(0, 2 * m, step):
            block, where = _gathered(data, chosen[start : start + step])
            clipped = fast_gram_rows(block, clip_norm)
            yield start // 2, (clipped[where[0::2]] - clipped[where[1::2]]) / math.sqrt(2.0)


def _pairs_by_higher_row(
    order: npt.NDArray[np.intp], n: int, chunk: int
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """``(low_by, high_by, by, bounds)``: the pairs ``(order[2j], order[2j+1])``, ``j < m =
    floor(n/2)``, ordered by their higher row (``high_by``, ascending), with their lower rows
    (``low_by``) and pair numbers ``by`` (so ``high_by = max(order[2 by], order[2 by + 1])``);
    ``bounds[c]:bounds[c+1]`` are the pairs whose higher row lies in chunk ``c`` of ``chunk``
    rows. Linear in ``n`` (a scatter of the pair numbers onto their higher rows, then one
    scan), not a sort of the ``m`` pairs: 0.5 ms against 1.5 ms at n = 50,000."""
    m = n // 2
    first, second = order[0 : 2 * m : 2], order[1 : 2 * m : 2]
    low = np.minimum(first, second)
    high = np.maximum(first, second)
    # Each row is the higher row of one pair at most: its pair number there, m elsewhere.
    owner = np.full(n, m, dtype=np.intp)
    owner[high] = np.arange(m, dtype=np.intp)
    del high
    high_by = np.flatnonzero(owner < m)
    by = owner[high_by]
    del owner
    low_by = low[by]
    starts = np.arange(0, (n + chunk - 1) // chunk + 1, dtype=np.intp) * chunk
    bounds = np.searchsorted(high_by, starts)
    return low_by, high_by, by, bounds


def pair_blocks(
    data: Any,
    order: npt.NDArray[np.intp],
    offset: int,
    factors: FloatArray,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> Any:
    """Yield ``(first, p)`` as :func:`pair_chunks` (the same chunks of pairs, in the same
    order, the same arithmetic per pair: the same pairs to the last bit) from the rows' clip
    factors to ``C`` already known (``factors``, the probe pass's): no norms recomputed, only
    the rows of the pairs read."""
    n = data.shape[0]
    m = (n - offset) // 2
    if m <= 0:
        return
    index = np.asarray(order)
    first = index[offset : offset + 2 * m : 2]
    second = index[offset + 1 : offset + 2 * m : 2]
    step = max(1, chunk_rows // 2)
    root = math.sqrt(2.0)
    for begin in range(0, m, step):
        a, b = first[begin : begin + step], second[begin : begin + step]
        rows_a = np.array(data[a], dtype=np.float64)
        rows_b = np.array(data[b], dtype=np.float64)
        f_a, f_b = factors[a], factors[b]
        if bool(np.any(f_a != 1.0)):
            rows_a *= f_a[:, None]
        if bool(np.any(f_b != 1.0)):
            rows_b *= f_b[:, None]
        rows_a -= rows_b
        rows_a /= root
        yield begin, rows_a


def paired_gram(
    data: Any,
    clip_norm: float,
    order: npt.NDArray[np.intp],
    row_clip: float | None,
    offset: int = 0,
    factors: FloatArray | None = None,
) -> FloatArray:
    """``sum_j q_j q_j^T`` over the pairs ``p_j`` of :func:`paired_differences` made Gram rows
    (:func:`~service.mechanisms.linalg.gram_rows`: clipped to ``C``, then to ``row_clip``), a
    chunk at a time: equal to ``clipped_gram(paired_differences(..), C, row_clip=..)`` up to
    the order of the sum's terms, without the ``m x d`` copy. With the rows' clip ``factors``
    (the probe pass's) the pairs come from :func:`pair_blocks` (no norms recomputed)."""
    d = data.shape[1]
    gram = np.zeros((d, d), dtype=np.float64)
    with np.errstate(under="ignore"):
        for _, diffs in _pairs_of(data, clip_norm, offset, order, factors):
            rows = fast_gram_rows(diffs, clip_norm, None, row_clip)
            gram += rows.T @ rows
    return gram


def paired_energy(
    data: Any,
    clip_norm: float,
    order: npt.NDArray[np.intp],
    offset: int,
    basis: FloatArray,
    row_clip: float | None = None,
    factors: FloatArray | None = None,
) -> tuple[float, float, int]:
    """``(captured, residual, m)`` of :func:`~service.mechanisms.linalg.captured_energy` over
    the halved pairs ``p_j/sqrt(2)`` (norm ``<= C``) of :func:`paired_differences` at
    ``offset``, a chunk at a time, and their number ``m`` (``factors``: as
    :func:`paired_gram`)."""
    captured = 0.0
    residual = 0.0
    count = 0
    with np.errstate(under="ignore"):
        for _, diffs in _pairs_of(data, clip_norm, offset, order, factors):
            rows = fast_gram_rows(diffs / math.sqrt(2.0), clip_norm, None, row_clip)
            c, r = _energy(rows, basis)
            captured += c
            residual += r
            count += rows.shape[0]
    return captured, residual, count


def _pairs_of(
    data: Any,
    clip_norm: float,
    offset: int,
    order: npt.NDArray[np.intp],
    factors: FloatArray | None,
) -> Any:
    """:func:`pair_blocks` from known clip factors, else :func:`pair_chunks`."""
    if factors is not None:
        return pair_blocks(data, order, offset, factors)
    return pair_chunks(data, clip_norm, offset, order)
