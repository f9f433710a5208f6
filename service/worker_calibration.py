"""A worker's one calibration, at its start: the mechanisms' rates on public random data and
its own per-job overhead, stored for the padding (:mod:`service.calibration`,
:mod:`service.padding`). Called by :meth:`service.worker.Worker.calibrate_if_due`, which
states when and why it runs once."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from service.jobs import JobRunner, blas_threads

log = logging.getLogger("dpss.worker")


class Calibrating(JobRunner, Protocol):
    """What calibrating needs of the worker (:class:`service.worker.Worker`): what a
    registration needs (:class:`service.jobs.JobRunner`), and its presence mark."""

    def note_alive(self) -> None: ...


def calibrate(worker: Calibrating) -> bool:
    """What :meth:`~service.worker.Worker.calibrate_if_due` does once it is due; True if it
    stored rates."""
    # Imported here: the mechanisms' timing code is needed once, at start, not by every import.
    from service import calibration

    stopping = worker.stop.is_set
    with blas_threads(worker.settings):
        rates = calibration.measure(interrupted=stopping)
    for attempt in range(1, calibration.PROBE_RETRIES + 1):
        try:
            rates.update(probe_overhead(worker, stopping))
            break
        except OSError as exc:
            # Disk full, a read-only or missing data directory: the operator's to fix.
            log.warning(
                "worker %s: calibration: cannot write the overhead probe (%s: %s); "
                "attempt %d of %d, keeping the previous or default overhead rates",
                worker.worker_id,
                type(exc).__name__,
                exc.strerror or exc,
                attempt,
                calibration.PROBE_RETRIES,
            )
            if attempt == calibration.PROBE_RETRIES or worker.stop.wait(
                calibration.PROBE_RETRY_SECONDS
            ):
                break
    if not rates:
        return False

    def save() -> None:
        with worker.session_factory.begin() as session:
            calibration.store(session, worker.worker_id, rates)

    worker.with_db_retry("calibrate", save)
    log.info("worker %s calibrated %d rates", worker.worker_id, len(rates))
    return True


def probe_overhead(
    worker: Calibrating, stopping: Callable[[], bool]
) -> dict[tuple[str, int], float]:
    """The per-job overhead, through this worker's own path (forked when it isolates runs),
    the probe file in this process's incoming directory (removed with it if it dies)."""
    from service import calibration

    probe = worker.store.new_incoming_path().with_suffix(".npy")
    try:
        calibration.write_probe(probe)
        return calibration.measure_overhead(
            probe,
            (lambda work: worker.isolated("calibration probe", work))
            if worker.isolate
            else (lambda work: work()),
            lambda: worker.with_db_retry("calibrate", worker.note_alive),
            stopping,
        )
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
