"""Synthetic datasets for the client tests."""

from __future__ import annotations

from typing import Any

import numpy as np


def low_rank_rows(n: int, d: int, k: int, seed: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Rows with a dominant k-dimensional subspace (the first k axes), norms at most 1."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * np.r_[np.full(k, 1.0), np.full(d - k, 0.05)]
    return x / np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))


def isotropic_rows(n: int, d: int, seed: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)
