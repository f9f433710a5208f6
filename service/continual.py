"""Continual releases as a job kind (:class:`Continual`, under :mod:`service.worker`): one
epoch per batch of a growing dataset, one charge.

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
(:meth:`Continual.waiting_claimable`). The worker owns the lease, the heartbeat, the isolated
process and the transactions; this module says what an epoch reads (:func:`next_input`),
computes (:func:`compute_epoch`) and stores (:func:`store_epoch`).

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
fixed before that epoch ran (:func:`pending_visible_at`). On a dataset by reference an epoch
shows only once a re-check of its objects at its ``visible_at`` finds them unchanged, a grace
later (:mod:`service.reference_recheck`, :func:`_shown`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from pydantic import ValidationError
from randomgen import ChaCha
from sqlalchemy import ColumnElement, Select, and_, bindparam, case, exists, func, or_, select
from sqlalchemy.orm import Session, aliased

from service import audit, privacy_unit, reference
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
    LOST,
    NO_RELEASE_REASON,
    QUEUED_CLAIMABLE,
    REFUSED_AT_RUN_REASON,
    STORED,
    WAITING,
    ClaimedJob,
    End,
    Outcome,
    RunContext,
)
from service.mechanisms.base import InvalidParameter, ReleaseSpec
from service.mechanisms.continual_gauss import (
    ContinualGauss,
    ContinualGaussParams,
    ContinualState,
)
from service.mechanisms.registry import get_mechanism
from service.padding import late_schedule, padded
from service.padding_epoch_facts import point
from service.padding_epochs import continual_names as continual_names
from service.padding_epochs import end_due, epoch_padding, in_order
from service.padding_epochs import epoch_visible_at as epoch_visible_at
from service.padding_epochs import unverified as unverified
from service.pagination import Page, list_scope, parse_seq_cursor, seq_cursor
from service.registration import CLAIMABLE as REGISTRATION_CLAIMABLE
from service.registration_visibility import REQUESTED
from service.store import DatasetStore

log = logging.getLogger("dpss.worker")

EPOCH_EVENT = "release_epoch"
EPOCH_KEY_LABEL = b"dpss continual epoch"
EPOCH_CURSOR = "epoch"
#: ``release_epochs.reference_check`` of an epoch waiting for its re-check
#: (:data:`service.reference_recheck.PENDING`; that module imports this one).
REFERENCE_PENDING = "pending"

#: A waiting release's next batch (``Release`` joined with ``Dataset``, outer).
NEXT_BATCH = and_(
    DatasetBatch.dataset_id == Release.dataset_id, DatasetBatch.seq == Release.epochs_done
)
_CAME = func.coalesce(DatasetBatch.created_at, Dataset.deleted_at, Release.created_at)
#: When a waiting job's new work came (a continual release's: its next batch's commit, else its
#: dataset's deletion; both an owner's public act), not before the release was requested (a
#: batch committed before the request is work of the request's moment, as the padding's
#: :func:`service.padding_epoch_facts.point` says), on ``Release`` joined with ``Dataset`` and,
#: outer, :data:`NEXT_BATCH`. The order of waiting jobs and of waiting against queued ones.
WORK_SINCE = case((Release.created_at < _CAME, _CAME), else_=Release.created_at)


@functools.cache
def _ahead_look() -> Select[Any]:
    """One statement (bound ``release_id``, ``worker_id``, ``point``, ``requested``): is a
    job other than the release claimable that comes before its next epoch in the workers'
    order (a queued one requested before ``point``, a waiting one whose work came before it,
    or at it for a release requested before ``requested``, a registration by reference
    requested before it)? The claim's own order
    (:mod:`service.claims`), asked before a worker goes on with a release's next epoch."""
    other = Release.id != bindparam("release_id")
    at = bindparam("point", type_=Release.created_at.type)
    queued = exists().where(QUEUED_CLAIMABLE, other, Release.created_at < at)
    waiting = (
        exists()
        .select_from(
            Release.__table__.join(Dataset.__table__).outerjoin(DatasetBatch.__table__, NEXT_BATCH)
        )
        .where(
            Release.status == "running",
            Release.lease_owner.is_(None),
            *continual_ready(),
            other,
            or_(
                at > WORK_SINCE,
                and_(
                    at == WORK_SINCE,
                    Release.created_at < bindparam("requested", type_=Release.created_at.type),
                ),
            ),
        )
    )
    # A registration by reference requested by the point: the claim takes it first
    # (:func:`service.claims.registration_ahead`).
    registering = exists().where(*REGISTRATION_CLAIMABLE, at >= REQUESTED).correlate(None)
    return select(or_(queued, waiting, registering))


def continual_ready() -> list[ColumnElement[bool]]:
    """What makes a waiting continual release claimable (:meth:`Continual.waiting_claimable`)."""
    return [
        Release.mechanism.in_(continual_names()),
        or_(Release.epochs_done < Dataset.n_batches, Dataset.file_name.is_(None)),
    ]


def work_ahead(session: Session, release: Release, batch: DatasetBatch, worker_id: str) -> bool:
    """Whether a job comes before the release's epoch on ``batch`` in the workers' order
    (:func:`_ahead_look`)."""
    params = {
        "release_id": release.id,
        "worker_id": worker_id,
        "point": point(batch.created_at, release.created_at),
        "requested": release.created_at,
    }
    return bool(session.execute(_ahead_look(), params).scalar())


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
    #: The padding ``visible_at`` added to the batch's commit, its queue term included
    #: (:func:`pending_padding`): the late schedule's step if the epoch ends after it.
    padding: timedelta
    #: The dataset's unit is a person (issue 34): each person has one bound over all batches
    #: (:func:`service.privacy_unit.continual_batch_rows`, usage kept in the state).
    person_level: bool = False
    #: ``datasets.reference`` of a dataset by reference: the batch's Gram is a pass of the
    #: reference engine (on Dask when configured) over the batch's row groups.
    reference: dict[str, Any] | None = None
    #: The release's request: an object's identity stamp at or after it is a change
    #: (:func:`service.reference.objects.identity_differs`).
    requested_at: datetime | None = None


def epoch_generator(key: bytes, epoch: int) -> np.random.Generator:
    """The generator of epoch ``epoch`` of the release with CSPRNG key ``key``: ChaCha20 (20
    rounds) keyed with ``SHA-256("dpss continual epoch" || key || epoch as 8 bytes)``."""
    digest = hashlib.sha256(EPOCH_KEY_LABEL + key + epoch.to_bytes(8, "little")).digest()
    return np.random.Generator(ChaCha(key=int.from_bytes(digest, "little"), counter=0, rounds=20))


def pending_visible_at(
    session: Session, settings: Settings, release: Release, dataset: Dataset
) -> datetime:
    """When analysts may see what epoch ``epochs_done + 1`` brings (the epoch, or the release's
    end without it): :func:`epoch_visible_at` from its batch's commit, or the dataset's deletion
    if later (which ends the release), plus one epoch's padding (:func:`pending_padding`).
    Public facts only, so it is fixed before the epoch runs and says nothing about how long it
    ran."""
    return pending_padding(session, settings, release, dataset)[0]


def pending_padding(
    session: Session, settings: Settings, release: Release, dataset: Dataset
) -> tuple[datetime, timedelta]:
    """:func:`pending_visible_at` and the padding it added to the act (the batch's commit or
    the deletion): one epoch's modelled work on that batch plus the queue at that moment
    (:func:`service.padding_epochs.act_queue_seconds`): :func:`service.padding_epochs.
    epoch_padding`, which a release requested while the epoch is pending computes too
    (:func:`service.padding_epochs.epoch_seconds`)."""
    return epoch_padding(session, settings, release, dataset, release.epochs_done + 1)


def new_release_key() -> bytes:
    """256 bits from the OS CSPRNG."""
    return os.urandom(32)


@dataclass(frozen=True)
class EpochOutput:
    """A computed epoch, ready to store: the state after it and the worker's outcome."""

    state: bytes | None
    outcome: Outcome


def compute_epoch(
    store: DatasetStore,
    mechanism: ContinualGauss,
    spec: ReleaseSpec[ContinualGaussParams],
    step: EpochInput,
    release_label: object = None,
    settings: Settings | None = None,
) -> EpochOutput:
    """Advance the state with batch ``step.batch_seq`` (a slice of the memory map: no copy)."""
    if step.reference is not None:
        return _compute_reference_epoch(mechanism, spec, step, settings, release_label)
    # A missing or short file ends the release at once, refunded when no epoch was released
    # (nothing was read); it would otherwise fail every attempt until abandoned, charged.
    refund = step.epoch == 1
    fault = store.fault(step.file_name, step.row_offset + step.n_rows, step.n_cols)
    if fault is not None:
        log.error("release %s: its dataset file %s", release_label, fault)
        return EpochOutput(None, Outcome.failed(DATASET_FILE_FAULT_REASON, refund=refund))
    try:
        rows = store.open(step.file_name, step.row_offset + step.n_rows)[step.row_offset :]
        units = (
            store.open_units(step.file_name, step.row_offset + step.n_rows)
            if step.person_level
            else None
        )
    except (FileNotFoundError, ValueError):
        # A lost or short unit index: never read per row on a person-level dataset.
        return EpochOutput(None, Outcome.failed(DATASET_FILE_FAULT_REASON, refund=refund))
    try:
        state = (
            ContinualState.from_bytes(step.state)
            if step.state is not None
            else mechanism.start(step.n_cols, spec)
        )
        used = None
        if units is not None:
            assert spec.params.clip_norm is not None  # resolved by prepare
            # A first epoch starts with no usage; a later one without it is a state from
            # before usage was kept (each person in their first batch only, as it ran).
            earlier = state.person_used
            if earlier is None and state.leaves_done == 0:
                earlier = np.zeros(0, dtype=np.float64)
            rows, used = privacy_unit.continual_batch_rows(
                rows, units, step.row_offset, spec.params.clip_norm, earlier
            )
        new_state, output = mechanism.advance(
            state,
            rows,
            spec,
            epoch_generator(step.key, step.epoch),
        )
        if used is not None:
            new_state = dataclasses.replace(new_state, person_used=used)
    except InvalidParameter:
        return EpochOutput(None, Outcome.failed(REFUSED_AT_RUN_REASON))
    except Exception as exc:
        return _unexpected(exc, step, release_label)
    return EpochOutput(new_state.to_bytes(), Outcome.of(output))


def _unexpected(exc: Exception, step: EpochInput, release_label: object) -> EpochOutput:
    """An epoch that raised what no mechanism should: logged as type and location only, and
    recorded as ``no_result`` (totality: nothing about the data reaches the client)."""
    log.error(
        "BUG: release %s: continual epoch %d raised %s; recorded as no_result",
        release_label,
        step.epoch,
        safe_traceback(exc),
    )
    return EpochOutput(None, Outcome(status="no_result", reason=NO_RELEASE_REASON, extras={}))


def _compute_reference_epoch(
    mechanism: ContinualGauss,
    spec: ReleaseSpec[ContinualGaussParams],
    step: EpochInput,
    settings: Settings | None,
    release_label: object,
) -> EpochOutput:
    """Epoch ``step.epoch`` of a dataset by reference: the batch's clipped Gram is one pass of
    the reference engine over the batch's row groups (on the Dask cluster when
    ``DPSS_DASK_SCHEDULER`` is set; only the ``d x d`` sum leaves it), every object of the
    reference checked unchanged before and after; the tree, its noise and the output are
    :meth:`ContinualGauss.advance`'s, in this process, as for an upload. A
    :class:`~service.reference.ReferenceFault` (a changed object, a failed cluster) ends the
    release ``failed`` without the epoch, refunded only when no epoch was released and the
    fault is one that reads nothing of the values (as for a one-shot release)."""
    assert step.reference is not None
    if step.person_level or settings is None:
        # Refused before any row group is read: refunded when no epoch was released.
        return EpochOutput(None, Outcome.failed(REFUSED_AT_RUN_REASON, refund=step.epoch == 1))
    state = (
        ContinualState.from_bytes(step.state)
        if step.state is not None
        else mechanism.start(step.n_cols, spec)
    )
    try:
        with reference.open_rows(
            step.reference, settings, (step.row_offset, step.n_rows), step.requested_at
        ) as rows:
            # A RowSource where advance takes rows: it reaches them only through clipped_gram.
            source: Any = rows
            new_state, output = mechanism.advance(
                state, source, spec, epoch_generator(step.key, step.epoch)
            )
            rows.check_unchanged()
    except reference.ReferenceFault as fault:
        log.warning(
            "release %s: epoch %d: %s (%s)", release_label, step.epoch, fault.reason, fault.path
        )
        refund = fault.refund and step.epoch == 1
        return EpochOutput(None, Outcome.failed(fault.reason, refund=refund))
    except InvalidParameter:
        return EpochOutput(None, Outcome.failed(REFUSED_AT_RUN_REASON))
    except Exception as exc:
        return _unexpected(exc, step, release_label)
    return EpochOutput(new_state.to_bytes(), Outcome.of(output))


@dataclass(frozen=True)
class Epoch:
    """The work of one epoch: the claimed release and what the epoch reads."""

    job: ClaimedJob
    step: EpochInput


def _end_visible_at(session: Session, settings: Settings, release: Release) -> datetime | None:
    """When analysts may see the release's end without a new epoch (:func:`pending_visible_at`;
    the release's own ``visible_at`` once its dataset row is gone).

    After the dataset's deletion, from the deletion and the release's own padding only: the
    epochs released before it are a race with the claim (:mod:`service.visibility`), so the
    pending epoch's batch and the last epoch's ``visible_at`` must not set the moment; and a
    worker that ends the release after that moment (it took the job late: the queue was busy)
    shows the end at the next step of the late schedule, not when it got to it."""
    dataset = session.get(Dataset, release.dataset_id)
    if dataset is None:
        return release.visible_at
    if dataset.deleted_at is None or not padded(release):
        # Not before the last epoch shows (its formula moment is not its shown one).
        due = pending_visible_at(session, settings, release, dataset)
        return in_order(session, release.id, release.epochs_done + 1, due)
    # Plus the queue at the deletion, with the epochs ahead of the end in the workers' order
    # (its own pending epoch among them): the chain's formula (padding_epochs.end_due).
    due = end_due(session, settings, release, dataset.deleted_at)
    return late_schedule(release.created_at, due, utcnow())[0]


def next_input(session: Session, release: Release, settings: Settings) -> EpochInput | End | str:
    """The next epoch's input, the release's end, or :data:`WAITING` (no batch to read yet);
    in the worker's transaction, the release locked and leased to it."""
    dataset = session.get(Dataset, release.dataset_id)
    if dataset is None or dataset.file_name is None:
        # Asked only when no epoch was released; the worker keeps the charge all the same once
        # the dataset row says deleted (service.worker.Worker._record).
        refund = release.epochs_done == 0
        outcome = Outcome.failed(DATASET_DELETED_REASON, refund=refund)
        return End(outcome, _end_visible_at(session, settings, release))
    horizon = int(release.params["horizon"])
    if release.epochs_done >= min(dataset.n_batches, horizon):
        return WAITING
    batch = session.get(DatasetBatch, (dataset.id, release.epochs_done))
    assert batch is not None  # batches 0 .. n_batches - 1 exist
    if release.lease_owner is not None and work_ahead(session, release, batch, release.lease_owner):
        # A job comes first in the workers' order (another release's epoch whose batch came
        # before this one's, a job requested before it): going on with this release's next
        # epoch in the same claim ran it before them, though their padding could not count an
        # epoch whose batch came after (a cycle: their showing on time or late said whether
        # this release's epochs before had ended). Wait: the claim takes them in order.
        return WAITING
    if release.continual_key is None:
        # Drawn once per release and committed before any epoch reads the data.
        release.continual_key = new_release_key()
    state = session.get(ReleaseState, release.id)
    visible_at, padding = pending_padding(session, settings, release, dataset)
    return EpochInput(
        epoch=release.epochs_done + 1,
        visible_at=visible_at,
        padding=padding,
        horizon=horizon,
        batch_seq=batch.seq,
        row_offset=batch.row_offset,
        n_rows=batch.n_rows,
        n_cols=dataset.n_cols,
        file_name=dataset.file_name,
        state=state.state if state is not None else None,
        key=release.continual_key,
        person_level=dataset.privacy_unit_column is not None,
        reference=dataset.reference,
        requested_at=release.created_at,
    )


def store_epoch(
    session: Session, release: Release, step: EpochInput, computed: EpochOutput, settings: Settings
) -> End | str:
    """Store epoch ``step.epoch`` with its state, if it is the next one, in the worker's
    transaction (the release locked and still leased to it): :data:`STORED`, :data:`LOST`, or
    the release's end (a refusal or a bug ends it without an epoch; the epoch at the horizon
    ends it with one).

    An epoch stored after its ``step.visible_at`` (late) shows at the next step of its public
    schedule (:func:`service.padding.late_schedule` with the epoch's own padding), as a late
    one-shot release does, not at the moment it was stored; and never before the epoch before
    shows (:func:`service.padding_epochs.in_order`: ``step.visible_at`` follows that one's
    formula moment, not its late step)."""
    outcome = computed.outcome
    late_step, _ = late_schedule(step.visible_at - step.padding, step.visible_at, utcnow())
    shows_at = in_order(session, release.id, step.epoch, late_step)
    if release.epochs_done == step.epoch:
        return STORED  # committed earlier; the answer was lost
    if release.epochs_done != step.epoch - 1:
        log.warning("release %s: lease lost, epoch discarded", release.id)
        return LOST
    if outcome.status != "succeeded" or computed.state is None:
        # A refusal or a bug ends the release (no epoch for it); earlier epochs stay.
        return End(outcome, shows_at)
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
            due_at=step.visible_at,
            # Shown only once a re-check at or after shows_at finds its objects unchanged
            # (service.reference_recheck): whether this job read before or after its owner
            # changed one (the epoch stored, or the release ended) tells when it was claimed.
            reference_check=(
                REFERENCE_PENDING if step.reference is not None and padded(release) else None
            ),
        )
    )
    if basis is not None:
        session.add(ReleaseBasis(release_id=release.id, epoch=step.epoch, basis=basis))
    session.merge(ReleaseState(release_id=release.id, state=computed.state))
    release.epochs_done = step.epoch
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
        return End(outcome, shows_at)
    return STORED


class Continual:
    """The job kind of continual releases: one work per epoch, waiting between batches."""

    resumable = True

    def first(self, job: ClaimedJob, context: RunContext) -> End | None:
        mechanism = get_mechanism(job.mechanism)
        if not isinstance(mechanism, ContinualGauss):
            raise TypeError(f"{job.mechanism} is not a continual mechanism this worker knows")
        return None  # its params are checked in load, which knows the epochs released

    def load(
        self, session: Session, release: Release, job: ClaimedJob, settings: Settings
    ) -> Epoch | End | str:
        mechanism = get_mechanism(job.mechanism)
        try:
            assert mechanism is not None  # first() checked it
            mechanism.parse_params(job.params)
        except (ValidationError, InvalidParameter):
            # Stored params that no longer parse (a refusal missed at prepare): decided before
            # this epoch reads a row, so refunded when no epoch was released (as a one-shot
            # release's), and shown when the epoch would have been (public facts only).
            outcome = Outcome.failed(REFUSED_AT_RUN_REASON, refund=release.epochs_done == 0)
            return End(outcome, _end_visible_at(session, settings, release))
        step = next_input(session, release, settings)
        return Epoch(job, step) if isinstance(step, EpochInput) else step

    def run(self, work: Epoch, context: RunContext) -> EpochOutput:
        mechanism = get_mechanism(work.job.mechanism)
        assert isinstance(mechanism, ContinualGauss)  # first() checked it
        job = work.job
        params = mechanism.parse_params(job.params)  # first() checked it parses
        spec = ReleaseSpec(k=job.k, epsilon=job.epsilon, delta=job.delta, params=params)
        return compute_epoch(
            context.store, mechanism, spec, work.step, context.label, context.settings
        )

    def save(
        self,
        session: Session,
        release: Release,
        job: ClaimedJob,
        work: Epoch,
        result: EpochOutput,
        settings: Settings,
    ) -> End | str:
        return store_epoch(session, release, work.step, result, settings)

    def saved(self, job: ClaimedJob, work: Epoch) -> None:
        on_epoch_stored(job, work.step.epoch)

    def shown_at(self, release: Release, ended_at: datetime) -> datetime | None:
        # A continual release's end has its own moment (End.visible_at); none is kept as is.
        return release.outcome_visible_at

    def late(self, release: Release, ended_at: datetime) -> bool:
        # A late epoch or end shows at its own schedule's next step (store_epoch); counted, not
        # logged, as before.
        return False

    def abandoned(self, session: Session, release: Release, settings: Settings) -> End:
        return End(Outcome.failed(ABANDONED_REASON), _end_visible_at(session, settings, release))

    def waiting_claimable(self) -> list[ColumnElement[bool]] | None:
        """A waiting release with a batch to process, or whose dataset was deleted (to end
        it)."""
        if not continual_names():
            return None
        return continual_ready()


CONTINUAL = Continual()


def on_epoch_stored(job: ClaimedJob, epoch: int) -> None:
    """Called after each stored epoch (the fault tests replace it to kill the worker here)."""
    log.info("release %s: epoch %d stored", job.release_id, epoch)


# -- reading -------------------------------------------------------------------------------------


def _shown(release_id: object, visible_by: datetime | None) -> list[ColumnElement[bool]]:
    """The epochs of ``release_id`` a reader sees: all, or those visible by ``visible_by``
    (analysts and owners). Epochs become visible in order (``visible_at`` never decreases with
    ``t``: each is stored no earlier than the one before, :func:`service.padding_epochs.
    in_order`).

    For analysts and owners an epoch on a dataset by reference shows only once its re-check's
    verdict ``unchanged`` shows, and none after the first that does not: one whose objects
    changed before it was due is never shown, nor any later one, whether its job read before
    the change (stored) or after it (the release ended there, no epoch): which it was tells
    when a worker claimed it (:mod:`service.visibility`)."""
    conditions: list[ColumnElement[bool]] = [ReleaseEpoch.release_id == release_id]
    if visible_by is not None:
        conditions.append(ReleaseEpoch.visible_at <= visible_by)
        # The first epoch not shown for its re-check: one uncorrelated subquery (evaluated
        # once, not once per epoch row), none when no epoch waits.
        cut = aliased(ReleaseEpoch)
        first = (
            select(func.min(cut.epoch))
            .where(cut.release_id == release_id, unverified(cut, visible_by))
            .scalar_subquery()
        )
        conditions.append(or_(first.is_(None), ReleaseEpoch.epoch < first))
    return conditions


def reference_cut(session: Session, release_id: object, by: datetime) -> ReleaseEpoch | None:
    """The first epoch of ``release_id`` not shown at ``by`` for its re-check (the epochs from
    it on are hidden: :func:`_shown`); ``None``: none."""
    return session.execute(
        select(ReleaseEpoch)
        .where(ReleaseEpoch.release_id == release_id, unverified(ReleaseEpoch, by))
        .order_by(ReleaseEpoch.epoch)
        .limit(1)
    ).scalar_one_or_none()


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


def epoch_scope(release_id: object) -> str:
    """The scope of one release's epoch list (its cursors are refused on another's)."""
    return list_scope("epochs", release_id=release_id)


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
        after = parse_seq_cursor(cursor, EPOCH_CURSOR, epoch_scope(release_id))
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
        items=rows,
        total=total,
        next=seq_cursor(EPOCH_CURSOR, epoch_scope(release_id), rows[-1].epoch) if more else None,
    )
