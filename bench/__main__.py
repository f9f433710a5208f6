"""``python -m bench``: the benchmark harness (accuracy and speed, the service against its peers).

    python -m bench --quick            # small subset, prints the tables (CI; about 2 minutes)
    python -m bench                    # full run: bench/results/*.csv, docs/benchmarks.md, plots
    python -m bench --sections speed,http      # some sections only (their CSVs are rewritten)
    python -m bench --report           # rebuild docs/benchmarks.md's generated blocks and plots
    python -m bench --sections accounting      # the accounting table (bench_accounting.py)
    python -m bench --sections synthetic,real --peers-only --ds 10,50 --reps 2 --real-reps 2
                                       # the peers alone: synthetic_peers.csv, real_peers.csv

Fixed seeds; every figure a median with its spread over repetitions; every timing a ratio to a
baseline measured in the same process on the same data. Progress goes to stderr, one line per
cell. See docs/benchmarks.md for what the sections measure.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import bench_accounting, report
from bench.accuracy import SyntheticGrid, downstream, real, synthetic
from bench.core import RESULTS, Row, SlowGuard, read_csv, write_csv
from bench.peers import PeerEnvs
from bench.speed import SpeedGrid, http_release, load_test, memory, speed

SECTIONS = ("synthetic", "real", "downstream", "speed", "memory", "http", "load", "accounting")


@dataclass(frozen=True)
class Config:
    synthetic: SyntheticGrid
    real_sets: tuple[str, ...]
    real_epsilons: tuple[float, ...]
    real_reps: int
    real_peer_epsilons: tuple[float, ...]
    real_peer_reps: int
    downstream_ds: tuple[int, ...]
    downstream_reps: int
    speed: SpeedGrid
    memory_shape: tuple[int, int]
    http_shape: tuple[int, int]
    http_reps: int
    peer_limit: float
    peer_build_timeout: float
    load: tuple[int, float] | None
    sections: tuple[str, ...] = field(default=SECTIONS)
    #: Only the peers' rows in the accuracy sections (``--peers-only``).
    peers_only: bool = False
    #: Which peers run (``--peers``).
    peers: tuple[str, ...] = ("diffprivlib", "opendp")


QUICK = Config(
    synthetic=SyntheticGrid(ds=(10, 50), distances=(1e-1, 1e-5), ns=(5_000,), epsilons=(1.0,),
                            reps=2),
    # The peers on one tiny cell (wine, 178 x 13, epsilon 1, one repetition), 15 s per fit.
    real_sets=("wine",), real_epsilons=(1.0,), real_reps=1, real_peer_epsilons=(1.0,),
    real_peer_reps=1,
    downstream_ds=(100,), downstream_reps=1,
    speed=SpeedGrid(n=10_000, ds=(50, 100), reps=2, n_sweep=(5_000,), n_sweep_d=100),
    memory_shape=(5_000, 50), http_shape=(5_000, 50), http_reps=1,
    peer_limit=15.0, peer_build_timeout=150.0, load=None,
)  # fmt: skip

FULL = Config(
    synthetic=SyntheticGrid(
        ds=(10, 50, 300), distances=(1e-1, 1e-3, 1e-5), ns=(5_000, 50_000),
        epsilons=(0.1, 1.0), reps=3, peer_cells=((10, 5_000),), peer_limit=30.0, peer_reps=1,
    ),
    real_sets=("digits", "breast_cancer", "wine"), real_epsilons=(0.1, 0.3, 1.0, 3.0),
    real_reps=5, real_peer_epsilons=(1.0,), real_peer_reps=2,
    downstream_ds=(100, 300, 1000), downstream_reps=3,
    speed=SpeedGrid(n=50_000, ds=(100, 400, 1000), reps=3, n_sweep=(12_500, 25_000, 50_000),
                    n_sweep_d=400),
    memory_shape=(50_000, 400), http_shape=(50_000, 400), http_reps=5,
    peer_limit=30.0, peer_build_timeout=900.0, load=(20, 10.0),
)  # fmt: skip


def run(config: Config, save: Path | None, tag: str = "") -> dict[str, list[Row]]:
    """Run the configured sections; returns their rows by section. With ``save``, each
    section's CSV is written there as soon as the section ends (a cut run keeps what it did)."""
    # With --no-peers no cell asks for them: building their environments (a pip install in
    # background threads) would only take CPU from the mechanisms being timed.
    wants_peers = ("synthetic" in config.sections and bool(config.synthetic.peer_cells)) or (
        "real" in config.sections and bool(config.real_peer_epsilons)
    )
    peers = PeerEnvs(config.peer_build_timeout) if wants_peers else None
    sc = config.synthetic
    jobs: dict[str, Callable[[], list[Row]]] = {
        "synthetic": lambda: synthetic(sc, peers),
        "real": lambda: real(
            config.real_sets, config.real_epsilons, config.real_reps, peers,
            config.real_peer_epsilons, config.peer_limit, peer_reps=config.real_peer_reps,
            peers_only=config.peers_only, peer_names=config.peers,
        ),
        "downstream": lambda: downstream(config.downstream_ds, config.downstream_reps),
        "speed": lambda: speed(config.speed),
        "memory": lambda: memory(*config.memory_shape),
        "http": lambda: http_release(*config.http_shape, config.http_reps),
    }  # fmt: skip
    results: dict[str, list[Row]] = {}
    try:
        for section, job in jobs.items():
            if section in config.sections:
                results[section] = job()
                if save is not None:
                    write_csv(save / f"{section}{'_' + tag if tag else ''}.csv", results[section])
    finally:
        if peers is not None:
            # A build no section waited for (or one a failed section left) must not go on
            # writing after the run: its thread is a daemon, its pip a process of its own.
            peers.close()
    return results


def limit_blas(threads: int) -> None:
    """Same BLAS thread count for every mechanism, floor and peer (subprocesses inherit it)."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    threadpool_limits(limits=threads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small subset, tables to stdout")
    parser.add_argument("--sections", help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--report", action="store_true", help="only rebuild the docs from CSVs")
    parser.add_argument("--no-peers", action="store_true", help="skip diffprivlib and OpenDP")
    parser.add_argument("--peers", help="comma-separated subset of diffprivlib,opendp")
    parser.add_argument(
        "--peers-only", action="store_true",
        help="only diffprivlib and OpenDP in the accuracy sections, on every synthetic (d, n) cell "
        "and repetition of the grid (--ds, --reps) and every real epsilon and repetition "
        "(--real-reps); their rows go to <section>_peers.csv (or --tag), next to the mechanisms'",
    )  # fmt: skip
    parser.add_argument("--results", type=Path, default=RESULTS, help="CSV directory")
    parser.add_argument(
        "--blas-threads", type=int, default=1,
        help="BLAS threads for the whole run, peers included (default 1: on a shared machine "
        "a threaded BLAS under oversubscription makes X^T X 20-50x slower and erratic)",
    )  # fmt: skip
    parser.add_argument(
        "--mechanisms", help="comma-separated registered mechanisms for the accuracy sections "
        "(default: all); with --results elsewhere, to re-measure one and splice its rows",
    )  # fmt: skip
    parser.add_argument("--ds", help="override the synthetic grid's d values, e.g. 1000")
    parser.add_argument("--reps", type=int, help="override the synthetic grid's repetitions")
    parser.add_argument("--real-reps", type=int, help="override the real section's repetitions")
    parser.add_argument(
        "--downstream-reps", type=int, help="override the downstream section's repetitions"
    )
    parser.add_argument(
        "--tag", default="", help="suffix of the CSV names (<section>_<tag>.csv), so that an "
        "extra run adds to the results instead of replacing them; the report reads them all",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.peers_only and args.no_peers:
        parser.error("--peers-only and --no-peers exclude each other")
    limit_blas(args.blas_threads)
    if args.mechanisms:
        from bench import core

        core.ONLY_MECHANISMS = frozenset(m.strip() for m in args.mechanisms.split(",") if m)
    config = QUICK if args.quick else FULL
    if args.quick:
        SlowGuard.shared = SlowGuard(5.0)
    if args.sections:
        chosen = tuple(s.strip() for s in args.sections.split(",") if s.strip())
        unknown = sorted(set(chosen) - set(SECTIONS))
        if unknown:
            parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
        config = Config(**{**config.__dict__, "sections": chosen})
    if args.ds or args.reps:
        grid = SyntheticGrid(**{
            **config.synthetic.__dict__,
            **({"ds": tuple(int(d) for d in args.ds.split(","))} if args.ds else {}),
            **({"reps": args.reps} if args.reps else {}),
        })  # fmt: skip
        config = Config(**{**config.__dict__, "synthetic": grid})
    if args.real_reps:
        config = Config(**{**config.__dict__, "real_reps": args.real_reps})
    if args.downstream_reps:
        config = Config(**{**config.__dict__, "downstream_reps": args.downstream_reps})
    if args.no_peers:
        grid = SyntheticGrid(**{**config.synthetic.__dict__, "peer_cells": ()})
        config = Config(**{**config.__dict__, "synthetic": grid, "real_peer_epsilons": ()})
    if args.peers_only:
        # The peers wherever the grid goes, instead of the config's few cells; the floor and
        # the mechanisms are left out, so the CSVs only add the peers' rows to the report.
        grid = SyntheticGrid(**{
            **config.synthetic.__dict__, "peers_only": True, "peer_reps": config.synthetic.reps,
            "peer_cells": tuple((d, n) for d in config.synthetic.ds for n in config.synthetic.ns),
        })  # fmt: skip
        config = Config(**{
            **config.__dict__, "synthetic": grid, "peers_only": True,
            "real_peer_epsilons": config.real_epsilons, "real_peer_reps": config.real_reps,
        })  # fmt: skip
        args.tag = args.tag or "peers"
    if args.peers:
        names = tuple(p.strip() for p in args.peers.split(",") if p.strip())
        if not set(names) <= {"diffprivlib", "opendp"}:
            parser.error("--peers: choose from diffprivlib, opendp")
        grid = SyntheticGrid(**{**config.synthetic.__dict__, "peers": names})
        config = Config(**{**config.__dict__, "synthetic": grid, "peers": names})
    started = time.perf_counter()
    if not args.report:
        results = run(config, None if args.quick else args.results, args.tag)
        if config.load is not None and "load" in config.sections:
            text = load_test(*config.load)
            if not args.quick:
                (args.results / "load_test.txt").parent.mkdir(parents=True, exist_ok=True)
                (args.results / "load_test.txt").write_text(text)
        if "accounting" in config.sections:
            # Deterministic figures (no timing): bench/bench_accounting.py's table, kept in
            # results/accounting.md for the report.
            table = bench_accounting.table(args.quick)
            if args.quick:
                print(table)
            else:
                report.publish_section(
                    bench_accounting.RESULT,
                    bench_accounting.START,
                    bench_accounting.END,
                    bench_accounting.section(table),
                )
        if args.quick:
            print(report.tables(results, quick=True))
            print(f"\n(quick run: {time.perf_counter() - started:.0f} s on {platform.node()})")
            return 0
    loaded: dict[str, list[Row]] = {}
    for section in SECTIONS:
        for path in sorted(args.results.glob(f"{section}*.csv")):
            loaded.setdefault(section, []).extend(report.label_oracle(read_csv(path)))
    load_text = args.results / "load_test.txt"
    report.write(
        loaded, load_text.read_text() if load_text.exists() else "", FULL,
        measured=not args.report,
    )  # fmt: skip
    print(report.tables(loaded, quick=False))
    print(f"\n(wrote docs/benchmarks.md and docs/img/*.png in "
          f"{time.perf_counter() - started:.0f} s)", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
