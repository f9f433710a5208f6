"""Calibrate the padding's run-time model on this machine, from public random data only.

A worker times every one-shot mechanism at a few public shapes on random rows (never a dataset)
once, at its start, before it claims any job, and stores the rates (work units per second,
:mod:`service.padding`) in ``machine_rates``. Only then: a worker that recalibrated whenever it
was idle (as it once did every ``DPSS_WORKER_CALIBRATE_SECONDS``), or that cut a calibration
short when a job was queued, changed the padding of new releases at moments set by when other
jobs really ended, an oracle for their run times (issue 30). A worker that runs for days keeps
its start's rates; restart it to recalibrate (a slower machine makes jobs late, which
:func:`service.padding.late_schedule` bounds). The API reads the slowest recent
rate of any worker when it fixes a new release's ``visible_at`` (:func:`current_rates`); a
release already requested keeps its ``visible_at`` whatever is calibrated later.

The per-job overhead is calibrated too (:func:`measure_overhead`): a probe goes through the
path of a real job -- a database round trip as the claim, the worker's run process (its
:meth:`~service.worker.Worker.isolated`, :mod:`service.isolation`) that opens a public random
dataset file as the store does (a read-only memory map), reads every row and makes a run's BLAS,
LAPACK and noise calls, the result back through the pipe, and a second round trip as the
outcome's store -- a few times, and the slowest is kept. The first probe starts the run
process (a fork and a cold process's first calls, as the first run after a run process died
pays), so the slowest kept covers that start too. It is
stored in ``machine_rates`` as two pseudo-mechanisms at ``d = 0`` (no migration): ``_overhead``
with ``rate = 1 / seconds`` (so that the slower rate kept by :func:`store` and
:func:`current_rates` is the longer overhead) and ``_read``, the bytes read per second.

Every input of a calibration is public: the mechanism, a shape fixed here, random data from a
fixed seed, and the machine's speed at that moment, a moment the operator chose (a worker's
start). Other workers' jobs running at that moment slow it, as they slow any job: a residual
that an analyst can neither time nor repeat (they do not start workers).

A calibration that cannot write its probe file (a full disk: ``OSError``) is an operational
condition, not a bug: the worker logs a warning, keeps the rates measured in memory and the
previous (or default) overhead rates, and retries the probe a few times at start
(:data:`PROBE_RETRIES`, :data:`PROBE_RETRY_SECONDS`) before it claims jobs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import scipy.linalg
from sqlalchemy import bindparam, func, or_, select
from sqlalchemy.orm import Session

from service.db.models import MachineRate, WorkerHeartbeat, utcnow
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.noise import secure_generator
from service.mechanisms.registry import MECHANISMS
from service.padding import (
    DATA_DEPENDENT_FACTOR,
    OVERHEAD,
    READ,
    CalibratedRates,
    work_units,
)

#: Shapes (n, d, k) timed per mechanism: a small and larger dimensions (BLAS runs faster per
#: flop at larger d), the model's rate being interpolated between them
#: (:class:`service.padding.CalibratedRates`). Each run takes well under a second on a quiet
#: 2-core machine, so a calibration takes about 10 s (22 s under a load average of 16).
SHAPES: dict[str, tuple[tuple[int, int, int], ...]] = {
    "exact_gapmax": ((200, 10, 2), (200, 50, 2)),
    "histogram_aggregate": ((4_000, 20, 2), (4_000, 200, 2)),
    "friendly_aggregate": ((4_000, 20, 2), (4_000, 200, 2)),
    "auto": ((2_000, 20, 2), (2_000, 200, 2)),
    "gap_perturbation": ((20_000, 50, 3), (2_000, 200, 3)),
}
DEFAULT_SHAPES = ((20_000, 50, 3), (2_000, 300, 3), (1_000, 800, 3))
#: Params other than the defaults: a bounded sample keeps exact_gapmax's run short.
PARAMS: dict[str, dict[str, object]] = {
    "exact_gapmax": {"sample_rows": 150},
    "histogram_aggregate": {"cell_width": 0.1},
}
#: The overhead probe's public random dataset (n x d float64: 3.2 MB) and how many probes a
#: calibration times (the slowest counts: scheduling delays under load are heavy-tailed).
PROBE_SHAPE = (4_000, 100)
PROBES = 3
#: How often a calibration's probe is tried when it cannot write its file (a full disk), and
#: the pause between tries, seconds: at start only, before the worker claims any job.
PROBE_RETRIES = 3
PROBE_RETRY_SECONDS = 10.0
#: Rates of a worker without a heartbeat row older than this are ignored (it is gone).
STALE_AFTER = timedelta(days=1)


#: The kinds of public random data a mechanism whose run time depends on the data
#: (:data:`DATA_DEPENDENT_FACTOR`) is timed on; the slowest counts. "rank_deficient" (rows on
#: a line, every subset of rank 1 < k) is the aggregators' costliest route: each block's Gram
#: fails the lift's floor and is decomposed by its own SVD (subset_top_k). It ran 3.4-3.8x the
#: structured rows for friendly_aggregate and up to 3.1x the slower of the other two kinds for
#: histogram_aggregate (n = 4,000-20,000, d = 20-200, one BLAS thread): beyond the margin of
#: the calibrated padding, so a rank-deficient dataset could end after its padding.
DATA_KINDS = ("structured", "isotropic", "rank_deficient")


def _rows(n: int, d: int, k: int, rng: np.random.Generator, kind: str) -> np.ndarray:
    # Structured: rows near a k-dimensional subspace with a little noise in every direction (in
    # general position: exact_gapmax's worst case, no candidate skipped; auto's private test
    # finds the structure). Isotropic: no structure (auto's other branch, many occupied cells).
    # Rank-deficient: rows on one line (subsets of rank 1, the SVD route of subset_top_k).
    if kind == "structured":
        basis, _ = np.linalg.qr(rng.standard_normal((d, k)))
        rows = rng.standard_normal((n, k)) @ basis.T * 0.3 + rng.standard_normal((n, d)) * 1e-3
    elif kind == "isotropic":
        rows = rng.standard_normal((n, d)) / np.sqrt(d)
    elif kind == "rank_deficient":
        rows = np.outer(rng.standard_normal(n), rng.standard_normal(d) / np.sqrt(d))
    else:
        raise ValueError(kind)
    scaled: np.ndarray = rows / np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
    return scaled


def measure(
    mechanisms: Mapping[str, object] | None = None,
    interrupted: Callable[[], bool] = lambda: False,
) -> dict[tuple[str, int], float]:
    """``{(mechanism, d): work units per second}`` timed on this machine now.

    ``interrupted()`` is asked before each timed run: when it says true (a job is waiting), the
    rates measured so far are returned, so that a calibration delays a job by one run at most."""
    rng = np.random.default_rng(20261126)
    rates: dict[tuple[str, int], float] = {}
    for name, mechanism in sorted(MECHANISMS.items()):
        if mechanism.continual or (mechanisms is not None and name not in mechanisms):
            continue
        for n, d, k in SHAPES.get(name, DEFAULT_SHAPES):
            if interrupted():
                return rates
            ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
            raw = dict(PARAMS.get(name, {}))
            try:
                params = mechanism.prepare(ctx, k, 1.0, 1e-6, mechanism.parse_params(raw))
            except InvalidParameter:
                continue
            spec = ReleaseSpec(k=k, epsilon=1.0, delta=1e-6, params=params)
            kinds = DATA_KINDS if name in DATA_DEPENDENT_FACTOR else DATA_KINDS[:1]
            seconds = 1e-6
            for kind in kinds:  # the slowest kind of data, for data-dependent run times
                if kind != kinds[0] and interrupted():
                    return rates
                data = _rows(n, d, k, rng, kind)
                started = time.perf_counter()
                mechanism.run(data, spec, np.random.default_rng(0))
                seconds = max(seconds, time.perf_counter() - started)
            work = work_units(name, n, d, k, params.model_dump(mode="json"))
            rates[(name, d)] = work / seconds
    return rates


def write_probe(path: Path) -> None:
    """The overhead probe's dataset file: public random rows from a fixed seed, as ``.npy``."""
    n, d = PROBE_SHAPE
    with path.open("wb") as out:
        np.save(out, _rows(n, d, 2, np.random.default_rng(20261126), "isotropic"))


def read_probe(path: Path) -> float:
    """In the probe's child: open ``path`` as the store opens a dataset (a read-only memory map)
    and read every row, as a run's first pass does; the seconds the read took. Then the first
    calls a run makes in a fresh process, whose fixed cost is part of the overhead: the noise
    generator, and BLAS and LAPACK (NumPy's and SciPy's), which set themselves up again after a
    fork (about 0.08 s on the reference machine against 0.016 s for a whole 3,000 x 200
    ``analyze_gauss`` in a warm process)."""
    started = time.perf_counter()
    rows = np.load(path, mmap_mode="r")
    float(np.asarray(rows).sum())  # pages every row in
    seconds = time.perf_counter() - started
    gram = np.asarray(rows[:1000]).T @ np.asarray(rows[:1000])
    np.linalg.eigh(gram)
    scipy.linalg.eigh(gram, subset_by_index=[gram.shape[0] - 2, gram.shape[0] - 1])
    secure_generator().standard_normal(gram.shape[0])
    return seconds


def measure_overhead(
    path: Path,
    isolated: Callable[[Callable[[], float]], float | None],
    round_trip: Callable[[], None],
    interrupted: Callable[[], bool] = lambda: False,
) -> dict[tuple[str, int], float]:
    """The per-job overhead of this machine now: ``{(OVERHEAD, 0): 1 / seconds, (READ, 0):
    bytes per second}``, the slowest of :data:`PROBES` probes (fewer when ``interrupted()``).

    A probe is a job's path without its mechanism: ``round_trip()`` (a database transaction, as
    the claim), ``isolated(work)`` (``work`` in the worker's run process, its result back
    through the pipe: :meth:`service.worker.Worker.isolated`) reading the probe file ``path``
    (:func:`write_probe`) with :func:`read_probe`, and ``round_trip()`` again (the outcome's
    store). Empty if no probe completed."""
    size = float(path.stat().st_size)
    overhead, read = 0.0, 0.0
    for _ in range(PROBES):
        if interrupted():
            break
        started = time.perf_counter()
        round_trip()
        # A picklable call: the worker's run process takes it as it takes a release's run.
        seconds = isolated(functools.partial(read_probe, path))
        round_trip()
        if seconds is None:
            continue
        overhead = max(overhead, time.perf_counter() - started)
        read = max(read, seconds, 1e-6)
    if overhead <= 0:
        return {}
    return {(OVERHEAD, 0): 1.0 / overhead, (READ, 0): size / read}


def store(
    session: Session,
    worker_id: str,
    rates: Mapping[tuple[str, int], float],
    keep_for: timedelta = timedelta(minutes=15),
) -> None:
    """Record ``worker_id``'s rates for the mechanisms in ``rates``: the slower of each new rate
    and the one stored less than ``keep_for`` ago. One timing is a sample of a machine whose
    load varies: a slowdown applies at once, a speed-up only when it lasts past ``keep_for``."""
    now = utcnow()
    names = {name for name, _ in rates}
    stored = {
        (row.mechanism, row.d): row
        for row in session.execute(
            select(MachineRate).where(
                MachineRate.worker_id == worker_id, MachineRate.mechanism.in_(names)
            )
        ).scalars()
    }
    for key, rate in rates.items():
        row = stored.pop(key, None)
        if row is None:
            session.add(
                MachineRate(
                    worker_id=worker_id, mechanism=key[0], d=key[1], rate=rate, measured_at=now
                )
            )
            continue
        if row.measured_at >= now - keep_for:
            rate = min(rate, row.rate)
        row.rate, row.measured_at = rate, now
    for row in stored.values():  # a shape no longer calibrated
        session.delete(row)


#: The rates that count (:func:`current_rates`): measured since ``since`` or of a live worker.
_CURRENT_RATE = or_(
    MachineRate.measured_at >= bindparam("since"),
    MachineRate.worker_id.in_(select(WorkerHeartbeat.worker_id)),
)
#: :func:`current_rates`'s two statements, built once (read by every release request).
_SLOWEST_RATES = (
    select(MachineRate.mechanism, MachineRate.d, func.min(MachineRate.rate))
    .where(_CURRENT_RATE)
    .group_by(MachineRate.mechanism, MachineRate.d)
)
_RATED_WORKERS = select(func.count(func.distinct(MachineRate.worker_id))).where(_CURRENT_RATE)


def current_rates(session: Session, now: datetime | None = None) -> CalibratedRates:
    """The slowest rate of any current worker per (mechanism, d): any of them may run the job.

    A worker's rates count while it lives (its heartbeat row, written by a thread of its own,
    whatever its jobs do, and removed when it stops) and for :data:`STALE_AFTER` after they
    were measured. Workers measure only at their start (:mod:`service.worker`), so what this
    returns changes when an operator starts or stops a worker, never when a job ends."""
    since = {"since": (now or utcnow()) - STALE_AFTER}
    rows = session.execute(_SLOWEST_RATES, since).all()
    workers = session.execute(_RATED_WORKERS, since).scalar_one()
    return CalibratedRates({(name, d): rate for name, d, rate in rows}, workers=workers)
