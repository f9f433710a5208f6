"""Fix ``c2`` of ``histogram_aggregate``'s width rule by simulation (not a test).

ALGORITHMS.md (M5) derives the cell width from the assumed gap ``gamma`` as
``w = c2 gamma sqrt(dk) (sqrt(k) + sqrt(ln(kt))) / sqrt(m)`` and leaves ``c2`` to simulation.

Model (seed 003, Remark 4.2): rows ``~ N(0, Sigma)`` with ``k`` eigenvalues 1 and ``d - k``
eigenvalues ``gamma^2`` in a random basis. For each setting we draw the ``t`` points ``y_j`` of
step 1 (q = 2k reference points) and compute, over the uniform per-coordinate grid offsets, the
exact probability that all ``t`` points share one cell: ``prod_c max(0, 1 - R_c / w)`` with
``R_c`` the range of coordinate ``c``. The smallest ``w`` with probability 0.9 (bisection), divided
by the formula's ``w / c2``, is the ``c2`` this trial needs. ``c2`` is scale free in ``gamma`` (we
check two values). Prints the needed ``c2`` per setting (median and max over trials).

Second criterion ("half"), the one Algorithm 2 actually needs: some cell holds at least ``t/2``
points, with probability 0.9 over ``OFFSETS`` random offsets. ``C2_WIDTH`` is chosen to cover
the worst "half" value over ``d <= 20``, ``k <= 3``; the "all" values (5-15 times larger, and
growing like ``sqrt(qd)``) are printed for comparison. Takes a few minutes on one core.

Run: ``.venv/bin/python bench/experiments/simulate_gamma_width.py``
"""

from __future__ import annotations

import math
import time

import numpy as np

from service.mechanisms.histogram_aggregate import C2_WIDTH, width_from_gamma
from service.mechanisms.sample_aggregate import (
    partition_and_bases,
    reference_embeddings,
    reference_points,
)

TARGET = 0.9
OFFSETS = 50


def needed_c2(
    d: int, k: int, m: int, t: int, gamma: float, rng: np.random.Generator
) -> tuple[float, float]:
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
    scales = np.r_[np.ones(k), np.full(d - k, gamma)]
    data = (rng.standard_normal((t * m, d)) * scales) @ basis.T
    _, bases = partition_and_bases(data, t, k, rng)
    y = reference_embeddings(bases, reference_points(2 * k, d, rng))
    ranges = y.max(axis=0) - y.min(axis=0)

    def p_all(w: float) -> float:
        return float(np.prod(np.maximum(0.0, 1.0 - ranges / w)))

    low, high = float(ranges.max()), float(ranges.max())
    while p_all(high) < TARGET:
        high *= 2
    for _ in range(60):
        mid = math.sqrt(low * high)
        low, high = (low, mid) if p_all(mid) >= TARGET else (mid, high)
    base = width_from_gamma(gamma, d, k, t, m, c2=1.0)
    all_in_one = high / base

    # Half criterion (what Algorithm 2 needs: a cell holding >= t/2 points), over OFFSETS fixed
    # random offsets in units of w (common random numbers keep the bisection monotone enough).
    unit_offsets = rng.uniform(0.0, 1.0, size=(OFFSETS, y.shape[1]))

    def p_half(w: float) -> float:
        hits = 0
        for off in unit_offsets:
            _, counts = np.unique(np.floor(y / w - off), axis=0, return_counts=True)
            hits += counts.max() >= t / 2
        return hits / OFFSETS

    low, high = float(ranges.max()) / 10, high
    for _ in range(12):
        mid = math.sqrt(low * high)
        low, high = (low, mid) if p_half(mid) >= TARGET else (mid, high)
    return all_in_one, high / base


def main() -> None:
    rng = np.random.default_rng(20240601)
    trials = 3
    print(f"needed c2 (median/max over {trials} trials) for probability {TARGET} that all t points")
    print(f"share one cell ('all') and that one cell holds >= t/2 ('half'); C2_WIDTH = {C2_WIDTH}")
    print(
        f"{'d':>4} {'k':>2} {'m':>4} {'t':>5} {'gamma':>7} {'all med':>8} {'all max':>8} "
        f"{'half med':>8} {'half max':>8}"
    )
    worst_all = worst_half = 0.0
    start = time.perf_counter()
    for d in (5, 10, 20):
        for k in (1, 2, 3):
            for m_per_k in (10, 40):
                for gamma in (1e-3, 1e-6):
                    m, t = m_per_k * k, 200
                    need = np.array([needed_c2(d, k, m, t, gamma, rng) for _ in range(trials)])
                    worst_all = max(worst_all, need[:, 0].max())
                    worst_half = max(worst_half, need[:, 1].max())
                    med, top = np.median(need, axis=0), need.max(axis=0)
                    print(
                        f"{d:>4} {k:>2} {m:>4} {t:>5} {gamma:>7.0e} {med[0]:>8.1f} "
                        f"{top[0]:>8.1f} {med[1]:>8.1f} {top[1]:>8.1f}"
                    )
    elapsed = time.perf_counter() - start
    print(f"worst 'all' c2: {worst_all:.1f}; worst 'half' c2: {worst_half:.1f} ({elapsed:.0f} s)")
    print(f"C2_WIDTH = {C2_WIDTH} covers 'half' everywhere: {worst_half <= C2_WIDTH}")


if __name__ == "__main__":
    main()
