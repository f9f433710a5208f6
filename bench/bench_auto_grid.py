"""The benchmark grid behind ``mechanism: "auto"`` (issue 16): every mechanism, every cell.

Grid (issue 16): d in {10, 50, 300, 1000}, distance-to-subspace in {1e-1, 1e-3, 1e-5},
n in {5,000, 50,000}, epsilon in {0.1, 1}; k = 3, delta = 1e-6, rows of norm <= 1 within an
exact distance of a random k-dimensional subspace (``bench.core.near_subspace``), clip norm 1
(public); one cell's release is ``bench.grids.run_one``. Each mechanism is called through
the registry exactly as the service calls it: ``parse_params`` -> ``prepare`` (a refusal is
recorded as ``refused``) -> the worker memory gate (``DPSS_WORKER_MEMORY_MB`` default, 6 GiB;
above it ``refused``) -> ``run`` with a seeded generator. Error is ``||Pi_hat - Pi||_2`` (the
largest principal-angle sine); a ``no_result`` is recorded with error 1 (what an analyst who
must fall back to a random subspace gets). ``random`` is a Haar-random subspace.

Writes one row per (cell, mechanism, seed) to ``bench/results/auto_grid.csv`` and prints, per
cell, the median error of each mechanism (the note column keeps ``auto``'s choice and the
released search exponents, which calibrate ``auto``'s staged rule; ``friendly`` and
``histogram`` are those mechanisms with their own defaults). Fewer seeds at d = 1000
(``--seeds-large``), and the
most expensive configurations (``friendly_aggregate`` with the projection aggregator at
d >= 300, whose t x t distances are in R^{d^2}) are skipped unless ``--all`` is given.

    PYTHONPATH=. .venv/bin/python bench/bench_auto_grid.py [--seeds 3] [--seeds-large 1]
        [--quick] [--only d=10,50] [--out bench/results/auto_grid.csv]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from bench.grids import DELTA, K, Outcome, near_subspace, random_error, run_one

RESULTS = Path(__file__).resolve().parent / "results"
DIMS = (10, 50, 300, 1000)
DISTANCES = (1e-1, 1e-3, 1e-5)
ROWS = (5_000, 50_000)
EPSILONS = (0.1, 1.0)
HEADER = [
    "d",
    "distance",
    "n",
    "epsilon",
    "k",
    "delta",
    "mechanism",
    "seed",
    "status",
    "error",
    "seconds",
    "note",
]

#: (label, registered mechanism, params). ``random`` is handled separately.
CONFIGS: list[tuple[str, str, dict[str, Any]]] = [
    ("analyze_gauss", "analyze_gauss", {}),
    ("gap_perturbation", "gap_perturbation", {}),
    ("smooth_sensitivity", "smooth_sensitivity", {}),
    ("friendly_projection", "friendly_aggregate", {"aggregator": "projection"}),
    ("friendly_reference", "friendly_aggregate", {"aggregator": "reference_points"}),
    ("friendly", "friendly_aggregate", {}),
    ("histogram", "histogram_aggregate", {}),
    ("auto", "auto", {}),
]


def cells(only_dims: Iterable[int] | None) -> list[tuple[int, float, int, float]]:
    dims = tuple(only_dims) if only_dims else DIMS
    return list(itertools.product(dims, DISTANCES, ROWS, EPSILONS))


def summarize(paths: list[Path]) -> str:
    """A Markdown table from result CSVs: per cell, each mechanism's median error (``-`` when
    refused or skipped), the best real mechanism, ``auto`` and its ratio to the best."""
    errors: dict[tuple[str, ...], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in paths:
        with path.open() as handle:
            for row in csv.DictReader(handle):
                if row["status"] in ("succeeded", "no_result"):
                    cell: tuple[str, ...] = (row["d"], row["distance"], row["n"], row["epsilon"])
                    errors[cell][row["mechanism"]].append(float(row["error"]))
    labels = ["random"] + [label for label, _, _ in CONFIGS]
    short = {"friendly_projection": "fa_proj", "friendly_reference": "fa_ref", "friendly": "fa"}
    head = ["d", "dist", "n", "eps", *(short.get(x, x) for x in labels), "best", "auto/best"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in sorted(errors, key=lambda c: tuple(float(x) for x in c)):
        med = {label: float(np.median(v)) for label, v in errors[cell].items()}
        real = {k: v for k, v in med.items() if k not in ("random", "auto")}
        best = min(real, key=real.__getitem__)
        beats = real[best] < 0.9 * med["random"]
        ratio = f"{med['auto'] / real[best]:.2f}" if "auto" in med and beats else "-"
        values = [f"{med[label]:.3g}" if label in med else "-" for label in labels]
        lines.append("| " + " | ".join([*cell, *values, best if beats else "none", ratio]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per cell for d < 1000")
    parser.add_argument("--seeds-large", type=int, default=1, help="seeds per cell at d = 1000")
    parser.add_argument("--only", default="", help="comma-separated d values, e.g. 10,50")
    parser.add_argument("--mechanisms", default="", help="comma-separated labels to run")
    parser.add_argument("--quick", action="store_true", help="d in {10, 50}, one seed")
    parser.add_argument("--first-seed", type=int, default=0, help="to add seeds to a run")
    parser.add_argument("--cells", default="", help="only cells 'distance:n:eps', comma-separated")
    parser.add_argument("--all", action="store_true", help="also the projection at d >= 300")
    parser.add_argument("--out", type=Path, default=RESULTS / "auto_grid.csv")
    parser.add_argument("--summarize", nargs="+", type=Path, help="print a table of CSVs")
    args = parser.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize))
        return
    only = [int(x) for x in args.only.split(",") if x] or None
    if args.quick:
        only, args.seeds = only or [10, 50], 1
    labels = {x for x in args.mechanisms.split(",") if x}
    configs = [c for c in CONFIGS if not labels or c[0] in labels]

    args.out.parent.mkdir(parents=True, exist_ok=True)
    medians: dict[tuple[int, float, int, float], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    with args.out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        wanted = {tuple(float(x) for x in c.split(":")) for c in args.cells.split(",") if c}
        for d, distance, n, epsilon in cells(only):
            if wanted and (distance, float(n), epsilon) not in wanted:
                continue
            seeds = args.seeds_large if d >= 1000 else args.seeds
            for seed in range(args.first_seed, args.first_seed + seeds):
                data, basis = near_subspace(n, d, K, distance, seed)
                rows: list[tuple[str, Outcome]] = [
                    ("random", Outcome("succeeded", random_error(d, basis, seed), 0.0))
                ]
                for label, name, params in configs:
                    if label == "friendly_projection" and d >= 300 and not args.all:
                        rows.append((label, Outcome("skipped", float("nan"), 0.0, "cost")))
                        continue
                    rows.append((label, run_one(name, params, data, basis, epsilon, seed)))
                for label, outcome in rows:
                    cell = [d, distance, n, epsilon, K, DELTA, label, seed, outcome.status]
                    figures = [f"{outcome.error:.6g}", f"{outcome.seconds:.3f}", outcome.note]
                    writer.writerow([*cell, *figures])
                    if outcome.status in ("succeeded", "no_result"):
                        medians[(d, distance, n, epsilon)][label].append(outcome.error)
                handle.flush()
            errors = medians[(d, distance, n, epsilon)]
            summary = {label: float(np.median(v)) for label, v in errors.items()}
            line = " ".join(f"{lab}={err:.3g}" for lab, err in summary.items())
            print(f"d={d} dist={distance:g} n={n} eps={epsilon:g}: {line}", flush=True)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
