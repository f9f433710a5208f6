"""Datasets by reference on Dask: a Parquet dataset larger than any Dask worker's memory limit.

    python bench/bench_dask.py [--rows 1000000] [--cols 500] [--row-group-rows 8192]
                               [--worker-memory-mb 1536] [--slice-rows 100000]
                               [--speedup-rows 200000] [--skip-friendly]

Everything runs on this machine: an S3 endpoint from moto's server mode (``ThreadedMotoServer``
on 127.0.0.1, objects spilled to its temporary files), and ``distributed.LocalCluster``\\ s of
worker processes (1 thread each, ``memory_limit`` = ``--worker-memory-mb``).

1. **Write** ``--rows x --cols`` float64 rows near a 3-dim subspace (row norm <= 1) as Parquet
   objects of ``--row-group-rows``-row groups, and a slice (the first ``--slice-rows`` rows) as
   a second dataset; **register** both through :func:`service.reference.inspect` (footers and
   every value read in bounded batches, as the API does).
2. **Release** ``analyze_gauss`` and ``friendly_aggregate`` on the whole dataset on 2 Dask
   workers; on the slice both in process (Dask's synchronous scheduler) and on Dask, with one
   seed: the results must be equal (they are the same tasks, added in the same order).
3. **Peak memory** of each Dask worker process (RSS sampled every 0.2 s) against its limit.
4. **Speed-up** of the Gram pass from 1 to 2 workers on the first ``--speedup-rows`` rows, and
   per-task rates (Dask's task stream) for a model of 8, 32 and 128 workers: the row-group tasks
   divide over the workers, the reduction chain and the graph's submission do not.

Prints a table; times are wall-clock seconds on this machine (2 cores, shared).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.config import Settings  # noqa: E402
from service.mechanisms.analyze_gauss import AnalyzeGauss  # noqa: E402
from service.mechanisms.base import PublicContext, ReleaseSpec  # noqa: E402
from service.mechanisms.friendly_aggregate import FriendlyAggregate  # noqa: E402
from service.mechanisms.linalg import subspace_distance  # noqa: E402
from service.reference import ParquetRows, Reference, inspect  # noqa: E402

BUCKET = "dpss-bench"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_dataset(fs: Any, prefix: str, rows: int, cols: int, group: int, seed: int) -> list[str]:
    """Rows near a 3-dim subspace in objects of at most 48 MiB (whole row groups), each one PUT
    (moto's server loses parts of large multipart uploads), written group by group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(cols, 3)))
    names = [f"c{i}" for i in range(cols)]
    schema = pa.schema([(name, pa.float64()) for name in names])
    per_object = group * max(1, (48 << 20) // (8 * group * cols))
    for index, start in enumerate(range(0, rows, per_object)):
        stop = min(rows, start + per_object)
        with (
            fs.open(f"{prefix}/part-{index:05d}.parquet", "wb") as handle,
            pq.ParquetWriter(handle, schema, compression="none") as writer,
        ):
            for first in range(start, stop, group):
                count = min(group, stop - first)
                block = rng.normal(size=(count, 3)) @ basis.T * 0.3
                block += rng.normal(size=(count, cols)) * (1e-4 / np.sqrt(cols))
                block /= np.maximum(1.0, np.linalg.norm(block, axis=1))[:, None]
                writer.write_table(
                    pa.table({n: block[:, i] for i, n in enumerate(names)}, schema=schema)
                )
    return names


class PeakMemory:
    """Each Dask worker process's largest RSS, sampled every 0.2 s from the nannies' pids."""

    def __init__(self, pids: list[int]) -> None:
        import psutil

        self.processes = [psutil.Process(pid) for pid in pids]
        self.peaks = [0] * len(pids)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            for i, process in enumerate(self.processes):
                try:
                    self.peaks[i] = max(self.peaks[i], process.memory_info().rss)
                except Exception:
                    continue

    def close(self) -> list[int]:
        self.stop.set()
        self.thread.join()
        return self.peaks


def release(
    rows: ParquetRows, mechanism: Any, k: int, epsilon: float, delta: float, seed: int
) -> Any:
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, k, epsilon, delta, mechanism.parse_params({}))
    spec = ReleaseSpec(k=k, epsilon=epsilon, delta=delta, params=params)
    return mechanism.run(rows, spec, np.random.default_rng(seed))


def timed(label: str, work: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - start
    print(f"  {label}: {seconds:.1f} s", file=sys.stderr, flush=True)
    return result, seconds


def main() -> None:
    # One BLAS thread here, as in Dask's worker processes (the nanny sets it): the in-process
    # and the Dask runs then add in the same order down to the BLAS kernels (equal bits).
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cols", type=int, default=500)
    parser.add_argument("--row-group-rows", type=int, default=8192)
    parser.add_argument("--worker-memory-mb", type=int, default=1536)
    parser.add_argument("--slice-rows", type=int, default=100_000)
    parser.add_argument("--speedup-rows", type=int, default=200_000)
    parser.add_argument("--skip-friendly", action="store_true")
    parser.add_argument("--skip-gauss", action="store_true")
    parser.add_argument("--skip-speedup", action="store_true")
    parser.add_argument("--dask-pass-mb", type=float, default=512)
    parser.add_argument(
        "--tag", default="", help="figures go to bench/results/dask<tag>.txt (default: dask.txt)"
    )
    args = parser.parse_args()

    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    import s3fs
    from distributed import Client, LocalCluster, get_task_stream
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    fs.mkdir(BUCKET)
    settings = Settings(
        data_dir=Path("/tmp"), reference_roots=f"s3://{BUCKET}", s3_endpoint_url=endpoint
    )
    figures: dict[str, Any] = {
        "shape": (args.rows, args.cols),
        "bytes": 8 * args.rows * args.cols,
        "worker_limit": args.worker_memory_mb << 20,
    }
    group = args.row_group_rows
    print(
        f"writing {args.rows} x {args.cols} ({figures['bytes'] / 2**30:.2f} GiB)", file=sys.stderr
    )
    names, figures["write_s"] = timed(
        "write", lambda: write_dataset(fs, f"{BUCKET}/full", args.rows, args.cols, group, 7)
    )
    # The slice: the first rows, as objects of their own (registered as a dataset of its own).
    timed(
        "write slice",
        lambda: write_dataset(fs, f"{BUCKET}/slice", args.slice_rows, args.cols, group, 7),
    )
    full, figures["register_s"] = timed(
        "register (every value read)", lambda: inspect(f"s3://{BUCKET}/full", names, settings)
    )
    part = inspect(f"s3://{BUCKET}/slice", names, settings)

    def cluster(workers: int) -> Any:
        return LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            memory_limit=f"{args.worker_memory_mb}MiB",
        )

    mechanisms = [] if args.skip_gauss else [("analyze_gauss", AnalyzeGauss(), 0.5, 1e-6)]
    if not args.skip_friendly:
        mechanisms.append(("friendly_aggregate", FriendlyAggregate(), 1.0, 1e-6))
    with cluster(2) as two, Client(two) as client:
        pids = list(client.run(os.getpid).values())
        on_dask = settings.model_copy(
            update={"dask_scheduler": two.scheduler_address, "dask_pass_mb": args.dask_pass_mb}
        )
        for name, mechanism, eps, delta in mechanisms:
            here = release(ParquetRows(part, settings), mechanism, 3, eps, delta, 11)
            there_rows = ParquetRows(part, on_dask)
            there = release(there_rows, mechanism, 3, eps, delta, 11)
            there_rows.close()
            same = (here.basis is None and there.basis is None) or bool(
                here.basis is not None
                and there.basis is not None
                and np.array_equal(here.basis, there.basis)
            )
            distance = (
                subspace_distance(here.basis, there.basis)
                if here.basis is not None and there.basis is not None
                else float("nan")
            )
            figures[f"{name}_slice_equal"] = f"bits equal {same}, distance {distance:.1e}"
            print(f"  {name} slice: {figures[f'{name}_slice_equal']}", file=sys.stderr)
            peak = PeakMemory(pids)
            big = ParquetRows(full, on_dask)
            out, seconds = timed(
                f"{name} full on 2 workers", partial(release, big, mechanism, 3, eps, delta, 11)
            )
            big.close()
            figures[f"{name}_full_s"] = seconds
            figures[f"{name}_full_status"] = "no_result" if out.basis is None else "succeeded"
            figures[f"{name}_peak_rss"] = peak.close()
    # Speed-up of the Gram pass (1 and 2 workers) on a prefix, and the per-task rate.
    prefix = Reference(
        uri=full.uri,
        location=full.location,
        columns=full.columns,
        objects=full.objects,
        pieces=[p for p in full.pieces if p.offset < args.speedup_rows],
    )
    for workers in () if args.skip_speedup else (1, 2):
        with cluster(workers) as lc, Client(lc) as client:
            rows = ParquetRows(
                prefix, settings.model_copy(update={"dask_scheduler": lc.scheduler_address})
            )
            # Warm: each worker builds its S3 client once (one small pass per worker).
            ParquetRows(
                Reference(
                    full.uri, full.location, full.columns, full.objects, full.pieces[:workers]
                ),
                rows.settings,
            ).clipped_gram(1.0, None)
            with get_task_stream(client) as recorded:
                _, seconds = timed(
                    f"gram on {workers} worker(s)", partial(rows.clipped_gram, 1.0, None)
                )
            stream = recorded.data
            rows.close()
            tasks = [
                sum(s["stop"] - s["start"] for s in t["startstops"] if s["action"] == "compute")
                for t in stream
                if "_run_sum" in str(t["key"])
            ]
            adds = [
                sum(s["stop"] - s["start"] for s in t["startstops"] if s["action"] == "compute")
                for t in stream
                if "_add" in str(t["key"])
            ]
            figures[f"gram_{workers}w_s"] = seconds
            figures[f"gram_{workers}w_task_s"] = float(np.median(tasks)) if tasks else float("nan")
            figures[f"gram_{workers}w_tasks"] = len(tasks)
            figures[f"gram_{workers}w_add_s"] = float(np.sum(adds)) if adds else 0.0
    server.stop()
    report(figures, len(prefix.pieces), args.tag)


def report(figures: dict[str, Any], blocks: int, tag: str = "") -> None:
    """Print the figures and keep them in ``bench/results/dask.txt`` (docs/benchmarks.md)."""
    lines: list[str] = ["command: python bench/bench_dask.py " + " ".join(sys.argv[1:])]
    say = lines.append
    gib = figures["bytes"] / 2**30
    limit = figures["worker_limit"]
    say(
        f"dataset {figures['shape'][0]:,} x {figures['shape'][1]} = {gib:.2f} GiB; "
        f"2 Dask workers of {limit / 2**30:.2f} GiB each"
    )
    say(
        f"write {figures['write_s']:.0f} s, register (footers + every value) "
        f"{figures['register_s']:.0f} s"
    )
    for name in ("analyze_gauss", "friendly_aggregate"):
        if f"{name}_full_s" not in figures:
            continue
        peaks = ", ".join(
            f"{p / 2**20:,.0f} MiB ({p / limit:.0%})" for p in figures[f"{name}_peak_rss"]
        )
        say(
            f"{name}: {figures[f'{name}_full_s']:.0f} s on 2 workers, "
            f"{figures[f'{name}_full_status']}; slice in process vs on Dask: "
            f"{figures[f'{name}_slice_equal']}; peak RSS per worker: {peaks}"
        )
    if "gram_1w_s" in figures:  # not --skip-speedup
        one, two = figures["gram_1w_s"], figures["gram_2w_s"]
        task = figures["gram_1w_task_s"]
        serial = max(0.0, one - blocks * task)  # submission, reduction chain, transfers
        say(
            f"gram pass on {blocks} row groups: 1 worker {one:.1f} s, 2 workers {two:.1f} s "
            f"(speed-up {one / two:.2f}x); median task {task * 1000:.0f} ms; "
            f"not divided by workers: {serial:.1f} s"
        )
        for workers in (8, 32, 128):
            model = serial + blocks * task / workers
            say(f"  model, {workers} workers: {model:.1f} s (speed-up {one / model:.1f}x)")
    text = "\n".join(lines)
    sys.stdout.write(text + "\n")
    (ROOT / "bench" / "results" / f"dask{tag}.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
