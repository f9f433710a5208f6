"""Benchmark friendly_aggregate at n = 100,000, d = 1,000, k = 5 (defaults: t = 2000, q = 10).

Writes the data to a .npy file and reads it back as a memory map, as the service does, then
times, in the same process: the full mechanism, its stages, and analyze_gauss on the same data
(the baseline the ratio is against). The distance stage is the mechanism's own: per-pair direct
differences in cache-sized tiles, counted against the whole radius grid in blocks on
``distance_workers()`` threads. It is timed against the Gram route the mechanism used before
(one ``t x t`` Gram matrix of the points centred on their mean: fast, but one far point changes
the rounding of every pair) and against the same direct differences without tiling, and the
direct counts are checked against the Gram-route distances.

    .venv/bin/python bench/experiments/bench_friendly_aggregate.py \
        [--n 100000 --d 1000 --k 5 --repeat 3]

A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.spatial.distance import cdist

from service.mechanisms.analyze_gauss import analyze_gauss
from service.mechanisms.friendly_aggregate import (
    block_rows,
    count_friends,
    default_t,
    distance_workers,
    friend_counts,
    friendly_aggregate,
    radius_grid,
    reference_distance_block,
)
from service.mechanisms.linalg import subspace_distance
from service.mechanisms.sample_aggregate import (
    partition_and_bases,
    reference_embeddings,
    reference_points,
)


def write_data(path: Path, n: int, d: int, k: int, distance: float, seed: int) -> np.ndarray:
    """Rows of norm <= 1 within ``distance`` of a random k-dim subspace, written in chunks."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((d, k)))
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, d))
    for start in range(0, n, 10_000):
        rows = min(10_000, n - start)
        coords = rng.standard_normal((rows, k))
        coords *= rng.uniform(0.2, 0.9, (rows, 1)) / np.linalg.norm(coords, axis=1, keepdims=True)
        resid = rng.standard_normal((rows, d))
        resid -= (resid @ basis) @ basis.T
        resid *= distance / np.linalg.norm(resid, axis=1, keepdims=True)
        out[start : start + rows] = coords @ basis.T + resid
    out.flush()
    del out
    return basis


def best_of(repeat: int, fn: object) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--d", type=int, default=1000)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--distance", type=float, default=1e-5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n, d, k = args.n, args.d, args.k
    t, q = default_t(n, k), 2 * k

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.npy"
        basis = write_data(path, n, d, k, args.distance, seed=0)
        data = np.load(path, mmap_mode="r")
        np.asarray(data).sum()  # warm the page cache so both timings read from memory

        rng = np.random.default_rng(1)
        fa_time, result = best_of(
            args.repeat, lambda: friendly_aggregate(data, k, 1.0, 1e-6, rng, t=t)
        )
        ag_time, ag = best_of(args.repeat, lambda: analyze_gauss(data, k, 1.0, 1e-6, 1.0, rng))

        stage_rng = np.random.default_rng(2)
        start = time.perf_counter()
        _, bases = partition_and_bases(data, t, k, stage_rng)
        t_bases = time.perf_counter() - start
        start = time.perf_counter()
        ref = reference_points(q, d, stage_rng)
        points = reference_embeddings(bases, ref)
        t_embed = time.perf_counter() - start
        radii = radius_grid(float(np.linalg.norm(ref)))

        t_gram, gram = best_of(args.repeat, lambda: gram_route(points))
        t_direct, counts = best_of(
            args.repeat,
            lambda: count_friends(
                reference_distance_block(points),
                t,
                radii,
                rows=block_rows(t),
                workers=distance_workers(),
            ),
        )
        t_untiled, _ = best_of(1, lambda: untiled_rows(points))
        # The two routes agree except for pairs within rounding of a radius.
        mismatch = max(
            int(np.abs(friend_counts(gram, float(r)) - counts[:, i]).max())  # type: ignore[arg-type, index]
            for i, r in enumerate(radii)
            if r > 1e-6 * radii[-1]
        )
    fa_basis = result.basis  # type: ignore[attr-defined]
    fa_err = subspace_distance(fa_basis, basis) if fa_basis is not None else math.nan
    ag_err = subspace_distance(ag[0], basis)  # type: ignore[index]
    print(
        f"n={n} d={d} k={k} t={t} q={q} distance-to-subspace={args.distance:g}, eps=1, delta=1e-6"
    )
    print(f"friendly_aggregate: {fa_time:.2f} s (best of {args.repeat}), error {fa_err:.2e}")
    print(f"analyze_gauss:      {ag_time:.2f} s (best of {args.repeat}), error {ag_err:.2e}")
    print(f"time ratio friendly_aggregate / analyze_gauss: {fa_time / ag_time:.2f}")
    print(
        f"stages: partition+subset SVDs {t_bases:.2f} s, reference embeddings {t_embed:.2f} s, "
        f"distances and counts at {radii.shape[0]} radii {t_direct:.2f} s"
    )
    print(
        f"distances: direct differences, tiled, {distance_workers()} thread(s) {t_direct:.2f} s; "
        f"old Gram route after centring {t_gram:.2f} s; ratio direct/Gram "
        f"{t_direct / t_gram:.2f}; untiled direct differences, 1 thread {t_untiled:.2f} s "
        f"(tiling+threads gain {t_untiled / t_direct:.1f}x); largest count difference between "
        f"the routes at radii >= 1e-6 r_max: {mismatch}"
    )


def gram_route(points: np.ndarray) -> np.ndarray:
    """The former distance step (baseline only): centre on the mean, one Gram matrix."""
    centred = points - points.mean(axis=0)
    gram = centred @ centred.T
    sq = np.diagonal(gram).copy()
    dist2 = sq[:, None] + sq[None, :] - 2.0 * gram
    np.maximum(dist2, 0.0, out=dist2)
    np.fill_diagonal(dist2, 0.0)
    return np.sqrt(dist2, out=dist2)


def untiled_rows(points: np.ndarray) -> None:
    """Direct differences one block of 256 rows against all later rows, no tiles, no threads."""
    t = points.shape[0]
    for start in range(0, t, 256):
        cdist(points[start : start + 256], points[start:])


if __name__ == "__main__":
    main()
