"""Timing of ``exact_gapmax`` scoring against its stated cost (a benchmark, not a test).

The docstring of :mod:`service.mechanisms.exact_gapmax` states the cost of scoring as
``O(C(n0, k) n0 d k)``. This measures one release on data in general position (the worst case:
no candidate is skipped) and on data in one subspace (the skip makes it almost free), and prints
seconds per unit of ``C(n0, k) n0 d`` for several sizes; a flat ratio confirms the cost model.
Baseline in the same process: a plain numpy matmul of the same number of flops.

Run: ``.venv/bin/python bench/bench_exact_gapmax.py``
"""

from __future__ import annotations

import time

import numpy as np

from service.mechanisms.exact_gapmax import (
    MAX_SCORING_WORK,
    default_sample_rows,
    exact_gapmax,
    scoring_work,
)


def timed(data: np.ndarray, k: int, n0: int, rng: np.random.Generator) -> float:
    start = time.perf_counter()
    exact_gapmax(data, k, 1.0, 1e-6, k - 1, 1e-9, n0, rng)
    return time.perf_counter() - start


def matmul_baseline(work: int, k: int) -> float:
    """Seconds for ``work * k`` multiply-adds as one float64 matmul."""
    side = max(1, round((work * k) ** (1 / 3)))
    a = np.random.default_rng(0).standard_normal((side, side))
    start = time.perf_counter()
    a @ a
    return time.perf_counter() - start


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"MAX_SCORING_WORK = {MAX_SCORING_WORK:.2g} (= C(n0, k) n0 d)")
    print(
        f"{'case':>8} {'n0':>5} {'k':>2} {'d':>5} {'work':>9} {'seconds':>8} "
        f"{'ns/unit':>8} {'matmul s':>9} {'ratio':>6}"
    )
    for n0, k, d in [
        (150, 2, 10),
        (300, 2, 10),
        (400, 2, 10),
        (737, 2, 10),
        (120, 3, 10),
        (186, 3, 10),
        (200, 2, 100),
        (159, 2, 1000),
    ]:
        work = scoring_work(n0, k, d)
        basis = np.linalg.qr(rng.standard_normal((d, k)))[0]
        for case, data in [
            ("general", rng.standard_normal((n0, d))),
            ("exact", rng.standard_normal((n0, k)) @ basis.T),
        ]:
            seconds = timed(data, k, n0, rng)
            base = matmul_baseline(work, k)
            print(
                f"{case:>8} {n0:>5} {k:>2} {d:>5} {work:>9.2e} {seconds:>8.3f} "
                f"{1e9 * seconds / work:>8.2f} {base:>9.4f} {seconds / base:>6.0f}"
            )
    print(
        "default n0 at the cap:",
        {
            (n, k, d): default_sample_rows(n, k, d)
            for n, k, d in [(10**6, 1, 10), (10**6, 2, 10), (10**6, 3, 10), (10**6, 2, 1000)]
        },
    )


if __name__ == "__main__":
    main()
