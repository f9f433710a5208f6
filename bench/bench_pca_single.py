"""Issue 32 item 5: the recommended settings' float32 statistics against float64 on the same
releases.

    python -m bench.bench_pca_single [--runs 40]

From 8,192 rows the chosen-centring ``analyze_gauss`` sums the mean and none routes' Gram in
float32 blocks (its noise drawn ``1 + 5.7e-3`` larger: ``fast_rows.single_gram_fits``; the mean
route centres in float32 too where ``fast_rows.single_centring_fits`` allows) and
projects for the explained variance in float32 (``fast_rows.single_projections_fit``). Here the
same seeds are run with both public guards as they are and patched to refuse (float64
throughout): coverage of the true centred share by the 90% interval, the mean share the
released basis keeps, the mean point error and the routes taken, at eps 0.3 and 1, k = 10, on
12,000-row power-law rows with and without a common offset.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from service.mechanisms import analyze_gauss as module
from service.mechanisms.base import PublicContext, ReleaseSpec

Rows = np.ndarray[Any, Any]


def unit_clipped(x: Rows) -> Rows:
    return np.asarray(x / np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True)))


def power_law(n: int, d: int, seed: int, spread: float, offset: float) -> Rows:
    rng = np.random.default_rng(seed)
    scales = 1.0 / np.sqrt(np.arange(1, d + 1))
    x = rng.standard_normal((n, d)) * scales @ np.linalg.qr(rng.standard_normal((d, d)))[0]
    return unit_clipped(x / np.sqrt(np.sum(scales**2)) * spread + offset / np.sqrt(d))


def share(rows: Rows, basis: Rows) -> float:
    """The centred rows' sum of squares the basis captures, over their total."""
    y = rows - rows.mean(axis=0)
    return float(np.sum((y @ basis) ** 2) / np.sum(y**2))


def cell(rows: Rows, eps: float, runs: int) -> tuple[float, float, float, str]:
    mechanism = module.AnalyzeGauss()
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, 10, eps, 1e-6, mechanism.parse_params({"center": "private"}))
    spec = ReleaseSpec(10, eps, 1e-6, params)
    hits, kept, errors, routes = 0, [], [], set()
    for seed in range(runs):
        out = mechanism.run(rows, spec, np.random.default_rng(seed))
        assert out.basis is not None
        low, high = out.extras["explained_variance_ratio_interval"]
        truth = share(rows, out.basis)
        hits += low <= truth <= high
        kept.append(truth)
        errors.append(float(np.sum(out.extras["explained_variance_ratio"])) - truth)
        routes.add(str(out.extras["centring"]))
    return hits / runs, float(np.mean(kept)), float(np.mean(errors)), "/".join(sorted(routes))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    cases = {
        "power law, offset 0.3": power_law(12_000, 40, 6, 0.5, 0.3 * np.sqrt(40)),
        "power law, offset/spread 5": power_law(12_000, 60, 7, 0.15, 0.8),
        "power law, centred": power_law(12_000, 60, 8, 1.0, 0.0),
    }
    real = (module.single_gram_fits, module.single_projections_fit)
    print("| rows | eps | float32: cover, kept, point error, route | float64: the same |")
    print("|---|---|---|---|")
    with threadpool_limits(limits=1):
        for name, rows in cases.items():
            for eps in (0.3, 1.0):
                found = {}
                for mode in ("float32", "float64"):
                    single = mode == "float32"
                    module.single_gram_fits = real[0] if single else (lambda *a: False)  # type: ignore[assignment]
                    module.single_projections_fit = real[1] if single else (lambda *a: False)  # type: ignore[assignment]
                    found[mode] = cell(rows, eps, args.runs)
                module.single_gram_fits, module.single_projections_fit = real
                cells = " | ".join(
                    f"{c:.2f}, {k:.4f}, {e:+.4f}, {r}" for c, k, e, r in found.values()
                )
                print(
                    f"| {name} ({rows.shape[0]:,} x {rows.shape[1]}) | {eps} | {cells} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
