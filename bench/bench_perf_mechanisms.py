"""Each mechanism's release time over its linear-algebra floor, in one process on the same data.

    python bench/bench_perf_mechanisms.py [--rows 50000] [--cols 1000] [--k 5] [--repeat 3]
                                          [--only friendly_aggregate,histogram_aggregate]

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


def timings(function: Callable[[], Any], repeat: int) -> list[float]:
    """Wall-clock seconds of ``repeat`` runs."""
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        out.append(time.perf_counter() - start)
    return out


def show(label: str, runs: list[float], floor: float | None = None) -> float:
    """Print the median (min-max) and the ratio over ``floor``; return the median."""
    median = statistics.median(runs)
    ratio = "" if floor is None else f"  ratio {median / floor:5.2f}x"
    print(f"  {label:<34} {median:7.3f} s  ({min(runs):.3f}-{max(runs):.3f}){ratio}", flush=True)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--cols", type=int, default=1_000)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated mechanism names")
    args = parser.parse_args()
    names = [n for n in PARAMS if not args.only or n.split("[")[0] in args.only.split(",")]
    n, d, k = args.rows, args.cols, args.k
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.npy"
        np.save(path, planted(n, d, k, 1e-3))
        data = np.load(path, mmap_mode="r")
        print(f"n = {n}, d = {d}, k = {k}, median of {args.repeat} runs", flush=True)

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
