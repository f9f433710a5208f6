"""Where a padded run's wall time goes, under load (issue 22, item 10).

    .venv/bin/python -m bench.padding_breakdown [--runs 10] [--load-factor 2]

The same app and isolated worker as ``bench/bench_visible_latency.py`` (its ``Bench``), with
the worker's steps timed (wall clock, across the fork): for each run, from the request's
``created_at`` to ``finished_at``:

- **request**: the API call returning (the release is committed and queued),
- **claim**: the claim transaction (queue wait in this harness: the worker claims at once),
- **fault check**: the store's header/size check of the dataset file,
- **fork**: ``Process.start`` to the child's first line,
- **load**: ``store.open`` in the child (a memory map: the rows are paged in by the mechanism),
- **mechanism**: ``mechanism.run`` in the child,
- **return**: the outcome sent through the pipe, received, the child joined,
- **store**: the finish transaction up to ``finished_at``,

and ``calibrated run``: the mechanism's modelled run time at the calibrated rate, to compare
with the measured mechanism step. Prints the median and the maximum per step, per mechanism.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_visible_latency import LOADED, Bench, _seconds
from scripts.harness import table
from service import calibration
from service.padding import PaddingModel
from service.worker import Worker

STEPS = ["request", "claim", "fault", "fork", "load", "mechanism", "return", "store"]


class TimedWorker(Worker):
    """The isolated worker with wall-clock marks written to a file (the child's too)."""

    marks_path: Path

    def mark(self, name: str) -> None:
        with open(self.marks_path, "a") as out:
            out.write(f"{name} {time.time():.6f}\n")

    def claim(self) -> Any:
        self.mark("claim0")
        job = super().claim()
        self.mark("claim1")
        return job

    def _execute_isolated(self, job: Any) -> Any:
        self.mark("fork0")
        outcome = super()._execute_isolated(job)
        self.mark("return1")
        return outcome

    def execute(self, job: Any) -> Any:  # in the child
        self.mark("fork1")
        original_open = self.store.open

        def timed_open(*args: Any) -> Any:
            data = original_open(*args)
            self.mark("load1")
            return data

        self.store.open = timed_open  # type: ignore[method-assign]
        return super().execute(job)

    def _run(self, job: Any, mechanism: Any, data: Any, spec: Any, reraise: Any = None) -> Any:
        self.mark("mech0")
        outcome = super()._run(job, mechanism, data, spec, reraise)
        self.mark("mech1")
        return outcome

    def finish(self, job: Any, outcome: Any) -> str:
        self.mark("store0")
        return super().finish(job, outcome)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--load-factor", type=float, default=2)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="dpss-breakdown-") as tmp:
        bench = Bench(Path(tmp))
        worker = TimedWorker(
            bench.factory, bench.app.state.store, bench.settings, "bench", isolate=True
        )
        worker.marks_path = Path(tmp) / "marks.txt"
        bench.worker = worker
        for _mechanism, n, d, _k, _ in LOADED:
            bench.dataset(n, d)
        burners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(round(args.load_factor * cores))
        ]
        rows = []
        try:
            time.sleep(2)
            worker.calibrate_if_due()  # under the load, as a worker started under it
            with bench.factory() as session:
                model = PaddingModel.from_settings(
                    bench.settings, calibration.current_rates(session)
                )
            for mechanism, n, d, k, params in LOADED:
                per_step: dict[str, list[float]] = {s: [] for s in [*STEPS, "padding", "total"]}
                modelled = 0.0
                for _ in range(args.runs):
                    worker.marks_path.unlink(missing_ok=True)
                    before = time.time()
                    release = bench.run(mechanism, n, d, k, params)
                    marks: dict[str, float] = {}
                    for line in worker.marks_path.read_text().splitlines():
                        name, value = line.split()
                        # The first of each: run_pending claims again (nothing) after the job.
                        marks.setdefault(name, float(value))
                    created = release.created_at.timestamp()
                    finished = release.finished_at.timestamp()  # type: ignore[union-attr]
                    per_step["request"].append(marks["claim0"] - max(created, before))
                    per_step["claim"].append(marks["claim1"] - marks["claim0"])
                    per_step["fault"].append(marks["fork0"] - marks["claim1"])
                    per_step["fork"].append(marks["fork1"] - marks["fork0"])
                    per_step["load"].append(marks["load1"] - marks["fork1"])
                    per_step["mechanism"].append(marks["mech1"] - marks["mech0"])
                    per_step["return"].append(marks["return1"] - marks["mech1"])
                    per_step["store"].append(finished - marks["store0"])
                    per_step["total"].append(finished - created)
                    per_step["padding"].append(_seconds(release.visible_at, release.created_at))
                    modelled = model.run_seconds(mechanism, n, d, k, release.params or {})
                rows.append(
                    [
                        f"{mechanism} {n}x{d}",
                        *(
                            f"{statistics.median(per_step[s]):.3f}/{max(per_step[s]):.3f}"
                            for s in [*STEPS, "total", "padding"]
                        ),
                        f"{modelled:.3f}",
                    ]
                )
        finally:
            for burner in burners:
                burner.kill()
                burner.wait()
        print(f"under load: {len(burners)} busy processes on {cores} cores; median/max seconds")
        print(table(rows, ["case", *STEPS, "total", "padding", "calibrated run"]))
        bench.client.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
