"""``auto`` against the best single mechanism, cell by cell (issue 33, item 1).

    python -m bench.bench_auto_cells [--reps 2] [--first-seed 0] [--dims 50 300]
        [--ns 20000 50000] [--eps 0.1 1 2] [--kinds power_law heavy_tailed spiked_outliers
        near_1e-05 near_0.001 near_0.01] [--k 3] [--only auto] [--out bench/results/auto_cells.csv]
    python -m bench.bench_auto_cells --table A.csv B.csv ...   # merged, one row per cell

Kinds: ``power_law``, ``heavy_tailed``, ``spiked_outliers`` (``bench_auto_realistic.rows``:
norms ~1/3, clipped at C = 1) and ``near_<distance>`` (``bench.grids.near_subspace``: every row
exactly that far from a random k-dim subspace). Candidates, each through the registry as the
service runs it (``parse_params`` -> ``prepare`` -> ``run``; a refusal is left out):
``analyze_gauss`` (clip C), ``analyze_gauss`` with ``clip_quantile`` 0.3 (the clip choice),
``friendly_aggregate`` (its defaults), ``spatial_sign`` (``center: "none"``, the same uncentred
target as the others), and ``auto``, each after ``for_accounting(--accounting)`` as the service
applies it. The error of a release: for the ``near``
kinds ``||sin Theta||_2`` to the planted subspace (as ``bench_auto_grid.py``), for the others
the captured-variance deficit ``1 - captured/PCA's`` (clipped, uncentred sum of squares, as
``bench_auto_realistic.py``); a ``no_result`` counts 1. Per cell:
each candidate's median error over ``--reps`` seeds, the best single mechanism, ``auto/best``
and ``auto/best`` without ``spatial_sign`` (the set issue 33 named). delta = 1e-6. Every
figure of a row is measured in the same process.

Seeds: seed ``s`` draws the data from ``s`` and every candidate's noise from
``noise_rng(kind, d, n, eps, s)``, a stream independent of the data seed and different per
cell (the same for every candidate of that cell and seed, so the comparison stays paired).
Before 29 Nov 2026 (sixth pass) the noise was seeded with the data seed itself, so one draw
(say auto's count missing, an ``ALPHA`` event) repeated in every cell of that seed.
"""

from __future__ import annotations

import argparse
import csv
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from bench.bench_auto_realistic import rows
from bench.grids import near_subspace
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.linalg import subspace_distance
from service.mechanisms.registry import get_mechanism

DELTA = 1e-6
CANDIDATES: list[tuple[str, str, dict[str, Any]]] = [
    ("analyze_gauss", "analyze_gauss", {}),
    ("analyze_gauss_q0.3", "analyze_gauss", {"clip_quantile": 0.3}),
    ("friendly_aggregate", "friendly_aggregate", {}),
    ("spatial_sign", "spatial_sign", {"center": "none"}),
    ("auto", "auto", {}),
]
#: ``--accounting``: the dataset's accounting, applied as the service does (``for_accounting``);
#: the default is the product's, ``hybrid`` (no candidate adapts its params to it, so its releases
#: are those of ``zcdp`` and ``basic``; only ``gaussian`` turns auto's estimate off).
ACCOUNTING = {"kind": "hybrid"}
#: ``--share`` overrides auto's ``structure_share`` (its default when not given).
AUTO_PARAMS: dict[str, Any] = {}


def data_of(
    kind: str, n: int, d: int, k: int, seed: int
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]:
    if kind.startswith("near_"):
        return near_subspace(n, d, k, float(kind[5:]), seed)
    return rows(kind, n, d, seed), None


def error(
    x: np.ndarray[Any, Any],
    basis: np.ndarray[Any, Any] | None,
    planted: np.ndarray[Any, Any] | None,
    best: float,
) -> float:
    """``||sin Theta||_2`` to the planted subspace, else the captured-variance deficit."""
    if basis is None:
        return 1.0
    if planted is not None:
        return subspace_distance(basis, planted)
    return max(0.0, 1.0 - float(np.sum((x @ basis) ** 2)) / best)


def noise_rng(kind: str, d: int, n: int, eps: float, seed: int) -> np.random.Generator:
    """The candidates' noise for one cell and seed: reproducible, independent of the data
    seed's stream and of the other cells' (the cell's name hashed into the seed sequence)."""
    cell = zlib.crc32(f"{kind}/{d}/{n}/{eps}".encode())
    return np.random.default_rng(np.random.SeedSequence((seed, cell)))


def release(
    name: str,
    raw: dict[str, Any],
    x: np.ndarray[Any, Any],
    k: int,
    eps: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray[Any, Any] | None, str] | None:
    mechanism = get_mechanism(name)
    assert mechanism is not None
    n, d = x.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    try:
        parsed = mechanism.for_accounting(ACCOUNTING["kind"], mechanism.parse_params(raw))
        params = mechanism.prepare(ctx, k, eps, DELTA, parsed)
    except (InvalidParameter, ValidationError):
        return None
    out = mechanism.run(x, ReleaseSpec(k, eps, DELTA, params), rng)
    return out.basis, str(out.extras.get("auto_choice", ""))


def read_cells(*paths: Path) -> dict[tuple[str, ...], dict[str, Any]]:
    """Per cell of the CSVs this bench wrote (a later file's row replaces an earlier one's of
    the same cell, seed and label): each label's median error, the best single mechanism (all;
    and without ``spatial_sign``, the set issue 33 named) and what auto ran."""
    rows: dict[tuple[str, ...], dict[str, str]] = {}
    for path in paths:
        with path.open() as handle:
            for row in csv.DictReader(handle):
                cell = (row["kind"], row["d"], row["n"], row["eps"])
                rows[(*cell, row["seed"], row["mechanism"])] = row
    errors: dict[tuple[str, ...], dict[str, list[float]]] = {}
    ran: dict[tuple[str, ...], Counter[str]] = {}
    for key, row in rows.items():
        cell = key[:4]
        errors.setdefault(cell, {}).setdefault(row["mechanism"], []).append(float(row["error"]))
        if row["mechanism"] == "auto":
            ran.setdefault(cell, Counter())[row["ran"]] += 1
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for cell, found in errors.items():
        med = {label: float(np.median(v)) for label, v in found.items()}
        single = {label: v for label, v in med.items() if label != "auto"}
        issue = {label: v for label, v in single.items() if label != "spatial_sign"}
        best = min(single, key=single.__getitem__)
        out[cell] = {
            "seeds": len(found["auto"]),
            "median": med,
            "best": best,
            "ratio": med["auto"] / max(single[best], 1e-300),
            "ratio_issue": med["auto"] / max(min(issue.values()), 1e-300),
            "ran": ", ".join(f"{c} {v}" for c, v in sorted(ran[cell].items())),
        }
    return out


def compare(before: Path, after: Path) -> str:
    """A Markdown table of two runs of the same cells: the best single mechanism (all and
    without ``spatial_sign``) and ``auto``/best before and after, with what auto ran after."""
    old, new = read_cells(before), read_cells(after)
    head = [
        "data", "d", "eps", "best single (all)", "best", "best without spatial_sign",
        "auto before", "auto after", "after/best", "after/best without spatial_sign",
        "before/best", "before/best without spatial_sign", "auto ran (after)",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in new:
        a, b = new[cell], old.get(cell)
        med = a["median"]
        issue = min((v, k) for k, v in med.items() if k not in ("auto", "spatial_sign"))
        row = [
            cell[0], cell[1], cell[3], a["best"], f"{med[a['best']]:.3g}",
            f"{issue[1]} {issue[0]:.3g}",
            f"{b['median']['auto']:.3g}" if b else "-", f"{med['auto']:.3g}",
            f"{a['ratio']:.2f}", f"{a['ratio_issue']:.2f}",
            f"{b['ratio']:.2f}" if b else "-", f"{b['ratio_issue']:.2f}" if b else "-", a["ran"],
        ]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def table(paths: list[Path]) -> str:
    """A Markdown table of the cells of ``paths`` (merged as :func:`read_cells`): the best
    single mechanism and its error, auto's, ``auto/best`` (all, and without ``spatial_sign``),
    the seeds and what auto ran; the cells over 1.2x in bold."""
    head = [
        "data", "d", "eps", "best single (all)", "its error", "best without spatial_sign",
        "auto", "auto/best", "auto/best without spatial_sign", "seeds", "auto ran",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell, a in sorted(read_cells(*paths).items(), key=lambda c: (c[0][0], int(c[0][1]))):
        med = a["median"]
        issue = min((v, k) for k, v in med.items() if k not in ("auto", "spatial_sign"))
        ratios = [
            f"{r:.2f}" if r <= 1.2 else f"**{r:.2f}**" for r in (a["ratio"], a["ratio_issue"])
        ]
        row = [
            cell[0], cell[1], cell[3], a["best"], f"{med[a['best']]:.3g}",
            f"{issue[1]} {issue[0]:.3g}", f"{med['auto']:.3g}", *ratios, str(a["seeds"]), a["ran"],
        ]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compare", nargs=2, type=Path, help="BEFORE.csv AFTER.csv: a table")
    parser.add_argument("--table", nargs="+", type=Path, help="CSVs merged into one table")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first .. first + reps - 1")
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="these labels only (the others' errors do not change with auto's code; --table "
        "merges the CSV with an earlier one of the same seeds, paired)",
    )
    parser.add_argument("--dims", type=int, nargs="+", default=[50, 300])
    parser.add_argument("--ns", type=int, nargs="+", default=[20_000])
    parser.add_argument("--eps", type=float, nargs="+", default=[0.1, 1.0, 2.0])
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument(
        "--kinds",
        nargs="+",
        default=["power_law", "heavy_tailed", "spiked_outliers", "near_1e-05", "near_0.01"],
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--share", type=float, default=None, help="auto's structure_share")
    parser.add_argument(
        "--accounting", default="hybrid", choices=["basic", "zcdp", "gaussian", "hybrid"]
    )
    args = parser.parse_args()
    if args.compare:
        print(compare(*args.compare))
        return
    if args.table:
        print(table(args.table))
        return
    ACCOUNTING["kind"] = args.accounting
    if args.share is not None:
        AUTO_PARAMS["structure_share"] = args.share
    labels = [label for label, _, _ in CANDIDATES if args.only is None or label in args.only]
    head = " | best | auto/best | auto/best without spatial_sign | auto ran |"
    print("| data | k | d | n | eps | " + " | ".join(labels) + head)
    print("|---" * (len(labels) + 9) + "|")
    writer = handle = None
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        handle = args.out.open("w", newline="")
        writer = csv.writer(handle)
        writer.writerow(["kind", "k", "d", "n", "eps", "seed", "mechanism", "error", "ran"])
    for kind in args.kinds:
        for d in args.dims:
            for n in args.ns:
                for eps in args.eps:
                    found: dict[str, list[float]] = {label: [] for label in labels}
                    ran: Counter[str] = Counter()
                    for seed in range(args.first_seed, args.first_seed + args.reps):
                        x, planted = data_of(kind, n, d, args.k, seed)
                        best = float(np.linalg.eigvalsh(x.T @ x)[-args.k :].sum())
                        for label, name, raw in CANDIDATES:
                            if label not in labels:
                                continue
                            raw = {**raw, **AUTO_PARAMS} if name == "auto" else raw
                            rng = noise_rng(kind, d, n, eps, seed)
                            got = release(name, raw, x, args.k, eps, rng)
                            if got is None:
                                continue
                            found[label].append(error(x, got[0], planted, best))
                            if label == "auto":
                                ran[got[1]] += 1
                            if writer is not None:
                                row = [kind, args.k, d, n, eps, seed, label, found[label][-1]]
                                writer.writerow([*row, got[1]])
                    means = {lab: float(np.median(v)) for lab, v in found.items() if v}
                    if "auto" not in means or len(means) < 2:
                        print(f"| {kind} | {args.k} | {d} | {n} | {eps} | auto {means} |")
                        continue
                    single = {lab: v for lab, v in means.items() if lab != "auto"}
                    best_label = min(single, key=single.__getitem__)
                    ratio = means["auto"] / max(single[best_label], 1e-300)
                    # the issue's set: analyze_gauss (and its clip choice), friendly_aggregate
                    issue = {lab: v for lab, v in single.items() if lab != "spatial_sign"}
                    ratio_issue = means["auto"] / max(min(issue.values()), 1e-300)
                    shown = [f"{means[lab]:.3g}" if lab in means else "-" for lab in labels]
                    choices = ", ".join(f"{c} {v}" for c, v in ran.items())
                    figures = [best_label, f"{ratio:.2f}", f"{ratio_issue:.2f}", choices]
                    cells = [kind, args.k, d, n, eps, *shown, *figures]
                    print("| " + " | ".join(map(str, cells)) + " |", flush=True)
                    if handle is not None:
                        handle.flush()  # a cell's rows survive a run stopped part-way


if __name__ == "__main__":
    main()
