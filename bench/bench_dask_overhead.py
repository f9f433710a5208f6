"""Dask's overhead: the heavy passes of a release on a LocalCluster against the same passes in
process, in CPU seconds (issue 35: at most 1.2x).

    python -m bench.bench_dask_overhead [--rows 200000] [--cols 200] [--row-group-rows 8192]
        [--repeats 3] [--dask-defaults]

Writes ``--rows x --cols`` float64 rows as local Parquet files (row groups of
``--row-group-rows`` rows), registers them as a dataset by reference and runs, with one BLAS
thread everywhere: the bare ``X^T X`` of the rows in memory (the floor), the clipped Gram pass
in process (Dask's synchronous scheduler: reads, digest checks, clipping and the Gram) and the
same pass on a ``LocalCluster`` of 2 worker processes with 1 thread each, built as the service
builds one (:func:`service.reference.cluster.local_cluster`: the service's Dask configuration,
``service/reference/dask.yaml``, which a deployment's scheduler and workers read; with
``--dask-defaults``, Dask's own defaults instead, for a comparison) (one task per row
group, tasks of 32 MiB, the former default, and of ``DPSS_DASK_TASK_MB``), then where each
one's CPU goes: this process, the workers, their system time and minor page faults. CPU is
counted in every process that takes part (this one, which holds the client, the scheduler and
the workers' nannies, and each worker), before and after the pass, so the ratios do not depend
on how busy the machine is.
Each pass runs ``--repeats`` times and the median is kept.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.config import Settings  # noqa: E402
from service.reference import ParquetRows, inspect  # noqa: E402
from service.reference.cluster import local_cluster  # noqa: E402
from service.reference.engine import task_runs  # noqa: E402


def write_parquet(directory: Path, rows: int, cols: int, group: int, seed: int) -> list[str]:
    """Rows of norm at most 1 in files of at most 64 MiB, row groups of ``group`` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    names = [f"c{i}" for i in range(cols)]
    schema = pa.schema([(name, pa.float64()) for name in names])
    per_file = group * max(1, (64 << 20) // (8 * group * cols))
    for index, start in enumerate(range(0, rows, per_file)):
        stop = min(rows, start + per_file)
        with pq.ParquetWriter(directory / f"part-{index:05d}.parquet", schema) as writer:
            for first in range(start, stop, group):
                block = rng.normal(size=(min(group, stop - first), cols)) / np.sqrt(cols)
                block /= np.maximum(1.0, np.linalg.norm(block, axis=1))[:, None]
                writer.write_table(
                    pa.table({n: block[:, i] for i, n in enumerate(names)}, schema=schema)
                )
    return names


def _cpu(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def _system_and_faults(pids: list[int]) -> tuple[float, int]:
    """System CPU seconds and minor page faults (Linux's /proc; 0 elsewhere) of ``pids``."""
    import psutil

    system, faults = 0.0, 0
    for pid in pids:
        system += psutil.Process(pid).cpu_times().system
        with contextlib.suppress(OSError, IndexError, ValueError):
            faults += int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])
    return system, faults


def measured(work: Any, pids: list[int], repeats: int) -> float:
    """Median CPU seconds of ``work()`` summed over ``pids``."""
    samples = []
    for _ in range(repeats):
        before = _cpu(pids)
        work()
        samples.append(_cpu(pids) - before)
    return statistics.median(samples)


def where(work: Any, client_pid: int, workers: list[int], repeats: int) -> dict[str, float]:
    """Where one pass's CPU goes (medians): this process (client and scheduler), the workers,
    the workers' system time and their minor page faults."""
    samples: dict[str, list[float]] = {"client": [], "workers": [], "system": [], "faults": []}
    for _ in range(repeats):
        mine, theirs = _cpu([client_pid]), _cpu(workers)
        system, faults = _system_and_faults(workers)
        work()
        after_system, after_faults = _system_and_faults(workers)
        samples["client"].append(_cpu([client_pid]) - mine)
        samples["workers"].append(_cpu(workers) - theirs)
        samples["system"].append(after_system - system)
        samples["faults"].append(after_faults - faults)
    return {key: statistics.median(values) for key, values in samples.items()}


def main() -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--cols", type=int, default=200)
    parser.add_argument("--row-group-rows", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--dask-defaults",
        action="store_true",
        help="build the cluster with Dask's defaults, not the service's dask.yaml",
    )
    args = parser.parse_args()
    import pyarrow.parquet as pq
    from distributed import Client, LocalCluster

    with tempfile.TemporaryDirectory(prefix="dpss-dask-overhead-") as tmp:
        directory = Path(tmp)
        names = write_parquet(directory, args.rows, args.cols, args.row_group_rows, 5)
        settings = Settings(data_dir=directory / "store", reference_roots=str(directory))
        reference = inspect(f"file://{directory}", names, settings)
        here = ParquetRows(reference, settings)
        matrix = np.vstack(
            [
                np.column_stack([table.column(n).to_numpy() for n in names])
                for table in map(pq.read_table, sorted(directory.glob("*.parquet")))
            ]
        )
        me = [os.getpid()]
        floor = measured(lambda: matrix.T @ matrix, me, args.repeats)
        in_process = measured(lambda: here.clipped_gram(1.0, None), me, args.repeats)
        with (
            (LocalCluster if args.dask_defaults else local_cluster)(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster,
            Client(cluster) as client,
        ):
            workers = list(client.run(os.getpid).values())
            address = cluster.scheduler_address
            per_group = ParquetRows(
                reference,
                settings.model_copy(update={"dask_scheduler": address, "dask_task_mb": 1e-6}),
            )
            former = ParquetRows(
                reference,
                settings.model_copy(update={"dask_scheduler": address, "dask_task_mb": 32}),
            )
            there = ParquetRows(reference, settings.model_copy(update={"dask_scheduler": address}))
            for rows in (per_group, former, there):
                rows.clipped_gram(1.0, None)  # connect and warm the workers once
            everyone = me + workers
            started = time.perf_counter()
            on_dask_per_group = measured(
                lambda: per_group.clipped_gram(1.0, None), everyone, args.repeats
            )
            on_dask_former = measured(
                lambda: former.clipped_gram(1.0, None), everyone, args.repeats
            )
            on_dask = measured(lambda: there.clipped_gram(1.0, None), everyone, args.repeats)
            wall = (time.perf_counter() - started) / args.repeats / 3
            split = {
                name: where(lambda rows=rows: rows.clipped_gram(1.0, None), me[0], workers, 3)
                for name, rows in (("per group", per_group), ("32", former), ("default", there))
            }
            # What the cluster's processes spend doing nothing for as long as one pass takes
            # (heartbeats, event loops): a cost of keeping a cluster, not of the pass, and one
            # that grows with the wall time a loaded machine stretches a pass to.
            idle = measured(lambda: time.sleep(wall), everyone, args.repeats)
            gram_here = here.clipped_gram(1.0, None)
            gram_there = there.clipped_gram(1.0, None)
            for rows in (per_group, former, there):
                rows.close()
    print(
        f"dataset {args.rows:,} x {args.cols} in {len(reference.pieces)} row groups of "
        f"{args.row_group_rows} rows; CPU seconds (median of {args.repeats}), one BLAS thread; "
        f"cluster: {'Dask defaults' if args.dask_defaults else 'the service dask.yaml'}"
    )
    print("| pass | CPU s | / bare X^T X | / in process |")
    print("|---|---|---|---|")
    print(f"| bare X^T X (rows in memory) | {floor:.2f} | 1.00 | |")
    print(f"| Gram pass in process | {in_process:.2f} | {in_process / floor:.2f} | 1.00 |")
    print(
        f"| Gram pass on 2 Dask workers, one task per row group | {on_dask_per_group:.2f} | "
        f"{on_dask_per_group / floor:.2f} | {on_dask_per_group / in_process:.2f} |"
    )
    print(
        f"| Gram pass on 2 Dask workers, tasks of 32 MiB | {on_dask_former:.2f} | "
        f"{on_dask_former / floor:.2f} | {on_dask_former / in_process:.2f} |"
    )
    print(
        f"| Gram pass on 2 Dask workers, tasks of {settings.dask_task_mb:g} MiB (default; "
        f"mean wall {wall:.2f} s) | {on_dask:.2f} | {on_dask / floor:.2f} | "
        f"{on_dask / in_process:.2f} |"
    )
    print(
        f"cluster idle for one pass's wall time: {idle:.2f} CPU s; without it, tasks of "
        f"{settings.dask_task_mb:g} MiB / in process = {(on_dask - idle) / in_process:.2f}, "
        f"one task per row group = {(on_dask_per_group - idle) / in_process:.2f}"
    )
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}")
    print(f"equal bits in process and on Dask: {bool(np.array_equal(gram_here, gram_there))}")
    row_bytes = 8 * args.cols
    for name, parts in split.items():
        mb = {"per group": 1e-6, "32": 32.0}.get(name, settings.dask_task_mb)
        tasks = len(task_runs(reference.pieces, row_bytes, int(mb * 2**20)))
        print(
            f"where ({name}: {tasks} tasks a pass): client and scheduler {parts['client']:.2f} "
            f"CPU s, workers {parts['workers']:.2f} (of it system {parts['system']:.2f}), "
            f"workers' minor page faults {parts['faults']:,.0f}"
        )


if __name__ == "__main__":
    main()
