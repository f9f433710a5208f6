"""Issue 35, item 1: the aggregators' accuracy with the subset bases of before and of now.

    python -m bench.bench_aggregator_route_accuracy [--seeds 2] [--dims 100 300 1000] [--k 10]

``friendly_aggregate`` and ``histogram_aggregate`` at their defaults on cells like the
``auto`` grid's (bench_auto_grid: rows within ``distance`` of a planted subspace,
``bench.core.near_subspace``; delta 1e-6, clip 1, released through the registry as
``bench.grids.run_one`` does) but at k = 10: the defaults use subsets of ``m = 10 k`` rows,
so the new route (``min(m, d) >= 8 (k + 2)``) is taken from k = 8 on, never at the grid's
k = 3. n in {20,000, 50,000}, eps in {0.3, 1}. Each release runs twice
with the same data and the same seed: with the subset bases of before
(``subset_top_k.SKETCH_ROUTE = False``: the certified iteration on each block's Gram) and of
now (one fixed round of randomized subspace iteration on the rows, ``_sketch_top_k``).
Prints per cell the median error ``||Pi_hat - Pi||_2`` of each (a ``no_result`` counts 1),
how many of the paired releases are bit-identical in their basis, and the largest paired
difference; the last line sums the cells. Where ``min(n/t, d) < 8 (k + 2) = 40`` both
releases take the Gram route and are identical by construction. Cells the mechanism refuses
(public sizes) are left out.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

from bench.core import near_subspace
from service.mechanisms import subset_top_k
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.linalg import subspace_distance
from service.mechanisms.registry import get_mechanism

MECHANISMS = ("friendly_aggregate", "histogram_aggregate")


def release_error(
    name: str, data: np.ndarray, basis: np.ndarray, k: int, eps: float, seed: int
) -> float:
    """``||Pi_hat - Pi||_2`` of one release at the defaults (1 for ``no_result``; NaN refused)."""
    mechanism = get_mechanism(name)
    assert mechanism is not None
    n, d = data.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    try:
        params = mechanism.prepare(ctx, k, eps, 1e-6, mechanism.parse_params({}))
    except ValueError:
        return float("nan")
    out = mechanism.run(
        data, ReleaseSpec(k, eps, 1e-6, params), np.random.default_rng(10_000 + seed)
    )
    return 1.0 if out.basis is None else float(subspace_distance(out.basis, basis))


def paired(
    name: str, data: np.ndarray, basis: np.ndarray, k: int, eps: float, seed: int
) -> list[float]:
    errors = []
    for sketch in (False, True):
        subset_top_k.SKETCH_ROUTE = sketch
        try:
            errors.append(release_error(name, data, basis, k, eps, seed))
        finally:
            subset_top_k.SKETCH_ROUTE = True
    return errors


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--dims", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--rows", type=int, nargs="+", default=[20_000, 50_000])
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    print(f"k = {args.k}, {args.seeds} seeds")
    print("| d | distance | n | eps | mechanism | median error before | now | same | max diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    totals = {name: [0.0, 0.0, 0, 0] for name in MECHANISMS}
    cells = itertools.product(args.dims, (1e-1, 1e-2, 1e-3, 1e-5), args.rows, (0.3, 1.0))
    for d, distance, n, eps in cells:
        for name in MECHANISMS:
            pairs = []
            for seed in range(args.seeds):
                data, basis = near_subspace(n, d, args.k, distance, seed)
                pairs.append(paired(name, data, basis, args.k, eps, seed))
            before, now = np.array(pairs).T
            if not np.isfinite(before).any():
                continue  # refused at these sizes (both routes: refusals read public sizes)
            same = int(np.sum(before == now))
            totals[name][0] += float(np.sum(before))
            totals[name][1] += float(np.sum(now))
            totals[name][2] += same
            totals[name][3] += len(pairs)
            print(
                f"| {d} | {distance:g} | {n:,} | {eps:g} | {name} | {np.median(before):.3g} | "
                f"{np.median(now):.3g} | {same}/{len(pairs)} | "
                f"{float(np.max(np.abs(before - now))):.2g} |",
                flush=True,
            )
    for name, (before_sum, now_sum, same, count) in totals.items():
        print(
            f"{name}: mean error before {before_sum / count:.4g}, now {now_sum / count:.4g}, "
            f"identical {same}/{count}"
        )


if __name__ == "__main__":
    main()
