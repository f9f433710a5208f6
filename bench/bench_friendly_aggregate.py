"""Benchmark friendly_aggregate at n = 100,000, d = 1,000, k = 5 (defaults: t = 2000, q = 10).

Writes the data to a .npy file and reads it back as a memory map, as the service does, then
times, in the same process: the full mechanism, its stages, and analyze_gauss on the same data
(the baseline the ratio is against). Also times the naive per-pair distance loop on a slice and
extrapolates it to all t(t-1)/2 pairs, to show what the one-Gram-matrix route saves.

    .venv/bin/python bench/bench_friendly_aggregate.py [--n 100000 --d 1000 --k 5 --repeat 3]

A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from service.mechanisms.analyze_gauss import analyze_gauss
from service.mechanisms.friendly_aggregate import default_t, friendly_aggregate, gram_distances
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
        points = reference_embeddings(bases, reference_points(q, d, stage_rng))
        points -= points.mean(axis=0)
        t_embed = time.perf_counter() - start
        start = time.perf_counter()
        distances = gram_distances(points)
        t_gram = time.perf_counter() - start

        pairs = 20_000
        start = time.perf_counter()
        naive = np.empty(pairs)
        for idx in range(pairs):
            j, l_ = divmod(idx, t)
            naive[idx] = float(np.linalg.norm(points[j] - points[l_]))
        t_naive = (time.perf_counter() - start) * (t * (t - 1) / 2) / pairs
        check = distances.ravel()[:pairs]
        assert np.allclose(naive, check, atol=1e-9 * max(1.0, float(check.max())))

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
        f"Gram distances {t_gram:.2f} s"
    )
    print(
        f"naive per-pair distance loop (extrapolated from {pairs} pairs): {t_naive:.1f} s, "
        f"{t_naive / t_gram:.0f}x the Gram route"
    )


if __name__ == "__main__":
    main()
