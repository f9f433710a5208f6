"""Synthetic data with a known subspace, shared by the mechanism tests."""

from __future__ import annotations

import numpy as np


def near_subspace(
    n: int, d: int, k: int, *, noise: float = 0.01, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``u + e`` with ``u`` uniform on the unit sphere of a random k-dim subspace and ``e``
    isotropic Gaussian of total standard deviation ``noise``; rows then scaled to norm <= 1.

    Returns ``(X, U)``: the ``n x d`` data and an orthonormal ``d x k`` basis of the subspace.
    """
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((d, k)))
    coords = rng.standard_normal((n, k))
    coords /= np.linalg.norm(coords, axis=1, keepdims=True)
    data = coords @ basis.T + noise * rng.standard_normal((n, d)) / np.sqrt(d)
    data /= np.maximum(1.0, np.linalg.norm(data, axis=1, keepdims=True))
    return data, basis


def isotropic(n: int, d: int, *, seed: int = 0) -> np.ndarray:
    """Rows uniform on the unit sphere of ``R^d``: no eigengap at any ``k``."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, d))
    return data / np.linalg.norm(data, axis=1, keepdims=True)
