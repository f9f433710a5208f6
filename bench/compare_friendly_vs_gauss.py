"""Where friendly_aggregate beats analyze_gauss: error against distance-to-subspace and against d.

Same budget for both (eps = 1, delta = 1e-6), default parameters (t = min(n/(10k), 2000),
q = 2k, radius searched privately), rows of norm <= 1 within an exact distance of a random
k-dimensional subspace. Prints Markdown tables and writes two SVG figures (no plotting
dependency) to docs/figures/:

- friendly_vs_gauss_distance.svg: error (median over repeats) vs distance-to-subspace
  1e-6 .. 1e-2, at d = 1000;
- friendly_vs_gauss_dimension.svg: error vs d at distance 1e-5.

    .venv/bin/python bench/compare_friendly_vs_gauss.py [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from service.mechanisms.analyze_gauss import analyze_gauss
from service.mechanisms.friendly_aggregate import default_t, friendly_aggregate
from service.mechanisms.linalg import subspace_distance

FIGURES = Path(__file__).resolve().parent.parent / "docs" / "figures"
EPS, DELTA = 1.0, 1e-6


def near_subspace(
    n: int, d: int, k: int, distance: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((d, k)))
    coords = rng.standard_normal((n, k))
    coords *= rng.uniform(0.2, 0.9, (n, 1)) / np.linalg.norm(coords, axis=1, keepdims=True)
    resid = rng.standard_normal((n, d))
    resid -= (resid @ basis) @ basis.T
    resid *= distance / np.linalg.norm(resid, axis=1, keepdims=True)
    return coords @ basis.T + resid, basis


def errors(n: int, d: int, k: int, distance: float, repeats: int) -> tuple[float, float, int]:
    """Median errors of both mechanisms over ``repeats`` datasets; no result counts as error 1."""
    fa_errs, ag_errs, no_results = [], [], 0
    for seed in range(repeats):
        data, basis = near_subspace(n, d, k, distance, seed)
        rng = np.random.default_rng(1000 + seed)
        result = friendly_aggregate(data, k, EPS, DELTA, rng, t=default_t(n, k))
        if result.basis is None:
            no_results += 1
            fa_errs.append(1.0)
        else:
            fa_errs.append(subspace_distance(result.basis, basis))
        gauss, _ = analyze_gauss(data, k, EPS, DELTA, 1.0, rng)
        ag_errs.append(subspace_distance(gauss, basis))
    return float(np.median(fa_errs)), float(np.median(ag_errs)), no_results


def svg_loglog(
    path: Path, title: str, xlabel: str, xs: list[float], series: dict[str, list[float]]
) -> None:
    """A minimal log-log line chart as SVG."""
    width, height, left, right, top, bottom = 560, 380, 70, 20, 40, 55
    colours = ["#1f77b4", "#d62728", "#2ca02c"]
    ys = [y for values in series.values() for y in values if y > 0]
    x0, x1 = math.floor(math.log10(min(xs))), math.ceil(math.log10(max(xs)))
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    x1 = max(x1, x0 + 1)
    y1 = max(y1, y0 + 1)

    def px(x: float) -> float:
        return left + (math.log10(x) - x0) / (x1 - x0) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (math.log10(y) - y0) / (y1 - y0) * (height - top - bottom)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>',
    ]
    for e in range(x0, x1 + 1):
        x = px(10.0**e)
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - bottom}" stroke="#ddd"/>'
        )
        parts.append(
            f'<text x="{x:.1f}" y="{height - bottom + 16}" text-anchor="middle">1e{e}</text>'
        )
    for e in range(y0, y1 + 1):
        y = py(10.0**e)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#ddd"/>'
        )
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
    parts.append(
        f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">{xlabel}</text>'
        f'<text x="16" y="{height / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {height / 2})">subspace error ||P - P_hat||_2</text>'
    )
    for i, (name, values) in enumerate(series.items()):
        colour = colours[i % len(colours)]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, values, strict=True))
        parts.append(
            f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>'
        )
        for x, y in zip(xs, values, strict=True):
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{colour}"/>')
        ly = top + 16 + 18 * i
        parts.append(
            f'<line x1="{left + 12}" y1="{ly - 4}" x2="{left + 36}" y2="{ly - 4}" '
            f'stroke="{colour}" stroke-width="2"/>'
            f'<text x="{left + 42}" y="{ly}">{name}</text>'
        )
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smaller n and d, for a smoke run")
    args = parser.parse_args()
    n, k = (10_000, 2) if args.quick else (30_000, 3)
    d_fixed = 200 if args.quick else 1000
    distances = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2]
    dims = [50, 100, 200] if args.quick else [50, 100, 300, 1000, 2000]
    FIGURES.mkdir(parents=True, exist_ok=True)

    print(f"n = {n}, k = {k}, eps = {EPS}, delta = {DELTA}, t = {default_t(n, k)}, q = {2 * k}")
    print(f"\nError vs distance to the subspace (d = {d_fixed}), median of {args.repeats}:\n")
    print("| distance | friendly_aggregate | analyze_gauss | no result |")
    print("|---|---|---|---|")
    fa_row, ag_row = [], []
    for dist in distances:
        fa_e, ag_e, nr = errors(n, d_fixed, k, dist, args.repeats)
        fa_row.append(fa_e)
        ag_row.append(ag_e)
        print(f"| {dist:g} | {fa_e:.2e} | {ag_e:.2e} | {nr}/{args.repeats} |", flush=True)
    svg_loglog(
        FIGURES / "friendly_vs_gauss_distance.svg",
        f"Error vs distance to a {k}-dim subspace (n={n}, d={d_fixed}, eps=1)",
        "distance of each row to the subspace",
        distances,
        {"friendly_aggregate": fa_row, "analyze_gauss": ag_row},
    )

    print(f"\nError vs d (distance 1e-5), median of {args.repeats}:\n")
    print("| d | friendly_aggregate | analyze_gauss | no result |")
    print("|---|---|---|---|")
    fa_row, ag_row = [], []
    for d in dims:
        fa_e, ag_e, nr = errors(n, d, k, 1e-5, args.repeats)
        fa_row.append(fa_e)
        ag_row.append(ag_e)
        print(f"| {d} | {fa_e:.2e} | {ag_e:.2e} | {nr}/{args.repeats} |", flush=True)
    svg_loglog(
        FIGURES / "friendly_vs_gauss_dimension.svg",
        f"Error vs ambient dimension (n={n}, distance 1e-5, eps=1)",
        "d",
        [float(d) for d in dims],
        {"friendly_aggregate": fa_row, "analyze_gauss": ag_row},
    )
    print(f"\nfigures written to {FIGURES}")


if __name__ == "__main__":
    main()
