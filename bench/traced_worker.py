"""``dpss worker`` with timestamps: where a release's time goes inside the worker.

    DPSS_TRACE_FILE=/tmp/trace.jsonl python -m bench.traced_worker

Runs exactly what ``dpss worker`` runs (isolated runs in its run process), with the steps below
wrapped to append ``{"event": ..., "t": <wall clock>}`` lines to ``DPSS_TRACE_FILE`` (the parent
and the run process append to the same file; wall-clock times compare across processes on one
machine). Used by ``bench/bench_http_latency.py``; not part of the service.

Events: ``woken`` (the idle wait returned), ``claimed`` (the claim transaction committed with a
job), ``forked`` (the isolated run is sent to the worker's run process), ``opened`` (the
dataset's memory map is open, in the run process), ``computed`` (the mechanism returned,
there), ``received`` (the parent has the outcome), ``stored`` (the outcome and its audit event
committed).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from service import wake, worker
from service.store import DatasetStore

TRACE = Path(os.environ.get("DPSS_TRACE_FILE", "dpss-trace.jsonl"))


def mark(event: str, **extra: Any) -> None:
    with TRACE.open("a") as handle:
        handle.write(json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **extra}))
        handle.write("\n")


def install() -> None:
    """Wrap the worker's steps (idempotent per process)."""
    original_waker_for = wake.waker_for

    def waker_for(*args: Any, **kwargs: Any) -> wake.Waker:
        inner = original_waker_for(*args, **kwargs)
        original_wait = inner.wait

        def wait(timeout: float) -> None:
            original_wait(timeout)
            mark("woken")

        inner.wait = wait  # type: ignore[method-assign]
        return inner

    wake.waker_for = waker_for  # type: ignore[assignment]

    claim = worker.Worker.claim_queued

    def claim_queued(self: worker.Worker) -> worker.ClaimedJob | None:
        job = claim(self)
        if job is not None:
            mark("claimed", release=str(job.release_id))
        return job

    worker.Worker.claim_queued = claim_queued  # type: ignore[method-assign]

    run = worker.Worker._run

    def run_(self: worker.Worker, kind: Any, job: worker.ClaimedJob, work: Any) -> Any:
        mark("forked")
        result = run(self, kind, job, work)
        mark("received")
        return result

    worker.Worker._run = run_  # type: ignore[method-assign]

    opener = DatasetStore.open

    def open_(self: DatasetStore, file_name: str, n_rows: int | None = None) -> Any:
        matrix = opener(self, file_name, n_rows)
        mark("opened")
        return matrix

    DatasetStore.open = open_  # type: ignore[method-assign]

    of = worker.Outcome.of.__func__  # type: ignore[attr-defined]

    def outcome_of(cls: type[worker.Outcome], output: Any) -> worker.Outcome:
        mark("computed")
        result: worker.Outcome = of(cls, output)
        return result

    worker.Outcome.of = classmethod(outcome_of)  # type: ignore[method-assign,assignment]

    finish = worker.Worker.finish

    def finish_(self: worker.Worker, job: worker.ClaimedJob, *result: Any) -> str:
        status = finish(self, job, *result)
        mark("stored", release=str(job.release_id), status=status)
        return status

    worker.Worker.finish = finish_  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    from service.cli import worker as run_worker

    run_worker(parent_pid=None)
