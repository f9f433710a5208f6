"""What a caller may see of a release at a moment: the one projection every read goes through.

Analysts must learn nothing of a job's run time within its padding (:mod:`service.padding`).
So, for an analyst (and an owner: below), until the release's ``visible_at``:

- the release is ``queued`` with no reason, refund or result, whatever its real state (even the
  moment a worker claims it would tell when the job before it finished);
- no epoch is shown, and epochs are shown each from its own ``visible_at`` on;
- a continual release that ended is shown ``running`` until its last epoch is visible and until
  its ``outcome_visible_at`` (its end would tell when the last epoch was computed, or how long
  the epoch it ended at ran).

After ``visible_at``, a job's end shows only at a step of the fixed public schedule of
:func:`service.padding.late_schedule` (``visible_at``, then ``created_at + padding * 2^j``):

- a one-shot release's outcome shows from its ``outcome_visible_at``, the schedule's first step
  at or after its real end, stored by the worker with the outcome
  (:meth:`service.worker.Worker._record`); so does its refund (:func:`service.ledger.refund`);
- until then the release is shown ``running``, whatever its real state: neither the moment a
  worker claimed it (which tells when the job before it ended) nor its end shows between two
  steps, and a long poll sleeps until the next step (:attr:`View.sealed_until`).

Nothing else an analyst or owner can call may depend on the real state before then: not a
status filter or a count (:mod:`service.history` mirrors these rules in SQL), not a long poll's
answer or its moment (:attr:`View.sealed_until`), not the time a read takes. For the last, the
large columns (the basis, the continual state and key) and the columns whose size depends on
the outcome (``reason``, ``result_extras``) are deferred in :mod:`service.db.models` and loaded
only here (or by :func:`load_outcomes` for a list), for a state the caller may see.

Owners follow the same rules as analysts. Holding their own data does not entitle them to
the real state: the workers share one queue, so when a release of their dataset was claimed
(its real ``running``, its ``started_at``) and when it ended (``finished_at``, its outcome
before ``visible_at``) tell when the job ahead of it ended, a job on *another* dataset whose run
time can depend on one of its rows (a 0.15 s longer run ahead of a release was read from that
release's ``started_at`` by its owner every time, 24 of 24, before this). Only the roles trusted
with run times (:func:`sees_real_state`: admins, who read the queue and ``/metrics``, and
auditors, who read the audit log) are shown them.

A dataset deleted before a release's outcome shows (``deleted_at`` before its
``outcome_visible_at``, or its ``visible_at`` while it has none) ends that release, for every
caller but those roles, as :data:`DELETED_BEFORE_SHOWN_REASON` says: ``failed``, no result, no
refund, whatever the job did (:func:`deleted_before_shown`); a continual release's epochs are
shown only up to the deletion. Whether the job ran before the deletion (succeeded) or after it
(failed) is when a worker claimed it, that is when the job ahead of it ended: an owner who chose
the moment of the deletion read that from the outcome, one bit per release. The worker does not
refund such a release either (:meth:`service.worker.Worker._record`): a refund would tell the
same on the ledger.

The same race on a dataset by reference: the owner changes (removes, replaces, makes unreadable)
one of its objects at a moment they choose, and a job that read before the change succeeds
while one that read after it fails. So a one-shot release on a dataset by reference is
re-checked (:mod:`service.reference_recheck`) at or after its outcome was due (its
``outcome_visible_at``, else its ``visible_at``): every object's identity and every digest, by
a worker's re-check thread, which waits behind no job. Until the verdict's public moment
``reference_shown_at`` (the due moment plus :func:`recheck_grace`, or a step of the late
schedule when the re-check was later) the release is shown ``running``; a change found shows it
``failed`` with :data:`REFERENCE_CHANGED_BEFORE_SHOWN_REASON`, no result, no refund, whatever
the job did. A change before the outcome was due is found either way, so the job's side of the
race does not show; the worker refunds no fault found in an object either
(:func:`service.reference.integrity.object_fault`). A continual release's epochs are re-checked
each at its ``visible_at`` and shown only once its verdict ``unchanged`` shows, none after the
first that does not (:func:`service.continual._shown`); a ``changed`` one shows the release
``failed`` as above from its verdict's moment (:func:`epoch_change_shown`), as the end of the
release whose job met the change is shown once re-checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, select
from sqlalchemy.orm import Session, load_only
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from service import continual
from service.auth import Principal, sees_real_state
from service.db.models import Dataset, Release, ReleaseBasis, ReleaseEpoch
from service.padding import late_schedule, next_late_step, padded
from service.release_rows import HELD_DELETED_AT

#: Statuses after which a release changes no more.
FINISHED = frozenset({"succeeded", "no_result", "failed"})
#: The reason shown of a release whose dataset was deleted before its outcome showed
#: (:func:`deleted_before_shown`): true whether or not its job ran first.
DELETED_BEFORE_SHOWN_REASON = (
    "the dataset was deleted before this release's outcome was due; no result is shown"
)

#: The reason shown of a one-shot release on a dataset by reference whose re-check found an
#: object changed (:mod:`service.reference_recheck`): true whether or not its job read first.
REFERENCE_CHANGED_BEFORE_SHOWN_REASON = (
    "a referenced object changed before this release's outcome was due; no result is shown"
)
#: The re-check's grace: its verdict shows ``max(floor, share x padding)`` after the due moment
#: (public: the padding is), time for a worker to read the objects' digests again.
RECHECK_GRACE_FLOOR = timedelta(seconds=1)
RECHECK_GRACE_SHARE = 0.25


@dataclass(frozen=True)
class View:
    """A release as one caller may see it at one moment."""

    status: str
    reason: str | None
    refunded: bool
    #: Whether the result (basis, extras) is shown.
    shows_result: bool
    #: Continual releases: ``(epoch, batch_seq, n_rows_read, basis_sha256)`` of the epochs
    #: shown, oldest first, and the latest shown; ``None`` and ``None`` for one-shot releases.
    epochs: list[tuple[int, int, int, str | None]] | None
    latest_epoch: ReleaseEpoch | None
    #: The caller sees the epochs visible by this moment (``None``: every stored epoch).
    epochs_visible_by: datetime | None
    #: Until this moment nothing this caller is shown of the release can change, whatever a
    #: worker stores meanwhile (an analyst's release before its ``visible_at``). A long poll
    #: sleeps until then without listening to the workers' announcements.
    sealed_until: datetime | None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


def outcome_visible(release: Release, principal: Principal, now: datetime) -> bool:
    """Whether ``principal`` may see the release's real status and result at ``now``.

    Analysts and owners see it from ``visible_at`` on; admins and auditors always
    (:func:`sees_real_state`). Releases made before ``visible_at`` existed have none and are
    visible.
    """
    if sees_real_state(principal):
        return True
    return release.visible_at is None or now >= release.visible_at


def end_visible(
    release: Release, epochs: list[tuple[int, int, int, str | None]] | None, now: datetime
) -> bool:
    """Whether an analyst who sees ``epochs`` (of a continual release) may see its end at
    ``now``: once every stored epoch and ``outcome_visible_at`` have passed."""
    if epochs is not None and len(epochs) < release.epochs_done:
        return False
    return release.outcome_visible_at is None or now >= release.outcome_visible_at


def view(
    session: Session,
    release: Release,
    principal: Principal,
    now: datetime,
    with_basis: bool = False,
) -> View:
    """``release`` as ``principal`` may see it at ``now`` (see the module docstring).

    Reads no large column, and for an analyst's release before ``visible_at`` nothing a worker
    writes: the same statements, the same rows, before and after the job ends.
    ``with_basis``: the caller shows the basis of a one-shot end shown with a result; it is
    then read with the end's deferred columns, in their statement (:data:`HELD_BASES`).
    """
    padded_caller = not sees_real_state(principal)
    is_continual = continual.is_continual(release.mechanism)
    if not outcome_visible(release, principal, now):
        return View(
            status="queued",
            reason=None,
            refunded=False,
            shows_result=False,
            epochs=[] if is_continual else None,
            latest_epoch=None,
            epochs_visible_by=now,
            sealed_until=release.visible_at,
        )
    status, refunded = release.status, release.refunded
    epochs, latest = None, None
    visible_by = now if padded_caller else None
    deleted = False
    if padded_caller:
        deleted_at = dataset_deleted_at(session, release)
        deleted = deleted_before_shown(release, deleted_at)
        if deleted_at is not None and deleted_at < now:
            # Epochs shown only up to the deletion: whether a later one ran first is a race.
            visible_by = deleted_at
    epoch_changed = False
    if is_continual:
        epochs = continual.epoch_summaries(session, release.id, visible_by)
        latest = continual.latest_epoch(session, release.id, visible_by)
        if padded_caller and not deleted:
            epoch_changed = epoch_change_shown(
                continual.reference_cut(session, release.id, now), now
            )
    hidden = not shows_state(release, principal, now)
    if (
        padded_caller
        and status in FINISHED
        and not end_visible(release, None if deleted else epochs, now)
    ):
        hidden = True
    sealed_until = None
    reason = None
    if epoch_changed:
        # An epoch's objects changed before it was due: the release ends there, as it does
        # when that epoch's job read after the change (its end then re-checked alike).
        status, reason, refunded = "failed", REFERENCE_CHANGED_BEFORE_SHOWN_REASON, False
    elif hidden:
        # Late (or its end not yet shown): a fixed answer until the schedule's next step.
        status, refunded = "running", False
        if padded_caller and not is_continual and reference_waiting(release, now):
            # Not a continual release's: its epochs stay listed while its end is re-checked,
            # as they are while the epoch that would have ended it is.
            sealed_until = reference_sealed_until(release, now)
        elif not is_continual and release.visible_at is not None:  # padded: not None
            sealed_until = next_late_step(release.created_at, release.visible_at, now)
    elif status in FINISHED and deleted:
        status, reason, refunded = "failed", DELETED_BEFORE_SHOWN_REASON, False
    elif status in FINISHED and padded_caller and release.reference_check == "changed":
        status, reason, refunded = "failed", REFERENCE_CHANGED_BEFORE_SHOWN_REASON, False
    elif status in FINISHED:
        # Only now: ``reason`` (deferred with the extras) is loaded for an end shown. The
        # worker writes it with the end alone (:meth:`service.worker.Worker._record`): an
        # unfinished release has none, and reads the same statements as a hidden one.
        if with_basis and not is_continual and status in ("succeeded", "no_result"):
            _load_end_with_basis(session, release)
        reason = release.reason
    return View(
        status=status,
        reason=reason,
        refunded=refunded,
        shows_result=status in ("succeeded", "no_result"),
        epochs=epochs,
        latest_epoch=latest,
        epochs_visible_by=visible_by,
        sealed_until=sealed_until,
    )


#: Key in ``Session.info``: the bases read with their release's end by :func:`view`, by
#: release id (``None``: no basis stored); :func:`service.api.presenters.release_out` shows
#: them without a statement of their own.
HELD_BASES = "dpss_held_bases"

#: The end's deferred columns and the basis, in one statement (:func:`_load_end_with_basis`).
_END_WITH_BASIS = (
    select(Release.reason, Release.result_extras, ReleaseBasis.basis)
    .outerjoin(ReleaseBasis, and_(ReleaseBasis.release_id == Release.id, ReleaseBasis.epoch == 0))
    .where(Release.id == bindparam("release_id"))
)


def _load_end_with_basis(session: Session, release: Release) -> None:
    """Load a shown one-shot end's ``reason`` and ``result_extras`` (deferred) with its basis,
    in one statement where the deferred group's load and the basis's were two (the read
    after a worker's hint, ``bench/bench_release_cpu.py``). Only for an end shown: the same
    rule as the deferred load it replaces, so what is read still depends only on what the
    caller may see. Nothing when the columns are loaded already."""
    if "reason" in release.__dict__:
        return
    found = session.execute(_END_WITH_BASIS, {"release_id": release.id}).one()
    set_committed_value(release, "reason", found.reason)
    set_committed_value(release, "result_extras", found.result_extras)
    session.info.setdefault(HELD_BASES, {})[release.id] = found.basis


#: A dataset's deletion moment alone (:func:`dataset_deleted_at`), built once.
_DELETED_AT = select(Dataset.deleted_at).where(Dataset.id == bindparam("dataset_id"))


def dataset_deleted_at(
    session: Session, release: Release, *, settled: bool = False
) -> datetime | None:
    """When the release's dataset was deleted (``None``: it was not). The owner's act, a
    public moment; the row is usually in the session already.

    ``settled``: lock the dataset's row and read it afresh, so that a deletion still being
    committed is waited for rather than read as not made. The deletion removes the file before
    it commits (no raw rows left behind if the commit fails), so a job can find the file gone
    while the row still reads not deleted; the worker's refund rule asks with ``settled``."""
    if settled:
        dataset = session.get(
            Dataset, release.dataset_id, with_for_update=True, populate_existing=True
        )
        return None if dataset is None else dataset.deleted_at
    held = session.identity_map.get(identity_key(Dataset, release.dataset_id))
    if isinstance(held, Dataset):
        return held.deleted_at
    # Read with the release (service.release_rows.read_release): no statement of its own.
    known: dict[Any, datetime | None] = session.info.get(HELD_DELETED_AT, {})
    if release.dataset_id in known:
        return known[release.dataset_id]
    # Not in the session: its one column, not the row (a release's read after the job ended,
    # once per long poll's read: the whole row's thirty columns, nine of them exact decimals,
    # were most of that read's cost). The same statement whatever the worker stored.
    found: datetime | None = session.execute(
        _DELETED_AT, {"dataset_id": release.dataset_id}
    ).scalar_one_or_none()
    return found


def deleted_before_shown(release: Release, deleted_at: datetime | None) -> bool:
    """Whether the release's dataset was deleted before the release's outcome shows to
    analysts and owners (its ``outcome_visible_at``, else its ``visible_at``; a one-shot
    release's, or a continual release's that released no epoch, re-check verdict's
    ``reference_shown_at`` once stored): then the
    outcome is shown as :data:`DELETED_BEFORE_SHOWN_REASON` says, whatever the job did
    (module docstring). A release without padding hides nothing and is shown as it is."""
    if deleted_at is None or not padded(release):
        return False
    due = release.outcome_visible_at or release.visible_at
    if release.reference_shown_at is not None and (
        not continual.is_continual(release.mechanism) or release.epochs_done == 0
    ):
        # A one-shot outcome held for its re-check shows at the verdict's moment (later): a
        # deletion after the re-check and before then ends it too, as its refund, which takes
        # effect then (service.ledger.refund), is never counted after a deletion. So does a
        # continual release's end with no epoch released (the only one refunded: no epoch's
        # showing can change); one after an epoch keeps its end (never refunded, no epoch
        # hidden or shown otherwise).
        due = release.reference_shown_at
    return due is not None and deleted_at < due


def epoch_change_shown(cut: ReleaseEpoch | None, now: datetime) -> bool:
    """Whether the first epoch hidden for its re-check (:func:`service.continual.reference_cut`)
    is one whose re-check found its objects changed, that verdict shown by ``now``: then the
    release is shown ``failed`` as :data:`REFERENCE_CHANGED_BEFORE_SHOWN_REASON` says."""
    return (
        cut is not None
        and cut.reference_check == "changed"
        and cut.reference_shown_at is not None
        and cut.reference_shown_at <= now
    )


def recheck_due(release: Release) -> datetime:
    """When a release on a dataset by reference is re-checked: its outcome's due moment
    (``outcome_visible_at``, else ``visible_at``), public. An epoch's is its ``visible_at``."""
    due = release.outcome_visible_at or release.visible_at
    assert due is not None  # only padded releases are re-checked
    return due


def recheck_grace(release: Release) -> timedelta:
    """The time between the re-check's due moment and its verdict's showing: a public function
    of the release's padding."""
    assert release.visible_at is not None
    padding = release.visible_at - release.created_at
    return max(RECHECK_GRACE_FLOOR, padding * RECHECK_GRACE_SHARE)


def recheck_shown_at(
    release: Release, checked_at: datetime, due: datetime | None = None
) -> datetime:
    """When the verdict of a re-check that ended at ``checked_at`` shows: the due moment (the
    release's, or ``due``: an epoch's ``visible_at``) plus the grace, or (a re-check later than
    that: no worker free, a slow store) the first step of the release's late schedule at or
    after ``checked_at``, as a late job's outcome."""
    first = (recheck_due(release) if due is None else due) + recheck_grace(release)
    if checked_at <= first:
        return first
    assert release.visible_at is not None
    return max(first, late_schedule(release.created_at, release.visible_at, checked_at)[0])


def reference_waiting(release: Release, now: datetime) -> bool:
    """Whether a release's re-check verdict (a one-shot release on a dataset by reference) is
    not yet shown at ``now``: analysts and owners see it ``running`` until then."""
    if release.reference_check is None:
        return False
    shown = release.reference_shown_at
    return release.reference_check == "pending" or shown is None or now < shown


def reference_sealed_until(
    release: Release, now: datetime, epoch: ReleaseEpoch | None = None
) -> datetime:
    """Until when a release (or with ``epoch``, that epoch of it) waiting for its re-check's
    verdict is shown as now: the verdict's moment once known, else the earliest it may be (the
    due moment plus the grace), then the late schedule's next step."""
    row: Release | ReleaseEpoch = release if epoch is None else epoch
    if row.reference_shown_at is not None and row.reference_check != "pending":
        return row.reference_shown_at
    due = recheck_due(release) if epoch is None else epoch.visible_at
    first = due + recheck_grace(release)
    if now < first:
        return first
    assert release.visible_at is not None
    return next_late_step(release.created_at, release.visible_at, now)


def next_shown_at(session: Session, release: Release, after: int, now: datetime) -> datetime | None:
    """For an analyst or owner past ``visible_at``: when the first stored epoch after ``after``
    hidden at ``now`` may show (its ``visible_at``, or its re-check's verdict: the moment
    :func:`reference_sealed_until` gives, whatever the verdict, so that a long poll wakes at a
    public moment); ``None``: none stored."""
    cut = continual.reference_cut(session, release.id, now)
    moments = [continual.next_visible_at(session, release.id, after, now)]
    if cut is not None and cut.epoch > after and cut.visible_at <= now:
        moments.append(reference_sealed_until(release, now, cut))
    if release.reference_check is not None and reference_waiting(release, now):
        # The end, waiting for its own re-check (the epoch it ended at was not stored).
        moments.append(reference_sealed_until(release, now))
    return min((m for m in moments if m is not None and m > now), default=None)


def shows_state(release: Release, principal: Principal, now: datetime) -> bool:
    """Whether :func:`view` shows ``principal`` the release's real state at ``now``, from the
    release's row alone (a continual release's epochs may still hide its end: :func:`view`)."""
    if sees_real_state(principal):
        return True
    if not outcome_visible(release, principal, now):
        return False
    if release.status not in FINISHED:
        return not padded(release)
    if reference_waiting(release, now):
        return False
    return release.outcome_visible_at is None or now >= release.outcome_visible_at


def load_outcomes(
    session: Session, releases: Sequence[Release], principal: Principal, now: datetime
) -> None:
    """Load, in one statement, the deferred ``outcome`` columns (``reason``, ``result_extras``)
    of those of ``releases`` whose end :func:`view` shows ``principal`` at ``now``, so
    that a list reads them once rather than once per row; never those of a release whose
    outcome is hidden, so that a list of hidden releases takes the same time whatever the
    workers stored. A padded caller's continual releases are left to :func:`view` (whose epochs
    decide), which loads them one by one when shown."""
    ids = [
        release.id
        for release in releases
        if release.status in FINISHED
        and shows_state(release, principal, now)
        and not (not sees_real_state(principal) and continual.is_continual(release.mechanism))
    ]
    if ids:
        # Rows already in the session get the columns they have not loaded.
        session.execute(
            select(Release)
            .where(Release.id.in_(ids))
            .options(load_only(Release.reason, Release.result_extras))
        ).all()


def shown_at(release: Release, ended_at: datetime) -> datetime | None:
    """When analysts may see the outcome of ``release`` (one-shot) that really ended at
    ``ended_at``: ``visible_at``, or the late schedule's next step
    (:func:`service.padding.late_schedule`); ``None`` for a release without ``visible_at``."""
    if release.visible_at is None:
        return None
    return late_schedule(release.created_at, release.visible_at, ended_at)[0]


def is_late(release: Release, ended_at: datetime) -> bool:
    """Whether a one-shot release ending at ``ended_at`` ends after its ``visible_at``."""
    return release.visible_at is not None and ended_at > release.visible_at
