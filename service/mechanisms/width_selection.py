"""Private choice of the cell width of ``histogram_aggregate`` (issue 16, item 5).

When neither ``cell_width`` nor ``gamma`` is given, the width is chosen by AboveThreshold
(sparse vector; Dwork & Roth, The Algorithmic Foundations of Differential Privacy, 2014,
Algorithm 1) over the public geometric grid ``w_i = r_max 2^-i``, ``i = 26, ..., 0`` (smallest
first), where ``r_max = ||P||_F`` bounds every coordinate of every point ``y_j = P U_j U_j^T``.
Query ``i`` is the largest cell count of the ``t`` points on the grid of width ``w_i`` (with a
public uniform offset ``u_c w_i`` per coordinate, ``u ~ U[0, 1)^{qd}`` drawn once); the search
stops at the first query whose noisy answer reaches the noisy threshold ``0.75 t``.

Privacy: replacing one row changes one subset, hence one point ``y_j`` (step 1 of M5, per-subset
scaling: see ``subset_top_k``). At every width that moves one point out of one cell and into
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

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from service.mechanisms.friendly_radius import above_threshold_lazy
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
        index = np.subtract(points, offsets)
        np.divide(index, width, out=index)
        np.floor(index, out=index)
    # a NaN index (only from non-finite points, which step 1 never produces) goes to one cell;
    # an infinite one is clamped below (as nan_to_num's +-max double then clamped: the same
    # values, in two passes instead of nan_to_num's five)
    index[np.isnan(index)] = 0.0
    np.clip(index, -CELL_INDEX_LIMIT, CELL_INDEX_LIMIT, out=index)
    return np.asarray(index, dtype=np.float64)


def cell_counts(
    cells: FloatArray, *, overwrite: bool = False
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Group equal rows of ``cells``: one representative row and a count per distinct row.

    Rows are grouped by hashing their bytes (a dict keyed by each row's 8 D bytes), ``O(t D)``
    work, where ``np.unique(cells, axis=0)`` sorts ``t`` rows of ``D`` structured fields
    (two thirds of a release at ``t = 1000``, ``q d = 10^4``). Equality is that of the values,
    as before: ``+ 0.0`` turns ``-0.0`` (a floored ``-0.0`` or a tiny negative quotient that
    underflowed) into ``+0.0`` first, so the two zeros share a cell, and the cells are finite
    (clamped indices of finite points), so no NaN payload can split a cell.

    Parameters
    ----------
    cells : (t, D) array of finite cell indices
    overwrite : bool
        Canonicalise ``cells`` in place (``-0.0`` becomes ``+0.0``) instead of a copy.

    Returns
    -------
    first : (u,) int array
        For each distinct row, the index of its first occurrence (in order of first occurrence;
        the noise is i.i.d., so the order in which cells receive it changes nothing).
    counts : (u,) int array
        How many rows equal it; ``sum(counts) = t``.
    """
    if overwrite and cells.dtype == np.float64 and cells.flags.c_contiguous:
        # the caller's scratch cells canonicalised in place (no copy of t D doubles)
        canonical = np.add(cells, 0.0, out=cells)
    else:
        canonical = np.ascontiguousarray(cells, dtype=np.float64) + 0.0
    slot: dict[bytes, int] = {}
    first: list[int] = []
    label = np.empty(canonical.shape[0], dtype=np.int64)
    for i, row in enumerate(canonical):
        j = slot.setdefault(row.tobytes(), len(first))
        if j == len(first):
            first.append(i)
        label[i] = j
    counts = np.bincount(label, minlength=len(first)).astype(np.int64)
    return np.asarray(first, dtype=np.int64), counts


def largest_cell_count(points: FloatArray, width: float, offsets: FloatArray) -> int:
    """``max_c #{j : y_j in cell c}`` on the grid of width ``width`` shifted by ``offsets``."""
    _, counts = cell_counts(cells(points, width, offsets))
    return int(counts.max())


def fingerprint_coefficients(dim: int) -> npt.NDArray[np.uint64]:
    """``(dim, 2)`` public odd multipliers from a fixed seed: they depend on nothing private."""
    return np.random.default_rng(0x5EEDCE11).integers(
        1, 2**63, size=(dim, 2), dtype=np.uint64
    ) | np.uint64(1)


def largest_class_count(index: npt.NDArray[np.int64], coefficients: npt.NDArray[np.uint64]) -> int:
    """Largest number of rows of ``index`` with the same 128-bit fingerprint.

    The fingerprint of a row is two wrapping linear hashes of its integer entries: a function of
    the row alone, so its classes partition the space whatever collisions occur, and the largest
    class count has sensitivity 1 (the module doc's argument, for classes instead of cells). Two
    distinct cells share a fingerprint with probability far below ``2^-30`` per pair, which could
    only merge two cells (utility), never break privacy.
    """
    with np.errstate(over="ignore"):
        prints = index.view(np.uint64) @ coefficients
    _, counts = np.unique(prints, axis=0, return_counts=True)
    return int(counts.max())


def largest_cell_counts(points: FloatArray, widths: FloatArray, unit: FloatArray) -> FloatArray:
    """The largest cell count at every width, on nested grids with one offset ``unit w_max``.

    The widths are ``w_0 2^j`` (ascending), so with the common offset ``o = unit w_max`` the
    cell of a point at width ``w_j`` is its cell index at ``w_0`` shifted right by ``j`` bits
    (``floor(floor(x)/2^j) = floor(x/2^j)``): one division pass instead of one per width.
    ``o mod w_j`` is uniform on ``[0, w_j)`` per coordinate when ``unit`` is uniform on
    ``[0, 1)``, as a fresh offset per width would be. Every cell is a function of the point alone.

    Parameters
    ----------
    points : (t, D) array
    widths : (R,) array, ``widths[j] = widths[0] 2^j``
    unit : (D,) array in ``[0, 1)``

    Returns
    -------
    (R,) array of counts (integral doubles)
    """
    query = largest_cell_count_query(points, widths, unit)
    return np.array([query(j) for j in range(widths.shape[0])], dtype=np.float64)


def largest_cell_count_query(
    points: FloatArray, widths: FloatArray, unit: FloatArray
) -> Callable[[int], float]:
    """``j -> `` the largest cell count at ``widths[j]`` (:func:`largest_cell_counts`' ``j``-th
    entry, the same cells and the same value), for a search that asks the widths one at a
    time: the finest cell indices are computed once, each width's count only when asked."""
    finest = cells(points, float(widths[0]), unit * float(widths[-1])).astype(np.int64)
    nested = NestedCells(finest, fingerprint_coefficients(points.shape[1]))
    # The finest level whose largest count exceeds 1, found by bisection when first asked.
    # The grids are nested (a cell at w_j is a union of cells at w_{j-1}), so the exact
    # largest count never decreases with j: below that level every count is 1 and none needs
    # computing. The search asks the widths from the finest; near a subspace the first dozen
    # or more are all 1 (every point alone), and about 5 counts replace them.
    first_shared: list[int] = []

    def query(j: int) -> float:
        if not first_shared:
            first_shared.append(_first_shared_level(nested, widths.shape[0]))
        return 1.0 if j < first_shared[0] else float(nested.largest(j))

    return query


def _first_shared_level(nested: NestedCells, levels: int) -> int:
    """The finest level whose largest count exceeds 1 (``levels`` if none), counts being
    monotone in the level.

    The middle level first; if its points are all apart, the levels above it one at a time,
    each grouped from the one below (:class:`NestedCells`), up to the first shared one; else a
    bisection below it. A bisection above the middle asked a coarse level first and grouped it
    from the middle's classes, where every point is apart: all ``t`` rows over all ``D``
    coordinates (near a subspace, at d = 1,000, 0.15 s of the search's 0.36 s), while going up
    one level at a time groups each level from a finer one already known. The same level either
    way (the counts are exact), so the same answers."""
    low, high = 0, levels  # count(high) taken as > 1 (beyond the grid)
    middle = levels // 2
    if nested.largest(middle) > 1:
        high = middle
    else:
        for level in range(middle + 1, levels):
            if nested.largest(level) > 1:
                return level
        return levels
    while low < high:
        middle = (low + high) // 2
        if nested.largest(middle) > 1:
            high = middle
        else:
            low = middle + 1
    return low


class NestedCells:
    """The exact cells of the rows of ``finest >> j`` for the levels ``j`` asked, each level
    grouped from the classes of the nearest finer level already known.

    All rows of a class at level ``j'`` have equal ``finest >> j'``, hence equal ``finest >> j
    = (finest >> j') >> (j - j')`` for ``j >= j'``: the cells at ``j`` are unions of those at
    ``j'``, and grouping one representative row per class at ``j'`` gives them. Where the
    points cluster (the widths at which the search stops) a level then costs its few classes,
    not its ``t`` rows. Rows are grouped by :func:`largest_class_count`'s fingerprints, then
    every row is checked against its class's first row (a class whose rows differ, only on a
    fingerprint collision, ``< 2^-30`` per pair, is regrouped exactly by ``np.unique``), so the
    classes are the cells themselves: each a function of the point alone, and the largest
    count has the module's sensitivity 1. Exactness is also what makes the counts monotone in
    the width, which :func:`largest_cell_count_query` relies on.

    Parameters
    ----------
    finest : (t, D) int array
        Cell indices at the finest width.
    coefficients : (D, 2) uint64 array
        :func:`fingerprint_coefficients`.
    """

    def __init__(self, finest: npt.NDArray[np.int64], coefficients: npt.NDArray[np.uint64]):
        self.finest = finest
        self.coefficients = coefficients
        # level -> (class of each row, one row of each class, rows per class)
        self.levels: dict[int, tuple[npt.NDArray[np.int64], ...]] = {}

    def largest(self, level: int) -> int:
        """The largest cell count at ``level`` (``0`` for no rows)."""
        if self.finest.shape[0] == 0:
            return 0
        if level not in self.levels:
            self.levels[level] = self._group(level)
        return int(self.levels[level][2].max())

    def _group(self, level: int) -> tuple[npt.NDArray[np.int64], ...]:
        t = self.finest.shape[0]
        finer = [known for known in self.levels if known < level]
        if finer:
            row_class, representatives, sizes = self.levels[max(finer)]
        else:
            row_class = np.arange(t, dtype=np.int64)
            representatives = np.arange(t, dtype=np.int64)
            sizes = np.ones(t, dtype=np.int64)
        merged = exact_classes(self.finest, representatives, level, self.coefficients)
        count = int(merged.max()) + 1
        first = np.full(count, representatives.shape[0], dtype=np.int64)
        np.minimum.at(first, merged, np.arange(representatives.shape[0], dtype=np.int64))
        return (
            merged[row_class],
            representatives[first],
            np.bincount(merged, weights=sizes, minlength=count).astype(np.int64),
        )


#: Coordinates fingerprinted in :func:`exact_classes`' first step (each later step takes four
#: times as many).
FIRST_COLUMNS = 256


def exact_classes(
    finest: npt.NDArray[np.int64],
    chosen: npt.NDArray[np.int64],
    level: int,
    coefficients: npt.NDArray[np.uint64],
) -> npt.NDArray[np.int64]:
    """A class label per chosen row of ``finest >> level``, equal labels exactly for equal
    rows (labels ``0..u-1``, one per row of ``chosen``); each step shifts only the
    coordinates it reads.

    By refinement over the coordinates, in steps of :data:`FIRST_COLUMNS`, then 4 times as
    many each step: the rows are grouped by their class so far and the fingerprint
    (:func:`largest_class_count`'s multipliers) of the step's coordinates; a row alone in its
    group differs from every other row (equal rows have equal fingerprints on any
    coordinates) and is done. Rows that differ early, every row at the fine widths, cost
    one step instead of all ``D`` coordinates. At every step each row is compared with the
    first row of its group on the step's coordinates; only if some row differs (a fingerprint
    collision) are the rows grouped by ``np.unique`` on their values.
    """
    count, dim = chosen.shape[0], finest.shape[1]
    label = np.zeros(count, dtype=np.int64)
    active = np.arange(count, dtype=np.int64)
    fresh = 1
    start, step = 0, FIRST_COLUMNS
    # One 64-bit hash per row and step (the first multipliers' column, a matrix-vector
    # product), mixed with the row's label so far into one key grouped by a 1-d np.unique: a
    # fraction of the two-column product and the row-wise unique of before. Exactness does not
    # rest on the hash: equal rows always get equal keys (so a row alone in its group is
    # distinct from every other), and a collision, which may now also join rows of different
    # labels, only keeps rows grouped until the row-by-row check below (then np.unique).
    multipliers = np.ascontiguousarray(coefficients[:, 0])
    mix = coefficients[0, 1]
    while active.size and start < dim:
        stop = min(dim, start + step)
        block = finest[chosen[active], start:stop]
        np.right_shift(block, level, out=block)  # in place: one array of the step's size
        with np.errstate(over="ignore"):
            key = block.view(np.uint64) @ multipliers[start:stop]
            key += label[active].view(np.uint64) * mix
        _, first, inverse, sizes = np.unique(
            key, return_index=True, return_inverse=True, return_counts=True
        )
        inverse = np.asarray(inverse, dtype=np.int64).reshape(-1)
        # Each row against the first row of its group, on this step's coordinates (already
        # shifted, in cache). A row still grouped after the last step was checked at every
        # step against its group's first row, and its final group's first row against the
        # same rows (groups only split), so by transitivity the rows of a final group are
        # equal on every coordinate. One comparison of the step's block instead of a second
        # read of all D coordinates of the grouped rows at the end.
        if not np.array_equal(block, block[first[inverse]]):
            rows = np.right_shift(finest[chosen], level)
            _, exact = np.unique(rows, axis=0, return_inverse=True)
            return np.asarray(exact, dtype=np.int64).reshape(-1)
        label[active] = fresh + inverse  # new labels, distinct from every finished row's
        fresh += sizes.shape[0]
        active = active[sizes[inverse] > 1]
        start, step = stop, 4 * step
    _, labels = np.unique(label, return_inverse=True)
    return np.asarray(labels, dtype=np.int64).reshape(-1)


def grid_offsets(unit: FloatArray, width: float, widest: float) -> FloatArray:
    """The offsets of the searched grid at ``width``: ``unit widest mod width`` (the same cells
    as :func:`largest_cell_counts` used)."""
    return np.asarray(np.mod(unit * widest, width), dtype=np.float64)


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
    # The widths are asked one at a time and none after the stop (the same draws and the same
    # stop as answering all 27 up front; the counts past the stop were a third or more of
    # histogram_aggregate's time on rows near a subspace).
    query = largest_cell_count_query(points, widths, unit)
    stop = above_threshold_lazy(
        query, widths.shape[0], search_threshold(t), MAX_COUNT_SENSITIVITY, eps0, rng
    )
    if stop is None:
        return WidthSearch(None, None, None)
    width = float(widths[stop])
    return WidthSearch(width, WIDTH_STEPS - stop, grid_offsets(unit, width, float(widths[-1])))


def search_memory_bytes(t: int, dim: int) -> int:
    """Peak bytes of one width's query: the cell indices (``t D``), the difference and
    quotient temporaries and :func:`cell_counts`' canonical copy (``<= 5 t D`` doubles),
    the unit offsets and the scaled offsets."""
    return 8 * (5 * t * dim + 2 * dim)
