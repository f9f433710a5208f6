"""Whether a released subspace stands out of its own noise (issue 24, item 5).

A release should not end ``succeeded`` with a subspace that its own noise scale says is
indistinguishable from random without saying so. Every mechanism that releases a basis either
has a test that catches it (``exact_gapmax``: only a subspace holding many sampled rows exactly
wins) or puts the outcome of this check in its extras: ``components_above_noise`` (how many of
the ``k`` released directions stand out) and, when that is below ``k``, a ``warning`` sentence
and ``warning_code`` ``"indistinguishable_from_random"``.

The check is post-processing: it reads only public facts (noise scales that are functions of
public facts), values the mechanism released or that are functions of its private output
(noisy eigenvalues or singular values, a noise scale derived from a released noisy statistic),
never the raw data. Only an integer and a fixed sentence are released (no raw noisy double: see
the floating-point note in :mod:`service.mechanisms.noise`), so it costs nothing.

The rule is the spiked-matrix threshold (Baik, Ben Arous & Peche; Benaych-Georges & Nadakuditi
2012): a rank-k signal plus a noise matrix ``N`` has top-k eigenvectors (singular vectors) that
carry no information about the signal's direction below the noise's spectral edge, and there
the noisy top values sit at the edge itself; above it they separate. So a released direction
counts as standing out iff its noisy eigenvalue (singular value) exceeds the edge of ``N``:
``2 sigma sqrt(d)`` for a symmetric ``d x d`` Gaussian matrix with entry scale ``sigma``,
``sigma (sqrt(p) + sqrt(q))`` for a ``p x q`` one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from service.mechanisms.linalg import FloatArray

__all__ = [
    "WARNING_CODE",
    "count_above",
    "rectangular_edge",
    "top_singular_values",
    "usefulness_extras",
    "wigner_edge",
]

#: The machine-readable code of the warning (``extras["warning_code"]``).
WARNING_CODE = "indistinguishable_from_random"


def wigner_edge(sigma: float, d: int) -> float:
    """``2 sigma sqrt(d)``: the spectral norm of a symmetric ``d x d`` Gaussian matrix with entry
    scale ``sigma`` (semicircle law)."""
    return 2.0 * sigma * math.sqrt(d)


def rectangular_edge(sigma: float, rows: int, cols: int) -> float:
    """``sigma (sqrt(rows) + sqrt(cols))``: the largest singular value of a ``rows x cols``
    Gaussian matrix with entry scale ``sigma`` (Marchenko-Pastur edge)."""
    return sigma * (math.sqrt(rows) + math.sqrt(cols))


def count_above(values: FloatArray, k: int, edge: float) -> int:
    """How many of the top ``k`` of ``values`` (descending) are strictly above ``edge``; none
    when any of them or the edge is not finite (no claim that anything stands out)."""
    top = np.asarray(values[:k], dtype=np.float64)
    if not (math.isfinite(edge) and np.all(np.isfinite(top))):
        return 0
    return int(np.count_nonzero(top > edge))


def top_singular_values(matrix: FloatArray, k: int) -> FloatArray:
    """The ``k`` largest singular values of ``matrix`` (descending, zeros beyond its rank), or
    zeros when it is not finite or LAPACK fails (then nothing is claimed to stand out)."""
    out = np.zeros(k)
    if not np.all(np.isfinite(matrix)):
        return out
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            values = np.linalg.svd(matrix, compute_uv=False)
    except np.linalg.LinAlgError:
        return out
    top = np.asarray(values[:k], dtype=np.float64)
    out[: top.shape[0]] = top
    return out


def usefulness_extras(above: int, k: int, why: str) -> dict[str, Any]:
    """``components_above_noise`` and, when it is below ``k``, the warning (``why`` says what the
    directions were compared with: public words, no noisy number)."""
    extras: dict[str, Any] = {"components_above_noise": above}
    if above < k:
        extras["warning"] = (
            f"only {above} of the {k} released directions stand out of the noise ({why}): "
            "the others are indistinguishable from random directions at this budget"
        )
        extras["warning_code"] = WARNING_CODE
    return extras
