"""Linear algebra shared by the mechanisms: clipping, chunked Gram matrices, top-k subspaces.

Totality
--------
Every function here returns finite output on every finite input, at any scale (entries from
1e-300 to 1e300, zero rows, duplicate rows, rank-deficient matrices), and never raises on such
input: an exception that depends on the data would be an output no noise covers.

- Norms are taken of rows scaled by a power of two (exact in binary floating point) so that
  their largest entry lies in ``[0.5, 1)``: ``||x||^2`` can neither overflow nor underflow.
- Matrices are scaled by a power of two before LAPACK sees them (eigenvectors are unchanged,
  eigenvalues are scaled back exactly).
- If LAPACK still fails (it reports non-convergence on some pathological inputs), a fixed public
  fallback stands in: the first ``k`` standard basis vectors with eigenvalues 0. Its value does
  not depend on the data (whether it is used does; it has never been seen to trigger on finite
  input); the docstring of each function that can use it says so.

The magnitudes a clipping mechanism computes (``C^2`` times ``n``, noise scales and so on) are
kept finite by a refusal at prepare time (:meth:`ClippingMechanism.prepare`), not here.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import scipy.linalg

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Rows per chunk when streaming a memory-mapped dataset: 8192 rows of d = 1000 is 64 MB.
DEFAULT_CHUNK_ROWS = 8192


@runtime_checkable
class RowSource(Protocol):
    """Rows that are not a local array: the one data-access interface of the heavy passes.

    Mechanisms receive either an ``n x d`` array (a memory map of an uploaded dataset) or a
    ``RowSource`` (a Parquet dataset registered by reference, see :mod:`service.reference`),
    and reach the rows only through :func:`clipped_gram`, :func:`clipped_sum`,
    :func:`captured_energy`, :func:`gram_norm_counts` and
    :func:`~service.mechanisms.sample_aggregate.subset_bases`, which hand a ``RowSource`` the
    whole pass. A source returns only ``d x d``-sized results (and the ``t x d x k`` subset
    bases); noise is added by the caller, in the worker. The per-block work is these same
    functions on array blocks, so the results equal the array path's up to summation order.
    """

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, d)``: public."""

    def clipped_gram(
        self, clip_norm: float, center: FloatArray | None, row_clip: float | None = None
    ) -> FloatArray:
        """:func:`clipped_gram` of all rows."""

    def captured_energy(
        self, basis: FloatArray, clip_norm: float, center: FloatArray | None
    ) -> tuple[float, float]:
        """:func:`captured_energy` of all rows."""

    def gram_norm_counts(
        self, clip_norm: float, center: FloatArray | None, edges: FloatArray
    ) -> FloatArray:
        """:func:`gram_norm_counts` of all rows."""

    def clipped_sum(self, clip_norm: float) -> FloatArray:
        """:func:`clipped_sum` of all rows."""

    def subset_bases(self, partition: IntArray, k: int) -> FloatArray:
        """:func:`~service.mechanisms.sample_aggregate.subset_bases` of ``partition``."""


def power_of_two_exponent(magnitude: FloatArray | float) -> IntArray:
    """``e`` with ``magnitude = m 2^e``, ``m`` in ``[0.5, 1)`` (``e = 0`` for 0).

    Dividing by ``2^e`` is exact, so scaled values keep every bit (bar subnormal tails).
    """
    _, exponent = np.frexp(np.asarray(magnitude, dtype=np.float64))
    return np.asarray(exponent, dtype=np.int64)


#: Squared row norms in ``[2^-960, 2^960]`` are taken unscaled (see :func:`_clip_rows`): no
#: square or partial sum of such a row can overflow, and any square that underflows is below
#: ``2^-62`` of the row's total even with ``d = 2^40`` such entries, far under one rounding.
SAFE_SQUARED_NORMS = (2.0**-960, 2.0**960)


#: A row whose computed squared norm exceeds the clip's square by at most this relative amount
#: is kept unscaled (``fast_rows._scale_to``) and is not counted as above a bound
#: (:func:`count_rows_above`): the sum of ``d`` squares is computed to about ``d 2^-53``
#: relative, so a row scaled to norm ``C`` can read as ``C^2 (1 + 1e-14)``.
ROUNDING_SLACK = 2.0**-40


def _scaled_rows(block: FloatArray) -> tuple[FloatArray, FloatArray, IntArray]:
    """``(x 2^-e, ||x 2^-e||, e)`` per row, ``e`` bringing the row's largest entry into
    ``[0.5, 1)`` (so the norm can neither overflow nor underflow)."""
    # max(max, -min): no temporary of |block|
    peak = np.maximum(np.max(block, axis=1), -np.min(block, axis=1))
    exponent = power_of_two_exponent(peak)
    with np.errstate(over="ignore", under="ignore"):
        scaled = np.ldexp(block, -exponent[:, None])
        norms = np.linalg.norm(scaled, axis=1)
    return scaled, norms, exponent


def _clip_rows(block: FloatArray, clip_norm: float) -> FloatArray:
    """:func:`clip_rows` that returns ``block`` itself (no copy) when no row exceeds ``C``.

    Which rows exceed ``C``: one ``einsum`` pass gives every squared norm ``s`` without
    temporaries; a row with ``s`` in :data:`SAFE_SQUARED_NORMS` has the norm ``sqrt(s)`` to a
    few ulps (no term overflowed, none that underflowed matters). Only the other rows (norms
    beyond about ``1e144`` or below ``1e-144``, or non-finite sums) take the power-of-two
    scaled route for the test. Rows with norm ``<= C`` are kept bit for bit; the rows that
    exceed it are replaced by ``(x 2^-e)(C / r)`` with the scaled norm ``r``, exactly as
    before (the factor ``C / r`` then neither overflows nor underflows, whatever ``C``).
    Callers must not write into the result.

    Rounding: the test ``s > C^2`` is decided on a computed sum of ``d`` squares, so a kept row
    may exceed ``C`` by that sum's rounding, at most ``d 2^-53`` relative (``1e-13`` at
    ``d = 1000``; the scaled norm it replaces had a rounding of the same kind). The
    sensitivity ``sqrt(2) C^2`` of ``H`` then holds for ``C (1 + 1e-13)``: the privacy loss
    moves by a factor ``1 + 2e-13``, far below anything the noise calibration resolves.
    """
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        squares = np.einsum("ij,ij->i", block, block)
    low, high = SAFE_SQUARED_NORMS
    safe = (squares >= low) & (squares <= high)
    with np.errstate(over="ignore"):
        # C^2 is inf for C above 2^512 (the API caps C lower; this function is total): then
        # no safe row (squares <= 2^960) exceeds it, which the comparison with inf says.
        over = safe & (squares > clip_norm * clip_norm)
    unsafe = np.flatnonzero(~safe)
    if unsafe.size:
        _, norms, exponent = _scaled_rows(block[unsafe])
        with np.errstate(over="ignore", under="ignore"):
            # C 2^{-e} overflows to inf for tiny rows (kept) and underflows towards 0 for huge
            # rows (clipped): both sides of the comparison are right, as r lies in
            # [0.5, sqrt(d)] there.
            limit = np.ldexp(clip_norm, -exponent)
        over[unsafe] = ~(norms <= limit)
    rows = np.flatnonzero(over)
    if rows.size == 0:
        return block
    if 4 * rows.size > block.shape[0]:
        # Many rows to clip: whole-block arithmetic is faster than gathering them (the same
        # per-row formulas, so the same bits).
        scaled, norms, _ = _scaled_rows(block)
        with np.errstate(under="ignore"):
            scaled *= np.where(over, clip_norm / np.where(over, norms, 1.0), 0.0)[:, None]
        np.copyto(scaled, block, where=~over[:, None])
        return scaled
    scaled, norms, _ = _scaled_rows(block[rows])
    with np.errstate(under="ignore"):
        scaled *= (clip_norm / norms)[:, None]
    clipped = block.copy()
    clipped[rows] = scaled
    return clipped


def clip_rows(rows: npt.NDArray[Any], clip_norm: float) -> FloatArray:
    """Scale each row to norm at most ``clip_norm``: ``x <- x * min(1, C/||x||)``.

    Right at every finite scale. Most rows' norms come from one ``einsum`` pass (squared norm
    between ``2^-960`` and ``2^960``: nothing overflowed and any underflowed square is
    negligible). A row outside that range is first divided by the power of two ``2^e`` that
    brings its largest entry into ``[0.5, 1)``, so its scaled norm ``r`` lies in
    ``[0.5, sqrt(d)]`` (or is 0); it is kept as is when ``r <= C 2^{-e}`` and replaced by
    ``(x 2^{-e}) (C / r)`` otherwise. (``np.linalg.norm`` of a row of 1e200 is ``inf``, and of a
    row of 1e-300 is 0: both wrong before this scaling.) Rows of norm ``<= C`` are returned bit
    for bit.

    Parameters
    ----------
    rows : (n, d) array
    clip_norm : float
        ``C > 0``, finite.

    Returns
    -------
    (n, d) array of float64 (a new array), each row of norm ``<= C`` (up to a few ulps of
    ``C``).
    """
    block = np.asarray(rows, dtype=np.float64)
    if block.size == 0:
        return block.copy()
    clipped = _clip_rows(block, clip_norm)
    return clipped.copy() if clipped is block else clipped


class ReadAhead:
    """Asks the kernel to start reading rows of a memory-mapped file before they are needed.

    A pass over a dataset larger than memory otherwise alternates reading a chunk (waiting on
    the disk) and computing on it; with ``POSIX_FADV_WILLNEED`` on the next chunk, issued before
    the current one is processed, the disk works while the CPU does. Only a hint: the values
    read are the same, and with anything but a C-ordered memory map of a regular file (an
    in-memory array, a view with strides) it does nothing. Never raises.
    """

    def __init__(self, data: npt.NDArray[Any]) -> None:
        self.fd: int | None = None
        self.start = 0
        self.row_bytes = 0
        root: Any = data
        while isinstance(root, np.memmap) and isinstance(root.base, np.ndarray):
            root = root.base
        filename = getattr(root, "filename", None)
        if not isinstance(root, np.memmap) or filename is None or data.ndim != 2:
            return
        if not (data.flags.c_contiguous and root.flags.c_contiguous):
            return
        try:
            self.fd = os.open(filename, os.O_RDONLY)
        except OSError:
            return
        # ``root.offset`` is where ``root``'s first element sits in the file.
        self.start = int(root.offset) + (data.ctypes.data - root.ctypes.data)
        self.row_bytes = data.shape[1] * data.itemsize

    def __call__(self, first_row: int, stop_row: int) -> None:
        """Hint that rows ``[first_row, stop_row)`` are read soon."""
        if self.fd is None or stop_row <= first_row:
            return
        offset = self.start + first_row * self.row_bytes
        with contextlib.suppress(OSError):
            os.posix_fadvise(
                self.fd, offset, (stop_row - first_row) * self.row_bytes, os.POSIX_FADV_WILLNEED
            )

    def rows(self, indices: npt.NDArray[np.int64]) -> None:
        """Hint the rows ``indices`` (ascending) one run of consecutive rows at a time: only
        their pages are requested, all at once, so the disk serves many small reads in flight
        instead of one page fault's window at a time."""
        if self.fd is None or indices.shape[0] == 0:
            return
        breaks = np.flatnonzero(np.diff(indices) != 1) + 1
        starts = np.concatenate(([0], breaks))
        stops = np.concatenate((breaks, [indices.shape[0]]))
        for first, last in zip(indices[starts].tolist(), indices[stops - 1].tolist(), strict=True):
            self(first, last + 1)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def iter_row_chunks(data: npt.NDArray[Any], chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Any:
    """Yield consecutive row blocks of ``data`` (copies of at most ``chunk_rows`` rows).

    A memory map is read ahead one chunk (:class:`ReadAhead`): the next chunk's pages are on
    their way while the caller computes on this one (the chunks themselves are unchanged).
    """
    n = data.shape[0]
    ahead = ReadAhead(data)
    try:
        ahead(0, min(n, chunk_rows))
        for start in range(0, n, chunk_rows):
            ahead(start + chunk_rows, min(n, start + 2 * chunk_rows))
            yield np.asarray(data[start : start + chunk_rows], dtype=np.float64)
    finally:
        ahead.close()


def clipped_gram(
    data: npt.NDArray[Any],
    clip_norm: float,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    center: FloatArray | None = None,
    row_clip: float | None = None,
) -> FloatArray:
    """``H = X^T X`` of the clipped rows, accumulated in row chunks: memory ``O(d^2 + chunk d)``.

    With a ``center`` ``c`` (shape ``(d,)``, public, finite), each row is
    ``clip_C(clip_C(x) - c)``: clipped to ``C``, centred, and clipped to ``C`` again, so every
    row of the centred matrix still has norm ``<= C`` and the sensitivity of ``H`` is unchanged.
    With ``row_clip`` ``C2`` (public, e.g. a released private quantile), rows are then clipped
    to ``C2`` as well (:func:`gram_rows`): the sensitivity becomes ``sqrt(2) C2^2``.
    ``clip_C(x) - c`` cannot overflow: the mechanisms keep ``C`` and ``|c|`` below ``2^481``.

    Entries are at most ``n C^2`` in magnitude; the mechanisms refuse clip norms for which that
    (or any other multiple of ``C^2`` they compute) is not a comfortably finite double.
    A :class:`RowSource` computes it as a whole pass of its own.
    """
    if isinstance(data, RowSource):
        return data.clipped_gram(clip_norm, center, row_clip)
    d = data.shape[1]
    gram = np.zeros((d, d), dtype=np.float64)
    with np.errstate(under="ignore"):
        for block in iter_row_chunks(data, chunk_rows):
            if block.size == 0:
                continue
            # No copy of the block when no row exceeds C (the common case of a declared bound);
            # ``X^T X`` of the same buffer is one symmetric rank-k update (numpy calls syrk).
            clipped = gram_rows(block, clip_norm, center, row_clip)
            gram += clipped.T @ clipped
    return gram


def gram_rows(
    block: npt.NDArray[Any],
    clip_norm: float,
    center: FloatArray | None = None,
    row_clip: float | None = None,
) -> FloatArray:
    """The rows a Gram mechanism uses: ``clip_C(x)``, then (with a ``center``)
    ``clip_C(clip_C(x) - c)``, then (with ``row_clip`` ``C2 <= C``) clipped to ``C2`` as well.
    Each step is a fixed per-row map into a ball, so every row has norm ``<= min(C, C2)``."""
    clipped = _clip_rows(block, clip_norm)
    if center is not None:
        clipped = _clip_rows(clipped - center, clip_norm)
    if row_clip is not None:
        clipped = _clip_rows(clipped, row_clip)
    return clipped


def gram_row_norms(
    data: npt.NDArray[Any],
    clip_norm: float,
    center: FloatArray | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> FloatArray:
    """Norms of :func:`gram_rows` (no ``row_clip``), shape ``(n,)``, in row chunks; each is
    in ``[0, C]`` (computed after a power-of-two rescaling, so finite at every scale)."""
    parts = []
    with np.errstate(under="ignore"):
        for block in iter_row_chunks(data, chunk_rows):
            if block.size == 0:
                continue
            _, norms, exponent = _scaled_rows(gram_rows(block, clip_norm, center))
            with np.errstate(over="ignore"):
                parts.append(np.minimum(np.ldexp(norms, exponent), clip_norm))
    if not parts:
        return np.zeros(0, dtype=np.float64)
    return np.concatenate(parts)


def count_rows_above(
    data: npt.NDArray[Any], bound: float, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> int:
    """How many rows have a norm above ``bound`` beyond rounding: ``||x||^2 > bound^2 (1 +
    ROUNDING_SLACK)`` (norms after a power-of-two rescaling, so right at every finite scale).

    A row a user scaled to norm ``bound`` reads as ``bound (1 + 1e-16)`` after a CSV round trip
    or another BLAS's summation order; counting it would tell the owner that unit rows exceed a
    bound of 1 (and the count would change with the library version)."""
    # sqrt(1 + s) <= 1 + s/2: a row within the slack is never counted (one that the clip scales
    # by less than s^2/8 = 2^-83 relative is not counted either).
    factor = 1.0 + ROUNDING_SLACK / 2.0
    count = 0
    for block in iter_row_chunks(data, chunk_rows):
        if block.size == 0:
            continue
        _, norms, exponent = _scaled_rows(block)
        with np.errstate(over="ignore", under="ignore"):
            # Compare ||x 2^-e|| with bound 2^-e: no overflow whatever the scale.
            count += int(np.count_nonzero(norms > np.ldexp(bound, -exponent) * factor))
    return count


def captured_energy(
    data: npt.NDArray[Any],
    basis: FloatArray,
    clip_norm: float,
    center: FloatArray | None = None,
    row_clip: float | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> tuple[float, float]:
    """``(sum_i ||U^T y_i||^2, sum_i ||(I - U U^T) y_i||^2)`` over the Gram rows ``y_i``
    (:func:`gram_rows`); ``basis`` ``U`` is ``d x k`` orthonormal. Each row adds a point of the
    simplex ``{(a, b) >= 0, a + b <= min(C, C2)^2}``; the residual is the row's squared norm
    minus its captured part, floored at 0 (rounding)."""
    if isinstance(data, RowSource):
        return data.captured_energy(basis, clip_norm, center)
    captured = 0.0
    residual = 0.0
    with np.errstate(under="ignore"):
        for block in iter_row_chunks(data, chunk_rows):
            if block.size == 0:
                continue
            rows = gram_rows(block, clip_norm, center, row_clip)
            inside = np.einsum("ij,ij->i", rows @ basis, rows @ basis)
            total = np.einsum("ij,ij->i", rows, rows)
            captured += float(np.sum(inside))
            residual += float(np.sum(np.maximum(total - inside, 0.0)))
    return captured, residual


def gram_norm_counts(
    data: npt.NDArray[Any],
    clip_norm: float,
    center: FloatArray | None,
    edges: FloatArray,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> FloatArray:
    """How many :func:`gram_row_norms` fall in each bin of the ascending public ``edges``:
    bin ``j`` holds the norms in ``(edges[j-1], edges[j]]``, bin 0 everything up to
    ``edges[0]`` (the last bin also anything above, which cannot occur: norms are ``<= C``).
    Shape ``(len(edges),)``; a :class:`RowSource` counts in a pass of its own."""
    if isinstance(data, RowSource):
        return data.gram_norm_counts(clip_norm, center, edges)
    counts = np.zeros(edges.shape[0], dtype=np.float64)
    with np.errstate(under="ignore"):
        for block in iter_row_chunks(data, chunk_rows):
            if block.size == 0:
                continue
            norms = gram_row_norms(block, clip_norm, center, chunk_rows)
            bins = np.minimum(np.searchsorted(edges, norms, side="left"), edges.shape[0] - 1)
            counts += np.bincount(bins, minlength=edges.shape[0])
    return counts


def clipped_sum(
    data: npt.NDArray[Any], clip_norm: float, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> FloatArray:
    """``sum_i clip_C(x_i)``, shape ``(d,)``, accumulated in row chunks (norm ``<= n C``)."""
    if isinstance(data, RowSource):
        return data.clipped_sum(clip_norm)
    total = np.zeros(data.shape[1], dtype=np.float64)
    with np.errstate(under="ignore"):
        for block in iter_row_chunks(data, chunk_rows):
            if block.size:
                total += _clip_rows(block, clip_norm).sum(axis=0)
    return total


def clipped_gram_memory(
    n_rows: int, n_cols: int, chunk_rows: int = DEFAULT_CHUNK_ROWS, *, centred: bool = False
) -> int:
    """Peak bytes of :func:`clipped_gram`: per chunk the block (a copy when memory-mapped), its
    scaled copy, the squares inside the norm and the clipped block (``4 c d``; with a centre,
    the centred block and its scaled and clipped copies add ``3 c d``); the Gram matrix and the
    product added to it (``2 d^2``). :func:`clipped_sum` needs less than the uncentred case."""
    chunk = min(max(1, n_rows), chunk_rows)
    per_chunk = (7 if centred else 4) * chunk * n_cols
    return 8 * (per_chunk + 2 * n_cols * n_cols) + 16 * chunk * 8


def eigh_memory(d: int, k: int) -> int:
    """Peak bytes of :func:`top_k_eigh` or :func:`eigenvalues_desc` on a ``d x d`` matrix,
    beyond the matrix: its finiteness mask and absolute values, the scaled copy, LAPACK's copy
    and the divide-and-conquer fallback's workspace (``1 + 2 d^2`` doubles and ``5 d + 3``
    integers), and the eigenvectors."""
    return 8 * (4 * d * d + 2 * d * k + 40 * d) + d * d


def _scaled(matrix: FloatArray) -> tuple[FloatArray, int] | None:
    """``(matrix 2^{-e}, e)`` with the largest entry in ``[0.5, 1)``; ``None`` if not finite."""
    if not np.all(np.isfinite(matrix)):
        return None
    peak = float(np.max(np.abs(matrix))) if matrix.size else 0.0
    exponent = int(power_of_two_exponent(peak))
    with np.errstate(under="ignore"):
        return np.ldexp(matrix, -exponent), exponent


def _fallback_eigenpairs(d: int, k: int) -> tuple[FloatArray, FloatArray]:
    """The fixed public fallback: eigenvalues 0 and the first ``k`` standard basis vectors."""
    return np.zeros(k), np.eye(d, k)


def top_k_eigh(matrix: FloatArray, k: int) -> tuple[FloatArray, FloatArray]:
    """Top-k eigenpairs of a symmetric matrix, eigenvalues descending.

    The matrix is scaled by a power of two before LAPACK (``dsyevr``); if that fails, the
    divide-and-conquer driver is tried; if that fails too, or the input is not finite, the fixed
    public fallback is returned (eigenvalues 0, the first ``k`` standard basis vectors). The
    fallback does not depend on the data; with a finite input it has never been seen to trigger.

    Returns ``(values, vectors)`` with shapes ``(k,)`` and ``(d, k)``.
    """
    d = matrix.shape[0]
    scaled = _scaled(matrix)
    if scaled is None:
        return _fallback_eigenpairs(d, k)
    block, exponent = scaled
    for driver in ("evr", "evd"):
        try:
            if driver == "evr":
                values, vectors = scipy.linalg.eigh(block, subset_by_index=[d - k, d - 1])
            else:
                values, vectors = scipy.linalg.eigh(block, driver="evd")
                values, vectors = values[d - k :], vectors[:, d - k :]
        except (np.linalg.LinAlgError, ValueError):
            continue
        if np.all(np.isfinite(values)) and np.all(np.isfinite(vectors)):
            return np.ldexp(values[::-1], exponent), vectors[:, ::-1].copy()
    return _fallback_eigenpairs(d, k)


def eigenvalues_desc(matrix: FloatArray) -> FloatArray:
    """All eigenvalues of a symmetric matrix, descending.

    Scaled by a power of two before LAPACK; if it fails, or the input is not finite, the fixed
    public fallback is all zeros.
    """
    d = matrix.shape[0]
    scaled = _scaled(matrix)
    if scaled is None:
        return np.zeros(d)
    block, exponent = scaled
    for driver in ("evr", "evd"):
        try:
            values = scipy.linalg.eigvalsh(block, driver=driver)
        except (np.linalg.LinAlgError, ValueError):
            continue
        if np.all(np.isfinite(values)):
            return np.asarray(np.ldexp(values[::-1], exponent), dtype=np.float64)
    return np.zeros(d)


def orthonormal_basis(matrix: FloatArray) -> FloatArray:
    """Thin-QR orthonormal basis of the column span of ``matrix`` (``d x k``, ``k <= d``).

    The matrix is scaled by a power of two first (the ``Q`` factor is unchanged). Householder QR
    returns an orthonormal ``Q`` for every finite input, rank-deficient included; if LAPACK
    fails, or the input is not finite, the fixed public fallback is the first ``k`` standard
    basis vectors.
    """
    d, k = matrix.shape
    scaled = _scaled(matrix)
    if scaled is None:
        return np.eye(d, k)
    try:
        q, _ = np.linalg.qr(scaled[0], mode="reduced")
    except np.linalg.LinAlgError:
        return np.eye(d, k)
    if not np.all(np.isfinite(q)):
        return np.eye(d, k)
    return np.asarray(q, dtype=np.float64)


def top_right_singular_vectors(matrix: FloatArray, k: int) -> FloatArray:
    """Top-k right singular vectors of ``matrix`` (``m x d``) as a ``d x k`` orthonormal basis.

    Scaled by a power of two before the SVD (``gesdd``, then ``gesvd`` if it fails to converge);
    if both fail, or the input is not finite, the fixed public fallback is the first ``k``
    standard basis vectors.
    """
    d = matrix.shape[1]
    scaled = _scaled(matrix)
    if scaled is None:
        return np.eye(d, k)
    for driver in ("gesdd", "gesvd"):
        try:
            _, _, vt = scipy.linalg.svd(scaled[0], full_matrices=False, lapack_driver=driver)
        except (np.linalg.LinAlgError, ValueError):
            continue
        if np.all(np.isfinite(vt)):
            return np.asarray(vt[:k].T, dtype=np.float64)
    return np.eye(d, k)


def projector(basis: FloatArray) -> FloatArray:
    """``U U^T`` for an orthonormal ``d x k`` basis."""
    return basis @ basis.T


def subspace_distance(basis_a: FloatArray, basis_b: FloatArray) -> float:
    """Spectral distance ``||U U^T - V V^T||_2`` between two subspaces of equal dimension.

    For equal dimensions it equals ``||(I - U U^T) V||_2``, the sine of the largest principal
    angle; computing the residual directly keeps full relative precision for tiny angles,
    where ``sqrt(1 - cos^2)`` would bottom out near 1e-8.
    """
    if basis_a.shape != basis_b.shape:
        raise ValueError("subspaces must have the same shape")
    residual = basis_b - basis_a @ (basis_a.T @ basis_b)
    return min(1.0, float(np.linalg.norm(residual, 2)))
