"""The default ``t`` and the peak memory of M6 ``friendly_aggregate`` (public facts only).

Privacy argument: nothing here sees the data. ``t`` is chosen from ``n, d, k``, the budget, the
params and the worker memory limit (:func:`choose_t`), and the memory estimate
(:func:`friendly_memory_bytes`) is arithmetic on the same public facts, so neither leaks anything
and both can be shown before anything is charged. ``t`` below ``t_min``
(``friendly_ptr.t_min_for``, the least ``t`` whose test can pass) means the request is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.mechanisms.friendly_ptr import t_comfortable_for, t_min_for
from service.mechanisms.friendly_radius import radius_steps
from service.mechanisms.friendly_screen import cross_strip_bytes
from service.mechanisms.friendly_weights import (
    BLOCK_FLOATS,
    MAX_DISTANCE_WORKERS,
    MEAN_CHUNK_FLOATS,
    TILE_CROSS,
    Aggregator,
    block_rows,
    centred_rows,
    packed_chunks,
    packed_length,
    packed_projections,
)
from service.mechanisms.sample_aggregate import allowance, embeddings_bytes, subset_bases_bytes

#: Default ``t`` keeps ``m = floor(n/t) >= ROWS_PER_DIMENSION * k`` rows per subset.
ROWS_PER_DIMENSION = 10
#: Largest ``t`` accepted at all: the ``t x t`` distance matrix is 800 MB at 10,000.
MAX_T = 10_000


def rows_cap_t(n: int, k: int) -> int:
    """``floor(n/(10k))``: the most subsets that keep ``m >= 10k`` rows each."""
    return n // (ROWS_PER_DIMENSION * k)


def default_t(n: int, k: int) -> int:
    """``floor(n/(10k))`` (the row cap alone; :func:`choose_t` applies the budget and memory)."""
    return rows_cap_t(n, k)


def memory_cap_t(
    n: int,
    d: int,
    k: int,
    q: int | None,
    aggregator: Aggregator,
    radius: float | None,
    limit_bytes: int,
    high: int,
    low: int = 3,
) -> int:
    """Largest ``t`` in ``[low, high]`` whose :func:`friendly_memory_bytes` fits
    ``limit_bytes``; 0 when none does.

    The estimate is not monotone in ``t`` (few subsets mean large ``m x m`` subset Gram
    matrices, many subsets large distance blocks and points), so the range is scanned from the
    top; each estimate is a few arithmetic operations on public facts.
    """
    for t in range(high, max(3, low) - 1, -1):
        if friendly_memory_bytes(n, d, k, t, q, aggregator, radius) <= limit_bytes:
            return t
    return 0


@dataclass(frozen=True)
class TChoice:
    """How the default ``t`` was chosen (all from public facts)."""

    t: int
    t_min: int
    t_comfortable: int
    rows_cap: int
    #: largest ``t`` in ``[t_min, min(rows_cap, MAX_T)]`` that fits the memory limit, or 0
    memory_cap: int
    reason: str


def choose_t(
    n: int,
    d: int,
    k: int,
    epsilon: float,
    delta: float,
    q: int | None,
    aggregator: Aggregator,
    radius: float | None,
    limit_bytes: int,
) -> TChoice:
    """The default ``t``: the largest ``t`` that keeps ``m >= 10k`` rows per subset, fits the
    worker memory and :data:`MAX_T`; ``t < t_min`` means refuse.

    The largest, not the smallest that passes the test: the mean's noise is
    ``r (4(t-1)/b + 6)/W_low ~ 14 r/(t - shift)``, so more subsets lower it (about ``1/t``
    once the radius reaches the grid's floor), and they make both the test and the radius
    search more reliable (measured by ``bench/experiments/bench_small_budgets.py``, removed; in
    git history at commit ad45863).
    """
    t_min = t_min_for(epsilon, delta, radius is not None)
    t_comf = t_comfortable_for(epsilon, delta, radius is not None)
    rows_cap = rows_cap_t(n, k)
    upper = min(rows_cap, MAX_T)
    if upper < t_min:  # too few rows: refused whatever the memory
        return TChoice(upper, t_min, t_comf, rows_cap, 0, "too few rows")
    # the largest t in [t_min, upper] that fits (0: none does, refused)
    mem_cap = memory_cap_t(n, d, k, q, aggregator, radius, limit_bytes, upper, t_min)
    t = mem_cap
    if t == 0:
        reason = "no t >= t_min fits the worker memory"
    elif t == rows_cap:
        reason = f"the largest t that keeps m >= 10k rows per subset, floor(n/(10k)) = {t}"
    elif t == MAX_T:
        reason = f"the largest t accepted, {MAX_T}"
    else:
        reason = f"the largest t that fits the worker memory (DPSS_WORKER_MEMORY_MB), {t}"
    return TChoice(t, t_min, t_comf, rows_cap, mem_cap, reason)


def friendly_memory_bytes(
    n: int,
    d: int,
    k: int,
    t: int,
    q: int | None,
    aggregator: Aggregator,
    radius: float | None,
    workers: int = MAX_DISTANCE_WORKERS,
) -> int:
    """Peak bytes of :func:`friendly_aggregate`, from its own allocations (public facts only).

    The partition (``n`` permutation indices and ``t m`` kept), then the larger of: the subset
    step (:func:`subset_bases_bytes`); the distance step, which holds the bases, the points
    (``t q d`` and the reference points; projections: the stacked bases), per worker one block
    of distances with its bins and one indexed copy of them (projections: also the ``k x k``
    cross products and their squares), and the counts and weights of every radius; the
    release step (a chunk of points and its differences, the mean, noise and noisy estimate,
    the SVD's factors; for projections the used bases three more times and seven ``d x d``
    matrices). Plus :func:`allowance`.
    """
    m = n // t
    qq = 2 * k if q is None else q
    n_radii = 1 if radius is not None else (radius_steps(aggregator) + 1)
    partition = 8 * (2 * n + t * m)
    bases = 8 * t * d * k
    subset_step = subset_bases_bytes(t, m, d, k)
    counts = 8 * t * (n_radii + 1) * (workers + 3) + 8 * 2 * t * n_radii
    if aggregator == "reference_points":
        rows = block_rows(t)
        workers = min(workers, -(-t // rows))
        held = bases + embeddings_bytes(t, qq, d, k)
        # a block of distances, its bins and one indexed copy of them (the symmetrising
        # temporaries, 2 rows^2, come and go before the bins exist)
        per_worker = 8 * 3 * rows * t
        p = qq * d
        chunk = max(1, MEAN_CHUNK_FLOATS // p) * p
        release = 8 * (2 * chunk + 6 * p + qq * qq + qq)
    elif packed_projections(t, d, k):
        # the packed projectors, zero-padded to whole chunks (and, while they are built, a few
        # products of the bases' halves, under d x d each); the centred band's G_j (t d k) and,
        # while it is built, one more t d k and two t k k, or the single-precision screen's
        # packed rows and the bases rounded to single; per block the overlaps, the product
        # added to them, the squared distances' temporaries, the bins and their indexed copy
        rows = block_rows(t, 4)
        band = t * (2 * d * k + 2 * k * k)
        n_chunks, chunk = packed_chunks(d, k)
        screen = 4 * t * (n_chunks * chunk + d * k) + 8 * t * d * k
        held = bases + 8 * (t * (packed_length(d) + k * d) + band + BLOCK_FLOATS + d * d) + screen
        per_worker = 8 * 7 * rows * t
        workers = 1
        release = 3 * bases + 8 * (7 * d * d + d * k)
    else:
        # the bases, the centred band's G_j (t d k) and either its one t d k temporary while it
        # is built or, later, the stacked bases of the exact tiles; two t k k; per block the
        # band's strips and bins (as the packed route's) and one tile's cross products; or the
        # single-precision screen's stacked bases (with the copies that form them, 2 t d k
        # doubles at most) and one strip's products, single and summed in double
        rows = centred_rows(t, TILE_CROSS)
        held = 3 * bases + 8 * 2 * t * k * k + 2 * bases
        per_worker = 8 * (7 * rows * t + 2 * (TILE_CROSS * k) ** 2) + cross_strip_bytes(t, k)
        workers = 1
        release = 3 * bases + 8 * (7 * d * d + d * k)
    distance_step = held + counts + workers * per_worker
    release_step = held + counts + release
    return allowance(partition + max(subset_step, distance_step, release_step))
