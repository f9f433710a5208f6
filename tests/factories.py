"""Small factories for test data."""

from __future__ import annotations

from typing import Any

import numpy as np


def near_subspace(
    rng: np.random.Generator, n: int, d: int, k: int, noise: float = 0.01, norm: float = 1.0
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``n`` rows near a random ``k``-dim subspace of R^d, row norms <= ``norm``; with its basis."""
    basis, _ = np.linalg.qr(rng.normal(size=(d, k)))
    rows = rng.normal(size=(n, k)) @ basis.T * (0.5 * norm / np.sqrt(k))
    rows += rng.normal(size=(n, d)) * noise / np.sqrt(d)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows * np.minimum(1.0, norm / norms), basis
