"""Issue 32 item 5, seventh pass: the probe's pairs histogram from a public random subsample of
the pairs, measured before any change to the service (the service does not do this).

    python -m bench.bench_probe_subsample [--seeds 10]          # what users get
    python -m bench.bench_probe_subsample --speed [--reps 31]   # what it saves

The chosen-centring ``analyze_gauss`` pairs all ``m = floor(n/2)`` rows by a public permutation
and its probe counts every pair's norm (a gathered partner and a dot product per pair). The
first ``M`` pairs of that permutation are a uniform random subset of the pairs, drawn from the
release's generator before the data is read, so ``M`` and the subset are public; a row is in
one pair at most, so the counts over the subset have the same l2 sensitivity 2 (no
amplification is claimed). Their noise ``2/mu_Q`` per count weighs against ``M`` instead of
``m``. Variants: ``M`` fixed (8,192 or 2,048), or ``M`` from the public count noise,
``min(m, max(2,048, ceil(c 100 (2/mu_Q))))`` (the pairs' 1% tail, which sets the
explained-variance clip, at least ``c`` noise deviations; ``c`` 2 or 3).

What users get: the same seeds with the probe as it is and with each variant (the variants
only change the pairs' counts: ``read_probe`` patched, reading the first ``M`` pairs' norms the
probe pass computed anyway, ``M`` as the pairs' total): the share of the centred variance the
released basis keeps (median, range over seeds, and the largest seed-by-seed difference), the
routes, the median width of the 90% interval of the stated share and the median
explained-variance clip. Digits and breast_cancer (unit rows), the MNIST sample, the speed
bench's offset and spread rows at 50,000 x 100 and 3,500 x 784, eps 0.3 and 1, k = 10.

``--speed``: recommended over default CPU at 50,000 x 100 in one process (BLAS on one thread,
after warm-up releases at 3,500 x 784 as in ``bench_pca_speed``), with the probe pass replaced
by one that computes only the subset's dot products (the mean route never reads the other
pairs' norms; the none route would, so only the offset rows are timed), and the probe pass
alone, full against subsampled.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from sklearn.datasets import load_breast_cancer, load_digits  # type: ignore[import-untyped]
from threadpoolctl import threadpool_limits

from bench.bench_pca_speed import cpu_of, rows_of
from bench.mnist import load_mnist, unit_rows
from service.mechanisms import analyze_gauss as module
from service.mechanisms import centring_choice as cc
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.fast_rows import (
    _safe_squares,
    clip_factors,
    gram_chunk_rows,
    row_dots,
    row_squares_into,
)
from service.mechanisms.gauss_calibration import gauss_split
from service.mechanisms.linalg import ROUNDING_SLACK, iter_row_chunks

Rows = np.ndarray[Any, Any]
K, DELTA, EPS = 10, 1e-6, 1.0  # EPS: the --speed bench's (bench_pca_speed's)
#: A variant: a fixed M (> 0), or -c for the noise rule with c deviations; None: as shipped.
Variant = int | None
VARIANTS: tuple[Variant, ...] = (None, 8192, 2048, -2, -3)
#: What the variants replace in analyze_gauss's namespace.
PATCHED = ("read_probe", "probe_pass")


def label(variant: Variant) -> str:
    if variant is None:
        return "all pairs"
    return f"M = {variant:,}" if variant > 0 else f"M by noise, c = {-variant}"


def subset_size(variant: int, n_pairs: int, probe_mu: float) -> int:
    """``M`` for a variant: fixed, or from the public count noise (module docstring)."""
    if variant > 0:
        return min(n_pairs, variant)
    wanted = math.ceil(-variant * 100 * cc.PROBE_SENSITIVITY / probe_mu)
    return min(n_pairs, max(2048, wanted))


@contextmanager
def subsampled(variant: Variant, probe_mu: float | None = None) -> Iterator[None]:
    """Patch analyze_gauss's ``read_probe`` to read the pairs' counts over the first ``M``
    pairs (with ``probe_mu``, the releases' probe share: its ``probe_pass`` too, to compute
    only those)."""
    if variant is None:
        yield
        return
    saved = {name: getattr(module, name) for name in PATCHED}
    real_read = saved["read_probe"]
    sizes: dict[int, int] = {}

    def read(
        counts: cc.ProbePass,
        n_rows: int,
        clip: float,
        quantile: float,
        probe_mu: float,
        rng: np.random.Generator,
    ) -> cc.ProbeQuantiles:
        m = subset_size(variant, counts.n_pairs, probe_mu)
        if m < counts.n_pairs:
            if id(counts) in sizes:
                assert sizes[id(counts)] == m  # the fast pass counted the same subset
            else:
                assert counts.pair_norms is not None
                norms = counts.pair_norms[:m]
                counts = dataclasses.replace(
                    counts, counts_p=cc._count(norms, cc.probe_edges(clip), clip)
                )
        quantiles: cc.ProbeQuantiles = real_read(
            dataclasses.replace(counts, n_pairs=m), n_rows, clip, quantile, probe_mu, rng
        )
        return quantiles

    def probe(data: Rows, clip: float, order: Any) -> cc.ProbePass:
        assert probe_mu is not None and variant is not None
        m = subset_size(variant, data.shape[0] // 2, probe_mu)
        out = subset_probe_pass(data, clip, np.asarray(order), m)
        sizes[id(out)] = m
        return out

    patches: dict[str, Any] = {"read_probe": read, "probe_pass": probe}
    for name in PATCHED if probe_mu is not None else PATCHED[:1]:
        setattr(module, name, patches[name])
    try:
        yield
    finally:
        for name, real in saved.items():
            setattr(module, name, real)


def subset_probe_pass(data: Rows, clip: float, order: Rows, m: int) -> cc.ProbePass:
    """``centring_choice.probe_pass`` with dot products for the pairs ``j < m`` only (the same
    statistic per pair, its factors multiplied in another order; ``pair_norms`` None,
    ``n_pairs`` all pairs). Bench rows only: no rescaled route for extreme scales."""
    n, d = data.shape
    chunk = gram_chunk_rows(d)
    first, second = order[0 : 2 * m : 2], order[1 : 2 * m : 2]
    low, high = np.minimum(first, second), np.maximum(first, second)
    owner = np.full(n, m, dtype=np.intp)
    owner[high] = np.arange(m, dtype=np.intp)
    high_by = np.flatnonzero(owner < m)
    low_by = low[owner[high_by]]
    bounds = np.searchsorted(high_by, np.arange(0, (n + chunk - 1) // chunk + 1) * chunk)
    total, factors, squares = np.zeros(d), np.ones(n), np.empty(n)
    dots = np.empty(m)
    limit = clip * clip * (1.0 + ROUNDING_SLACK)
    ones = np.ones(chunk)
    most = max(1, min(chunk, m))
    partner_rows, own_rows = np.empty((most, d)), np.empty((most, d))
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        start = 0
        for number, block in enumerate(iter_row_chunks(data, chunk)):
            stop = start + block.shape[0]
            got = row_squares_into(block, squares[start:stop])
            factor = clip_factors(got, clip) if float(got.max()) > limit else None
            if factor is None:
                total += ones[: block.shape[0]] @ block
            else:
                factors[start:stop] = factor
                total += factor @ block
            lo, hi = int(bounds[number]), int(bounds[number + 1])
            if hi > lo:
                a = np.take(data, low_by[lo:hi], axis=0, out=partner_rows[: hi - lo], mode="clip")
                b = np.take(block, high_by[lo:hi] - start, axis=0, out=own_rows[: hi - lo])
                row_dots(a, b, out=dots[lo:hi])
            start = stop
        assert _safe_squares(squares, clip, squares) is not None
        f_a, f_b = factors[low_by], factors[high_by]
        dots *= -2.0 * f_a * f_b
        dots += f_a * f_a * squares[low_by] + f_b * f_b * squares[high_by]
        np.sqrt(np.maximum(dots * 0.5, 0.0), out=dots)
    edges = cc.probe_edges(clip)
    counts_u = cc._count(np.sqrt(squares), edges, clip)
    counts_p = cc._count(dots, edges, clip)
    return cc.ProbePass(counts_u, counts_p, total, n // 2, factors, None, squares)


def release(x: Rows, eps: float, seed: int) -> Any:
    mechanism = module.AnalyzeGauss()
    n, d = x.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, K, eps, DELTA, mechanism.parse_params({"center": "private"}))
    return mechanism.run(x, ReleaseSpec(K, eps, DELTA, params), np.random.default_rng(seed))


def kept(x: Rows, basis: Rows) -> float:
    centred = x - x.mean(axis=0)
    projected = centred @ basis
    return float(np.sum(projected * projected) / np.sum(centred * centred))


def datasets() -> dict[str, Rows]:
    out = {
        "digits": unit_rows(load_digits().data.astype(np.float64)),
        "breast_cancer": unit_rows(load_breast_cancer().data.astype(np.float64)),
    }
    loaded = load_mnist()
    if loaded is not None:
        out["MNIST 5,000 x 784"] = unit_rows(loaded[0])
    for n, d in ((50_000, 100), (3500, 784)):
        for kind in ("offset", "spread"):
            out[f"{kind} {n:,} x {d}"] = rows_of(kind, n, d)
    return out


def utility(seeds: int) -> None:
    print(
        "| rows | eps | M | kept: median [min, max] | max seed diff | routes "
        "| interval width | variance clip |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, x in datasets().items():
        for eps in (0.3, 1.0):
            base: list[float] = []
            for variant in VARIANTS:
                shares, widths, clips, routes = [], [], [], []
                with subsampled(variant):
                    for seed in range(seeds):
                        out = release(x, eps, seed)
                        shares.append(kept(x, out.basis))
                        low, high = out.extras["explained_variance_ratio_interval"]
                        widths.append(high - low)
                        clips.append(out.extras["variance_clip_norm"])
                        routes.append(out.extras["centring"])
                base = base or shares
                diff = max(abs(a - b) for a, b in zip(shares, base, strict=True))
                tally = ", ".join(f"{r} {routes.count(r)}" for r in sorted(set(routes)))
                print(
                    f"| {name} | {eps} | {label(variant)} | {statistics.median(shares):.4f} "
                    f"[{min(shares):.4f}, {max(shares):.4f}] | {diff:.4f} | {tally} "
                    f"| {statistics.median(widths):.4f} | {statistics.median(clips):.3f} |",
                    flush=True,
                )


def speed(reps: int) -> None:
    mechanism = module.AnalyzeGauss()
    ctx = PublicContext(n_rows=50_000, n_cols=100, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, K, EPS, DELTA, mechanism.parse_params({"center": "private"}))
    probe_mu = gauss_split(EPS, DELTA, params).clip_mu
    with threadpool_limits(1):
        warm = rows_of("spread", 3500, 784)
        for rep in range(3):
            cpu_of(warm, {}, rep)
            cpu_of(warm, {"center": "private"}, rep)
        x = rows_of("offset", 50_000, 100)
        runs: dict[str, list[float]] = {}
        for rep in range(reps + 1):
            timed: dict[str, float] = {"default": cpu_of(x, {}, rep)[0]}
            for variant in VARIANTS:
                with subsampled(variant, probe_mu):
                    timed["recommended, " + label(variant)] = cpu_of(x, {"center": "private"}, rep)[
                        0
                    ]
            order = np.random.default_rng(rep).permutation(x.shape[0])
            start = time.process_time()
            cc.probe_pass(x, 1.0, order)
            timed["probe pass, all pairs"] = time.process_time() - start
            start = time.process_time()
            subset_probe_pass(x, 1.0, order, 8192)
            timed["probe pass, 8,192 pairs"] = time.process_time() - start
            if rep:
                for key, value in timed.items():
                    runs.setdefault(key, []).append(value)
    default = statistics.median(runs["default"])
    for key, values in runs.items():
        value = statistics.median(values)
        print(f"{key}: {1e3 * value:.1f} ms, {value / default:.3f} of the default")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--reps", type=int, default=31)
    args = parser.parse_args()
    if args.speed:
        speed(args.reps)
    else:
        with threadpool_limits(1):
            utility(args.seeds)


if __name__ == "__main__":
    main()
