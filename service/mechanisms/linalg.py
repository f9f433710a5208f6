"""Linear algebra shared by the mechanisms: clipping, chunked Gram matrices, top-k subspaces."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.linalg

FloatArray = npt.NDArray[np.float64]

#: Rows per chunk when streaming a memory-mapped dataset: 8192 rows of d = 1000 is 64 MB.
DEFAULT_CHUNK_ROWS = 8192


def clip_rows(rows: npt.NDArray[Any], clip_norm: float) -> FloatArray:
    """Scale each row to norm at most ``clip_norm``: ``x <- x * min(1, C/||x||)``."""
    block = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(block, axis=1)
    scale = np.minimum(1.0, clip_norm / np.maximum(norms, np.finfo(np.float64).tiny))
    clipped: FloatArray = block * scale[:, None]
    return clipped


def iter_row_chunks(data: npt.NDArray[Any], chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Any:
    """Yield consecutive row blocks of ``data`` (copies of at most ``chunk_rows`` rows)."""
    for start in range(0, data.shape[0], chunk_rows):
        yield np.asarray(data[start : start + chunk_rows], dtype=np.float64)


def clipped_gram(
    data: npt.NDArray[Any], clip_norm: float, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> FloatArray:
    """``H = X^T X`` of the clipped rows, accumulated in row chunks: memory ``O(d^2 + chunk d)``."""
    d = data.shape[1]
    gram = np.zeros((d, d), dtype=np.float64)
    for block in iter_row_chunks(data, chunk_rows):
        clipped = clip_rows(block, clip_norm)
        gram += clipped.T @ clipped
    return gram


def top_k_eigh(matrix: FloatArray, k: int) -> tuple[FloatArray, FloatArray]:
    """Top-k eigenpairs of a symmetric matrix, eigenvalues descending.

    Returns ``(values, vectors)`` with shapes ``(k,)`` and ``(d, k)``.
    """
    d = matrix.shape[0]
    values, vectors = scipy.linalg.eigh(matrix, subset_by_index=[d - k, d - 1])
    return values[::-1].copy(), vectors[:, ::-1].copy()


def eigenvalues_desc(matrix: FloatArray) -> FloatArray:
    """All eigenvalues of a symmetric matrix, descending."""
    return np.asarray(scipy.linalg.eigvalsh(matrix)[::-1], dtype=np.float64)


def orthonormal_basis(matrix: FloatArray) -> FloatArray:
    """Thin-QR orthonormal basis of the column span of ``matrix`` (``d x k``)."""
    q, _ = np.linalg.qr(matrix, mode="reduced")
    return np.asarray(q, dtype=np.float64)


def top_right_singular_vectors(matrix: FloatArray, k: int) -> FloatArray:
    """Top-k right singular vectors of ``matrix`` (``m x d``) as a ``d x k`` orthonormal basis."""
    _, _, vt = np.linalg.svd(matrix, full_matrices=False)
    return np.asarray(vt[:k].T, dtype=np.float64)


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
