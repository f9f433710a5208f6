"""Issue 32 item 4: does the dry run's forecast range from an earlier release cover what the
release then keeps, at its stated 90%?

    python -m bench.bench_forecast_coverage [--reps 20] [--mnist] [--only NAME ...]
                                            [--save F.pkl | --load F.pkl]

``analyze_gauss`` with ``center: "private"`` (the recommended settings) on digits,
breast_cancer, wine (rows scaled to norm 1), a synthetic power-law set (3,000 x 100, ``i^-1``)
and, with ``--mnist``, 4,000 rows of the MNIST sample (``bench/mnist.py``); k 1, 2, 5 and 10;
eps 0.1, 0.3, 1 and 3 (delta 1e-6). Per data set, ``k`` and budget, ``--reps`` releases are
made once (seed ``SEED_BASE * setting + rep``: releases at different budgets never share a
seed). A cell is an earlier budget and a new one at the same ``k`` (every ordered pair of
different budgets): release ``rep`` of the earlier budget forecasts (``?forecast_from=``, the
preview's :func:`~service.mechanisms.gauss_preview.release_forecast`) what release ``rep`` of
the new budget keeps (the share of the rows' centred variance, rows clipped to 1, its basis
keeps). Printed per cell: the range's coverage (``low <= kept <= high``), its mean width,
the runs given a point (as the dry run states it: none from a hidden earlier release), the
point's mean absolute and signed error and the central figure's mean absolute error; then per
data set the cells whose coverage is below 0.9, and overall the share of covering cells and
the mean width; then the binomial reading (:func:`binomial_reading`): per cell the one-sided
exact binomial test of ``H0: coverage >= 0.9`` (20 runs show 0.85 or less with chance 0.32 at
exactly 0.9, so a cell's 0.85 alone is no evidence of under-coverage), the cells that reject at
5% after Holm's correction over all cells scored, and the pooled coverage per data set with
its own test. ``--eps``: the budgets (default 0.1, 0.3, 1, 3); ``--k``: only these k (a reduced
selection under load; the releases' seeds are the full grid's); ``--csv``: every cell.
``--save`` / ``--load``: keep the releases in a pickle and re-score them (before / after a
change of the forecast, on the very same releases).
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_honest_point import DELTA, MECHANISM, power_law, spec_of, truth, unit
from service.mechanisms.base import PublicContext
from service.mechanisms.explained_variance import HIDDEN_WIDTH
from service.mechanisms.gauss_preview import release_forecast

EPSILONS = (0.1, 0.3, 1.0, 3.0)
KS = (1, 2, 5, 10)
SEED_BASE = 10_000
#: The stated level of the range, each cell's coverage is held to.
LEVEL = 0.9
#: The family-wise error rate of the per-cell binomial tests (Holm's correction).
ALPHA = 0.05


def datasets(mnist: bool) -> dict[str, np.ndarray[Any, Any]]:
    from sklearn.datasets import load_breast_cancer, load_digits, load_wine

    sets = {
        "digits": unit(load_digits().data),
        "breast_cancer": unit(load_breast_cancer().data),
        "wine": unit(load_wine().data),
        "power-law 3000x100": power_law(3000, 100, 2),
    }
    if mnist:
        from bench.mnist import mnist_split

        split = mnist_split(0)
        if split is not None:
            sets["MNIST 4000x784"] = split[0]
    return sets


def collect(
    rows: np.ndarray[Any, Any],
    reps: int,
    epsilons: tuple[float, ...] = EPSILONS,
    ks: tuple[int, ...] = KS,
) -> dict[str, Any]:
    """Per (eps, k): ``reps`` releases' extras and what each keeps (``None`` where the
    release gave no basis). ``ks``: a reduced selection of :data:`KS` (``--k``); the seeds stay
    those of the full grid, so a reduced run re-scores the very releases of a full one."""
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    runs: dict[tuple[float, int], list[tuple[dict[str, Any], float] | None]] = {}
    for index, (eps, k) in enumerate((e, k) for e in epsilons for k in KS):
        if k not in ks:
            continue
        spec = spec_of(ctx, eps, k)
        runs[(eps, k)] = []
        for rep in range(reps):
            out = MECHANISM.run(rows, spec, np.random.default_rng(SEED_BASE * (index + 1) + rep))
            if out.basis is None:
                runs[(eps, k)].append(None)
                continue
            runs[(eps, k)].append((out.extras, truth(rows, out.basis)))
    return {"n": n, "d": d, "runs": runs, "epsilons": epsilons, "ks": ks}


def score(collected: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (earlier eps, new eps) pair at each ``k``: coverage, width and points."""
    ctx = PublicContext(n_rows=collected["n"], n_cols=collected["d"], row_norm_bound=1.0)
    runs = collected["runs"]
    epsilons = collected.get("epsilons", EPSILONS)
    out = []
    for k in collected.get("ks", KS):
        for source in epsilons:
            for target in epsilons:
                if source == target:
                    continue
                earlier_spec, spec = spec_of(ctx, source, k), spec_of(ctx, target, k)
                covered, widths, errors, count, central = 0, [], [], 0, []
                for before, after in zip(runs[(source, k)], runs[(target, k)], strict=True):
                    if before is None or after is None:
                        continue
                    found = release_forecast(ctx, spec, earlier_spec, before[0])
                    if found is None:
                        continue
                    forecast, kept = found[1], after[1]
                    count += 1
                    covered += forecast.low <= kept <= forecast.high
                    widths.append(forecast.high - forecast.low)
                    central.append(forecast.central - kept)
                    # The point the dry run states: none from a hidden earlier release
                    # (as gauss_preview.forecast_from).
                    low, high = before[0]["explained_variance_ratio_interval"]
                    hidden = before[0].get("explained_variance_hidden_by_noise")
                    if forecast.point is not None and not hidden and high - low < HIDDEN_WIDTH:
                        errors.append(forecast.point - kept)
                if not count:
                    continue
                out.append(
                    {
                        "k": k,
                        "source": source,
                        "target": target,
                        "runs": count,
                        "cover": covered / count,
                        "width": float(np.mean(widths)),
                        "points": len(errors),
                        "point_abs": float(np.mean(np.abs(errors))) if errors else float("nan"),
                        "point_bias": float(np.mean(errors)) if errors else float("nan"),
                        "central_abs": float(np.mean(np.abs(central))),
                        "central_bias": float(np.mean(central)),
                    }
                )
    return out


def cover_test(covered: int, runs: int) -> float:
    """The one-sided exact binomial p-value of ``covered`` of ``runs`` under ``H0: coverage >=
    LEVEL`` (small when too few runs were covered for a 90% range)."""
    from scipy.stats import binomtest

    if runs <= 0:
        return 1.0
    return float(binomtest(covered, runs, LEVEL, alternative="less").pvalue)


def holm(pvalues: list[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down rejections of ``pvalues`` at family-wise level ``alpha``."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    rejected = [False] * len(pvalues)
    count = len(pvalues)
    for rank, index in enumerate(order):
        if pvalues[index] > alpha / (count - rank):
            break
        rejected[index] = True
    return rejected


def binomial_reading(table: list[dict[str, Any]]) -> list[str]:
    """Lines of the binomial reading of the scored cells (``table``: rows of :func:`score`
    with ``data``): each cell's covered count and p-value (``H0: coverage >= LEVEL``), the
    cells rejecting after Holm over all cells, and the pooled coverage per data set (all its
    cells' runs together; the runs of one data set share releases across cells, so its p-value
    reads as if they were independent, an approximation)."""
    lines: list[str] = []
    covered = [round(row["cover"] * row["runs"]) for row in table]
    pvalues = [cover_test(c, row["runs"]) for c, row in zip(covered, table, strict=True)]
    rejected = holm(pvalues)
    lines.append(
        f"binomial: H0 coverage >= {LEVEL} per cell (one-sided exact), Holm at {ALPHA} "
        f"over {len(table)} cells"
    )
    lines.append(
        "| data | cells | p < 0.05 alone | reject after Holm | pooled coverage | runs | pooled p |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for name in dict.fromkeys(row["data"] for row in table):
        picked = [i for i, row in enumerate(table) if row["data"] == name]
        runs = sum(table[i]["runs"] for i in picked)
        hits = sum(covered[i] for i in picked)
        alone = sum(pvalues[i] < ALPHA for i in picked)
        lines.append(
            f"| {name} | {len(picked)} | {alone} | {sum(rejected[i] for i in picked)} "
            f"| {hits / runs:.3f} | {runs} | {cover_test(hits, runs):.3g} |"
        )
    for i, row in enumerate(table):
        if pvalues[i] < ALPHA:
            verdict = "rejects after Holm" if rejected[i] else "not after Holm"
            lines.append(
                f"low: {row['data']} k {row['k']} eps {row['source']} -> {row['target']}: "
                f"{covered[i]}/{row['runs']}, p = {pvalues[i]:.3g} ({verdict})"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--mnist", action="store_true", help="add MNIST (4,000 x 784)")
    parser.add_argument("--only", nargs="*", help="only these data sets")
    parser.add_argument("--save", help="keep the releases in this pickle")
    parser.add_argument("--load", help="re-score the releases of this pickle")
    parser.add_argument("--eps", type=float, nargs="*", default=list(EPSILONS))
    parser.add_argument("--csv", help="also write every cell to this CSV")
    parser.add_argument(
        "--k", type=int, nargs="*", default=list(KS), help="only these k (same seeds as all)"
    )
    args = parser.parse_args()
    if args.load:
        collected_all = pickle.loads(Path(args.load).read_bytes())
    else:
        collected_all = {
            name: collect(rows, args.reps, tuple(args.eps), tuple(args.k))
            for name, rows in datasets(args.mnist).items()
            if not args.only or name in args.only
        }
        if args.save:
            Path(args.save).write_bytes(pickle.dumps(collected_all))
    print(f"delta {DELTA}; a cell: release i at the earlier eps forecasts release i at the new")
    print(
        "| data | k | earlier eps | new eps | runs | range covers | range width | points "
        "| point: mean abs error | point: mean error | central: mean abs error |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary, table = [], []
    for name, collected in collected_all.items():
        if args.only and name not in args.only:
            continue
        rows_out = score(collected)
        for row in rows_out:
            print(
                f"| {name} | {row['k']} | {row['source']} | {row['target']} | {row['runs']} "
                f"| {row['cover']:.2f} | {row['width']:.3f} | {row['points']} "
                f"| {row['point_abs']:.3f} | {row['point_bias']:+.3f} "
                f"| {row['central_abs']:.3f} |",
                flush=True,
            )
        table += [{"data": name, **row} for row in rows_out]
        short = [r for r in rows_out if r["cover"] < LEVEL]
        summary.append(
            (
                name,
                len(rows_out),
                len(rows_out) - len(short),
                float(np.mean([r["width"] for r in rows_out])),
                min(r["cover"] for r in rows_out),
                sum(r["points"] for r in rows_out),
                short,
            )
        )
    if args.csv and table:
        import csv

        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    print()
    print("| data | cells | cells covering >= 0.9 | mean width | lowest coverage | points |")
    print("|---|---|---|---|---|---|")
    for name, cells, good, width, lowest, points, _ in summary:
        print(f"| {name} | {cells} | {good} | {width:.3f} | {lowest:.2f} | {points} |")
    for name, *_, short in summary:
        for r in short:
            print(
                f"short: {name} k {r['k']} eps {r['source']} -> {r['target']}: "
                f"{r['cover']:.2f} (width {r['width']:.3f})"
            )
    if table:
        print()
        print("\n".join(binomial_reading(table)))


if __name__ == "__main__":
    main()
