"""Workers: claim a queued release, run its mechanism, store the result exactly once.

The worker owns the job: the claim and the lease, the heartbeat, the isolated process, the
retries, the transaction that stores a result and the recording of the outcome. What one-shot
and continual releases do differently is their job kind (:mod:`service.oneshot`,
:mod:`service.continual`), which the worker calls and which never calls back; a job's path
reads straight down in :meth:`Worker._process` (the interface: :mod:`service.jobs`).

The releases table is the queue. A claim sets ``status = running`` and a lease (owner, attempt,
expiry) in one short transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite serialises
writers). While the mechanism runs, a heartbeat thread extends the lease. A worker that dies
stops heartbeating; once its lease expires the job is claimable again and runs afresh with fresh
randomness (an output that was never stored was never seen; what the retry itself reveals is
discussed in docs/service.md, "How it works"). Finishing checks that this worker still holds the
lease of this attempt, so a produced output is stored once. The budget was charged when the
release was requested; it is refunded when, and only when, the job provably never read the
data, decided on public facts before the first row is read (:func:`service.oneshot.execute`).

**Outcomes.** ``failed`` is reserved for faults that do not depend on the data, so that the
status field can never reveal a row:

- the dataset was deleted before the run, or its file is gone (refunded: never read);
- a refusal that was missed at prepare: the stored params no longer parse, or name a prior gone
  or changed (refunded: decided before any row is read), or ``run`` raised
  :class:`~service.mechanisms.base.InvalidParameter` (charged: it may have read rows);
- the service no longer has the mechanism (refunded);
- an object of a dataset by reference changed, gone or unreadable (charged: whether the job
  met the owner's change tells when it was claimed; :mod:`service.reference_recheck`);
- the job was abandoned after ``DPSS_WORKER_MAX_ATTEMPTS`` claims (charged).

A continual release is refunded only when no epoch was released.

Any other exception from a mechanism is a bug in it. It is logged as a bug (exception type and
location only, never the message, which may quote data) and the release is recorded as
``no_result`` with the one fixed reason :data:`NO_RELEASE_REASON`, charged like every
``no_result``: its status then says nothing that a correct mechanism's ``no_result`` would not.

**Isolation.** With ``isolate=True`` (``dpss worker``) each run happens in another process,
the worker's run process (:mod:`service.isolation`: forked at the first run, serving runs one
at a time, replaced when it dies), and the outcome comes back through a pipe. A mechanism can
then hold the interpreter lock for as long as one LAPACK call takes (SciPy's wrappers do not
release it) without starving the heartbeat, which would otherwise let the lease expire under a
running job, and a run that kills its process (out of memory) does not kill the worker: the job
is left to its lease, counted as an attempt, and abandoned after ``DPSS_WORKER_MAX_ATTEMPTS``.

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

import functools
import logging
import os
import random
import socket
import threading
import time
import typing
import uuid
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine, Select, update
from sqlalchemy.orm import Session, sessionmaker

from service import (
    audit,
    charges,
    claims,
    commit_order,
    ledger,
    oneshot,
    operations,
    priors,
    reference_recheck,
    registration,
    tracing,
    visibility,
    wake,
    worker_calibration,
)
from service.config import Settings
from service.continual import CONTINUAL, is_continual
from service.db.clock import lease_end
from service.db.models import Release, utcnow
from service.db.prepared import Prepared
from service.errors import safe_traceback
from service.isolation import RunProcess
from service.jobs import (
    ABANDONED_REASON,
    FINISHED,
    LOCKED_RELEASE,
    LOST,
    STORED,
    WAITING,
    ClaimedJob,
    End,
    JobKind,
    Outcome,
    ReleaseEnd,
    Run,
    RunContext,
    WorkerStopping,
    lease_update,
    queued_claim,
    take_lease,
)
from service.oneshot import ONE_SHOT
from service.outages import OutageLog, is_transient_db_error
from service.store import DatasetStore

log = logging.getLogger("dpss.worker")


T = TypeVar("T")


class _Abandoned:
    """What a claim's look found when it recorded a job as abandoned (claim again)."""


_ABANDONED = _Abandoned()

#: Key in ``Session.info``: the store transaction's :meth:`Worker.idle_look` found nothing.
_IDLE = "dpss_worker_idle"


def kind_of(mechanism: str) -> JobKind[Any, Any]:
    """The job kind of a release of ``mechanism``."""
    return CONTINUAL if is_continual(mechanism) else ONE_SHOT


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
        self._outage = OutageLog()
        #: Set when the transaction that stored a job's end found nothing else to claim
        #: (:meth:`idle_look`); read once by the loops (:meth:`_nothing_after_job`).
        self._idle_after_store = False
        #: The last release whose late end was logged. A store retried through an outage records
        #: the end again in each attempt's transaction; the warning is logged once per release
        #: (before, a 4 s outage at the store logged it about 20 times).
        self._late_logged: uuid.UUID | None = None
        #: ``time.monotonic()`` of the last calibration of this machine (None: not yet).
        self._calibrated_at: float | None = None
        bind = session_factory.kw.get("bind")
        #: The process isolated runs happen in (:mod:`service.isolation`), started at the first.
        self._runs = RunProcess(settings, bind if isinstance(bind, Engine) else None, (store,))
        #: The claim's write of a lease (:func:`service.jobs.lease_update`) and its length.
        self._lease_written: tuple[float, Prepared] | None = None
        weakref.finalize(self, self._runs.close)

    def close(self) -> None:
        """End the run process (a new one starts if this worker runs again)."""
        self._runs.close()

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
                    if failures:
                        self._outage.gave_up(operation)
                    raise
                failures += 1
                self._outage.failed(operation, exc)
                if wait(self._backoff(failures)):
                    self._outage.gave_up(operation)
                    raise WorkerStopping(operation) from None
                continue
            self._outage.succeeded(operation)
            return result

    # -- claiming -------------------------------------------------------------------------------

    def claim(self) -> ClaimedJob | None:
        """The next job or ``None``: a queued or expired one (:meth:`_queued`), else one that
        waited and has work again (:meth:`_waiting`), first if that work came before the oldest
        queued job (:func:`service.claims.waiting_ahead`). One transaction (``bench/
        bench_release_cpu.py``); a job abandoned on the way is recorded, and the claim redone.
        ``None`` too when a registration by reference was requested before those jobs
        (:func:`service.claims.registration_ahead`): the loops then run it
        (:meth:`run_registration`), in the releases' order."""
        lease = timedelta(seconds=self.settings.worker_lease_seconds)
        while True:
            with self.session_factory.begin() as session:
                # Every job stamped before now is committed first (service.commit_order): a
                # release requested before an epoch's point but committed after this claim
                # would otherwise run after the epoch, its padding never having counted it.
                commit_order.settle(session)
                now = utcnow()
                # One statement: the oldest queued job (locked), whether a waiting one goes first.
                queued = claims.queued(session, self.worker_id)
                if claims.registration_first(session, queued, self.worker_id):
                    # Requested before the jobs here: the loops take it (run_registration).
                    return None
                first = queued is not None and bool(queued.waiting_ahead)
                found = None if first else self._queued(session, queued, now, lease)
                for kind in claims.KINDS:
                    if found is not None:
                        break
                    found = self._waiting(session, kind, now, lease)
                if found is None and first:
                    found = self._queued(session, queued, now, lease)
                if not isinstance(found, _Abandoned):
                    return found

    def _queued(
        self, session: Session, found: Any, now: datetime, lease: timedelta
    ) -> ClaimedJob | _Abandoned | None:
        """Take ``found`` (the claim's look: the oldest queued job or one whose lease expired;
        ``None``: none); :data:`_ABANDONED` if it was one past its attempts (recorded here).

        A job still leased to this worker is taken again too: this worker runs one job at a
        time, so such a job is one whose claim committed although the commit's answer was lost,
        or whose outcome could not be stored. Each claim counts as an attempt.
        """
        if found is None:
            return None
        if found.attempts >= self.settings.worker_max_attempts:
            # The job keeps killing its workers; it may have read the data: no refund.
            # The lease names who decided, so the last runner cannot mistake this for
            # its own stored outcome. Rare: the release as an ORM object, as it is recorded.
            release = session.execute(LOCKED_RELEASE, {"release_id": found.id}).scalar_one()
            release.lease_owner = self.worker_id
            self._record(session, release, End(Outcome.failed(ABANDONED_REASON)))
            return _ABANDONED
        return queued_claim(session, found, self.worker_id, now, self._lease_write(lease))

    def _lease_write(self, lease: timedelta) -> Prepared:
        """:func:`service.jobs.lease_update` for ``lease``, built once per length."""
        seconds = lease.total_seconds()
        if self._lease_written is None or self._lease_written[0] != seconds:
            self._lease_written = (seconds, Prepared(lease_update(seconds)))
        return self._lease_written[1]

    def _waiting(
        self, session: Session, kind: JobKind[Any, Any], now: datetime, lease: timedelta
    ) -> ClaimedJob | _Abandoned | None:
        """Claim a job of ``kind`` that waits with its lease given up and has work again (the
        kind says when); ``None`` if there is none, :data:`_ABANDONED` as for :meth:`_queued`.
        The lease and attempt count work as for any claim; a waiting job has ``attempts``
        reset, so the limit counts claims since the last time it had nothing left to do."""
        look = claims.waiting_look(kind)
        if look is None:
            return None
        release = session.execute(look).scalar_one_or_none()
        if release is None:
            return None
        if release.attempts >= self.settings.worker_max_attempts:
            release.lease_owner = self.worker_id
            self._record(session, release, kind.abandoned(session, release, self.settings))
            return _ABANDONED
        return take_lease(session, release, self.worker_id, now, lease, None)

    def idle_look(self) -> Select[Any]:
        """:func:`service.claims.idle_look`: asked by the store transaction (:meth:`_store`)."""
        return claims.idle_look()

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
                .values(lease_expires_at=lease_end(self.settings.worker_lease_seconds))
            )
            return bool(getattr(result, "rowcount", 0) == 1)

    # -- running --------------------------------------------------------------------------------

    def context(self) -> RunContext:
        """What a run uses besides its work (the run process has it from the fork)."""
        return RunContext(store=self.store, settings=self.settings, label=self.worker_id)

    def execute(self, job: ClaimedJob) -> Outcome:
        """Run a one-shot job's mechanism here and turn whatever happens into an
        :class:`Outcome` (never raises an ``Exception``): :func:`service.oneshot.execute`, with
        the public prior its params name read first (:func:`service.oneshot.with_prior`)."""
        work: oneshot.OneShotWork | End = oneshot.OneShotWork(job)
        if priors.split_params(job.params)[1]:

            def load() -> oneshot.OneShotWork | End:
                with self.session_factory() as session:
                    return oneshot.with_prior(session, job)

            work = self.with_db_retry("read prior", load)
        if isinstance(work, End):
            return work.outcome
        return oneshot.execute(work.job, self.context(), work.prior)

    def process(self, job: ClaimedJob) -> str:
        """Run a claimed job to the end (or, for a job that waits between works, until it has
        nothing to do now) and record the outcome; returns the final status, ``"waiting"``,
        ``"lost"`` (another worker owns the job now) or ``"unstored"`` (a stop, or a run that
        died: the lease expires and the job runs again).

        Traced (when tracing is on) as spans of the request's trace: ``release.queue_wait``
        from the request to the claim, and ``release.job`` with ``release.run`` and
        ``release.store``; attributes are ids, the mechanism, ``k``, the attempt and the status.
        """
        self._idle_after_store = False
        with tracing.job_spans(job) as traced:
            status = self._process(job, traced)
            traced.finished(status)
            return status

    def _process(self, job: ClaimedJob, traced: tracing.JobSpans) -> str:
        """The job's path, straight down (:mod:`service.jobs`): the kind's first work or end,
        then load, run (isolated), save, until the kind ends the job or waits."""
        kind = kind_of(job.mechanism)
        work = kind.first(job, self.context())
        if isinstance(work, End):
            return self.finish(job, work)
        done = threading.Event()
        beat = threading.Thread(target=self._beat, args=(job, done), daemon=True)
        beat.start()
        try:
            while True:
                if work is None:
                    if self.stop.is_set():
                        break
                    loaded = self.with_db_retry("load", functools.partial(self._load, kind, job))
                    if isinstance(loaded, str):
                        return loaded
                    work = loaded
                with traced.step("release.run"):
                    result = self._run(kind, job, work)
                if result is None:
                    return "unstored"
                if not kind.resumable:
                    # The job ends with this result: the heartbeat's work is done.
                    done.set()
                    beat.join()
                with traced.step("release.store"):
                    status = self.finish(job, result, kind, work)
                if status != STORED:
                    if status == "unstored" and kind.resumable and self.stop.is_set():
                        break
                    return status
                kind.saved(job, work)
                work = None
        except WorkerStopping:
            pass
        finally:
            done.set()
            beat.join()
        log.warning("release %s: stopping between its works", job.release_id)
        self._give_up_lease(job)
        return "unstored"

    def _run(self, kind: JobKind[Any, Any], job: ClaimedJob, work: Any) -> Any:
        """``kind.run(work)``, in the run process when isolating; ``None`` if it died."""
        call = Run(kind, work, self.context())
        return self.isolated(f"release {job.release_id}", call) if self.isolate else call()

    def isolated(self, what: str, work: Callable[[], T]) -> T | None:
        """``work()`` (picklable) in the worker's run process (:mod:`service.isolation`), its
        result back through a pipe; ``None`` if the process died without one. The path of every
        isolated run, and of the calibration's probe of this path
        (:func:`service.calibration.measure_overhead`)."""
        return self._runs.run(what, work)

    def _ours(self, job: ClaimedJob, release: Release) -> bool:
        return release.lease_owner == self.worker_id and release.attempts == job.attempt

    def _locked(self, session: Session, job: ClaimedJob) -> Release:
        return session.execute(LOCKED_RELEASE, {"release_id": job.release_id}).scalar_one()

    def _load(self, kind: JobKind[Any, Any], job: ClaimedJob) -> Any:
        """The job's next work from its kind, or what ends this claim (one transaction): the
        end recorded, the lease given up while the job waits, or ``"lost"``."""
        with self.session_factory.begin() as session:
            release = self._locked(session, job)
            if release.status != "running" or not self._ours(job, release):
                return LOST
            loaded = kind.load(session, release, job, self.settings)
            if isinstance(loaded, End):
                self._record(session, release, loaded)
                return release.status
            if loaded == WAITING:
                release.lease_owner = None
                release.lease_expires_at = None
                release.attempts = 0
                return WAITING
            return loaded

    def _give_up_lease(self, job: ClaimedJob) -> None:
        """On a stop request between a resumable job's works: hand it back at once (another
        worker may continue it now rather than after the lease). One try: if the database is
        away the lease expires anyway."""
        try:
            with self.session_factory.begin() as session:
                release = self._locked(session, job)
                if release.status == "running" and self._ours(job, release):
                    release.lease_owner = None
                    release.lease_expires_at = None
        except Exception as exc:
            log.warning(
                "release %s: lease kept until it expires (%s)", job.release_id, type(exc).__name__
            )

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

    def finish(
        self,
        job: ClaimedJob,
        result: Any,
        kind: JobKind[Any, Any] | None = None,
        work: Any = None,
    ) -> str:
        """Store ``result`` (an :class:`Outcome` or :class:`End` that ends the job, or what
        ``kind.run(work)`` gave, saved by ``kind``) if this worker still holds the lease,
        retrying while the database is away. Returns the status stored, ``"stored"`` (the job
        goes on), ``"lost"`` when another worker now owns the job (this result is discarded),
        or ``"unstored"`` when a stop request or a non-transient error ended the retries (the
        job runs again once its lease expires; :meth:`process` also returns it when an
        isolated run died)."""
        try:
            return self.with_db_retry(
                "finish", functools.partial(self._store, job, result, kind, work)
            )
        except WorkerStopping:
            log.warning("release %s: stopping before its outcome was stored", job.release_id)
        except Exception as exc:
            log.error("BUG: release %s: finish: %s", job.release_id, safe_traceback(exc))
        return "unstored"

    def _store(
        self,
        job: ClaimedJob,
        result: Any,
        kind: JobKind[Any, Any] | None = None,
        work: Any = None,
    ) -> str:
        """One attempt at storing ``result`` (one transaction; see :meth:`finish`). When it
        ends the job, the same transaction asks :meth:`idle_look`; its answer is kept for the
        loops once the transaction committed."""
        with self.session_factory.begin() as session:
            status = self._stored(session, job, result, kind, work)
            idle = bool(session.info.pop(_IDLE, False))
        self._idle_after_store = idle
        return status

    def _stored(
        self,
        session: Session,
        job: ClaimedJob,
        result: Any,
        kind: JobKind[Any, Any] | None,
        work: Any,
    ) -> str:
        """:meth:`_store`'s work in its transaction ``session``."""
        if isinstance(result, Outcome):
            result = End(result)
        release: Release
        idle: bool | None  # nothing else claimable (None: not asked yet)
        if (
            isinstance(result, End)
            and not result.outcome.refund
            and kind_of(job.mechanism) is ONE_SHOT
        ):
            # The common end (a one-shot job's, no refund to weigh): recorded from the locked
            # row's columns (:class:`service.jobs.LockedRelease`), written at once by
            # :class:`ReleaseEnd`; the ORM object's load was a tenth of this transaction. A
            # refund reads the release through the session (:func:`service.ledger.refund`)
            # and a continual end its kind's columns: those keep the ORM object. The idle look
            # is asked in the same statement (:func:`service.claims.locked_end`).
            locked, anything = claims.locked_end(session, job.release_id, self.worker_id)
            release, idle = typing.cast(Release, locked), not anything
        else:
            release, idle = self._locked(session, job), None
        ours = self._ours(job, release)
        if ours and release.status in FINISHED:
            # An earlier attempt committed but its answer was lost on the way back.
            return release.status
        if release.status != "running" or not ours:
            log.warning("release %s: lease lost, outcome discarded", job.release_id)
            return LOST
        if isinstance(result, End) or kind is None:
            saved = result
        else:
            # The lease goes on with the job (an end clears it). Set before the kind saves:
            # the release's row is then written once, before the audit chain's head is
            # locked; a second write of it in this transaction would check its dataset key
            # (PostgreSQL's foreign-key check on a row this transaction changed) while
            # holding that head, and deadlock with an append that holds the dataset and
            # waits for the head.
            release.lease_expires_at = lease_end(self.settings.worker_lease_seconds)
            saved = kind.save(session, release, job, work, result, self.settings)
        if isinstance(saved, End):
            self._record(session, release, saved)
            if idle is None:
                # On the transaction's connection, not through the session: a Core read of
                # other rows needs no flush of this one's changes first (the commit flushes
                # them).
                found = (
                    session.connection()
                    .execute(
                        self.idle_look(),
                        {"worker_id": self.worker_id, "release_id": release.id},
                    )
                    .scalar_one()
                )
                idle = not found
            session.info[_IDLE] = idle
            return release.status
        if saved == STORED:
            # Long polls waiting for this job's next result return once this commits.
            wake.announce_finished(session, self.settings, release.id)
        return str(saved)

    def _record(self, session: Session, release: Release, end: End) -> None:
        """Record a job's end: status, reason, when analysts see it, its result, refund and
        audit event, and the wake-up of the long polls waiting on it."""
        outcome = end.outcome
        row = ReleaseEnd(release)  # written at once below, not flushed by the ORM
        row["status"] = outcome.status
        row["reason"] = outcome.reason
        row["finished_at"] = finished_at = utcnow()
        kind = kind_of(release.mechanism)
        row["outcome_visible_at"] = (
            end.visible_at if end.visible_at is not None else kind.shown_at(release, finished_at)
        )
        if (
            end.visible_at is None
            and kind.late(release, finished_at)
            and self._late_logged != release.id
        ):
            self._late_logged = release.id
            log.warning(
                "release %s: %s ended after its visible_at (late; shown at the next step "
                "of its schedule)",
                release.id,
                release.mechanism,
            )
        row["lease_expires_at"] = None
        row["result_extras"] = outcome.extras
        if reference_recheck.awaits_recheck(session, release):
            # Shown by the re-check at its due moment, not by what this job met: whether it
            # read before or after its owner changed an object tells when it was claimed.
            row["reference_check"] = reference_recheck.PENDING
        if outcome.basis is not None:
            basis, row["result_shape"], row["result_sha256"] = outcome.basis
            row.add_basis(session, basis)
        refunded = None
        # DESIGN: a refund only when the job provably never read the data. A failure decided
        # before any row is read proves it for this attempt only: an earlier attempt of the
        # same claim may have read rows before it died (its death itself possibly depending on
        # them), so a retry's such failure is charged.
        refund = outcome.refund and release.attempts <= 1
        if refund and visibility.dataset_deleted_at(session, release, settled=True) is not None:
            # Its dataset was deleted first: whether this job ran before the deletion (no
            # refund) or after it (never read) tells when a worker claimed it, that is when the
            # job ahead ended; analysts and owners see neither (service.visibility). Nothing
            # more can be charged to a deleted dataset: the charge stays.
            refund = False
        if refund:
            refunded = ledger.refund(session, release.dataset_id, release.id)
            row["refunded"] = True
        row.write(session)
        details: dict[str, Any] = {
            "mechanism": release.mechanism,
            "k": release.k,
            "cost": charges.outcome_cost(release),
            "attempts": release.attempts,
            "basis_sha256": release.result_sha256,
        }
        if outcome.reason is not None:
            details["reason"] = outcome.reason
        if refund:
            details["refunded"] = charges.refund_details(release, refunded)
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
                if self._nothing_after_job():
                    return count
            if not self.run_registration():
                return count

    def _nothing_after_job(self) -> bool:
        """Whether the job just processed ended in a transaction that found nothing else to
        claim (:meth:`idle_look`): the loops then skip the empty claim and registration look
        and wait. Read once."""
        idle, self._idle_after_store = self._idle_after_store, False
        return idle

    def run_registration(self) -> bool:
        """Claim and run one dataset registering by reference (:mod:`service.registration`);
        false if there was none. In the releases' order: :meth:`claim` leaves a job requested
        after a claimable registration for after it (:func:`service.claims.
        registration_ahead`)."""
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
        # Beside the job loop, so that no job (on any dataset) delays a re-check.
        rechecks = threading.Thread(
            target=reference_recheck.run,
            args=(self.session_factory, self.settings, self.stop, self._outage),
            daemon=True,
        )
        rechecks.start()
        bind = self.session_factory.kw.get("bind")
        # Woken when a release is queued (service.wake); the poll interval stays the fallback.
        waker = wake.waker_for(bind if isinstance(bind, Engine) else None, self.settings, self.stop)
        try:
            self._loop(waker)
        finally:
            waker.close()
            self.close()
            presence.join(timeout=5)
            rechecks.join(timeout=5)
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
        self._calibrated_at = time.monotonic()
        return worker_calibration.calibrate(self)

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
            if self._nothing_after_job():
                waker.wait(self.settings.worker_poll_seconds)
