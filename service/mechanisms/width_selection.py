"""Private choice of the cell width of ``histogram_aggregate`` (issue 16, item 5).

When neither ``cell_width`` nor ``gamma`` is given, the width is chosen by AboveThreshold
(sparse vector; Dwork & Roth, The Algorithmic Foundations of Differential Privacy, 2014,
Algorithm 1) over the public geometric grid ``w_i = r_max 2^-i``, ``i = 26, ..., 0`` (smallest
first), where ``r_max = ||P||_F`` bounds every coordinate of every point ``y_j = P U_j U_j^T``.
Query ``i`` is the largest cell count of the ``t`` points on the grid of width ``w_i`` (with a
public uniform offset ``u_c w_i`` per coordinate, ``u ~ U[0, 1)^{qd}`` drawn once); the search
stops at the first query whose noisy answer reaches the noisy threshold ``0.75 t``.

Privacy: replacing one row changes one subset, hence one point ``y_j`` (step 1 of M5, per-subset
scaling: see ``sample_aggregate``). At every width that moves one point out of one cell and into
one cell, so every cell count changes by at most 1 and **the largest count by at most 1** (a
maximum of functions that each move by at most 1 moves by at most 1; ``max_c n'_c <= max_c
(n_c + 1)`` and symmetrically). AboveThreshold with sensitivity ``Delta = 1`` (threshold noise
``Lap(2/eps0)``, query noise ``Lap(4/eps0)``) is ``(eps0, 0)``-DP however many widths are asked.
The histogram at the chosen (now public) width is the ``(eps_h, delta)`` stability histogram of
M5; sequential composition gives ``(eps0 + eps_h, delta)`` with ``eps0 = eps/4``,
``eps_h = 3 eps/4``. No width reaching the threshold is a charged ``no_result``.
(``Delta = 2``, the sensitivity of the whole histogram vector in l1, would also be valid but
wastes half the search budget: only the maximum is asked.)

Floating point: a point's cell at a width is a function of that point alone (indices clamped
to ``+-2^62``), so the sensitivity of the largest count holds for the computed counts exactly.
Counts are integers. Memory: one ``t x qd`` array of cell indices at a time, plus its sort.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.mechanisms.friendly_aggregate import above_threshold
from service.mechanisms.linalg import FloatArray

#: Widths searched: ``r_max 2^-i`` for ``i = WIDTH_STEPS, ..., 0`` (smallest first). The
#: smallest, ``2^-26 r_max ~ 1.5e-8 r_max``, is far above the points' rounding (a few
#: ``eps_machine r_max``), and every extra width is one more chance of a spurious stop.
WIDTH_STEPS = 26
#: The search stops at the first width whose largest cell holds this fraction of the ``t``
#: points (noisily).
THRESHOLD_FRACTION = 0.75
#: Sensitivity of the largest cell count under replacing one row (proved in the module doc).
MAX_COUNT_SENSITIVITY = 1.0
#: Share of epsilon spent on the search; the histogram gets the rest (and all of delta).
SEARCH_SHARE = 0.25
#: Cell indices are clamped to ``[-2^62, 2^62]`` (a per-point map: the sensitivity is unchanged).
CELL_INDEX_LIMIT = float(2**62)


@dataclass(frozen=True)
class WidthSearch:
    """Outcome of :func:`search_width` (private output, except the public grid)."""

    #: The chosen width, or ``None`` when no width reached the threshold (no result).
    width: float | None
    #: ``i`` with ``width = r_max 2^-i``, or ``None``.
    exponent: int | None
    #: The public offsets of the chosen width's grid (``u w``), or ``None``.
    offsets: FloatArray | None


def search_split(epsilon: float) -> tuple[float, float]:
    """``(eps0, eps_h) = (eps/4, 3 eps/4)``: the search's and the histogram's epsilon."""
    return SEARCH_SHARE * epsilon, (1.0 - SEARCH_SHARE) * epsilon


def search_threshold(t: int) -> float:
    """``0.75 t``: the largest cell must hold three quarters of the points."""
    return THRESHOLD_FRACTION * t


def threshold_noise_scale(eps0: float) -> float:
    """AboveThreshold's threshold noise ``Lap(2 Delta/eps0)``, ``Delta = 1``."""
    return 2.0 * MAX_COUNT_SENSITIVITY / eps0


def query_noise_scale(eps0: float) -> float:
    """AboveThreshold's query noise ``Lap(4 Delta/eps0)``, ``Delta = 1``."""
    return 4.0 * MAX_COUNT_SENSITIVITY / eps0


def width_grid(r_max: float, steps: int = WIDTH_STEPS) -> FloatArray:
    """``r_max 2^-i`` for ``i = steps, ..., 0``: ascending, in the order AboveThreshold asks."""
    return np.asarray(r_max * np.exp2(-np.arange(steps, -1, -1, dtype=np.float64)))


def cells(points: FloatArray, width: float, offsets: FloatArray) -> FloatArray:
    """Cell index of each point, ``floor((y - offset)/w)`` per coordinate, clamped to
    ``+-2^62``: a function of the point alone.

    Parameters
    ----------
    points : (t, D) array
    width : float
    offsets : (D,) array

    Returns
    -------
    (t, D) array of integral doubles
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        index = np.floor((points - offsets) / width)
    # a NaN index (only from non-finite points, which step 1 never produces) goes to one cell
    np.nan_to_num(index, copy=False, nan=0.0)
    np.clip(index, -CELL_INDEX_LIMIT, CELL_INDEX_LIMIT, out=index)
    return np.asarray(index, dtype=np.float64)


def largest_cell_count(points: FloatArray, width: float, offsets: FloatArray) -> int:
    """``max_c #{j : y_j in cell c}`` on the grid of width ``width`` shifted by ``offsets``."""
    _, counts = np.unique(cells(points, width, offsets), axis=0, return_counts=True)
    return int(counts.max())


def largest_cell_counts(points: FloatArray, widths: FloatArray, unit: FloatArray) -> FloatArray:
    """:func:`largest_cell_count` at every width, the offsets of width ``w`` being ``unit w``.

    Parameters
    ----------
    points : (t, D) array
    widths : (R,) array
    unit : (D,) array in ``[0, 1)``

    Returns
    -------
    (R,) array of counts (integral doubles)
    """
    return np.array(
        [float(largest_cell_count(points, float(w), unit * w)) for w in widths], dtype=np.float64
    )


def search_width(
    points: FloatArray, r_max: float, eps0: float, rng: np.random.Generator
) -> WidthSearch:
    """AboveThreshold over the widths ``r_max 2^-i``, ``i = 26..0``, queries the largest cell
    count (sensitivity 1), threshold ``0.75 t``; ``(eps0, 0)``-DP.

    Parameters
    ----------
    points : (t, D) array
        The subsets' points ``y_j``.
    r_max : float
        Public bound on the points' coordinates (``||P||_F``).
    eps0 : float
    rng : numpy.random.Generator
        Draws the unit offsets ``u`` (public), then the AboveThreshold noise.

    Returns
    -------
    WidthSearch
    """
    t, dim = points.shape
    unit = np.asarray(rng.uniform(0.0, 1.0, size=dim), dtype=np.float64)
    widths = width_grid(r_max)
    answers = largest_cell_counts(points, widths, unit)
    stop = above_threshold(answers, search_threshold(t), MAX_COUNT_SENSITIVITY, eps0, rng)
    if stop is None:
        return WidthSearch(None, None, None)
    width = float(widths[stop])
    return WidthSearch(width, WIDTH_STEPS - stop, np.asarray(unit * width, dtype=np.float64))


def search_memory_bytes(t: int, dim: int) -> int:
    """Peak bytes of one width's query: the cell indices (``t D``), the difference and
    quotient temporaries and ``np.unique``'s sorted copy and inverse (``<= 5 t D`` doubles),
    the unit offsets and the scaled offsets."""
    return 8 * (5 * t * dim + 2 * dim)
