"""Issue 35, item 1: CPU time of the aggregators over the bare ``X^T X`` of the same rows.

    python -m bench.bench_aggregator_speed [--reps 3] [--dims 100 400 1000] [--kinds near power]
        [--before]

In one process, interleaved per repetition: ``X^T X`` of the rows (the floor: one BLAS call,
what ``analyze_gauss`` cannot do without), then ``friendly_aggregate`` and ``histogram_aggregate``
at their default params (``prepare`` then ``run``, as the worker calls them), eps 1,
delta 1e-6, k = 10, on 50,000 rows of d = 100, 400 and 1,000. Two kinds of rows: "near" lie
within 1e-3 of a random 10-dimensional subspace (the regime the aggregators are for: their
subsets agree), "power" have a power-law spectrum (variance 1/i along axis i; no gap after
k, the subsets do not agree; before the eighth pass the certified iteration could not certify
them and kept their Ritz vectors, now every block takes the same fixed sketch). Prints the
median CPU seconds (``time.process_time``) of each and its ratio to the median ``X^T X``, then
the median and range of the per-repetition ratios (each over the ``X^T X`` measured just
before it: the spread on a shared machine), and the 1-minute load average; the goals
(issue 35) are at most 5x at d = 100 and 1.5x at d = 1,000. BLAS runs on one thread
(threadpoolctl): a spinning BLAS thread on the shared machine bills CPU that is not work.
With ``--before`` each repetition also runs both aggregators with the subset bases of before
(``subset_top_k.SKETCH_ROUTE = False``: the certified iteration on each block's Gram), in the
same process and against the same ``X^T X``, as columns marked "(before)". With ``--no-screen``
likewise ``friendly_aggregate`` with every exact tile computed where the centred band is
useless (``friendly_weights.SINGLE_SCREEN = False``, the friend counts of before the ninth
pass; the same counts), as a column marked "(no screen)".
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from service.mechanisms import friendly_weights, subset_top_k
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism

Rows = np.ndarray[Any, Any]
N, K, EPS, DELTA = 50_000, 10, 1.0, 1e-6
MECHANISMS = ("friendly_aggregate", "histogram_aggregate")
DISTANCE = 1e-3


def rows_of(kind: str, n: int, d: int, seed: int = 0) -> Rows:
    """``n x d`` rows of norm at most 1: near a k-dimensional subspace, or power-law."""
    rng = np.random.default_rng(seed)
    if kind == "near":
        basis, _ = np.linalg.qr(rng.standard_normal((d, K)))
        x = rng.standard_normal((n, K)) @ basis.T / np.sqrt(K)
        x += DISTANCE * rng.standard_normal((n, d)) / np.sqrt(d)
    else:
        x = rng.standard_normal((n, d)) / np.sqrt(np.arange(1, d + 1))
        x /= np.sqrt(np.sum(1.0 / np.arange(1, d + 1)))
    norms = np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    return np.ascontiguousarray(x / norms)


def floor_cpu(rows: Rows) -> float:
    start = time.process_time()
    rows.T @ rows
    return time.process_time() - start


def release_cpu(name: str, rows: Rows, seed: int) -> tuple[float, str]:
    """CPU seconds and outcome of one release; ``name`` may end in " (before)": the subset
    bases of before (``SKETCH_ROUTE = False``), or in " (no screen)": every exact tile where
    the band is useless (``SINGLE_SCREEN = False``), for this release only."""
    before = name.endswith(" (before)")
    subset_top_k.SKETCH_ROUTE = not before
    friendly_weights.SINGLE_SCREEN = not name.endswith(" (no screen)")
    try:
        return _release_cpu(name.removesuffix(" (before)").removesuffix(" (no screen)"), rows, seed)
    finally:
        subset_top_k.SKETCH_ROUTE = True
        friendly_weights.SINGLE_SCREEN = True


def _release_cpu(name: str, rows: Rows, seed: int) -> tuple[float, str]:
    mechanism = get_mechanism(name)
    assert mechanism is not None
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    start = time.process_time()
    params = mechanism.prepare(ctx, K, EPS, DELTA, mechanism.parse_params({}))
    out = mechanism.run(rows, ReleaseSpec(K, EPS, DELTA, params), np.random.default_rng(seed))
    elapsed = time.process_time() - start
    return elapsed, "no_result" if out.basis is None else "basis"


def table(
    reps: int, dims: list[int], kinds: list[str], before: bool = False, no_screen: bool = False
) -> None:
    columns = [*MECHANISMS, *(f"{name} (before)" for name in MECHANISMS if before)]
    columns += ["friendly_aggregate (no screen)"] if no_screen else []
    names = " | ".join(f"{name} CPU s (ratio; per-run median, range)" for name in columns)
    print(f"| n x d | rows | X^T X CPU s | {names} | load |")
    print("|---|---|---|" + "---|" * len(columns) + "---|")
    for d in dims:
        for kind in kinds:
            rows = rows_of(kind, N, d)
            floors: list[float] = []
            times: dict[str, list[float]] = {name: [] for name in columns}
            ratios: dict[str, list[float]] = {name: [] for name in columns}
            outcomes: dict[str, set[str]] = {name: set() for name in columns}
            for rep in range(reps + 1):
                floor = floor_cpu(rows)
                measured = {name: release_cpu(name, rows, rep) for name in columns}
                if rep == 0:
                    continue  # warm-up: imports, BLAS buffers, page faults
                floors.append(floor)
                for name, (cpu, outcome) in measured.items():
                    times[name].append(cpu)
                    ratios[name].append(cpu / max(floor, 1e-9))
                    outcomes[name].add(outcome)
            base = float(np.median(floors))
            cells = " | ".join(
                f"{float(np.median(times[name])):.3f} ({float(np.median(times[name])) / base:.1f}x"
                f"; {float(np.median(ratios[name])):.2f}x, {min(ratios[name]):.2f}-"
                f"{max(ratios[name]):.2f}x, {'/'.join(sorted(outcomes[name]))})"
                for name in columns
            )
            load = os.getloadavg()[0]
            print(f"| {N:,} x {d:,} | {kind} | {base:.3f} | {cells} | {load:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dims", type=int, nargs="+", default=[100, 400, 1000])
    parser.add_argument("--kinds", nargs="+", default=["near", "power"])
    parser.add_argument("--before", action="store_true", help="also the subset bases of before")
    parser.add_argument(
        "--no-screen", action="store_true", help="also friendly with every exact tile computed"
    )
    args = parser.parse_args()
    with threadpool_limits(limits=1):
        table(args.reps, args.dims, args.kinds, args.before, args.no_screen)


if __name__ == "__main__":
    main()
