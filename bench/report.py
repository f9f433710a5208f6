"""Tables (stdout), and docs/benchmarks.md with its plots (docs/img/*.png), from result rows.

Every cell is a median with its spread over repetitions (``median [q1, q3]``, or
``[min, max]`` below four values) over the runs that released something, followed by the
count of the other outcomes (``no_result``, ``refused`` by the service before charging,
``timeout``, ``skipped``, ...). The page is partly hand-written: :func:`write` rewrites only its
marked blocks (:data:`START`/:data:`END`, and the standing benches' own markers) in place, so
the conclusions and the measurement sections written there by hand survive every rebuild.
"""

from __future__ import annotations

import math
import os
import platform
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.core import (
    DOCS,
    IMG,
    NONPRIVATE,
    RESULTS,
    Row,
    cell_summary,
    show,
    skipped_mechanisms,
    spread,
    table,
)

PEERS = ("diffprivlib", "opendp")
#: The heading of ``bench/bench_dask.py``'s figures (``bench/results/dask.txt``, as printed).
DASK_SECTION = (
    "## Datasets by reference on Dask (`bench/bench_dask.py`)\n\n"
    "A Parquet dataset larger than each Dask worker's memory limit on a local S3 endpoint "
    "(moto's server mode), released by 2 Dask worker processes (LocalCluster, 1 thread each); "
    "a slice released in process and on Dask with one seed (the same tasks added in the same "
    "order, one BLAS thread as in Dask's workers: equal bits); peak RSS per worker; the Gram "
    "pass on 1 and 2 workers and a model for more from the measured per-task time. The "
    "output as printed (2 shared cores):"
)


def _order(rows: Sequence[Row]) -> list[str]:
    """Mechanism columns: the floor, the registered mechanisms (registry order), the peers."""
    from service.mechanisms.registry import MECHANISMS

    present = {r.mechanism for r in rows}
    names = [NONPRIVATE] + [m for m in MECHANISMS if m in present]
    names += [p for p in PEERS if p in present]
    names += sorted(present - set(names))
    return [n for n in names if n in present]


def label_oracle(rows: list[Row]) -> list[Row]:
    """Rows of a mechanism that was given the true gap (params ``oracle gamma``, from runs
    before ``histogram_aggregate`` searched its width privately) under their own name,
    ``histogram_aggregate (oracle gamma)``, so that no table mixes them with default runs."""
    for r in rows:
        if r.params.startswith("oracle") and not r.mechanism.endswith(")"):
            r.mechanism = f"{r.mechanism} ({r.params})"
    return rows


def _group(rows: Sequence[Row], key: Callable[[Row], Any]) -> dict[Any, list[Row]]:
    out: dict[Any, list[Row]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def _eps(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:g}"


# ---------------------------------------------------------------------------------------------
# Tables


def synthetic_tables(rows: list[Row], metric: str = "error_planted") -> str:
    """One table per (n, epsilon): rows d x distance, columns the mechanisms."""
    names = _order(rows)
    private = [r for r in rows if r.mechanism != NONPRIVATE]
    floors = _group(
        [r for r in rows if r.mechanism == NONPRIVATE], lambda r: (r.d, r.n, r.distance)
    )
    parts = []
    for (n, eps), group in sorted(_group(private, lambda r: (r.n, r.epsilon)).items()):
        cells = _group(group, lambda r: (r.d, r.distance))
        body = []
        for (d, dist), cell in sorted(cells.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
            by_mech = _group(cell + floors.get((d, n, dist), []), lambda r: r.mechanism)
            body.append(
                [d, f"{dist:g}"]
                + [cell_summary(by_mech.get(m, []), metric) if m in by_mech else "" for m in names]
            )
        label = {"error_planted": "||Pi_hat - Pi||_2 to the planted subspace",
                 "error_nonprivate": "||Pi_hat - Pi||_2 to the non-private top-k",
                 "captured": "captured variance / non-private PCA's"}[metric]  # fmt: skip
        parts.append(
            f"**n = {n:,}, epsilon = {_eps(eps)}** ({label}; the service's mechanisms at "
            "delta = 1e-6, the peers at delta = 0)\n\n" + table(["d", "distance", *names], body)
        )
    return "\n\n".join(parts)


def best_table(rows: list[Row]) -> str:
    """Per cell, the private mechanism with the lowest median error, and how it compares with
    ``analyze_gauss`` and a random subspace (error ~1): the input of a rule table for ``auto``."""
    private = [r for r in rows if r.mechanism not in (NONPRIVATE,)]
    body = []
    for (n, eps, d, dist), cell in sorted(
        _group(private, lambda r: (r.n, r.epsilon, r.d, r.distance)).items(),
        key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], -kv[0][3]),
    ):
        medians = {}
        for mech, runs in _group(cell, lambda r: r.mechanism).items():
            ok = [r.error_planted for r in runs if r.status == "succeeded"]
            # A mechanism that gave a basis in fewer than half its runs is not a choice here.
            if ok and len(ok) * 2 >= len(runs):
                medians[mech] = spread(ok)[0]
        if not medians:
            body.append([n, _eps(eps), d, f"{dist:g}", "none ran", "", ""])
            continue
        best = min(medians, key=lambda m: medians[m])
        gauss = medians.get("analyze_gauss", math.nan)
        # A random k-dim subspace of R^d has error ~1 for d >> k: no real winner there.
        label = best if medians[best] < 0.9 else f"none beats random (best: {best})"
        body.append([
            f"{n:,}", _eps(eps), d, f"{dist:g}", label, f"{medians[best]:.2g}",
            f"{gauss / medians[best]:.3g}" if not math.isnan(gauss) else "—",
        ])  # fmt: skip
    return table(
        ["n", "epsilon", "d", "distance", "best", "its error", "analyze_gauss / best"], body
    )


def real_table(rows: list[Row]) -> str:
    names = [m for m in _order(rows) if m != NONPRIVATE]
    body = []
    keyed = _group(rows, lambda r: (r.dataset, r.n, r.d, r.centered, r.epsilon))
    for (dataset, n, d, centred, eps), cell in sorted(keyed.items(), key=lambda kv: (
            kv[0][0], kv[0][3], -1.0 if math.isnan(kv[0][4]) else kv[0][4])):  # fmt: skip
        if math.isnan(eps):
            continue  # the floor's own row (captured = 1 by definition)
        by_mech = _group(cell, lambda r: r.mechanism)
        body.append(
            [f"{dataset} ({n} x {d})", centred, _eps(eps)]
            + [cell_summary(by_mech[m], "captured") if m in by_mech else "" for m in names]
        )
    return table(["dataset", "centred", "epsilon", *names], body)


def downstream_table(rows: list[Row]) -> str:
    names = ["plain_gaussian", "oracle"] + [
        m for m in _order(rows) if m not in ("plain_gaussian", "oracle", NONPRIVATE)
    ]
    body = []
    for d, cell in sorted(_group(rows, lambda r: r.d).items()):
        by_mech = _group(cell, lambda r: r.mechanism)
        plain = spread([r.error_planted for r in by_mech.get("plain_gaussian", [])])[0]
        line: list[Any] = [d]
        for m in names:
            runs = by_mech.get(m, [])
            text = cell_summary(runs, "error_planted")
            ok = [r.error_planted for r in runs if r.status == "succeeded"]
            if ok and m != "plain_gaussian":
                text += f"; plain / this = {plain / spread(ok)[0]:.2g}"
            line.append(text)
        body.append(line)
    first = rows[0]
    return (
        f"n = {first.n:,} points within {first.distance:g} of a {first.k}-dim subspace, "
        f"epsilon = {first.epsilon:g}, delta = {first.delta:g} in total (half for the "
        "subspace, half for the mean in it), data mean of norm 0.5; error ||mu_hat - mean||_2 "
        "(plain / this > 1: better than the plain Gaussian mean in R^d)\n\n"
        + table(["d", *names], body)
    )


def speed_table(rows: list[Row]) -> tuple[str, str]:
    """Ratio to the floor per mechanism and d (at the grid's n), and the fitted exponents."""
    from bench.speed import exponents

    ratios = [r for r in rows if not r.mechanism.startswith("floor_")]
    n_grid = max(r.n for r in rows)
    ds = sorted({r.d for r in rows if r.n == n_grid})
    d_sweep = max(_group(rows, lambda r: r.d).items(), key=lambda kv: len({r.n for r in kv[1]}))[0]
    body = []
    for mech in _order(ratios):
        runs = _group([r for r in ratios if r.mechanism == mech and r.n == n_grid], lambda r: r.d)
        line: list[Any] = [
            mech,
            (runs.get(ds[0]) or [Row("", "", "", 0, 0, 0, 0, 0, 0, 0, "")])[0].params,
        ]
        for d in ds:
            line.append(cell_summary(runs.get(d, []), "ratio"))
        body.append(line)
    floor_line: list[Any] = ["X^T X + eigh (seconds)", ""]
    for d in ds:
        floor_line.append(show([r.seconds for r in rows if r.mechanism == "floor_gram"
                                and r.n == n_grid and r.d == d], unit=" s"))  # fmt: skip
    body.append(floor_line)
    speed_md = (
        f"Release time / floor at n = {n_grid:,} (epsilon = 1, k = 3; floors measured in the "
        "same repetition on the same data)\n\n"
        + table(["mechanism", "floor", *[f"d = {d}" for d in ds]], body)
    )
    exps = exponents(rows, n_grid, d_sweep)
    exp_body = [
        [m, "—" if math.isnan(a) else f"{a:.2f}", "—" if math.isnan(b) else f"{b:.2f}"]
        for m, (a, b) in exps.items()
        if not m.startswith("floor_subsets")
    ]
    ns = sorted({r.n for r in rows if r.d == d_sweep})
    exp_md = (
        f"Fitted exponents of the release time (least squares on log-log medians): in n at "
        f"d = {d_sweep} (n in {ns}), in d at n = {n_grid:,} (d in {ds})\n\n"
        + table(["mechanism", "exponent in n", "exponent in d"], exp_body)
    )
    return speed_md, exp_md


def memory_table(rows: list[Row]) -> str:
    first = rows[0]
    body = [
        [r.mechanism, r.status, "—" if math.isnan(r.memory_ratio) else f"{r.memory_ratio:.3g}",
         "—" if math.isnan(r.ratio) else f"{r.ratio:.3g}"]
        for r in rows
    ]  # fmt: skip
    return (
        f"Peak memory of one run over the data's size ({first.n:,} x {first.d} float64, "
        f"{first.n * first.d * 8 / 2**20:.0f} MiB; tracemalloc, which sees numpy's allocations), "
        "and the mechanism's own public estimate (memory_bytes) over the same size\n\n"
        + table(["mechanism", "status", "measured peak / data", "estimate / data"], body)
    )


def http_table(rows: list[Row]) -> str:
    first = rows[0]
    body = []
    for name, label in (
        ("http_release", "HTTP release, request to result with the client's wait (long poll), "
         "over X^T X + eigh"),
        ("http_release_polled", "the same with the client polling (long_poll=0), over "
         "X^T X + eigh"),
        ("direct_call", "direct analyze_gauss call, over X^T X + eigh"),
        ("http_over_direct", "HTTP release (long poll) over the direct call"),
        ("http_upload", "upload of the dataset (.npy) over np.load + np.save of it"),
    ):  # fmt: skip
        runs = [r for r in rows if r.mechanism == name]
        if not runs:
            continue  # CSVs from before the long poll have no polled row
        body.append(
            [label, show([r.ratio for r in runs]), show([r.seconds for r in runs], unit=" s")]
        )
    return (
        f"analyze_gauss on {first.n:,} x {first.d}, through the ASGI app in process (SQLite, one "
        "worker thread woken by the wake file); the analyst waits with the Python client "
        "(`ReleaseHandle.wait`); the privacy padding is off (a deliberate delay with figures "
        "of its own)\n\n" + table(["what", "ratio", "seconds"], body)
    )


def table_sections(results: dict[str, list[Row]], quick: bool) -> dict[str, str]:
    """The tables' sections by name (their blocks in docs/benchmarks.md), in page order."""
    out: dict[str, str] = {}
    notes = skipped_mechanisms()
    parts: list[str] = []
    if results.get("synthetic"):
        rows = results["synthetic"]
        parts.append("## Accuracy on synthetic data near a k-dim subspace\n")
        parts.append(synthetic_tables(rows))
        parts.append("\n### Best private mechanism per cell\n\n" + best_table(rows))
        if not quick:
            parts.append("\n### Distance to the non-private top-k\n")
            parts.append(synthetic_tables(rows, "error_nonprivate"))
            parts.append("\n### Captured variance\n")
            parts.append(synthetic_tables(rows, "captured"))
    if notes:
        parts.append(
            "\nNot in the accuracy tables: "
            + "; ".join(f"`{name}`: {why}" for name, why in notes.items())
        )
    out["synthetic"] = "\n".join(parts)
    if results.get("real"):
        parts = ["## Real data (scikit-learn's bundled sets): captured variance / PCA's\n"]
        if any(r.mechanism == "random" for r in results["real"]):
            parts.append(
                "`random` is a Haar-random k-dim subspace drawn without the data (seeded per "
                "dataset, centring and repetition): the baseline a mechanism must beat.\n"
            )
        parts.append(real_table(results["real"]))
        out["real"] = "\n".join(parts)
    if results.get("downstream"):
        out["downstream"] = (
            "## Downstream: private mean near a subspace (seed 001, Section 6)\n\n"
            + downstream_table(results["downstream"])
        )
    if results.get("speed"):
        speed_md, exp_md = speed_table(results["speed"])
        out["speed"] = "## Speed\n\n" + speed_md + "\n\n" + exp_md
    if results.get("memory"):
        out["memory"] = "## Memory\n\n" + memory_table(results["memory"])
    if results.get("http"):
        out["http"] = "## End to end over HTTP\n\n" + http_table(results["http"])
    return out


def tables(results: dict[str, list[Row]], quick: bool) -> str:
    """All tables as Markdown text (the quick run prints this)."""
    return "\n\n".join(text.strip() for text in table_sections(results, quick).values() if text)


# ---------------------------------------------------------------------------------------------
# Plots and the document


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colour(name: str) -> str:
    """One colour per mechanism in every plot (tab10, then tab20's light shades)."""
    from service.mechanisms.registry import MECHANISMS

    if name == "random":
        return "black"  # the baseline, drawn apart from every mechanism
    fixed = [NONPRIVATE, "plain_gaussian", "oracle", *MECHANISMS, *PEERS]
    palette = [f"C{i}" for i in range(10)] + [
        "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2",
    ]  # fmt: skip
    index = fixed.index(name) if name in fixed else len(fixed) + sum(map(ord, name))
    return palette[index % len(palette)]


def _series(ax: Any, xs_rows: dict[float, list[Row]], label: str, metric: str) -> None:
    xs, med, lo, hi = [], [], [], []
    for x in sorted(xs_rows):
        ok = [getattr(r, metric) for r in xs_rows[x] if r.status == "succeeded"]
        if not ok:
            continue
        m, a, b = spread(ok)
        xs.append(x)
        med.append(m)
        lo.append(m - a)
        hi.append(b - m)
    if xs:
        ax.errorbar(
            xs,
            med,
            yerr=[lo, hi],
            marker="o",
            capsize=3,
            label=label,
            color=_colour(label),
            linestyle="--" if label == "random" else "-",
        )


def plots(results: dict[str, list[Row]]) -> list[tuple[str, str]]:
    """Write the PNGs; returns ``(file name, caption)`` pairs."""
    plt = _plt()
    IMG.mkdir(parents=True, exist_ok=True)
    made: list[tuple[str, str]] = []
    syn = results.get("synthetic", [])
    if syn:
        n_max = max(r.n for r in syn)
        d_max = max(r.d for r in syn)
        for eps in sorted({r.epsilon for r in syn if not math.isnan(r.epsilon)}):
            fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
            sel = [
                r for r in syn if r.n == n_max and (r.epsilon == eps or r.mechanism == NONPRIVATE)
            ]
            for mech in _order(sel):
                mine = [r for r in sel if r.mechanism == mech]
                _series(axes[0], _group([r for r in mine if r.d == d_max], lambda r: r.distance),
                        mech, "error_planted")  # fmt: skip
                dist_min = min(r.distance for r in sel)
                _series(axes[1], _group([r for r in mine if r.distance == dist_min],
                                        lambda r: r.d), mech, "error_planted")  # fmt: skip
            axes[0].set(xscale="log", yscale="log", xlabel="distance of each row to the subspace",
                        ylabel="||Pi_hat - Pi||_2 (planted)", title=f"d = {d_max}")  # fmt: skip
            axes[1].set(xscale="log", yscale="log", xlabel="d",
                        title=f"distance = {min(r.distance for r in sel):g}")  # fmt: skip
            for ax in axes:
                ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
                ax.grid(True, which="major", alpha=0.3)
            axes[1].legend(fontsize=8, loc="best")
            fig.suptitle(f"Subspace error, n = {n_max:,}, epsilon = {eps:g}, k = 3 "
                         "(median, IQR or min-max; dotted: a random subspace)")  # fmt: skip
            fig.tight_layout()
            name = f"synthetic_eps{eps:g}.png"
            fig.savefig(IMG / name, dpi=110)
            plt.close(fig)
            made.append((name, f"Subspace error against distance and d, epsilon = {eps:g}"))
    real = [r for r in results.get("real", []) if not math.isnan(r.epsilon)]
    if real:
        sets = sorted({r.dataset for r in real})
        fig, axes = plt.subplots(2, len(sets), figsize=(4.5 * len(sets), 7.5), squeeze=False)
        for j, dataset in enumerate(sets):
            for i, centred in enumerate(("no", "yes")):
                ax = axes[i][j]
                sel = [r for r in real if r.dataset == dataset and r.centered == centred]
                for mech in _order(sel):
                    _series(ax, _group([r for r in sel if r.mechanism == mech],
                                       lambda r: r.epsilon), mech, "captured")  # fmt: skip
                ax.set(xscale="log", ylim=(0, 1.05), xlabel="epsilon",
                       title=f"{dataset}, centred = {centred}")  # fmt: skip
                ax.grid(True, alpha=0.3)
            axes[0][j].set_ylabel("captured variance / PCA's")
        handles: dict[str, Any] = {}
        for ax in axes.flat:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(label, handle)
        fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles),
                   fontsize=8)  # fmt: skip
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        fig.savefig(IMG / "real_captured.png", dpi=110)
        plt.close(fig)
        made.append(("real_captured.png", "Captured variance against epsilon on real data"))
    down = results.get("downstream", [])
    if down:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for mech in ["plain_gaussian", "oracle"] + [
            m for m in _order(down) if m not in ("plain_gaussian", "oracle", NONPRIVATE)
        ]:
            _series(ax, _group([r for r in down if r.mechanism == mech], lambda r: r.d),
                    mech, "error_planted")  # fmt: skip
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="d",
            ylabel="||mu_hat - mean||_2",
            title="Private mean near a 3-dim subspace (n = 30,000, distance 1e-5, eps = 1)",
        )
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(IMG / "downstream_mean.png", dpi=110)
        plt.close(fig)
        made.append(("downstream_mean.png", "Downstream mean estimation error against d"))
    spd = results.get("speed", [])
    if spd:
        n_max = max(r.n for r in spd)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        sel = [r for r in spd if r.n == n_max and not r.mechanism.startswith("floor_")]
        for mech in _order(sel):
            _series(ax, _group([r for r in sel if r.mechanism == mech], lambda r: r.d), mech,
                    "ratio")  # fmt: skip
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.set(xscale="log", yscale="log", xlabel="d", ylabel="release time / floor",
               title=f"Release time over its floor, n = {n_max:,}")  # fmt: skip
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(IMG / "speed_ratio.png", dpi=110)
        plt.close(fig)
        made.append(("speed_ratio.png", "Release time over the floor against d"))
    return made


def machine() -> str:
    """The machine, from what the process can see."""
    import numpy as np

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        mem = f"{pages / 2**30:.0f} GiB"
    except (ValueError, OSError):
        mem = "?"
    blas = ""
    try:
        from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if info:
            blas = (
                f"{info[0].get('internal_api')} {info[0].get('version')} "
                f"({info[0].get('architecture')}), run with {info[0].get('num_threads')} "
                "BLAS thread(s) (`--blas-threads`, default 1: on a machine shared with other "
                "jobs a threaded BLAS made `X^T X` 20-50x slower and erratic)"
            )
    except ImportError:
        pass
    return (
        f"- CPU: {cpu}, {os.cpu_count()} cores; memory {mem}; {platform.system()} "
        f"{platform.release()}\n- Python {platform.python_version()}, numpy {np.__version__}"
        f"{', BLAS ' + blas if blas else ''}\n"
        "- The machine was shared with other jobs during the run: absolute times are noisy, "
        "which is why every timing is published as a ratio to a baseline measured in the same "
        "process, in the same repetition, on the same data."
    )


#: docs/benchmarks.md: the generator owns only the blocks between these marker lines (and the
#: standing benches' sections between their own ``<!-- NAME:start/end -->`` lines, from
#: bench/results/*.md); every other line of the page is hand-written and kept as it is.
START = "<!-- generated:{}:start -->"
END = "<!-- generated:{}:end -->"
#: The page's head when there is no page yet (a new checkout of the harness alone).
HEAD = (
    "# Benchmarks: accuracy and speed of every mechanism, against the peers and the floor\n\n"
    "Partly generated: `python -m bench` (the harness in `bench/`; `--report` from the CSVs "
    "in `bench/results/` alone) rewrites only the blocks between `generated:NAME:start` and "
    "`generated:NAME:end` comment lines (machine and commands, the accuracy, real-data, "
    "downstream, speed, memory and HTTP tables, the load test, Dask, raw results), and the "
    "standing benches' sections between their `NAME:start` and `NAME:end` lines (accounting, "
    "privacy unit: from `bench/results/*.md`, written by those scripts); do not edit inside "
    "those blocks. Everything else, the conclusions and the measurement sections, is written "
    "by hand here and kept as it is by every rebuild.\n\n"
    "## What to conclude\n\n(written by hand after a run)"
)


def regions(
    results: dict[str, list[Row]], load_text: str, images: Sequence[tuple[str, str]]
) -> dict[str, str]:
    """The generated blocks of docs/benchmarks.md by name, in page order (without markers);
    ``machine`` is this machine (only a run that measured should publish it)."""
    out: dict[str, str] = {"machine": "## Machine and commands\n\n" + machine()}
    commands = [
        "```sh",
        "python -m bench --quick     # CI: a small subset, tables on stdout (about 2 minutes)",
        "python -m bench             # this page: every section, CSVs, plots",
        "python -m bench --sections synthetic --ds 1000 --reps 2 --no-peers --tag d1000",
        "python -m bench --sections synthetic,real --no-peers   # some sections only",
        "# the re-run behind this page (one core, one BLAS thread):",
        "taskset -c 1 nice -n 5 python -m bench --no-peers --sections real --real-reps 15",
        "taskset -c 1 nice -n 5 python -m bench --no-peers --sections downstream "
        "--downstream-reps 3",
        "taskset -c 1 nice -n 5 python -m bench --no-peers --sections synthetic --ds 10 "
        "--reps 5 --tag d10",
        "#   (and --ds 50 --tag d50, --ds 300 --tag d300; --ds 1000 --reps 3 --tag d1000)",
        "taskset -c 1 nice -n 5 python -m bench --no-peers --sections speed",
        "# kept from earlier runs on the merged code (http.csv, *_peers.csv, memory.csv,",
        "# load_test.txt):",
        "taskset -c 0 python -m bench --no-peers --sections http",
        "taskset -c 1 python -m bench --peers-only --sections synthetic --ds 10 --reps 2 "
        "--tag peers_d10",
        "#   (and --ds 50 --tag peers_d50, --ds 300 --tag peers_d300; merged: synthetic_peers.csv)",
        "taskset -c 1 python -m bench --peers-only --sections real --real-reps 2",
        "taskset -c 1 python -m bench --sections memory",
        "python -m bench --sections load   # both cores",
        "python -m bench --report    # rebuild this page from bench/results/*.csv",
        "```",
        "",
        "Method. Synthetic rows lie within an exact distance of a random 3-dim subspace of R^d "
        "(seed 001, Section 6; row norms <= 1 = the public clip bound). Every registered "
        "mechanism runs through its public interface (params, `prepare`, `run`) with its "
        "default params at the same (epsilon, delta = 1e-6); `refused` is the 422 the service "
        "answers before charging; `histogram_aggregate` runs with its defaults too (its cell "
        "width searched privately; rows of an earlier run that gave it the *true* gap, an oracle "
        "no user has, would show as `histogram_aggregate (oracle gamma)`). The peers "
        "(diffprivlib 0.6.6 and OpenDP 0.16.0 PCA, each in its own "
        "virtual environment, a per-fit time limit) are **pure** epsilon-DP (delta = 0) at the "
        "same epsilon; OpenDP always centres on a private mean. Seeds are fixed per cell, and "
        "within a cell and repetition every mechanism draws from the same generator (common "
        "random numbers: `auto` running `analyze_gauss` with the whole budget releases exactly "
        "its result). "
        "Errors are `||Pi_hat - Pi||_2` (1 is a random subspace; the non-private floor is "
        "`nonprivate_pca`); captured variance is `||X U||_F^2` over the non-private top-k's; "
        "on the real sets `random`, a Haar-random k-dim subspace drawn without the data, is "
        "the baseline a mechanism must beat. "
        "A mechanism that spent more than 5 s to end without a result is not repeated in "
        "its cell (`skipped` with the reason in the CSV). The grid: d in {10, 50, 300} with 5 "
        "repetitions and d = 1,000 with 3 (more than the full configuration's 3 and 2: `auto`'s "
        "private tests err in a few percent of runs, and 2 repetitions let one such run decide "
        "a cell), distance in {0.1, 1e-3, 1e-5}, n in {5,000, 50,000}, "
        "epsilon in {0.1, 1}; real sets (15 repetitions), the downstream task (3) and speed (3) "
        "with the full configuration, on one core with one BLAS thread; HTTP (5 repetitions, "
        "the client's long poll) from its run earlier the same day. The peers were re-run alone "
        "(`--peers-only`, rows in `synthetic_peers.csv` and `real_peers.csv`) on every synthetic "
        "cell with d in {10, 50, 300} and on the real sets at every epsilon of the real grid, "
        "centred and not, 2 repetitions each, with a limit of 30 s of CPU time per fit (CPU, "
        "not wall clock: the core was shared with other jobs, load average 4-7 on 2 cores); "
        "after a time-out the cell's second repetition was not run (`skipped`), except at "
        "d = 10, where both ran. The memory section (one core) and the load test (API, workers, "
        "PostgreSQL and clients on the machine's 2 cores, shared; `load_test.txt` gives the "
        "load average) were re-run on the merged code too.",
        "",
    ]
    for name, caption in images:
        commands += [f"![{caption}](img/{name})", ""]
    out["commands"] = "\n".join(commands)
    out.update(table_sections(results, quick=False))
    if load_text.strip():
        out["load-test"] = "\n".join([
            "## Requests per second under concurrent load (`scripts/load_test.py`)",
            "",
            "API (2 processes) and two workers on the local PostgreSQL, closed-loop clients "
            "(see docs/reliability.md); the output as printed:",
            "",
            "```",
            load_text.strip(),
            "```",
        ])  # fmt: skip
    dask_results = sorted(RESULTS.glob("dask*.txt"))
    if dask_results:
        dask = [DASK_SECTION]
        for path in dask_results:
            dask += ["", f"`{path.name}`:", "", "```", path.read_text().strip(), "```"]
        out["dask"] = "\n".join(dask)
    out["raw-results"] = (
        "## Raw results\n\n"
        "`bench/results/<section>.csv`, one row per run: section, mechanism, dataset, d, n, "
        "distance, epsilon, delta, k, rep, status (succeeded / no_result / refused / timeout / "
        "failed / skipped / unavailable), error_planted, error_nonprivate, captured, seconds, "
        "ratio (timing over its floor, or the memory estimate over the data), memory_ratio, "
        "centered, params, reason."
    )
    return out


def standing_sections() -> list[str]:
    """The standing benches' sections as their scripts published them (bench/results/*.md,
    each opening with its ``<!-- NAME:start -->`` line and closing with its end line)."""
    paths = [*sorted(RESULTS.glob("accounting*.md")), *sorted(RESULTS.glob("privacy_unit*.md"))]
    return [path.read_text().strip() for path in paths]


def write(
    results: dict[str, list[Row]], load_text: str, config: Any, *, measured: bool = True
) -> None:
    """docs/img/*.png from the results, and their blocks of docs/benchmarks.md rewritten in
    place (every line outside them kept). ``measured=False`` (``--report``) keeps the page's
    machine: the CSVs were measured there, not on the machine that rebuilds the page."""
    path = DOCS / "benchmarks.md"
    doc = path.read_text() if path.exists() else None
    if doc is not None:
        # Every marked block closed before anything is written: an unclosed one would make a
        # later block's rewrite (or the insertion point) swallow hand-written lines.
        for start in re.findall(r"^<!-- [\w:-]+:start -->$", doc, flags=re.M):
            find_block(doc, start, start.replace(":start -->", ":end -->"))
    blocks = regions(results, load_text, plots(results))
    if doc is not None:
        if not measured and find_block(doc, START.format("machine"), END.format("machine")):
            del blocks["machine"]
    else:
        doc = HEAD + "".join(
            f"\n\n{START.format(name)}\n{END.format(name)}" for name in blocks
        ) + "\n"  # fmt: skip
    for name, text in blocks.items():
        start, end = START.format(name), END.format(name)
        body = text.strip()
        doc = put_block(doc, start, end, "\n".join([start, *([body] if body else []), end]))
    for text in standing_sections():
        lines = text.splitlines()
        doc = put_block(doc, lines[0], lines[-1], text)
    path.write_text(doc)


def find_block(doc: str, start: str, end: str) -> tuple[int, int] | None:
    """Where the block from the line ``start`` to the line ``end`` (both included) is in
    ``doc``, or None when ``start`` is on no line of its own. Only whole lines count: prose
    that quotes a marker is not one."""
    found = re.search(rf"^{re.escape(start)}$", doc, flags=re.M)
    if found is None:
        return None
    closed = re.compile(rf"^{re.escape(end)}$", flags=re.M).search(doc, found.end())
    if closed is None:
        # Rewriting to the end of the page would delete what follows: refuse instead.
        raise ValueError(f"docs/benchmarks.md: {start} has no {end} line after it")
    return found.start(), closed.end()


def put_block(doc: str, start: str, end: str, text: str) -> str:
    """``doc`` with its ``start`` ... ``end`` block replaced by ``text`` (which opens and closes
    with those lines), every other character kept; a block the page does not have yet goes
    before the raw results' block (else "## Raw results", else the end)."""
    where = find_block(doc, start, end)
    if where is not None:
        return doc[: where[0]] + text + doc[where[1] :]
    anchor = re.search(rf"^{re.escape(START.format('raw-results'))}$", doc, flags=re.M)
    anchor = anchor or re.search(r"^## Raw results$", doc, flags=re.M)
    if anchor is None:
        return doc.rstrip("\n") + "\n\n" + text + "\n"
    return doc[: anchor.start()] + text + "\n\n" + doc[anchor.start() :]


def publish_section(result: Path, start: str, end: str, text: str) -> None:
    """A standing bench's deterministic section: ``text`` (which opens with ``start`` and closes
    with ``end``) to ``result`` under bench/results, from which :func:`write` rewrites it, and
    into docs/benchmarks.md now, in place of the block between the same marker lines (before
    the raw results the first time)."""
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text(text + "\n")
    doc_path = DOCS / "benchmarks.md"
    doc_path.write_text(put_block(doc_path.read_text(), start, end, text))
