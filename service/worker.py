"""Workers: claim a queued release, run its mechanism, store the result exactly once.

The releases table is the queue. A claim sets ``status = running`` and a lease (owner, attempt,
expiry) in one short transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite serialises
writers). While the mechanism runs, a heartbeat thread extends the lease. A worker that dies
stops heartbeating; once its lease expires the job is claimable again and runs afresh with fresh
randomness (an output that was never stored was never seen; what the retry itself reveals is
discussed in docs/service.md, "How it works"). Finishing checks that this worker still holds the
lease of this attempt, so a produced output is stored once. The budget was charged when the
release was requested; it is refunded only when the job provably never read the data (its
dataset was deleted before any worker opened it).

**Outcomes.** ``failed`` is reserved for faults that do not depend on the data, so that the
status field can never reveal a row:

- the dataset was deleted before the run (refunded: the data was never read);
- a refusal that was missed at prepare: ``parse_params`` or ``run`` raised
  :class:`~service.mechanisms.base.InvalidParameter` (or the stored params no longer validate);
- the service no longer has the mechanism;
- the job was abandoned after ``DPSS_WORKER_MAX_ATTEMPTS`` claims.

Any other exception from a mechanism is a bug in it. It is logged as a bug (exception type and
location only, never the message, which may quote data) and the release is recorded as
``no_result`` with the one fixed reason :data:`NO_RELEASE_REASON`, charged like every
``no_result``: its status then says nothing that a correct mechanism's ``no_result`` would not.

**Isolation.** With ``isolate=True`` (``dpss worker``) each run happens in a forked child
process and the outcome comes back through a pipe. A mechanism can then hold the interpreter
lock for as long as one LAPACK call takes (SciPy's wrappers do not release it) without
starving the heartbeat, which would otherwise let the lease expire under a running job, and a
run that kills its process (out of memory) does not kill the worker: the job is left to its
lease, counted as an attempt, and abandoned after ``DPSS_WORKER_MAX_ATTEMPTS``.

**Database outages.** Claim, heartbeat and finish retry transient database errors (connection
refused or lost, the pool's timeout, SQLite's "database is locked") with capped exponential
backoff (``DPSS_WORKER_DB_RETRY_INITIAL_SECONDS`` doubling up to
``DPSS_WORKER_DB_RETRY_MAX_SECONDS``) and log the outage once when it starts and once when it
ends; the worker process never exits on them. A finished job's outcome is computed once and
kept in memory, and storing it is retried until it is stored or the lease is found lost. A
commit whose acknowledgement was lost is recognised on the retry (the release already carries
this attempt's terminal status), so nothing is recorded twice; the ledger's unique constraint
on ``(release_id, kind)`` backs this up for refunds. Only a stop request (SIGTERM) ends the
retries; the unstored outcome is then discarded and the job runs again once its lease expires.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError
from sqlalchemy import Engine, and_, or_, select, update
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

from service import (
    audit,
    ledger,
    operations,
    priors,
    privacy_unit,
    reference,
    registration,
    tracing,
    visibility,
    wake,
)
from service.config import Settings
from service.continual import claim_continual, is_continual, process_continual
from service.db.models import Release, ReleaseBasis, utcnow
from service.errors import InvalidInput, safe_traceback
from service.jobs import (
    ABANDONED_REASON,
    DATASET_DELETED_REASON,
    DATASET_FILE_FAULT_REASON,
    FINISHED,
    NO_MECHANISM_REASON,
    NO_RELEASE_REASON,
    REFUSED_AT_RUN_REASON,
    ClaimedJob,
    Outcome,
    WorkerStopping,
    blas_threads,
    die_with_parent,
    take_lease,
)
from service.logs import forked_child_failures
from service.mechanisms.base import InvalidParameter, Mechanism, ReleaseSpec
from service.mechanisms.noise import secure_generator
from service.mechanisms.registry import get_mechanism
from service.prior_projection import on_prior
from service.store import DatasetStore

log = logging.getLogger("dpss.worker")


T = TypeVar("T")


def outcome_cost(release: Release) -> dict[str, Any]:
    """A release's cost in its outcome event: ``(epsilon, delta)`` as before, plus ``(rho,
    zcdp_delta)`` where the dataset's accounting charged those."""
    cost: dict[str, Any] = {"epsilon": release.epsilon, "delta": release.delta}
    if release.cost_rho is not None:
        cost.update(rho=release.cost_rho, zcdp_delta=release.cost_delta)
    return cost


def refund_details(release: Release) -> dict[str, Any]:
    """What a refund gave back, as the ledger moved it (the charge's amounts)."""
    if release.cost_rho is None:
        return {"epsilon": release.epsilon, "delta": release.delta}
    return {"epsilon": Decimal(0), "delta": release.cost_delta, "rho": release.cost_rho}


def is_transient_db_error(exc: BaseException) -> bool:
    """Errors that say the database is unreachable or busy, not that the statement is wrong:
    retrying the same transaction later can succeed."""
    if isinstance(exc, OperationalError | InterfaceError | PoolTimeoutError):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


@dataclass
class _OutageLog:
    """Logs a database outage once when it starts and once when it ends, whichever of the
    worker's threads (main loop, heartbeat) meets it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    since: float | None = None
    failures: int = 0

    def failed(self, operation: str, exc: BaseException) -> None:
        with self.lock:
            self.failures += 1
            if self.since is not None:
                return
            self.since = time.monotonic()
        log.warning(
            "database unavailable (%s: %s); retrying with backoff",
            operation,
            safe_traceback(exc),
        )

    def succeeded(self) -> None:
        with self.lock:
            if self.since is None:
                return
            down, failures = time.monotonic() - self.since, self.failures
            self.since, self.failures = None, 0
        log.warning("database available again after %.1f s (%d failed attempts)", down, failures)


class Worker:
    """One worker; run several processes (or machines) against one database to scale out."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        store: DatasetStore,
        settings: Settings,
        worker_id: str | None = None,
        stop: threading.Event | None = None,
        *,
        isolate: bool = False,
    ) -> None:
        self.session_factory = session_factory
        self.store = store
        self.settings = settings
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stop = stop or threading.Event()
        self.isolate = isolate
        self._outage = _OutageLog()
        #: ``time.monotonic()`` of the last calibration of this machine (None: not yet).
        self._calibrated_at: float | None = None

    # -- database retries -----------------------------------------------------------------------

    def _backoff(self, failures: int) -> float:
        """Seconds before retry number ``failures``: capped doubling, with jitter in its upper
        half so that workers that lost the database together do not return in lockstep."""
        initial = self.settings.worker_db_retry_initial_seconds
        cap = self.settings.worker_db_retry_max_seconds
        ceiling = min(cap, initial * 2 ** min(failures - 1, 30))
        return random.uniform(ceiling / 2, ceiling)

    def with_db_retry(
        self,
        operation: str,
        attempt: Callable[[], T],
        wait: Callable[[float], bool] | None = None,
    ) -> T:
        """``attempt()`` until it does not fail with a transient database error; other errors
        propagate. Between attempts ``wait(seconds)`` (default: wait for :attr:`stop`) sleeps;
        when it returns true the retries end with :class:`WorkerStopping`."""
        wait = wait or self.stop.wait
        failures = 0
        while True:
            try:
                result = attempt()
            except Exception as exc:
                if not is_transient_db_error(exc):
                    raise
                failures += 1
                self._outage.failed(operation, exc)
                if wait(self._backoff(failures)):
                    raise WorkerStopping(operation) from None
                continue
            self._outage.succeeded()
            return result

    # -- claiming -------------------------------------------------------------------------------

    def claim(self) -> ClaimedJob | None:
        """The next job: a queued or expired one (:meth:`claim_queued`), else a continual
        release waiting with a new batch (:func:`service.continual.claim_continual`)."""
        job = self.claim_queued()
        if job is not None:
            return job
        return claim_continual(self)

    def claim_queued(self) -> ClaimedJob | None:
        """Take the oldest queued job, or one whose lease expired; ``None`` if there is none.

        A job still leased to this worker is taken again too: this worker runs one job at a
        time, so such a job is one whose claim committed although the commit's answer was lost,
        or whose outcome could not be stored. Each claim counts as an attempt.
        """
        lease = timedelta(seconds=self.settings.worker_lease_seconds)
        while True:
            with self.session_factory.begin() as session:
                now = utcnow()
                release = session.execute(
                    select(Release)
                    .where(
                        or_(
                            Release.status == "queued",
                            and_(
                                Release.status == "running",
                                or_(
                                    Release.lease_expires_at < now,
                                    Release.lease_owner == self.worker_id,
                                ),
                            ),
                        )
                    )
                    .order_by(Release.created_at)
                    .limit(1)
                    .with_for_update(skip_locked=True)
                ).scalar_one_or_none()
                if release is None:
                    return None
                if release.attempts >= self.settings.worker_max_attempts:
                    # The job keeps killing its workers; it may have read the data: no refund.
                    # The lease names who decided, so the last runner cannot mistake this for
                    # its own stored outcome.
                    release.lease_owner = self.worker_id
                    self._record(session, release, Outcome.failed(ABANDONED_REASON))
                    continue
                release.status = "running"
                return take_lease(session, release, self.worker_id, now, lease, release.n_rows_read)

    def heartbeat(self, job: ClaimedJob) -> bool:
        """Extend this worker's lease on ``job``; false if the lease was lost."""
        with self.session_factory.begin() as session:
            result = session.execute(
                update(Release)
                .where(
                    Release.id == job.release_id,
                    Release.lease_owner == self.worker_id,
                    Release.attempts == job.attempt,
                    Release.status == "running",
                )
                .values(
                    lease_expires_at=utcnow()
                    + timedelta(seconds=self.settings.worker_lease_seconds)
                )
            )
            return bool(getattr(result, "rowcount", 0) == 1)

    # -- running --------------------------------------------------------------------------------

    def execute(self, job: ClaimedJob) -> Outcome:
        """Run the mechanism and turn whatever happens into an :class:`Outcome` (never raises
        an ``Exception``); see the module docstring for which faults are ``failed``."""
        mechanism = get_mechanism(job.mechanism)
        if mechanism is None:
            return Outcome.failed(NO_MECHANISM_REASON)
        mechanism_params, recorded = priors.split_params(job.params)
        try:
            params = mechanism.parse_params(mechanism_params)
        except (ValidationError, InvalidParameter):
            return Outcome.failed(REFUSED_AT_RUN_REASON)
        if recorded:
            # A public prior (service.priors): read back and its digest checked before any row
            # is read; a prior gone or changed is a refusal missed at prepare (data-independent).
            def load() -> priors.PublicPrior | None:
                with self.session_factory() as session:
                    return priors.stored_prior(session, recorded)

            try:
                prior = self.with_db_retry("read prior", load)
            except LookupError:
                return Outcome.failed(REFUSED_AT_RUN_REASON)
            if prior is not None:
                mechanism = on_prior(mechanism, prior.matrix, prior.sha256)
        spec = ReleaseSpec(k=job.k, epsilon=job.epsilon, delta=job.delta, params=params)
        if job.file_name is None:
            return Outcome.failed(DATASET_DELETED_REASON, refund=True)
        if job.reference is not None:
            return self._execute_reference(job, mechanism, spec)
        try:
            data = self.store.open(job.file_name, job.n_rows)
        except FileNotFoundError:
            # Deleted (or lost) between the claim and the open: nothing was read.
            return Outcome.failed(DATASET_FILE_FAULT_REASON, refund=True)
        if job.person_level:
            try:
                units = self.store.open_units(job.file_name, data.shape[0])
            except (FileNotFoundError, ValueError):
                # The unit index is lost or short (a fault of the data directory, public like
                # the file's size): never run per row on a person-level dataset.
                return Outcome.failed(DATASET_FILE_FAULT_REASON, refund=True)
            if mechanism.name in privacy_unit.PERSON_PARTITIONED:
                # Sample-and-aggregate: the rows as they are, the partition of people drawn
                # inside the mechanism from the unit index (privacy_unit, random_partition).
                try:
                    privacy_unit.check_mechanism(mechanism.name, params, mechanism.continual)
                    privacy_unit.check_partition(
                        mechanism.name, params, int(units.max(initial=-1)) + 1
                    )
                except InvalidInput:
                    return Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
                return self._run(job, mechanism, data, spec, units=units)
            rule = privacy_unit.PERSON_LEVEL_RULES.get(mechanism.name)
            clip_norm = getattr(params, "clip_norm", None)
            if rule is None or clip_norm is None:
                # The request gate refuses these; a release queued before a change of that
                # gate must not run per row on a person-level dataset.
                return Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
            try:
                privacy_unit.check_mechanism(mechanism.name, params, mechanism.continual)
            except InvalidInput:
                return Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
            # A per-person map fixed by public facts (C, the rule, a public centre): total on
            # finite rows. A public centre is applied here, before the bound, and the mechanism
            # then runs uncentred on the centred rows (the same Gram; privacy_unit).
            center = getattr(params, "center", None)
            public_center = (
                np.asarray(center, dtype=np.float64) if isinstance(center, list) else None
            )
            if public_center is not None:
                spec = ReleaseSpec(
                    k=spec.k,
                    epsilon=spec.epsilon,
                    delta=spec.delta,
                    params=params.model_copy(update={"center": "none"}),
                )
            try:
                data = privacy_unit.bound_contributions(
                    data, units, clip_norm, rule, center=public_center
                )
            except Exception as exc:
                log.error(
                    "BUG: release %s: the per-person bound raised %s; recorded as no_result",
                    job.release_id,
                    safe_traceback(exc),
                )
                return Outcome(status="no_result", reason=NO_RELEASE_REASON, extras={})
        return self._run(job, mechanism, data, spec)

    def _execute_reference(
        self, job: ClaimedJob, mechanism: Mechanism[Any], spec: ReleaseSpec[Any]
    ) -> Outcome:
        """A dataset by reference: its objects checked unchanged before and after the run, the
        heavy passes on Dask or in process; a :class:`~service.reference.ReferenceFault` (a
        changed object, a failed cluster: nothing released) is ``failed`` and refunded."""
        assert job.reference is not None
        try:
            with reference.open_rows(job.reference, self.settings) as rows:
                outcome = self._run(job, mechanism, rows, spec, reraise=reference.ReferenceFault)
                rows.check_unchanged()
                return outcome
        except reference.ReferenceFault as fault:
            log.warning("release %s: %s", job.release_id, fault.reason)
            return Outcome.failed(fault.reason, refund=fault.refund)

    def _run(
        self,
        job: ClaimedJob,
        mechanism: Mechanism[Any],
        data: Any,
        spec: ReleaseSpec[Any],
        reraise: type[Exception] | None = None,
        units: npt.NDArray[np.int64] | None = None,
    ) -> Outcome:
        try:
            if units is not None:
                return Outcome.of(
                    privacy_unit.run_partitioned(mechanism, data, units, spec, secure_generator())
                )
            return Outcome.of(mechanism.run(data, spec, secure_generator()))
        except InvalidParameter:
            return Outcome.failed(REFUSED_AT_RUN_REASON)
        except Exception as exc:
            if reraise is not None and isinstance(exc, reraise):
                raise
            log.error(
                "BUG: release %s: mechanism %s raised %s; recorded as no_result",
                job.release_id,
                job.mechanism,
                safe_traceback(exc),
            )
            return Outcome(status="no_result", reason=NO_RELEASE_REASON, extras={})

    def process(self, job: ClaimedJob) -> str:
        """Run a claimed job to the end and record the outcome; returns the final status.
        A continual release instead releases the epochs of the batches present (see
        :mod:`service.continual`) and returns ``"waiting"`` or its final status.

        Traced (when tracing is on) as spans of the request's trace: ``release.queue_wait``
        from the request to the claim, and ``release.job`` with ``release.run`` and
        ``release.store``; attributes are ids, the mechanism, ``k``, the attempt and the status.
        """
        with tracing.job_spans(job) as traced:
            status = self._process(job, traced)
            traced.finished(status)
            return status

    def _process(self, job: ClaimedJob, traced: tracing.JobSpans) -> str:
        if is_continual(job.mechanism):
            return process_continual(self, job)
        if job.file_name is None:
            return self.finish(job, Outcome.failed(DATASET_DELETED_REASON, refund=True))
        fault = None if job.reference is not None else self.store.fault(job.file_name, job.n_rows)
        if fault is not None:
            # Not a fault of the data: ended at once (no retries), refunded, nothing read.
            log.error("release %s: its dataset file %s", job.release_id, fault)
            return self.finish(job, Outcome.failed(DATASET_FILE_FAULT_REASON, refund=True))
        done = threading.Event()
        beat = threading.Thread(target=self._beat, args=(job, done), daemon=True)
        beat.start()
        try:
            with traced.step("release.run"):
                outcome = self._execute_isolated(job) if self.isolate else self.execute(job)
        finally:
            done.set()
            beat.join()
        if outcome is None:
            return "unstored"
        with traced.step("release.store"):
            return self.finish(job, outcome)

    def _execute_isolated(self, job: ClaimedJob) -> Outcome | None:
        """:meth:`execute` in a forked child; ``None`` if the child died without an outcome."""
        return self.isolated(f"release {job.release_id}", lambda: self.execute(job))

    def isolated(self, what: str, work: Callable[[], T]) -> T | None:
        """``work()`` in a forked child, its result back through a pipe; ``None`` if the child
        died without one. The path of every isolated run, and of the calibration's probe of
        this path (:func:`service.calibration.measure_overhead`)."""
        context = multiprocessing.get_context("fork")
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(
            target=self._child, args=(what, work, receiver, sender, os.getpid()), daemon=True
        )
        child.start()
        sender.close()
        try:
            # Waiting here holds no lock: the heartbeat thread runs whatever the child does.
            result: T = receiver.recv()
        except EOFError:
            child.join()
            log.error(
                "%s: the run's process ended without an outcome (exit code %s); "
                "the job is left to its lease",
                what,
                child.exitcode,
            )
            return None
        finally:
            receiver.close()
        child.join()
        return result

    def _child(
        self,
        what: str,
        work: Callable[[], Any],
        receiver: Connection,
        sender: Connection,
        parent: int,
    ) -> None:
        with forked_child_failures(what):
            die_with_parent(parent)
            # Only the parent reads: with this end closed here, a send to a dead parent fails
            # instead of blocking on a full pipe.
            receiver.close()
            # The parent's pooled connections must never be used (or closed) from here.
            bind = self.session_factory.kw.get("bind")
            if isinstance(bind, Engine):
                bind.dispose(close=False)
            with blas_threads(self.settings):
                result = work()
            sender.send(result)
            sender.close()

    def _beat(self, job: ClaimedJob, done: threading.Event) -> None:
        while not done.wait(self.settings.worker_heartbeat_seconds):
            try:
                held = self.with_db_retry(
                    "heartbeat",
                    lambda: self.heartbeat(job),
                    # The job's end (or a stop) ends a heartbeat's retries: finish takes over.
                    lambda seconds: done.wait(seconds) or self.stop.is_set(),
                )
            except WorkerStopping:
                return
            except Exception as exc:
                log.error("BUG: release %s: heartbeat: %s", job.release_id, safe_traceback(exc))
                continue
            if not held:
                log.warning("release %s: lease lost", job.release_id)
                return

    # -- finishing ------------------------------------------------------------------------------

    def finish(self, job: ClaimedJob, outcome: Outcome) -> str:
        """Store ``outcome`` if this worker still holds the lease, retrying while the database
        is away. Returns the status stored, ``"lost"`` when another worker now owns the job
        (this outcome is discarded), or ``"unstored"`` when a stop request or a non-transient
        error ended the retries (the job runs again once its lease expires; :meth:`process`
        also returns it when an isolated run died)."""
        try:
            return self.with_db_retry("finish", lambda: self._store(job, outcome))
        except WorkerStopping:
            log.warning("release %s: stopping before its outcome was stored", job.release_id)
        except Exception as exc:
            log.error("BUG: release %s: finish: %s", job.release_id, safe_traceback(exc))
        return "unstored"

    def _store(self, job: ClaimedJob, outcome: Outcome) -> str:
        """One attempt at storing ``outcome`` (one transaction)."""
        with self.session_factory.begin() as session:
            release = session.execute(
                select(Release).where(Release.id == job.release_id).with_for_update()
            ).scalar_one()
            ours = release.lease_owner == self.worker_id and release.attempts == job.attempt
            if ours and release.status in FINISHED:
                # An earlier attempt committed but its answer was lost on the way back.
                return release.status
            if release.status != "running" or not ours:
                log.warning("release %s: lease lost, outcome discarded", job.release_id)
                return "lost"
            self._record(session, release, outcome)
            return release.status

    def _record(self, session: Session, release: Release, outcome: Outcome) -> None:
        release.status = outcome.status
        release.reason = outcome.reason
        release.finished_at = utcnow()
        if not is_continual(release.mechanism):
            # Late or not, analysts see the outcome (and the refund) only at a step of the
            # release's public schedule (service.visibility); a continual release's end has its
            # own moment, set by service.continual.end before this.
            release.outcome_visible_at = visibility.shown_at(release, release.finished_at)
            if visibility.is_late(release, release.finished_at):
                log.warning(
                    "release %s: %s ended after its visible_at (late; shown at the next step "
                    "of its schedule)",
                    release.id,
                    release.mechanism,
                )
        release.lease_expires_at = None
        release.result_extras = outcome.extras
        if outcome.basis is not None:
            basis, release.result_shape, release.result_sha256 = outcome.basis
            session.add(ReleaseBasis(release_id=release.id, epoch=0, basis=basis))
        if outcome.refund:
            ledger.refund(session, release.dataset_id, release.id)
            release.refunded = True
        details: dict[str, Any] = {
            "mechanism": release.mechanism,
            "k": release.k,
            "cost": outcome_cost(release),
            "attempts": release.attempts,
            "basis_sha256": release.result_sha256,
        }
        if outcome.reason is not None:
            details["reason"] = outcome.reason
        if outcome.refund:
            details["refunded"] = refund_details(release)
        audit.record(
            session,
            f"release_{outcome.status}",
            actor_key_id=None,
            dataset_id=release.dataset_id,
            release_id=release.id,
            details=details,
        )
        # Long polls waiting on this release return once this transaction commits.
        wake.announce_finished(session, self.settings, release.id)

    # -- loops ----------------------------------------------------------------------------------

    def run_pending(self) -> int:
        """Process every claimable job now (tests, one-shot runs): releases, then datasets
        registering by reference; returns how many releases ran."""
        count = 0
        while True:
            while (job := self.with_db_retry("claim", self.claim)) is not None:
                self.process(job)
                count += 1
            if not self.run_registration():
                return count

    def run_registration(self) -> bool:
        """Claim and run one dataset registering by reference (:mod:`service.registration`);
        false if there was none. Releases go first: a registration may read for minutes."""
        job = self.with_db_retry("claim registration", lambda: registration.claim(self))
        if job is None:
            return False
        log.info("dataset %s: registering (attempt %d)", job.dataset_id, job.attempt)
        status = registration.process(self, job)
        log.info("dataset %s: registration %s", job.dataset_id, status)
        return True

    def run_forever(self) -> None:
        """Poll for jobs until :attr:`stop` is set. Nothing but the stop ends the loop: database
        outages are waited out, and any other error is logged as a bug and the loop goes on."""
        log.info("worker %s started", self.worker_id)
        presence = threading.Thread(target=self._presence, daemon=True)
        presence.start()
        bind = self.session_factory.kw.get("bind")
        # Woken when a release is queued (service.wake); the poll interval stays the fallback.
        waker = wake.waker_for(bind if isinstance(bind, Engine) else None, self.settings, self.stop)
        try:
            self._loop(waker)
        finally:
            waker.close()
            presence.join(timeout=5)
        log.info("worker %s stopped", self.worker_id)

    def note_alive(self) -> None:
        """Renew this worker's heartbeat row (read by the admins' views and /metrics)."""
        with self.session_factory.begin() as session:
            operations.note_worker_alive(session, self.worker_id, utcnow())

    def _presence(self) -> None:
        """Beat every ``worker_heartbeat_seconds`` until stopped, then remove the row. Best
        effort: a beat lost to a database outage only makes the worker look idle-dead for a
        moment (the claim loop logs outages), so failures are not retried or logged here."""
        while True:
            try:
                self.note_alive()
            except Exception as exc:
                if not is_transient_db_error(exc):
                    log.error("BUG: worker heartbeat: %s", safe_traceback(exc))
            if self.stop.wait(self.settings.worker_heartbeat_seconds):
                break
        try:
            with self.session_factory.begin() as session:
                operations.forget_worker(session, self.worker_id)
        except Exception:
            log.debug("worker %s: heartbeat row left behind (database away)", self.worker_id)

    def calibrate_if_due(self) -> bool:
        """Time the mechanisms on public random data and store the rates for the padding
        (:mod:`service.calibration`), once: at this worker's start, before it claims any job.
        True if it calibrated now.

        Once only, and not cut short by a queued job (a stop ends it between mechanisms): the
        rates read for a new release's padding must not change when another job ends, and a
        worker recalibrating whenever it is idle, or stopping early when a job waits, would
        change them exactly then (:mod:`service.padding`, "Every input"). A probe that cannot
        write its file (a full disk) is an operational condition: a warning, the rates measured
        in memory are stored, the previous or default overhead rates stay, and the probe is
        tried again at start (:func:`service.calibration.PROBE_RETRIES` times)."""
        if self.settings.worker_calibrate_seconds <= 0 or self._calibrated_at is not None:
            return False
        from service import calibration

        self._calibrated_at = time.monotonic()
        stopping = self.stop.is_set
        with blas_threads(self.settings):
            rates = calibration.measure(interrupted=stopping)
        for attempt in range(1, calibration.PROBE_RETRIES + 1):
            try:
                rates.update(self._probe_overhead(stopping))
                break
            except OSError as exc:
                # Disk full, a read-only or missing data directory: the operator's to fix.
                log.warning(
                    "worker %s: calibration: cannot write the overhead probe (%s: %s); "
                    "attempt %d of %d, keeping the previous or default overhead rates",
                    self.worker_id,
                    type(exc).__name__,
                    exc.strerror or exc,
                    attempt,
                    calibration.PROBE_RETRIES,
                )
                if attempt == calibration.PROBE_RETRIES or self.stop.wait(
                    calibration.PROBE_RETRY_SECONDS
                ):
                    break
        if not rates:
            return False

        def save() -> None:
            with self.session_factory.begin() as session:
                calibration.store(session, self.worker_id, rates)

        self.with_db_retry("calibrate", save)
        log.info("worker %s calibrated %d rates", self.worker_id, len(rates))
        return True

    def _probe_overhead(self, stopping: Callable[[], bool]) -> dict[tuple[str, int], float]:
        """The per-job overhead, through this worker's own path (forked when it isolates runs),
        the probe file in this process's incoming directory (removed with it if it dies)."""
        from service import calibration

        probe = self.store.new_incoming_path().with_suffix(".npy")
        try:
            calibration.write_probe(probe)
            return calibration.measure_overhead(
                probe,
                (lambda work: self.isolated("calibration probe", work))
                if self.isolate
                else (lambda work: work()),
                lambda: self.with_db_retry("calibrate", self.note_alive),
                stopping,
            )
        finally:
            with contextlib.suppress(OSError):
                probe.unlink(missing_ok=True)

    def _calibrate_at_start(self) -> None:
        """:meth:`calibrate_if_due` before the first claim; a failure leaves the previous (or
        default) rates and never stops the worker."""
        try:
            self.calibrate_if_due()
        except WorkerStopping:
            return
        except OSError as exc:
            log.warning(
                "worker %s: calibration failed (%s: %s); keeping the previous or default rates "
                "until this worker restarts",
                self.worker_id,
                type(exc).__name__,
                exc.strerror or exc,
            )
        except Exception as exc:
            log.error("BUG: calibrate: %s", safe_traceback(exc))

    def _loop(self, waker: wake.Waker) -> None:
        self._calibrate_at_start()
        while not self.stop.is_set():
            try:
                job = self.with_db_retry("claim", self.claim)
            except WorkerStopping:
                break
            except Exception as exc:
                log.error("BUG: claim: %s", safe_traceback(exc))
                job = None
            if job is None:
                try:
                    if self.run_registration():
                        continue
                except WorkerStopping:
                    break
                except Exception as exc:
                    log.error("BUG: registration: %s", safe_traceback(exc))
                waker.wait(self.settings.worker_poll_seconds)
                continue
            log.info(
                "release %s: running %s (attempt %d)", job.release_id, job.mechanism, job.attempt
            )
            try:
                status = self.process(job)
            except Exception as exc:
                log.error("BUG: release %s: %s", job.release_id, safe_traceback(exc))
                self.stop.wait(self.settings.worker_poll_seconds)
                continue
            log.info("release %s: %s", job.release_id, status)
