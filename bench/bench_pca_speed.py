"""Issue 32, item 5: CPU time of the recommended PCA settings against the default.

    python -m bench.bench_pca_speed [--reps 5]

In one process, interleaved per repetition: ``analyze_gauss`` at its default params (uncentred,
no clip quantile) and at the recommended ones (``center: "private"``, which now gets the
default clip quantile and the centring choice), eps 1, delta 1e-6, k = 10, through
``prepare`` and ``run``, on rows of norm <= 1 at 3,500 x 784 and 50,000 x 100. Two kinds of
rows, so that each centring route is timed: "offset" (a common mean much larger than the
spread: the mean route) and "spread" (centred power-law rows: the probe takes pairs or none).
Prints the median CPU seconds (``time.process_time``) of each, the route taken and the ratio
recommended / default; the target is at most 1.5. BLAS runs on one thread: a BLAS thread
that spins while the machine's other cores are busy bills CPU time that is not work, and
made the figures swing 2x between repetitions on the shared 2-core machine.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism

Rows = np.ndarray[Any, Any]
SHAPES = ((3500, 784), (50_000, 100))
K, EPS, DELTA = 10, 1.0, 1e-6


def rows_of(kind: str, n: int, d: int, seed: int = 0) -> Rows:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) / np.sqrt(np.arange(1, d + 1))
    x /= np.sqrt(np.sum(1.0 / np.arange(1, d + 1)))
    if kind == "offset":
        x = 0.15 * x + 0.8 * np.ones(d) / np.sqrt(d)
    norms = np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    return np.ascontiguousarray(x / norms)


def cpu_of(rows: Rows, raw: dict[str, Any], seed: int) -> tuple[float, str]:
    mechanism = get_mechanism("analyze_gauss")
    assert mechanism is not None
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    start = time.process_time()
    params = mechanism.prepare(ctx, K, EPS, DELTA, mechanism.parse_params(raw))
    out = mechanism.run(rows, ReleaseSpec(K, EPS, DELTA, params), np.random.default_rng(seed))
    return time.process_time() - start, str(out.extras.get("centring", "-"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    reps = parser.parse_args().reps
    with threadpool_limits(limits=1):
        table(reps)


def table(reps: int) -> None:
    print("| n x d | rows | default CPU s | recommended CPU s | route | ratio |")
    print("|---|---|---|---|---|---|")
    for n, d in SHAPES:
        for kind in ("offset", "spread"):
            rows = rows_of(kind, n, d)
            default, recommended, routes = [], [], set()
            for rep in range(reps + 1):
                base, _ = cpu_of(rows, {}, rep)
                best, route = cpu_of(rows, {"center": "private"}, rep)
                if rep == 0:
                    continue  # warm-up: imports, BLAS threads, page faults
                default.append(base)
                recommended.append(best)
                routes.add(route)
            a, b = float(np.median(default)), float(np.median(recommended))
            print(
                f"| {n:,} x {d} | {kind} | {a:.3f} | {b:.3f} | {'/'.join(sorted(routes))} "
                f"| {b / a:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
