"""What row marks add to a registration by reference (``service.reference.integrity.RowMarks``).

    python -m bench.bench_row_marks [--rows 200000] [--cols 20] [--reps 5]

One local Parquet file of ``rows x cols`` float64 values (normal, row groups of 50,000) read by
``service.reference.inspect`` (every value read, digested, checked: a registration's worker
pass), in one process, alternating: *before*, :class:`RowMarks` replaced by a class that does
nothing (the registration as it was), and *after*, the real one. CPU seconds of the process
(``time.process_time``) and wall seconds, medians, with the load average beside them.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from service.config import Settings
from service.reference import register


class _NoMarks:
    """The registration before row marks: nothing fed, nothing named."""

    def add(self, matrix: Any) -> None:
        return None

    def names(self) -> list[str]:
        return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--cols", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        rows = np.random.default_rng(0).normal(size=(args.rows, args.cols))
        names = [f"c{i}" for i in range(args.cols)]
        table = pa.table({name: rows[:, i] for i, name in enumerate(names)})
        pq.write_table(table, root / "a.parquet", row_group_size=50_000)
        settings = Settings(
            data_dir=root / "data",
            database_url=f"sqlite:///{root / 'db.sqlite'}",
            reference_roots=str(root),
            max_dataset_bytes=1 << 34,
        )
        real = register.RowMarks
        timings: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
        marks = 0
        for _ in range(args.reps):
            for label, marker in (("before", _NoMarks), ("after", real)):
                register.RowMarks = marker  # type: ignore[misc,assignment]
                cpu, wall = time.process_time(), time.perf_counter()
                found = register.inspect(str(root / "a.parquet"), names, settings)
                timings[label].append((time.process_time() - cpu, time.perf_counter() - wall))
                if label == "after":
                    marks = len(found.objects[0]["row_marks_sha256"])
        register.RowMarks = real  # type: ignore[misc]
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"{args.rows} x {args.cols}, {args.reps} reps each, load average {' '.join(load)}")
    before = statistics.median(c for c, _ in timings["before"])
    after = statistics.median(c for c, _ in timings["after"])
    for label in ("before", "after"):
        cpu = statistics.median(c for c, _ in timings[label])
        wall = statistics.median(w for _, w in timings[label])
        print(f"{label:7s} cpu {cpu:.3f} s  wall {wall:.3f} s")
    share = (after / before - 1) * 100
    print(f"added   cpu {after - before:+.3f} s ({share:+.1f}%), {marks} marks")


if __name__ == "__main__":
    main()
