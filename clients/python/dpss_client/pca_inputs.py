"""The checks :class:`dpss_client.pca.PrivatePCA` applies to what a caller passes it (rows to
transform, a public centre, parameter values): kept apart from ``pca.py`` to hold that module
under the house limit of ~800 lines; moved verbatim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpss_client.client import is_sparse

FloatArray = NDArray[np.float64]


def _plain(value: Any) -> Any:
    """A NumPy scalar as the Python number it holds (``np.int64(3)`` from ``np.arange`` or a
    parameter grid is the int 3), anything else unchanged: the strict checks refuse ``"3"``
    and ``3.0`` for an int, not a NumPy integer."""
    return value.item() if isinstance(value, np.generic) else value


def _rows(x: ArrayLike, width: int, name: str) -> FloatArray:
    """``x`` as finite real float64 rows of ``width`` columns, or an error naming ``name``."""
    if is_sparse(x):
        # numpy.asarray makes a 0-d object array of it ("setting an array element with a
        # sequence"); scikit-learn refuses it here too.
        raise TypeError(f"{name}: sparse input is not supported here; use {name}.toarray()")
    try:
        raw = np.asarray(x)
        if np.iscomplexobj(raw):
            # float64 would drop the imaginary parts with only a ComplexWarning.
            raise ValueError("complex values are not supported")
        rows = raw.astype(np.float64, copy=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name}: expected real numbers: {error}") from None
    if rows.ndim != 2 or rows.shape[1] != width:
        raise ValueError(f"{name}: expected shape (m, {width}), got {rows.shape}")
    _check_finite(rows, name)
    return rows


def _check_finite(values: FloatArray, name: str, where: str = "") -> None:
    if not np.all(np.isfinite(values)):
        # scikit-learn's rule too: a NaN would silently spread to every coordinate of its row.
        bad = np.argwhere(~np.isfinite(values))[0]
        at = where or f" (first at row {bad[0]}, column {bad[1]})"
        raise ValueError(f"{name}: contains NaN or infinity{at}; impute or drop those rows first")


def _sparse_rows(x: Any, width: int, name: str) -> Any:
    """A SciPy sparse ``x`` as CSR float64 of ``width`` columns with finite stored values."""
    if len(x.shape) != 2 or x.shape[1] != width:
        raise ValueError(f"{name}: expected shape (m, {width}), got {tuple(x.shape)}")
    if np.dtype(x.dtype).kind == "c":
        raise ValueError(f"{name}: expected real numbers: complex values are not supported")
    rows = x.tocsr().astype(np.float64)
    _check_finite(np.asarray(rows.data), name, where=" (among its stored values)")
    return rows


def _public_center(center: Sequence[float] | FloatArray) -> FloatArray:
    values = np.asarray(center, dtype=np.float64)
    if values.ndim != 1 or not np.all(np.isfinite(values)):
        raise ValueError("center: expected a flat list of finite numbers (a public centre)")
    return values
