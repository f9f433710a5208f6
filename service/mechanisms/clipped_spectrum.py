"""Undo the flattening that clipping the rows' norms does to a spectrum (issue 32 item 4): the
forecast from an earlier release reads that release's noisy eigenvalues, which are those of the
Gram matrix of rows clipped at ``C2`` (most rows are: ``C2`` sits near a low quantile of the
norms), while what a release keeps is measured on the centred rows clipped at ``C``. Clipping
the long rows pulls the spectrum towards isotropy (all rows clipped: the spatial-sign matrix),
so the clipped shares understate a dominant direction (breast_cancer, unit rows: 0.50-0.63 of
the clipped trace on the top direction, 0.767 of the centred variance).

Model: Gaussian rows ``N(0, diag(lambda))`` (for elliptical rows the clipped matrix has the
same eigenvectors as the covariance; the Gaussian fixes the radial law), clipped at the level
``c`` where the mean of ``min(||x||^2, c^2) / c^2`` is the released clipped share
``a = tr(H) / (n C2^2)`` (1 when every row is clipped). The shares of the clipped matrix
follow from ``lambda`` by quadrature over a fixed set of draws; :func:`declipped_shares` finds
the ``lambda`` whose clipped shares are the observed ones (a fixed point, the map being
monotone in each share). Public inputs only (released eigenvalues and trace, public ``n`` and
the released clip): post-processing. The draws are a quadrature rule from a fixed seed, not
privacy noise, so the forecast is a deterministic function of what was released.
"""

from __future__ import annotations

import numpy as np

from service.mechanisms.linalg import FloatArray

#: Quadrature draws (rows of the model) and fixed-point steps; the shares' quadrature error is
#: about ``1/sqrt(DRAWS)`` relative (a 0.01 share of 0.5 at 4,000 draws).
DRAWS = 4000
STEPS = 40
#: The fixed seed of the quadrature rule (not privacy randomness: see the module docstring).
QUADRATURE_SEED = 20261129


def clipped_shares(
    top: FloatArray, rest: float, draws: FloatArray, tail: FloatArray, clipped: float
) -> tuple[FloatArray, float]:
    """The shares of the trace of ``E[min(1, c^2/||x||^2) x x^T]`` on the ``m`` leading
    coordinates and on the remaining ``d - m`` together, for ``x ~ N(0, diag(top, rest I))``:
    ``draws`` are ``m`` standard normals per row, ``tail`` a chi-square with ``d - m`` degrees
    per row (the rest enters only through its squared norm), and ``c`` is set so the mean of
    ``min(||x||^2/c^2, 1)`` is ``clipped`` (the share of ``n c^2`` the clipped trace fills)."""
    squares = draws**2 * top
    rest_squares = tail * rest
    norms = squares.sum(axis=1) + rest_squares
    if clipped >= 1.0:
        factors = 1.0 / np.maximum(norms, np.finfo(np.float64).tiny)
    else:
        level = clip_level(norms, clipped)
        factors = np.minimum(1.0, level / np.maximum(norms, np.finfo(np.float64).tiny))
    leading = (factors[:, None] * squares).mean(axis=0)
    remaining = float((factors * rest_squares).mean())
    total = float(leading.sum()) + remaining
    if not total > 0:
        return np.zeros_like(top), 1.0
    return leading / total, remaining / total


def clip_level(norms: FloatArray, clipped: float) -> float:
    """The ``c^2`` with ``mean(min(norms / c^2, 1)) = clipped`` (``0 < clipped < 1``): the
    mean decreases in ``c^2``, from 1 below the smallest norm; piecewise, so solved exactly on
    the sorted norms (above the ``j`` smallest, ``(sum of them / c^2 + (N - j)) / N``)."""
    ordered = np.sort(norms)
    count = ordered.shape[0]
    below = np.concatenate(([0.0], np.cumsum(ordered)))
    # c^2 between ordered[j-1] and ordered[j]: (below[j] / c^2 + count - j) / count = clipped.
    j = np.arange(count + 1)
    remaining = count * clipped - (count - j)
    with np.errstate(divide="ignore", invalid="ignore"):
        level = np.where(remaining > 0, below / remaining, np.inf)
    low = np.concatenate(([0.0], ordered))
    high = np.concatenate((ordered, [np.inf]))
    fits = (remaining > 0) & (below > 0) & (low <= level) & (level <= high)
    if fits.any():
        return float(level[np.argmax(fits)])
    return float(ordered[-1]) / max(clipped, 1e-300)


def declipped_shares(observed: FloatArray, d: int, clipped: float) -> tuple[FloatArray, float]:
    """The covariance shares ``(leading, rest)`` whose clipped shares (:func:`clipped_shares`)
    are ``observed`` on the ``m`` leading directions (the rest of the trace spread evenly over
    the other ``d - m``). With ``clipped`` near 0 (no row clipped) they are ``observed``."""
    m = observed.shape[0]
    observed = np.asarray(observed, dtype=np.float64)
    spare = 1.0 - float(observed.sum())
    if m == 0 or d <= m or spare <= 0:
        return observed, max(spare, 0.0)
    rng = np.random.default_rng(QUADRATURE_SEED)
    draws = rng.standard_normal((DRAWS, m))
    tail = rng.chisquare(d - m, DRAWS)
    top = observed.copy()
    rest = spare / (d - m)
    for _ in range(STEPS):
        leading, remaining = clipped_shares(top, rest, draws, tail, clipped)
        top = top * observed / np.maximum(leading, np.finfo(np.float64).tiny)
        rest = rest * spare / max(remaining, np.finfo(np.float64).tiny)
        total = float(top.sum()) + rest * (d - m)
        top, rest = top / total, rest / total
    return top, rest * (d - m)
