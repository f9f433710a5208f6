"""``auto``'s private-centre rule (``SIGN_CENTRE_LIMIT``) measured on data it was not fitted to.

    python -m bench.bench_sign_centre [--seeds 5] [--families mnist power_law spiked offset heavy]
        [--ks 5 10] [--lo 0.2] [--hi 2.0] [--min-n 0] [--max-n 20000]
        [--out bench/results/sign_centre.csv]

With ``center: "private"`` ``auto`` runs its Gram candidate at the whole budget
(``auto.plan``): ``spatial_sign`` where
:func:`~service.mechanisms.auto_gram.centre_offset_ratio` (public: n, d, epsilon, delta) is below
the limit, else ``analyze_gauss`` with its private clip quantile. Both are run here through the
registry as auto's ``gram_candidate`` builds them (same clip, centre share, seed), on every
high-dimension cell (``d >= n^(2/3)``) whose ratio lies in ``[--lo, --hi]``; a release's figure is
the share of the clipped rows' centred variance its k-subspace keeps. Families: ``mnist`` (unit
rows of the 5,000-image sample, a fresh subset per seed; the rule's check used 4,000 rows),
``power_law``, ``heavy`` (``bench_auto_realistic``'s power_law / heavy_tailed, norms ~1/3),
``spiked`` (k spikes over an isotropic floor) and ``offset`` (power-law spread of norm ~0.25
about a shared mean of norm 0.6: centring matters). delta = 1e-6, accounting hybrid.

``bench/results/sign_centre.csv`` (docs/benchmarks.md) joins four runs: ``--families mnist --lo
0.3 --hi 1.2``; the other four families with ``--lo 0.35 --hi 1.0``, with ``--lo 0.1 --hi 0.349
--max-n 2000`` and with ``--lo 0.2 --hi 0.3 --min-n 20000``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_auto_realistic import rows as realistic_rows
from bench.mnist import mnist_split
from service.mechanisms.analyze_gauss import DEFAULT_PRIVATE_CENTRE_QUANTILE
from service.mechanisms.auto_gram import centre_offset_ratio, high_dimension
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism

Array = np.ndarray[Any, Any]
DELTA = 1e-6
SHARE = 0.2  # CenterParams' default centre share
CENTRE: dict[str, Any] = {"clip_norm": 1.0, "center": "private", "center_share": SHARE}
CANDIDATES = {
    "analyze_gauss": {**CENTRE, "clip_quantile": DEFAULT_PRIVATE_CENTRE_QUANTILE},
    "spatial_sign": dict(CENTRE),
}
SHAPES = [(500, 100), (500, 300), (1000, 100), (1000, 300), (1000, 1000), (2000, 300),
          (2000, 1000), (5000, 1000), (10000, 1000), (20000, 1000)]  # fmt: skip
MNIST_NS = [500, 1000, 2000, 5000]
EPS = [0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0]


def clip(x: Array, bound: float = 1.0) -> Array:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    out: Array = x * np.minimum(1.0, bound / np.maximum(norms, 1e-300))
    return out


def spiked(n: int, d: int, k: int, seed: int) -> Array:
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((d, k)))[0]
    x = (rng.standard_normal((n, k)) * np.linspace(1.0, 0.5, k)) @ basis.T
    x += 0.3 / np.sqrt(d) * np.sqrt(k) * rng.standard_normal((n, d))
    return clip(x / (2.0 * np.sqrt(k)))


def offset(n: int, d: int, seed: int) -> Array:
    rng = np.random.default_rng(seed + 1000)
    mean = rng.standard_normal(d)
    spread = realistic_rows("power_law", n, d, seed) * 0.75
    return clip(spread + 0.6 * mean / np.linalg.norm(mean))


def data(family: str, n: int, d: int, k: int, seed: int) -> Array:
    if family == "mnist":
        split = mnist_split(seed, n)
        assert split is not None
        return split[0]
    if family == "spiked":
        return spiked(n, d, k, seed)
    if family == "offset":
        return offset(n, d, seed)
    return realistic_rows("heavy_tailed" if family == "heavy" else family, n, d, seed)


def kept(x: Array, basis: Array) -> float:
    y = x - x.mean(axis=0)
    return float(np.sum((y @ basis) ** 2) / np.sum(y**2))


def release(name: str, x: Array, k: int, eps: float, seed: int) -> float:
    mechanism = get_mechanism(name)
    assert mechanism is not None
    n, d = x.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    parsed = mechanism.for_accounting("hybrid", mechanism.parse_params(CANDIDATES[name]))
    params = mechanism.prepare(ctx, k, eps, DELTA, parsed)
    out = mechanism.run(x, ReleaseSpec(k, eps, DELTA, params), np.random.default_rng(seed))
    return 0.0 if out.basis is None else kept(x, out.basis)


def cells(
    family: str, lo: float, hi: float, max_n: int, min_n: int = 0
) -> list[tuple[int, int, float]]:
    shapes = [(n, 784) for n in MNIST_NS] if family == "mnist" else SHAPES
    out = []
    for n, d in (shape for shape in shapes if min_n <= shape[0] <= max_n):
        for eps in EPS:
            ratio = centre_offset_ratio(n, d, eps, DELTA, CENTRE)
            if high_dimension(n, d) and lo <= ratio <= hi:
                out.append((n, d, eps))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--families", nargs="+", default=["mnist", "power_law", "spiked", "offset", "heavy"]
    )
    parser.add_argument("--ks", type=int, nargs="+", default=[5, 10])
    parser.add_argument("--lo", type=float, default=0.2)
    parser.add_argument("--hi", type=float, default=2.0)
    parser.add_argument("--max-n", type=int, default=20_000)
    parser.add_argument("--min-n", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    writer = None
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        writer = csv.writer(args.out.open("w", newline=""))
        writer.writerow(["family", "k", "n", "d", "eps", "ratio", "seed", "gauss", "sign"])
    print("| family | k | n | d | eps | ratio | analyze_gauss | spatial_sign | sign/gauss |")
    print("|---|---|---|---|---|---|---|---|---|")
    for family in args.families:
        for n, d, eps in cells(family, args.lo, args.hi, args.max_n, args.min_n):
            ratio = centre_offset_ratio(n, d, eps, DELTA, CENTRE)
            for k in args.ks:
                got: dict[str, list[float]] = {name: [] for name in CANDIDATES}
                for seed in range(args.seeds):
                    x = data(family, n, d, k, seed)
                    for name in CANDIDATES:
                        got[name].append(release(name, x, k, eps, seed))
                    if writer is not None:
                        row = [family, k, n, d, eps, f"{ratio:.4f}", seed]
                        writer.writerow([*row, got["analyze_gauss"][-1], got["spatial_sign"][-1]])
                g, s = (float(np.median(got[name])) for name in CANDIDATES)
                figures = f"{ratio:.2f} | {g:.4f} | {s:.4f} | {s / max(g, 1e-12):.2f}"
                print(f"| {family} | {k} | {n} | {d} | {eps:g} | {figures} |", flush=True)


if __name__ == "__main__":
    main()
