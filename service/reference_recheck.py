"""The re-check of a dataset by reference at a public moment, which decides what analysts and
owners are shown of a release on it (a one-shot release's outcome; a continual release's epochs
and end: below).

**Why.** Every release on a dataset by reference verifies the digests fixed at registration as
it reads, so a job that read before the owner changed an object succeeds and one that read
after fails. When it read is when a worker claimed it, that is when the job ahead of it in the
shared queue (on any dataset) ended; the owner chooses the moment of the change and reads the
outcome: one bit per release about another dataset's run time. The outcome is therefore decided,
for every caller but admins and auditors, by a re-check made at or after the outcome was due:

- the worker that records a one-shot release's end on a dataset by reference (padded) marks it
  ``reference_check = pending`` (:meth:`service.worker.Worker._record`);
- from the release's due moment on (:func:`service.visibility.recheck_due`: its
  ``outcome_visible_at``, else its ``visible_at``, both public) a worker's re-check thread
  (:func:`run`, beside the job loop: it waits behind no job) checks every object of the dataset
  as registered: its identity (S3: ETag and version; a file: size and mtime, by ``lstat``, no
  symlink followed) and then every footer's and column chunk's bytes against their SHA-256
  (:meth:`~service.reference.engine.ParquetRows.verify_unchanged`; a rewrite keeping the size
  and mtime is found by the digests). ``unchanged`` or ``changed`` (gone, replaced, not a
  regular file, unreadable, a byte differing, the dataset deleted meanwhile) is stored with
  ``reference_shown_at`` (:func:`service.visibility.recheck_shown_at`: the due moment plus a
  grace that is a public function of the padding, or the next step of the late schedule when
  the re-check ended later);
- until ``reference_shown_at`` analysts and owners see the release ``running``; then, if
  ``changed``, ``failed`` with one fixed reason, no result and no refund, whatever the job did
  (:mod:`service.visibility`, and :mod:`service.history` in SQL). The worker refunds no fault
  found in an object (:func:`service.reference.integrity.object_fault`), and a refund the
  worker does make (a failure before any read) is held until the verdict
  (:func:`service.ledger.refund`): it takes effect at ``reference_shown_at`` if ``unchanged``,
  never if ``changed``, so the ledger, the budget and the grants say what the release says,
  at every moment, both ways too.

A change made before the outcome was due is found by the re-check whether the job read before or
after it (both worlds read ``failed``), and one made after the job read and after the re-check
is found by neither (both read the job's outcome). What the owner can still learn is when the
re-check ran within its grace (a change between the due moment and the re-check counts), a
function of the re-check thread's own latency, not of the queue. Admins and auditors see what
happened (the real status, the verdict and ``reference_checked_at``); nothing is rewritten.

**Continual releases.** An epoch whose job read before the owner's change is stored and was
shown; one that read after it ended the release there: the same bit, epoch by epoch. So every
epoch a padded continual release stores on a dataset by reference is ``pending``
(:func:`service.continual.store_epoch`) and re-checked at its ``visible_at``
(:func:`recheck_epoch`: every object's identity and the digests of the rows through its batch,
what its job checked and more), its verdict shown at the same grace; the release's end is
re-checked as a one-shot release's outcome, over the rows through the epoch it ended at
(:func:`_read_rows`), at the same moment the epoch would have been. Analysts and owners see an
epoch only once its ``unchanged`` shows and none after the first that does not
(:func:`service.continual._shown`); a ``changed`` epoch shows the release ``failed`` from its
verdict's moment (:func:`service.visibility.epoch_change_shown`), as the end re-checked in the
other world does.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Hashable
from datetime import datetime, timedelta
from functools import partial

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session, sessionmaker

from service import ledger, reference, wake
from service.config import Settings
from service.continual import is_continual
from service.db.models import Dataset, DatasetBatch, Release, ReleaseEpoch, utcnow
from service.errors import safe_traceback
from service.outages import OutageLog, is_transient_db_error
from service.padding import padded
from service.visibility import recheck_due as due_of
from service.visibility import recheck_shown_at

log = logging.getLogger(__name__)

PENDING, UNCHANGED, CHANGED = "pending", "unchanged", "changed"
#: What :func:`verdict` reads when the object store could not be reached (a connection refused,
#: reset or timed out: the store, not the object, :func:`store_unreachable`): nothing is stored,
#: the re-check stays ``pending`` and is tried again (:class:`Retries`).
DEFERRED = "deferred"
#: How long past its due moment a re-check waits out an unreachable store; then it reads
#: ``changed`` (nothing can be shown as verified), so no release waits forever.
STORE_WAIT = timedelta(hours=1)
#: The longest wait before a re-check that could not end is tried again.
RETRY_MAX_SECONDS = 60.0
#: How many due re-checks one pass takes; the rest wait for the next pass.
BATCH = 32
#: The longest the thread sleeps between looks for due re-checks (it sleeps less when the next
#: due moment is nearer).
LOOK_SECONDS = 1.0


def due_ids(session: Session, now: datetime, extra: int = 0) -> list[uuid.UUID]:
    """The releases whose re-check is due at ``now``, the earliest due first (:data:`BATCH`
    of them, and ``extra`` more: as many as may be skipped)."""
    due = func.coalesce(Release.outcome_visible_at, Release.visible_at)
    return list(
        session.scalars(
            select(Release.id)
            .where(Release.reference_check == PENDING, due <= now)
            .order_by(due, Release.id)
            .limit(BATCH + extra)
        ).all()
    )


def next_due(session: Session) -> datetime | None:
    """The earliest due moment of a pending re-check, a release's or an epoch's (``None``:
    none pending)."""
    due = func.coalesce(Release.outcome_visible_at, Release.visible_at)
    moments = [
        session.scalar(select(func.min(due)).where(Release.reference_check == PENDING)),
        session.scalar(
            select(func.min(ReleaseEpoch.visible_at)).where(ReleaseEpoch.reference_check == PENDING)
        ),
    ]
    return min((m for m in moments if m is not None), default=None)


def store_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from or while handling) says the object
    store could not be reached: a connection refused, reset or timed out. Not a removed
    permission, a missing object or bucket, or any answer of the store: those are the owner's."""
    kinds: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)
    try:
        from botocore import exceptions as botocore_errors  # type: ignore[import-untyped]

        kinds += (
            botocore_errors.ConnectionError,
            botocore_errors.ConnectionClosedError,
            botocore_errors.ReadTimeoutError,
        )
    except ImportError:  # pragma: no cover - botocore comes with s3fs
        pass
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kinds):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def verdict(
    raw: dict[str, object] | None,
    settings: Settings,
    n_rows: int | None = None,
    since: datetime | None = None,
    wait_for_store: bool = False,
) -> str:
    """``unchanged`` if every object of the reference ``raw`` is as registered (with
    ``n_rows``: the digests of the first ``n_rows`` rows' row groups, the batches the release
    read, and every object's identity, as the job checked them), else ``changed``.

    Total: an object that cannot be read, a dataset deleted meanwhile (no record left to
    check) or any error is ``changed`` (nothing can be shown as verified). A reference
    registered before digests were recorded is ``unchanged``: its releases fail at once, with
    their own fixed reason, whenever they run.

    With ``wait_for_store``, a store that cannot be reached reads :data:`DEFERRED` (tried again
    later), not ``changed``: an outage of the operator's store is not the owner's change. It
    does not depend on when the release's job ran, so it shows nothing of the queue: only the
    verdict's moment moves (to a later step of the public late schedule)."""
    if raw is None:
        return CHANGED
    try:
        ref = reference.Reference.from_json(dict(raw), settings)
        if not ref.digested:
            return UNCHANGED
        if n_rows is not None:
            ref = reference.batch_of(ref, 0, n_rows)
        rows = reference.ParquetRows(ref, settings, reference.stamp_ns(since))
        try:
            rows.verify_unchanged()
        finally:
            rows.close()
    except reference.ReferenceFault as fault:
        if wait_for_store and store_unreachable(fault):
            log.info("re-check: the object store cannot be reached (%s); retried", fault.path)
            return DEFERRED
        log.info("re-check: %s (%s)", fault.reason, fault.path)
        return CHANGED
    except Exception as exc:
        if wait_for_store and store_unreachable(exc):
            log.info("re-check: the object store cannot be reached; retried")
            return DEFERRED
        log.error("BUG: re-check: %s", safe_traceback(exc))
        return CHANGED
    return UNCHANGED


def _live_reference(session: Session, dataset_id: uuid.UUID) -> dict[str, object] | None:
    """The dataset's reference record, or ``None`` once it is deleted (nothing left to check:
    :func:`verdict` reads ``changed``)."""
    dataset = session.get(Dataset, dataset_id)
    return None if dataset is None or dataset.deleted_at is not None else dataset.reference


def rows_through(session: Session, dataset_id: uuid.UUID, seq: int) -> int | None:
    """The rows of a dataset's batches ``0 .. seq`` (what a continual epoch reading batch
    ``seq`` has checked); ``None`` when there is no such batch (then every object is)."""
    batch = session.get(DatasetBatch, (dataset_id, seq)) if seq >= 0 else None
    return None if batch is None else batch.row_offset + batch.n_rows


def _read_rows(session: Session, release: Release) -> int | None:
    """The rows whose digests a release's re-check compares: a one-shot release's
    ``n_rows_read``; a continual release's end, those through the batch of the epoch it ended
    at (the last stored one at the horizon, else the next one, which its job met), as the
    re-check of that epoch would had it been stored (:func:`recheck_epoch`)."""
    if not is_continual(release.mechanism):
        return release.n_rows_read
    seq = release.epochs_done - 1 if release.status == "succeeded" else release.epochs_done
    return rows_through(session, release.dataset_id, seq)


def _waits_for_store(due: datetime) -> bool:
    """Whether a re-check due at ``due`` still waits out an unreachable store
    (:data:`STORE_WAIT`)."""
    return utcnow() < due + STORE_WAIT


def recheck(
    session_factory: sessionmaker[Session], settings: Settings, release_id: uuid.UUID
) -> str | None:
    """Re-check one release now and store the verdict; ``None`` if another worker did first,
    :data:`DEFERRED` (nothing stored) if the object store could not be reached."""
    with session_factory() as session:
        release = session.get(Release, release_id)
        if release is None or release.reference_check != PENDING:
            return None
        raw = _live_reference(session, release.dataset_id)
        n_rows = _read_rows(session, release)
        since = release.created_at
        wait = _waits_for_store(due_of(release))
    # Read outside any transaction: the objects may take a while.
    found = verdict(raw, settings, n_rows, since, wait_for_store=wait)
    if found == DEFERRED:
        return found
    checked_at = utcnow()
    with session_factory.begin() as session:
        release = session.get(Release, release_id, with_for_update=True, populate_existing=True)
        if release is None or release.reference_check != PENDING:
            return None
        release.reference_check = found
        release.reference_checked_at = checked_at
        release.reference_shown_at = recheck_shown_at(release, checked_at)
        if found == UNCHANGED:
            # A refund held for this verdict (service.ledger.refund) takes effect when the
            # release shows it; after ``changed`` it stays held: the release shows no refund.
            ledger.release_held_refund(session, release.id, release.reference_shown_at)
        # Long polls waiting on this release re-read it once this commits.
        wake.announce_finished(session, settings, release.id)
    return found


def due_epochs(session: Session, now: datetime, extra: int = 0) -> list[tuple[uuid.UUID, int]]:
    """The epochs whose re-check is due at ``now`` (their ``visible_at``), the earliest first
    (:data:`BATCH` and ``extra`` more, as :func:`due_ids`)."""
    rows = session.execute(
        select(ReleaseEpoch.release_id, ReleaseEpoch.epoch)
        .where(ReleaseEpoch.reference_check == PENDING, ReleaseEpoch.visible_at <= now)
        .order_by(ReleaseEpoch.visible_at, ReleaseEpoch.release_id, ReleaseEpoch.epoch)
        .limit(BATCH + extra)
    ).all()
    return [(row[0], row[1]) for row in rows]


def recheck_epoch(
    session_factory: sessionmaker[Session], settings: Settings, release_id: uuid.UUID, epoch: int
) -> str | None:
    """Re-check one epoch of a continual release now (every object's identity and the digests
    of the rows through its batch: what its job checked, and more) and store the verdict;
    ``None`` if another worker did first, :data:`DEFERRED` if the store could not be reached."""
    key = (release_id, epoch)
    with session_factory() as session:
        row = session.get(ReleaseEpoch, key)
        release = session.get(Release, release_id)
        if row is None or release is None or row.reference_check != PENDING:
            return None
        raw = _live_reference(session, release.dataset_id)
        n_rows = rows_through(session, release.dataset_id, row.batch_seq)
        since = release.created_at
        wait = _waits_for_store(row.visible_at)
    found = verdict(raw, settings, n_rows, since, wait_for_store=wait)
    if found == DEFERRED:
        return found
    checked_at = utcnow()
    with session_factory.begin() as session:
        row = session.get(ReleaseEpoch, key, with_for_update=True, populate_existing=True)
        release = session.get(Release, release_id)
        if row is None or release is None or row.reference_check != PENDING:
            return None
        row.reference_check = found
        row.reference_checked_at = checked_at
        row.reference_shown_at = recheck_shown_at(release, checked_at, row.visible_at)
        wake.announce_finished(session, settings, release_id)
    return found


class Retries:
    """The re-checks one thread could not end (an unreachable store, or an unexpected error in
    one release's re-check): each waits a growing time (2, 4, ... up to
    :data:`RETRY_MAX_SECONDS`) before it is tried again, and meanwhile the others go on. One
    release that cannot be re-checked must not hold back every other one's verdict."""

    def __init__(self) -> None:
        self._next: dict[Hashable, tuple[int, float]] = {}

    def waiting(self) -> set[Hashable]:
        """The keys (a release id, or a release id and epoch) not to try now."""
        now = time.monotonic()
        return {key for key, (_, at) in self._next.items() if at > now}

    def failed(self, key: Hashable) -> bool:
        """Note a failed try of ``key``; true on its first (the one to log)."""
        tries = self._next.get(key, (0, 0.0))[0] + 1
        self._next[key] = (tries, time.monotonic() + min(RETRY_MAX_SECONDS, 2.0**tries))
        return tries == 1

    def ended(self, key: Hashable) -> None:
        if self._next.pop(key, None) is not None:
            log.info("re-check of %s ended after retries", key)


def _try(retries: Retries, key: Hashable, job: Callable[[], str | None]) -> bool:
    """Run one re-check; whether it stored a verdict. A database outage is raised (the pass
    stops and the thread waits it out); a store that cannot be reached, or any other error
    (logged as a bug, by location only, once per re-check), leaves it pending for a retry."""
    try:
        found = job()
    except Exception as exc:
        if is_transient_db_error(exc):
            raise
        if retries.failed(key):
            log.error("BUG: re-check of %s: %s", key, safe_traceback(exc))
        return False
    if found == DEFERRED:
        if retries.failed(key):
            log.warning("re-check of %s: the object store cannot be reached; retried", key)
        return False
    retries.ended(key)
    return found is not None


def recheck_due(
    session_factory: sessionmaker[Session],
    settings: Settings,
    now: datetime | None = None,
    retries: Retries | None = None,
) -> int:
    """Every re-check due by ``now`` (default: the current time), releases' and epochs'; how
    many were stored. With ``retries``: those waiting for a retry are skipped."""
    moment = utcnow() if now is None else now
    retries = Retries() if retries is None else retries
    skip = retries.waiting()
    with session_factory() as session:
        ids = [rid for rid in due_ids(session, moment, len(skip)) if rid not in skip]
        epochs = [key for key in due_epochs(session, moment, len(skip)) if key not in skip]
    done = 0
    for rid in ids[:BATCH]:
        done += _try(retries, rid, partial(recheck, session_factory, settings, rid))
    for rid, epoch in epochs[:BATCH]:
        done += _try(
            retries, (rid, epoch), partial(recheck_epoch, session_factory, settings, rid, epoch)
        )
    return done


def run(
    session_factory: sessionmaker[Session],
    settings: Settings,
    stop: threading.Event,
    outages: OutageLog | None = None,
) -> None:
    """The re-check thread of a worker: every due re-check as soon as it is due, until
    ``stop``. It shares nothing with the job loop (a job running on any dataset does not delay
    it); a database outage is waited out (logged once, with ``outages`` the worker's log of
    them), and a re-check that cannot end is retried without holding back the others
    (:class:`Retries`)."""
    retries = Retries()
    while not stop.is_set():
        wait = LOOK_SECONDS
        try:
            while (
                recheck_due(session_factory, settings, retries=retries) >= BATCH
                and not stop.is_set()
            ):
                pass
            with session_factory() as session:
                upcoming = next_due(session)
            if outages is not None:
                outages.succeeded("re-check")
            if upcoming is not None and upcoming > utcnow():
                # (One already due waits for its retry: look again after LOOK_SECONDS.)
                wait = min(wait, (upcoming - utcnow()).total_seconds())
        except Exception as exc:
            if not is_transient_db_error(exc):
                log.error("BUG: re-check: %s", safe_traceback(exc))
            elif outages is not None:
                outages.failed("re-check", exc)
        stop.wait(max(0.0, wait))


#: Whether a dataset is, or was until its deletion, by reference (:func:`awaits_recheck`):
#: its ``reference`` and its ``registration_request`` (kept after the deletion, which forgets
#: the reference), built once.
_DATASET_REFERENCE = select(Dataset.reference, Dataset.registration_request).where(
    Dataset.id == bindparam("dataset_id")
)


def awaits_recheck(session: Session, release: Release) -> bool:
    """Whether ``release``'s outcome waits for a re-check of its objects (:func:`run`): it is
    padded and its dataset is by reference (a continual release's end too), or was until its
    owner deleted it.

    A deletion forgets the reference (``datasets.reference`` null), so a job that ended after
    it was not marked and showed ``failed`` from its due moment, while one that ended before
    it was marked and showed ``running`` until the re-check's verdict (``changed``: the
    dataset is gone) a grace later: which it was told when a worker claimed it, that is when
    the job ahead in the shared queue ended. The request (never cleared) says what the
    dataset was; the re-check of a deleted one reads ``changed`` either way."""
    if not padded(release):
        return False
    # The two columns, not the dataset's row (its 39 columns, eight exact decimals, and an
    # ORM object): asked for every padded release, the default. No row for a row gone.
    found = (
        session.connection()
        .execute(_DATASET_REFERENCE, {"dataset_id": release.dataset_id})
        .one_or_none()
    )
    return found is not None and (found[0] is not None or found[1] is not None)
