"""Which mechanism ``PrivatePCA`` should send by default: ``analyze_gauss`` with ``center:
"private"`` (its default before 29 Nov 2026) against ``auto`` with ``center: "private"`` (which
runs ``spatial_sign`` in high dimension, ``d >= n^(2/3)``, else the same ``analyze_gauss``).

``python -m bench.bench_default_mechanism [--reps 5] [--eps 1 0.3]``. Data: digits (a fresh 75%
train split per repetition, 1,347 x 64, unit rows) and MNIST (a fresh 4,000 of the 5,000-image
sample per repetition, 784 pixels, unit rows; ``bench/mnist.py``), or (``--data power_law``)
4,000 of ``bench_highdim``'s power-law rows at d = 1,000; k = 10, delta = 1e-6. Per
run: the share of the rows' centred variance (rows clipped to 1, centred on their true mean)
that the released basis keeps, the stated share (sum of ``explained_variance_ratio``), whether
the 90% interval covers the kept share, and the process CPU time. ``spatial_sign`` before the
explained-variance step (its Gram at ``(1 - center_share) mu^2``) is run too, by setting the
step's share to ~0 in this process, to show what the step costs. Every candidate runs on the
same rows in the same repetition, interleaved.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.datasets import load_digits  # type: ignore[import-untyped]

from bench.bench_highdim import power_law
from bench.mnist import mnist_split, unit_rows
from service.mechanisms import spatial_sign as sign_module
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.linalg import clip_rows
from service.mechanisms.registry import get_mechanism

K, DELTA = 10, 1e-6
Array = np.ndarray[Any, Any]


def kept(rows: Array, basis: Array) -> float:
    y = clip_rows(rows, 1.0)
    y = y - y.mean(axis=0)
    return float(np.sum((y @ basis) ** 2) / np.sum(y**2))


def run(name: str, raw: dict[str, Any], rows: Array, eps: float, seed: int) -> dict[str, Any]:
    mechanism = get_mechanism(name)
    assert mechanism is not None
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, K, eps, DELTA, mechanism.parse_params(raw))
    start = time.process_time()
    out = mechanism.run(rows, ReleaseSpec(K, eps, DELTA, params), np.random.default_rng(seed))
    cpu = time.process_time() - start
    assert out.basis is not None
    truth = kept(rows, out.basis)
    extras = out.extras
    stated = interval = None
    if "explained_variance_ratio" in extras:
        stated = float(np.sum(extras["explained_variance_ratio"]))
        interval = tuple(extras["explained_variance_ratio_interval"])
    return {
        "kept": truth,
        "stated": stated,
        "covered": None if interval is None else interval[0] <= truth <= interval[1],
        "width": None if interval is None else interval[1] - interval[0],
        "cpu": cpu,
        "ran": extras.get("auto_choice", name),
    }


def sign_before(raw: dict[str, Any]) -> Callable[[Array, float, int], dict[str, Any]]:
    def go(rows: Array, eps: float, seed: int) -> dict[str, Any]:
        saved = sign_module.VARIANCE_SHARE
        sign_module.VARIANCE_SHARE = 1e-12  # the Gram gets (1 - center_share) mu^2, as before
        try:
            out = run("spatial_sign", raw, rows, eps, seed)
        finally:
            sign_module.VARIANCE_SHARE = saved
        out["stated"] = out["covered"] = out["width"] = None
        return out

    return go


CANDIDATES: dict[str, Callable[[Array, float, int], dict[str, Any]]] = {
    "analyze_gauss center=private (old default)": lambda r, e, s: run(
        "analyze_gauss", {"center": "private"}, r, e, s
    ),
    "auto center=private (new default)": lambda r, e, s: run(
        "auto", {"center": "private"}, r, e, s
    ),
    "spatial_sign center=private, with variance step": lambda r, e, s: run(
        "spatial_sign", {"center": "private"}, r, e, s
    ),
    "spatial_sign center=private, no variance step (before)": sign_before({"center": "private"}),
}


def summary(results: list[dict[str, Any]]) -> str:
    kept_ = np.array([r["kept"] for r in results])
    text = f"{kept_.mean():.3f} (sd {kept_.std(ddof=1) if len(kept_) > 1 else 0:.3f})"
    stated = [r["stated"] for r in results if r["stated"] is not None]
    if stated:
        bias = np.mean([r["stated"] - r["kept"] for r in results if r["stated"] is not None])
        cov = sum(bool(r["covered"]) for r in results if r["covered"] is not None)
        width = np.mean([r["width"] for r in results if r["width"] is not None])
        text += f" | stated-kept {bias:+.3f}, covered {cov}/{len(stated)}, width {width:.3f}"
    else:
        text += " | no explained variance"
    ran = sorted({r["ran"] for r in results})
    cpu = np.mean([r["cpu"] for r in results])
    return text + f" | cpu {cpu:.2f} s | ran {', '.join(ran)}"


def _split_rows(seed: int) -> Array:
    split = mnist_split(seed)
    assert split is not None
    return split[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--eps", type=float, nargs="+", default=[1.0, 0.3])
    parser.add_argument("--data", nargs="+", default=["digits", "mnist"])  # or power_law
    args = parser.parse_args(argv)

    def fresh(rows: Array, size: int) -> Callable[[int], Array]:
        # A fresh split per repetition, public seed 1000 + rep.
        return lambda rep: rows[np.random.default_rng(1000 + rep).permutation(len(rows))[:size]]

    sources: dict[str, Callable[[int], Array]] = {}
    if "digits" in args.data:
        digits = unit_rows(load_digits().data.astype(np.float64))
        sources["digits"] = fresh(digits, int(0.75 * len(digits)))
    if "mnist" in args.data:
        if mnist_split(1000) is None:
            print("MNIST unavailable")
        else:
            # The same rows as ``fresh`` drew from the file's order (bench/mnist.py).
            sources["mnist"] = lambda rep: _split_rows(1000 + rep)
    if "power_law" in args.data:
        # bench_highdim's power-law rows (eigenvalues 1/i in a random basis, an offset, unit
        # rows), 5,000 drawn so that each repetition takes a fresh 4,000 x 1,000.
        sources["power_law"] = fresh(power_law(5000, 1000, seed=0), 4000)
    for label, draw in sources.items():
        for eps in args.eps:
            results: dict[str, list[dict[str, Any]]] = {name: [] for name in CANDIDATES}
            for rep in range(args.reps):
                sample = draw(rep)
                for name, candidate in CANDIDATES.items():
                    results[name].append(candidate(sample, eps, rep))
            size, width = sample.shape
            base = np.mean([r["kept"] for r in results[next(iter(CANDIDATES))]])
            print(f"## {label} {size} x {width}, eps {eps}, {args.reps} reps", flush=True)
            for name, found in results.items():
                ratio = np.mean([r["kept"] for r in found]) / base
                print(f"  {name}: {summary(found)} | x{ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
