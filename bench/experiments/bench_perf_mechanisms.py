"""Each mechanism's release time over its linear-algebra floor, in one process on the same data.

    python bench/experiments/bench_perf_mechanisms.py [--rows 50000] [--cols 1000] [--k 5]
        [--repeat 3]
                                          [--only friendly_aggregate,histogram_aggregate]

Times are process CPU seconds with one BLAS thread by default (``--clock wall`` for wall-clock
time with threaded BLAS): on a machine shared with other jobs the wall clock of the same
computation varied 2x between runs here, the CPU time by a few percent.

Floors (issue 15):

* Gram mechanisms (``analyze_gauss``, ``gap_perturbation``, ``smooth_sensitivity``,
  ``spectrum``): one in-memory ``X.T @ X`` of the raw rows plus a full ``eigh`` of it.
* Aggregators (``histogram_aggregate``, ``friendly_aggregate``): the ``t`` subset
  decompositions alone, i.e. the batched top-k route of :mod:`service.mechanisms.sample_aggregate`
  on ``t`` contiguous blocks of ``m`` rows (no partition gather, no aggregation).

The data is a memory map of ``.npy`` (as the worker reads it), rows near a ``k``-dimensional
subspace (distance ``1e-3``) so that every mechanism has a result to release. Each figure is
the median of ``--repeat`` runs (with min and max), and each ratio divides medians measured
in this process. Steps inside a mechanism are timed separately with ``--steps`` (profiles of
what dominates: ``np.unique`` of the cells, the row norms of the clipping, the cross-Gram).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.registry import MECHANISMS
from service.mechanisms.sample_aggregate import _top_k_right_singular

#: "cpu" (process CPU seconds, the default: robust on a shared machine, with one BLAS thread)
#: or "wall" (wall-clock seconds).
CLOCK = {"clock": "cpu"}


def timings(function: Callable[[], Any], repeat: int) -> list[float]:
    """Seconds of ``repeat`` runs on the chosen clock."""
    clock = time.process_time if CLOCK["clock"] == "cpu" else time.perf_counter
    out = []
    for _ in range(repeat):
        start = clock()
        function()
        out.append(clock() - start)
    return out


def show(label: str, runs: list[float], floor: float | None = None) -> float:
    """Print the median (min-max) and the ratio over ``floor``; return the median."""
    median = statistics.median(runs)
    ratio = "" if floor is None else f"  ratio {median / floor:5.2f}x"
    print(f"  {label:<38} {median:7.3f} s  ({min(runs):.3f}-{max(runs):.3f}){ratio}", flush=True)
    return median


def planted(n: int, d: int, k: int, distance: float, seed: int = 0) -> np.ndarray:
    """Rows ``N(0, I_k)`` in a random k-dim subspace plus isotropic noise of norm ~``distance``."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((d, k)))
    rows = rng.standard_normal((n, k)) @ basis.T
    rows += rng.standard_normal((n, d)) * (distance / np.sqrt(d))
    return np.asarray(rows, dtype=np.float64)


PARAMS: dict[str, dict[str, Any]] = {
    "analyze_gauss": {"clip_norm": 10.0},
    "gap_perturbation": {"clip_norm": 10.0},
    "smooth_sensitivity": {"clip_norm": 10.0},
    "spectrum": {"clip_norm": 10.0},
    "histogram_aggregate": {"cell_width": 0.5},
    "friendly_aggregate": {},
    "friendly_aggregate[projection]": {"aggregator": "projection"},
}
AGGREGATORS = ("histogram_aggregate", "friendly_aggregate", "friendly_aggregate[projection]")


def release(data: np.ndarray, name: str, k: int) -> Callable[[], Any]:
    mechanism = MECHANISMS[name.split("[")[0]]
    ctx = PublicContext(n_rows=data.shape[0], n_cols=data.shape[1], row_norm_bound=None)
    params = mechanism.prepare(ctx, k, 1.0, 1e-6, mechanism.parse_params(PARAMS[name]))
    spec = ReleaseSpec(k=k, epsilon=1.0, delta=1e-6, params=params)

    def run() -> Any:
        return mechanism.run(data, spec, np.random.default_rng(1))

    return run


def subset_floor(data: np.ndarray, t: int, k: int) -> Callable[[], Any]:
    """The t subset decompositions on contiguous blocks (in groups, as subset_bases reads)."""
    n, d = data.shape
    m = n // t
    per_group = max(1, 8192 // m)

    def run() -> None:
        for start in range(0, t, per_group):
            stop = min(t, start + per_group)
            block = np.asarray(data[start * m : stop * m], dtype=np.float64)
            _top_k_right_singular(block.reshape(stop - start, m, d), k)

    return run


# ---------------------------------------------------------------------------------------------
# Steps, each against the implementation it replaced (kept here only as the baseline)


def previous_clip_rows(rows: np.ndarray, clip_norm: float) -> np.ndarray:
    """clip_rows before the einsum fast path: every row scaled, always a copy."""
    from service.mechanisms.linalg import power_of_two_exponent

    block = np.asarray(rows, dtype=np.float64)
    exponent = power_of_two_exponent(np.max(np.abs(block), axis=1))
    with np.errstate(over="ignore", under="ignore"):
        scaled = np.ldexp(block, -exponent[:, None])
        norms = np.linalg.norm(scaled, axis=1)
        limit = np.ldexp(clip_norm, -exponent)
    keep = norms <= limit
    factor = np.where(keep, 0.0, clip_norm / np.where(keep, 1.0, norms))
    scaled *= factor[:, None]
    return np.asarray(np.where(keep[:, None], block, scaled))


def previous_clipped_gram(data: np.ndarray, clip_norm: float) -> np.ndarray:
    gram = np.zeros((data.shape[1], data.shape[1]))
    for start in range(0, data.shape[0], 8192):
        block = previous_clip_rows(np.asarray(data[start : start + 8192]), clip_norm)
        gram += block.T @ block
    return gram


def previous_projection_mean(bases: np.ndarray, weights: np.ndarray, total: float) -> np.ndarray:
    _, d, k = bases.shape
    stacked = bases.transpose(1, 0, 2).reshape(d, -1)
    return np.asarray((stacked * np.repeat(weights / total, k)) @ stacked.T)


def steps(data: np.ndarray, k: int, repeat: int) -> None:
    """Each fixed step against its previous implementation (and the Gram against ``X^T X``)."""
    from service.mechanisms import friendly_aggregate as fa
    from service.mechanisms.histogram_aggregate import cell_counts
    from service.mechanisms.linalg import clipped_gram
    from service.mechanisms.sample_aggregate import random_partition, subset_bases

    n, d = data.shape
    print("steps (each against the code it replaced, same process, same data):", flush=True)
    in_memory = np.asarray(data)
    floor = show("X^T X (in memory, syrk)", timings(lambda: in_memory.T @ in_memory, repeat))
    show("clipped_gram before", timings(lambda: previous_clipped_gram(data, 10.0), repeat), floor)
    show("clipped_gram now", timings(lambda: clipped_gram(data, 10.0), repeat), floor)
    over = float(np.median(np.linalg.norm(in_memory[:8192], axis=1)))  # half the rows clipped
    show(
        "clipped_gram before, half clipped",
        timings(lambda: previous_clipped_gram(data, over), repeat),
        floor,
    )
    show("clipped_gram now, half clipped", timings(lambda: clipped_gram(data, over), repeat), floor)

    t = min(n // (10 * k), 1000)
    rng = np.random.default_rng(2)
    bases = subset_bases(data, random_partition(n, t, rng), k)
    ref = rng.standard_normal((2 * k, d))
    points = np.matmul(np.matmul(ref, bases), bases.transpose(0, 2, 1)).reshape(t, -1)
    cells = np.floor((points - rng.uniform(0, 0.5, points.shape[1])) / 0.5)
    before = show(
        f"histogram cells np.unique ({t} x {cells.shape[1]})",
        timings(lambda: np.unique(cells, axis=0, return_counts=True), repeat),
    )
    show("histogram cells cell_counts", timings(lambda: cell_counts(cells), repeat), before)

    weights = rng.uniform(0.0, 1.0, t)
    total = float(weights.sum())
    before = show(
        f"projection mean before (d={d}, tk={t * k})",
        timings(lambda: previous_projection_mean(bases, weights, total), repeat),
    )
    show(
        "projection mean now (syrk)",
        timings(lambda: fa.projection_mean(bases, weights, total), repeat),
        before,
    )
    radii = fa.radius_grid(float(np.sqrt(2 * k)), fa.PROJECTION_RADIUS_STEPS)
    rows = fa.block_rows(t, k * k)
    show(
        f"projection distances (t={t}, blocks of {rows})",
        timings(
            lambda: fa.count_friends(fa.projection_distance_block(bases), t, radii, rows=rows),
            repeat,
        ),
    )
    small = bases[:200]
    show(
        "projection distances t=200 (one block)",
        timings(
            lambda: fa.count_friends(fa.projection_distance_block(small), 200, radii, rows=200),
            repeat,
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--cols", type=int, default=1_000)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated mechanism names")
    parser.add_argument("--steps", action="store_true", help="time the fixed steps only")
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="cpu: process CPU time with one BLAS thread (default; robust when the machine is "
        "shared); wall: wall-clock time with the BLAS threads the machine gives",
    )
    args = parser.parse_args()
    CLOCK["clock"] = args.clock
    if args.clock == "cpu":
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

        threadpool_limits(limits=1)
    names = [n for n in PARAMS if not args.only or n.split("[")[0] in args.only.split(",")]
    n, d, k = args.rows, args.cols, args.k
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.npy"
        np.save(path, planted(n, d, k, 1e-3))
        data = np.load(path, mmap_mode="r")
        print(
            f"n = {n}, d = {d}, k = {k}, median (min-max) of {args.repeat} runs, "
            f"{args.clock} seconds",
            flush=True,
        )
        if args.steps:
            steps(data, k, args.repeat)
            return

        def gram_floor() -> None:
            x = np.asarray(data)
            np.linalg.eigh(x.T @ x)

        floors: dict[str, float] = {}
        if any(name not in AGGREGATORS for name in names):
            floors["gram"] = show("floor: X^T X + eigh", timings(gram_floor, args.repeat))
        for name in names:
            if name in AGGREGATORS:
                mechanism = MECHANISMS[name.split("[")[0]]
                ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=None)
                t = mechanism.prepare(ctx, k, 1.0, 1e-6, mechanism.parse_params(PARAMS[name])).t
                key = f"subsets t={t}"
                if key not in floors:
                    floors[key] = show(
                        f"floor: {t} subset decompositions",
                        timings(subset_floor(data, t, k), args.repeat),
                    )
                floor = floors[key]
            else:
                floor = floors["gram"]
            show(name, timings(release(data, name, k), args.repeat), floor)


if __name__ == "__main__":
    main()
