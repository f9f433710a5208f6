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
  found in an object (:func:`service.reference.integrity.object_fault`), so the ledger, the
  budget and the grants are the same both ways too.

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
import uuid
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service import reference, wake
from service.config import Settings
from service.continual import is_continual
from service.db.models import Dataset, DatasetBatch, Release, ReleaseEpoch, utcnow
from service.errors import safe_traceback
from service.outages import is_transient_db_error
from service.visibility import recheck_shown_at

log = logging.getLogger(__name__)

PENDING, UNCHANGED, CHANGED = "pending", "unchanged", "changed"
#: How many due re-checks one pass takes; the rest wait for the next pass.
BATCH = 32
#: The longest the thread sleeps between looks for due re-checks (it sleeps less when the next
#: due moment is nearer).
LOOK_SECONDS = 1.0


def due_ids(session: Session, now: datetime) -> list[uuid.UUID]:
    """The releases whose re-check is due at ``now``, the earliest due first."""
    due = func.coalesce(Release.outcome_visible_at, Release.visible_at)
    return list(
        session.scalars(
            select(Release.id)
            .where(Release.reference_check == PENDING, due <= now)
            .order_by(due, Release.id)
            .limit(BATCH)
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


def verdict(
    raw: dict[str, object] | None,
    settings: Settings,
    n_rows: int | None = None,
    since: datetime | None = None,
) -> str:
    """``unchanged`` if every object of the reference ``raw`` is as registered (with
    ``n_rows``: the digests of the first ``n_rows`` rows' row groups, the batches the release
    read, and every object's identity, as the job checked them), else ``changed``.

    Total: an object that cannot be read, a dataset deleted meanwhile (no record left to
    check) or any error is ``changed`` (nothing can be shown as verified). A reference
    registered before digests were recorded is ``unchanged``: its releases fail at once, with
    their own fixed reason, whenever they run."""
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
        log.info("re-check: %s (%s)", fault.reason, fault.path)
        return CHANGED
    except Exception as exc:
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


def recheck(
    session_factory: sessionmaker[Session], settings: Settings, release_id: uuid.UUID
) -> str | None:
    """Re-check one release now and store the verdict; ``None`` if another worker did first."""
    with session_factory() as session:
        release = session.get(Release, release_id)
        if release is None or release.reference_check != PENDING:
            return None
        raw = _live_reference(session, release.dataset_id)
        n_rows = _read_rows(session, release)
        since = release.created_at
    # Read outside any transaction: the objects may take a while.
    found = verdict(raw, settings, n_rows, since)
    checked_at = utcnow()
    with session_factory.begin() as session:
        release = session.get(Release, release_id, with_for_update=True, populate_existing=True)
        if release is None or release.reference_check != PENDING:
            return None
        release.reference_check = found
        release.reference_checked_at = checked_at
        release.reference_shown_at = recheck_shown_at(release, checked_at)
        # Long polls waiting on this release re-read it once this commits.
        wake.announce_finished(session, settings, release.id)
    return found


def due_epochs(session: Session, now: datetime) -> list[tuple[uuid.UUID, int]]:
    """The epochs whose re-check is due at ``now`` (their ``visible_at``), the earliest first."""
    rows = session.execute(
        select(ReleaseEpoch.release_id, ReleaseEpoch.epoch)
        .where(ReleaseEpoch.reference_check == PENDING, ReleaseEpoch.visible_at <= now)
        .order_by(ReleaseEpoch.visible_at, ReleaseEpoch.release_id, ReleaseEpoch.epoch)
        .limit(BATCH)
    ).all()
    return [(row[0], row[1]) for row in rows]


def recheck_epoch(
    session_factory: sessionmaker[Session], settings: Settings, release_id: uuid.UUID, epoch: int
) -> str | None:
    """Re-check one epoch of a continual release now (every object's identity and the digests
    of the rows through its batch: what its job checked, and more) and store the verdict;
    ``None`` if another worker did first."""
    key = (release_id, epoch)
    with session_factory() as session:
        row = session.get(ReleaseEpoch, key)
        release = session.get(Release, release_id)
        if row is None or release is None or row.reference_check != PENDING:
            return None
        raw = _live_reference(session, release.dataset_id)
        n_rows = rows_through(session, release.dataset_id, row.batch_seq)
        since = release.created_at
    found = verdict(raw, settings, n_rows, since)
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


def recheck_due(
    session_factory: sessionmaker[Session], settings: Settings, now: datetime | None = None
) -> int:
    """Every re-check due by ``now`` (default: the current time), releases' and epochs'; how
    many were stored."""
    moment = utcnow() if now is None else now
    with session_factory() as session:
        ids = due_ids(session, moment)
        epochs = due_epochs(session, moment)
    done = sum(recheck(session_factory, settings, rid) is not None for rid in ids)
    return done + sum(
        recheck_epoch(session_factory, settings, rid, epoch) is not None for rid, epoch in epochs
    )


def run(session_factory: sessionmaker[Session], settings: Settings, stop: threading.Event) -> None:
    """The re-check thread of a worker: every due re-check as soon as it is due, until
    ``stop``. It shares nothing with the job loop (a job running on any dataset does not delay
    it); a database outage is waited out."""
    while not stop.is_set():
        wait = LOOK_SECONDS
        try:
            while recheck_due(session_factory, settings) >= BATCH and not stop.is_set():
                pass
            with session_factory() as session:
                upcoming = next_due(session)
            if upcoming is not None:
                wait = min(wait, max(0.0, (upcoming - utcnow()).total_seconds()))
        except Exception as exc:
            if not is_transient_db_error(exc):
                log.error("BUG: re-check: %s", safe_traceback(exc))
        stop.wait(wait)
