"""Continual releases in the worker: one epoch per batch of a growing dataset, one charge.

A continual release (a mechanism with ``continual = True``, today ``continual_gauss``) is charged
once, when it is requested, like every release. Its leaves are the dataset's batches in order:
batch ``s`` (0 is the upload) is leaf ``t = s + 1`` and gives epoch ``t``. Batches already present
when the release is requested are leaves too: the worker releases their epochs at once, one
after the other, so the release's output does not depend on when it was requested. Batches
beyond the horizon ``T`` are never read; after epoch ``T`` the release ends ``succeeded`` with
epoch ``T`` as its result.

Lifecycle (the ``releases`` row is still the queue): ``queued`` until a worker claims it, then
``running`` until epoch ``T``. A worker holding the lease releases every epoch whose batch is
present; when it runs out of batches it gives the lease up (``lease_owner`` null: *waiting*) and
any worker claims the release again once ``epochs_done < n_batches``
(:func:`claim_continual`).

Exactly-once epochs and no redrawn node. Epoch ``t`` is computed from the stored state after
``t - 1`` (the tree's closed nodes with their noise, :class:`ContinualState`) and the rows of batch
``t - 1``; one transaction then stores the epoch, the new state (with the noise of the nodes that
closed at ``t``), ``epochs_done = t`` and a ``release_epoch`` audit event, and only if this worker
still holds the lease and ``epochs_done`` is still ``t - 1``. A worker killed before that commit
leaves the state after ``t - 1``, and every node stored with it is reused, never drawn again.

The release's CSPRNG: a 256-bit key drawn from the OS once per release (before its first epoch)
and kept with it; epoch ``t`` draws from ChaCha20 keyed with ``SHA-256(label, key, t)``
(:func:`epoch_generator`). So the noise of the nodes closing at ``t`` is fixed once for the
release: a worker that recomputes epoch ``t`` after a crash draws exactly the same noise and
stores exactly the epoch the dead worker would have stored. Distinct epochs use independent
keys (SHA-256 as a PRF), so the draws are as independent as fresh ones.

The state and the key are private: they live in ``release_states`` and
``releases.continual_key`` and are never in a response, log or audit event.

Analysts see each epoch from its own ``visible_at`` on, and the release's end (after its horizon,
or earlier without a new epoch: a refusal, a deleted dataset, an abandoned job) from
``releases.outcome_visible_at`` on: the moment the epoch it ended at would have become visible,
fixed before that epoch ran (:func:`pending_visible_at`).
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

import numpy as np
from pydantic import ValidationError
from randomgen import ChaCha
from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from service import audit, wake
from service.config import Settings
from service.db.models import (
    Dataset,
    DatasetBatch,
    Release,
    ReleaseBasis,
    ReleaseEpoch,
    ReleaseState,
    utcnow,
)
from service.errors import safe_traceback
from service.jobs import (
    ABANDONED_REASON,
    DATASET_DELETED_REASON,
    DATASET_FILE_FAULT_REASON,
    FINISHED,
    NO_RELEASE_REASON,
    REFUSED_AT_RUN_REASON,
    ClaimedJob,
    JobRunner,
    Outcome,
    WorkerStopping,
    blas_threads,
    die_with_parent,
    take_lease,
)
from service.logs import forked_child_failures
from service.mechanisms.base import InvalidParameter, ReleaseSpec
from service.mechanisms.continual_gauss import (
    ContinualGauss,
    ContinualGaussParams,
    ContinualState,
)
from service.mechanisms.registry import MECHANISMS, get_mechanism
from service.padding import PaddingModel, late_schedule
from service.pagination import Page, parse_seq_cursor, seq_cursor
from service.store import DatasetStore

log = logging.getLogger("dpss.worker")

T = TypeVar("T")

EPOCH_EVENT = "release_epoch"
EPOCH_KEY_LABEL = b"dpss continual epoch"
EPOCH_CURSOR = "epoch"
WAITING = "waiting"
LOST = "lost"
STORED = "stored"


def continual_names() -> list[str]:
    """The registered continual mechanisms."""
    return [name for name, mechanism in MECHANISMS.items() if mechanism.continual]


def is_continual(name: str) -> bool:
    mechanism = get_mechanism(name)
    return mechanism is not None and mechanism.continual


@dataclass(frozen=True)
class EpochInput:
    """What epoch ``epoch`` reads: batch ``batch_seq`` (rows ``[row_offset, row_offset +
    n_rows)`` of ``file_name``) and the state after the previous epoch (``None``: none yet)."""

    epoch: int
    horizon: int
    batch_seq: int
    row_offset: int
    n_rows: int
    n_cols: int
    file_name: str
    state: bytes | None
    key: bytes
    #: When analysts may see the epoch (see :func:`epoch_visible_at`).
    visible_at: datetime


def epoch_generator(key: bytes, epoch: int) -> np.random.Generator:
    """The generator of epoch ``epoch`` of the release with CSPRNG key ``key``: ChaCha20 (20
    rounds) keyed with ``SHA-256("dpss continual epoch" || key || epoch as 8 bytes)``."""
    digest = hashlib.sha256(EPOCH_KEY_LABEL + key + epoch.to_bytes(8, "little")).digest()
    return np.random.Generator(ChaCha(key=int.from_bytes(digest, "little"), counter=0, rounds=20))


def epoch_visible_at(
    release_visible_at: datetime | None,
    batch_created_at: datetime,
    padding: timedelta,
    previous_visible_at: datetime | None = None,
) -> datetime:
    """When analysts may see an epoch: its batch's commit time plus the padding of one epoch's
    work on that batch (:mod:`service.padding`, public facts only), never before the release's
    own ``visible_at`` nor before the previous epoch (so epochs appear in order). The worker
    runs the epoch after the batch commits, so as for one-shot releases, polling says nothing
    about how long it ran within the padding."""
    candidates = [batch_created_at + padding, release_visible_at, previous_visible_at]
    return max(moment for moment in candidates if moment is not None)


def pending_visible_at(
    session: Session, settings: Settings, release: Release, dataset: Dataset
) -> datetime:
    """When analysts may see what epoch ``epochs_done + 1`` brings (the epoch, or the release's
    end without it): :func:`epoch_visible_at` from its batch's commit, or the dataset's deletion
    if later (which ends the release), plus one epoch's padding. Public facts only, so it is
    fixed before the epoch runs and says nothing about how long it ran."""
    batch = session.get(DatasetBatch, (dataset.id, release.epochs_done))
    n_rows = batch.n_rows if batch is not None else dataset.n_rows
    started = batch.created_at if batch is not None else None
    moments = [moment for moment in (started, dataset.deleted_at) if moment is not None]
    padding = PaddingModel.from_settings(settings).padding(
        release.mechanism, n_rows, dataset.n_cols, release.k, release.params
    )
    previous = latest_epoch(session, release.id)
    return epoch_visible_at(
        release.visible_at,
        max(moments) if moments else utcnow(),
        padding,
        previous.visible_at if previous is not None else None,
    )


def end(
    worker: JobRunner,
    session: Session,
    release: Release,
    outcome: Outcome,
    visible_at: datetime | None = None,
) -> None:
    """Record the release's end, shown to analysts from ``visible_at`` (by default, as
    :func:`pending_visible_at` says) on."""
    if visible_at is None:
        dataset = session.get(Dataset, release.dataset_id)
        visible_at = (
            pending_visible_at(session, worker.settings, release, dataset)
            if dataset is not None
            else release.visible_at
        )
    release.outcome_visible_at = visible_at
    worker._record(session, release, outcome)


def new_release_key() -> bytes:
    """256 bits from the OS CSPRNG."""
    return os.urandom(32)


@dataclass(frozen=True)
class EpochOutput:
    """A computed epoch, ready to store: the state after it and the worker's outcome."""

    state: bytes | None
    outcome: Outcome


# -- claiming ------------------------------------------------------------------------------------


def claim_continual(worker: JobRunner) -> ClaimedJob | None:
    """Claim a waiting continual release that has a batch to process (or whose dataset was
    deleted, to end it); ``None`` if there is none. The lease and attempt count work as for any
    claim; a waiting release has ``attempts`` reset, so the limit counts claims since the last
    time it had nothing left to do."""
    names = continual_names()
    if not names:
        return None
    lease = timedelta(seconds=worker.settings.worker_lease_seconds)
    while True:
        with worker.session_factory.begin() as session:
            now = utcnow()
            release = session.execute(
                select(Release)
                .join(Dataset, Dataset.id == Release.dataset_id)
                .where(
                    Release.status == "running",
                    Release.mechanism.in_(names),
                    Release.lease_owner.is_(None),
                    or_(Release.epochs_done < Dataset.n_batches, Dataset.file_name.is_(None)),
                )
                .order_by(Release.created_at)
                .limit(1)
                .with_for_update(of=Release, skip_locked=True)
            ).scalar_one_or_none()
            if release is None:
                return None
            if release.attempts >= worker.settings.worker_max_attempts:
                release.lease_owner = worker.worker_id
                end(worker, session, release, Outcome.failed(ABANDONED_REASON))
                continue
            return take_lease(session, release, worker.worker_id, now, lease, None)


# -- processing ----------------------------------------------------------------------------------


def process_continual(worker: JobRunner, job: ClaimedJob) -> str:
    """Release every epoch whose batch is present, then wait (give the lease up) or end.

    Returns ``"waiting"``, a terminal status, ``"lost"`` (another worker owns the release now)
    or ``"unstored"`` (a stop, or a run that died: the lease expires and another worker goes on).
    """
    mechanism = get_mechanism(job.mechanism)
    if not isinstance(mechanism, ContinualGauss):
        raise TypeError(f"{job.mechanism} is not a continual mechanism this worker knows")
    try:
        params = mechanism.parse_params(job.params)
    except (ValidationError, InvalidParameter):
        return worker.finish(job, Outcome.failed(REFUSED_AT_RUN_REASON))
    spec = ReleaseSpec(k=job.k, epsilon=job.epsilon, delta=job.delta, params=params)
    done = threading.Event()
    beat = threading.Thread(target=worker._beat, args=(job, done), daemon=True)
    beat.start()
    try:
        while not worker.stop.is_set():
            step = worker.with_db_retry("epoch input", lambda: _next_input(worker, job))
            if isinstance(step, str):
                return step
            computed = _compute(worker, mechanism, spec, step)
            if computed is None:
                return "unstored"
            stored = worker.with_db_retry("epoch", _storing(worker, job, step, computed))
            if stored != STORED:
                return stored
            on_epoch_stored(job, step.epoch)
    except WorkerStopping:
        pass
    finally:
        done.set()
        beat.join()
    log.warning("release %s: stopping between epochs", job.release_id)
    _give_up_lease(worker, job)
    return "unstored"


def _give_up_lease(worker: JobRunner, job: ClaimedJob) -> None:
    """On a stop request: hand the release back at once (another worker may continue it now
    rather than after the lease). One try: if the database is away the lease expires anyway."""
    try:
        with worker.session_factory.begin() as session:
            release = session.execute(
                select(Release).where(Release.id == job.release_id).with_for_update()
            ).scalar_one()
            if release.status == "running" and _ours(worker, job, release):
                release.lease_owner = None
                release.lease_expires_at = None
    except Exception as exc:
        log.warning(
            "release %s: lease kept until it expires (%s)", job.release_id, type(exc).__name__
        )


def _storing(
    worker: JobRunner, job: ClaimedJob, step: EpochInput, computed: EpochOutput
) -> Callable[[], str]:
    return lambda: _store_epoch(worker, job, step, computed)


def on_epoch_stored(job: ClaimedJob, epoch: int) -> None:
    """Called after each stored epoch (the fault tests replace it to kill the worker here)."""
    log.info("release %s: epoch %d stored", job.release_id, epoch)


def _ours(worker: JobRunner, job: ClaimedJob, release: Release) -> bool:
    return release.lease_owner == worker.worker_id and release.attempts == job.attempt


def _next_input(worker: JobRunner, job: ClaimedJob) -> EpochInput | str:
    """The next epoch's input, or what ends this claim (one transaction)."""
    with worker.session_factory.begin() as session:
        release = session.execute(
            select(Release).where(Release.id == job.release_id).with_for_update()
        ).scalar_one()
        if release.status != "running" or not _ours(worker, job, release):
            return LOST
        dataset = session.get(Dataset, release.dataset_id)
        if dataset is None or dataset.file_name is None:
            # Refunded only when no epoch was released (as a one-shot release deleted first).
            refund = release.epochs_done == 0
            end(worker, session, release, Outcome.failed(DATASET_DELETED_REASON, refund=refund))
            return release.status
        horizon = int(release.params["horizon"])
        if release.epochs_done >= min(dataset.n_batches, horizon):
            release.lease_owner = None
            release.lease_expires_at = None
            release.attempts = 0
            return WAITING
        batch = session.get(DatasetBatch, (dataset.id, release.epochs_done))
        assert batch is not None  # batches 0 .. n_batches - 1 exist
        if release.continual_key is None:
            # Drawn once per release and committed before any epoch reads the data.
            release.continual_key = new_release_key()
        state = session.get(ReleaseState, release.id)
        return EpochInput(
            epoch=release.epochs_done + 1,
            visible_at=pending_visible_at(session, worker.settings, release, dataset),
            horizon=horizon,
            batch_seq=batch.seq,
            row_offset=batch.row_offset,
            n_rows=batch.n_rows,
            n_cols=dataset.n_cols,
            file_name=dataset.file_name,
            state=state.state if state is not None else None,
            key=release.continual_key,
        )


def compute_epoch(
    store: DatasetStore,
    mechanism: ContinualGauss,
    spec: ReleaseSpec[ContinualGaussParams],
    step: EpochInput,
    release_label: object = None,
) -> EpochOutput:
    """Advance the state with batch ``step.batch_seq`` (a slice of the memory map: no copy)."""
    # A missing or short file ends the release at once, refunded when no epoch was released
    # (nothing was read); it would otherwise fail every attempt until abandoned, charged.
    refund = step.epoch == 1
    fault = store.fault(step.file_name, step.row_offset + step.n_rows, step.n_cols)
    if fault is not None:
        log.error("release %s: its dataset file %s", release_label, fault)
        return EpochOutput(None, Outcome.failed(DATASET_FILE_FAULT_REASON, refund=refund))
    try:
        rows = store.open(step.file_name, step.row_offset + step.n_rows)[step.row_offset :]
    except FileNotFoundError:
        return EpochOutput(None, Outcome.failed(DATASET_FILE_FAULT_REASON, refund=refund))
    try:
        state = (
            ContinualState.from_bytes(step.state)
            if step.state is not None
            else mechanism.start(step.n_cols, spec)
        )
        new_state, output = mechanism.advance(
            state,
            rows,
            spec,
            epoch_generator(step.key, step.epoch),
        )
    except InvalidParameter:
        return EpochOutput(None, Outcome.failed(REFUSED_AT_RUN_REASON))
    except Exception as exc:
        log.error(
            "BUG: release %s: continual epoch %d raised %s; recorded as no_result",
            release_label,
            step.epoch,
            safe_traceback(exc),
        )
        return EpochOutput(None, Outcome(status="no_result", reason=NO_RELEASE_REASON, extras={}))
    return EpochOutput(new_state.to_bytes(), Outcome.of(output))


def _compute(
    worker: JobRunner,
    mechanism: ContinualGauss,
    spec: ReleaseSpec[ContinualGaussParams],
    step: EpochInput,
) -> EpochOutput | None:
    def work() -> EpochOutput:
        return compute_epoch(worker.store, mechanism, spec, step, worker.worker_id)

    return run_isolated(worker, work) if worker.isolate else work()


def run_isolated(worker: JobRunner, work: Callable[[], T]) -> T | None:
    """``work()`` in a forked child (as the worker's isolated runs); ``None`` if it died."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    parent = os.getpid()

    def child() -> None:
        with forked_child_failures("a continual epoch"):
            die_with_parent(parent)
            receiver.close()
            bind = worker.session_factory.kw.get("bind")
            if bind is not None:
                bind.dispose(close=False)
            with blas_threads(worker.settings):
                result = work()
            sender.send(result)
            sender.close()

    process = context.Process(target=child, daemon=True)
    process.start()
    sender.close()
    try:
        result: T = receiver.recv()
    except EOFError:
        process.join()
        log.error("a continual epoch's process ended without an outcome; left to its lease")
        return None
    finally:
        receiver.close()
    process.join()
    return result


def _store_epoch(
    worker: JobRunner, job: ClaimedJob, step: EpochInput, computed: EpochOutput
) -> str:
    """Store epoch ``step.epoch`` with its state in one transaction, if still ours and next.

    An epoch stored after its ``step.visible_at`` (late) shows at the next step of its public
    schedule (:func:`service.padding.late_schedule` with the epoch's own padding), as a late
    one-shot release does, not at the moment it was stored."""
    outcome = computed.outcome
    with worker.session_factory.begin() as session:
        release = session.execute(
            select(Release).where(Release.id == job.release_id).with_for_update()
        ).scalar_one()
        padding = PaddingModel.from_settings(worker.settings).padding(
            release.mechanism, step.n_rows, step.n_cols, release.k, release.params
        )
        shows_at, _ = late_schedule(step.visible_at - padding, step.visible_at, utcnow())
        ours = _ours(worker, job, release)
        if ours and release.status in FINISHED:
            return release.status  # committed earlier; the answer was lost
        if ours and release.epochs_done == step.epoch:
            return STORED  # committed earlier; the answer was lost
        if release.status != "running" or not ours or release.epochs_done != step.epoch - 1:
            log.warning("release %s: lease lost, epoch discarded", job.release_id)
            return LOST
        if outcome.status != "succeeded" or computed.state is None:
            # A refusal or a bug ends the release (no epoch for it); earlier epochs stay.
            end(worker, session, release, outcome, shows_at)
            return release.status
        basis, shape, sha256 = outcome.basis if outcome.basis is not None else (None, None, None)
        session.add(
            ReleaseEpoch(
                release_id=release.id,
                epoch=step.epoch,
                batch_seq=step.batch_seq,
                n_rows_read=step.n_rows,
                basis_shape=shape,
                basis_sha256=sha256,
                extras=outcome.extras,
                created_at=utcnow(),
                visible_at=shows_at,
            )
        )
        if basis is not None:
            session.add(ReleaseBasis(release_id=release.id, epoch=step.epoch, basis=basis))
        session.merge(ReleaseState(release_id=release.id, state=computed.state))
        release.epochs_done = step.epoch
        release.lease_expires_at = utcnow() + timedelta(
            seconds=worker.settings.worker_lease_seconds
        )
        audit.record(
            session,
            EPOCH_EVENT,
            actor_key_id=None,
            dataset_id=release.dataset_id,
            release_id=release.id,
            details={
                "epoch": step.epoch,
                "batch_seq": step.batch_seq,
                "n_rows_read": step.n_rows,
                "basis_sha256": sha256,
            },
        )
        if step.epoch >= step.horizon:
            end(worker, session, release, outcome, shows_at)  # announces it too
            return release.status
        # Long polls waiting for this release's next epoch return once this commits.
        wake.announce_finished(session, worker.settings, release.id)
        return STORED


# -- reading -------------------------------------------------------------------------------------


def _shown(release_id: object, visible_by: datetime | None) -> list[ColumnElement[bool]]:
    """The epochs of ``release_id`` a reader sees: all, or those visible by ``visible_by``
    (analysts). Epochs become visible in order (``visible_at`` never decreases with ``t``:
    batches commit in order and the padding of a batch is stored with its epoch)."""
    conditions: list[ColumnElement[bool]] = [ReleaseEpoch.release_id == release_id]
    if visible_by is not None:
        conditions.append(ReleaseEpoch.visible_at <= visible_by)
    return conditions


def latest_epoch(
    session: Session, release_id: object, visible_by: datetime | None = None
) -> ReleaseEpoch | None:
    return session.execute(
        select(ReleaseEpoch)
        .where(*_shown(release_id, visible_by))
        .order_by(ReleaseEpoch.epoch.desc())
        .limit(1)
    ).scalar_one_or_none()


def epoch_summaries(
    session: Session, release_id: object, visible_by: datetime | None = None
) -> list[tuple[int, int, int, str | None]]:
    """``(epoch, batch_seq, n_rows_read, basis_sha256)`` of every epoch shown, oldest first."""
    rows = session.execute(
        select(
            ReleaseEpoch.epoch,
            ReleaseEpoch.batch_seq,
            ReleaseEpoch.n_rows_read,
            ReleaseEpoch.basis_sha256,
        )
        .where(*_shown(release_id, visible_by))
        .order_by(ReleaseEpoch.epoch)
    ).all()
    return [(row[0], row[1], row[2], row[3]) for row in rows]


def next_visible_at(
    session: Session, release_id: object, after: int, visible_by: datetime
) -> datetime | None:
    """When the first stored epoch after ``after`` that is hidden at ``visible_by`` shows."""
    return session.execute(
        select(func.min(ReleaseEpoch.visible_at)).where(
            ReleaseEpoch.release_id == release_id,
            ReleaseEpoch.epoch > after,
            ReleaseEpoch.visible_at > visible_by,
        )
    ).scalar_one_or_none()


def epoch_bases(session: Session, release_id: object, epochs: list[int]) -> dict[int, bytes]:
    """The stored bases of these epochs of ``release_id`` (one statement)."""
    if not epochs:
        return {}
    rows = session.execute(
        select(ReleaseBasis.epoch, ReleaseBasis.basis).where(
            ReleaseBasis.release_id == release_id, ReleaseBasis.epoch.in_(epochs)
        )
    )
    return {epoch: basis for epoch, basis in rows}


def page_epochs(
    session: Session,
    release_id: object,
    limit: int,
    cursor: str | None,
    after: int = 0,
    visible_by: datetime | None = None,
) -> Page[ReleaseEpoch]:
    """Epochs oldest first, after ``cursor`` (the last epoch of the previous page) if given,
    else after epoch number ``after``."""
    if cursor is not None:
        after = parse_seq_cursor(cursor, EPOCH_CURSOR)
    shown = _shown(release_id, visible_by)
    total = session.execute(
        select(func.count()).select_from(ReleaseEpoch).where(*shown)
    ).scalar_one()
    rows = list(
        session.execute(
            select(ReleaseEpoch)
            .where(*shown, ReleaseEpoch.epoch > after)
            .order_by(ReleaseEpoch.epoch)
            .limit(limit + 1)
        ).scalars()
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(
        items=rows, total=total, next=seq_cursor(EPOCH_CURSOR, rows[-1].epoch) if more else None
    )
