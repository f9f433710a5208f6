"""The epoch chain as it was before the one-read sweep (``service/padding_epochs.py`` at commit
1b025ea): its ``_Chain`` and the pending lists' statements verbatim (with wip/privreg's one
change, the queue term counting the registrations pending at a point, read through the service's
``queue_parts``, so the kept batches' moments of migration 0027 too); everything else is the
service's own, unchanged by the sweep, imported. ``tests/continual/test_chain_sweep.py`` runs
the service's ``epoch_seconds``, ``epoch_padding`` and ``end_due`` with this ``_Chain`` in place
of the service's (this module's functions of those names), the slow reference the sweep is
compared with figure for figure (and ``bench/bench_chain.py`` times). Not imported by the
service."""

# ruff: noqa
# mypy: ignore-errors
from __future__ import annotations

from unittest import mock

import bisect
import functools
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    bindparam,
    case,
    exists,
    false,
    func,
    or_,
    select,
    union_all,
)
from sqlalchemy.orm import Session, aliased
from sqlalchemy.sql.expression import BindParameter, CompoundSelect

from service import padding_epochs
from service.config import Settings
from service.db.models import Dataset, DatasetBatch, Release, ReleaseEpoch, utcnow
from service.mechanisms.registry import MECHANISMS
from service.padding import PaddingModel, next_late_step
from service.padding_queue import (
    QUEUE,
    REGISTRATIONS,
    padding_model,
    queue_parts,
    queue_seconds,
    shown_unfinished,
)
from service.padding_epoch_facts import END_SEQ as _END_SEQ
from service.padding_epoch_facts import End as _End
from service.padding_epoch_facts import Key
from service.padding_epoch_facts import Point as _Point
from service.padding_epoch_facts import pending_key as _key
from service.padding_epoch_facts import point
from service.padding_epochs import (
    _Epoch,
    _act,
    _looks,
    _moment,
    act_queue_seconds,
    continual_names,
    epoch_visible_at,
    in_order,
    previous_due,
    request_queue_seconds,
    unverified,
)


class _Chain:
    """The moments of the pending epochs, each computed once, in the workers' order.

    An epoch waits behind every epoch of a smaller :data:`Key` not shown at its point (those
    are before it in the order and may still run: their release's, and other releases'), so
    its queue term adds the wait until the latest next public moment of those (their
    ``visible_at``, or past it the next step of their late schedule) at its point; each of
    those moments is this same formula's, computed the same way, from earlier points only (no
    cycle: the keys strictly decrease). Every input is fixed by the point: what is *shown* at
    it (an epoch, a release's end, a deletion, a re-check's verdict each shows no earlier than
    it is stored), never what a worker stored before it shows."""

    def __init__(self, session: Session, settings: Settings) -> None:
        self.session = session
        self.settings = settings
        self.continual = tuple(continual_names())
        # The epoch's own padding is uncalibrated (its queue term is not): as it always was.
        self.model = PaddingModel.from_settings(settings)
        self.queues: dict[datetime, tuple[float, float]] = {}
        self.points: dict[datetime, _Point] = {}
        self.moments: dict[tuple[Any, int], tuple[datetime, timedelta]] = {}
        #: Each end's due moment after a deletion (:meth:`end_due`), and those being computed.
        self.dues: dict[Any, datetime] = {}
        self.computing: set[Any] = set()
        #: The first moment a list was read at (the latest asked: a point is never later),
        #: and the changes in ``(lowest point in it, read]`` (:meth:`quiet`).
        self.read: datetime | None = None
        self.changes: tuple[datetime, list[datetime]] | None = None

    def queue(self, at: datetime, epochs: float) -> float:
        """The queue term at ``at`` (:func:`act_queue_seconds`) with ``epochs`` the epochs'."""
        if at not in self.queues:
            model = padding_model(self.session, self.settings, at)
            self.queues[at] = queue_parts(
                self.session, model, at, registrations=True, only_one_shot=True
            )
        total, wait = self.queues[at]
        return total + max(wait, epochs)

    def pending(self, at: datetime) -> _Point:
        """The epochs pending at ``at`` (:func:`_pending`), in the workers' order: the rows of
        a list read at a later moment ``q`` whose point is not after ``at``, when nothing
        showed in ``(at, q]`` (:meth:`quiet`; the same rows, and one statement for many
        points), else read."""
        found = self.points.get(at)
        if found is None:
            later = self.quiet(at)
            if later is not None:
                end = bisect.bisect_right(later.points, at)
                found = _Point(later.keys[:end], later.rows[:end], [], later.points[:end])
                self.points[at] = found
                return found
            rows: list[Any] = [
                row
                for row in self.session.execute(_pending(self.continual), {"now": at}).all()
                # A release ends at its horizon; its end shows with its last epoch.
                if int(row.batch_seq) + 1 <= int(row.params.get("horizon", 0))
            ]
            rows += self.ends(at, rows)
            keyed = sorted(((_key(row), row) for row in rows), key=lambda pair: pair[0])
            keys = [key for key, _ in keyed]
            found = _Point(keys, [row for _, row in keyed], [], [key[0] for key in keys])
            self.points[at] = found
            if self.read is None:
                self.read = at
        return found

    def ends(self, at: datetime, epochs: list[Any]) -> list[_End]:
        """The ends pending at ``at`` after a dataset's deletion (:data:`_DELETED_ENDS`): a
        worker claims such a release to store its end (:func:`service.continual.next_input`),
        a job in the order like an epoch, at the place of its first pending epoch (the batch
        its ``WORK_SINCE`` reads, here the earliest pending: never later), else of the
        deletion. Its moment is the worker's (:meth:`end_due`, computed when asked)."""
        first: dict[Any, Any] = {}
        for row in epochs:
            if row.deleted_at is not None and row.release_id not in first:
                first[row.release_id] = row  # by release, then batch: the first
        found: list[_End] = []
        for row in self.session.execute(_deleted_ends(self.continual), {"now": at}).all():
            epoch = first.get(row.release_id)
            came = row.deleted_at if epoch is None else epoch.batch_created_at
            found.append(
                _End(row.release_id, row.created_at, came, _END_SEQ, row.visible_at, row.deleted_at)
            )
        return found

    def end_due(
        self, release_id: Any, created_at: datetime, visible_at: datetime, deleted_at: datetime
    ) -> datetime:
        """The due moment of a padded continual release's end after its dataset's deletion
        (:func:`service.continual._end_visible_at`, and :meth:`moment` of an :class:`_End`):
        the deletion plus the release's own padding plus the queue at the deletion, whose
        epochs' term waits until the latest next public moment, at the deletion, of the jobs
        before the end in the workers' order (:meth:`ahead` with the end's key as the
        pending list at the deletion places it: its release's own pending epoch, the epochs
        and ends before it). Why: counted from the deletion alone, an epoch claimed before
        the deletion that ran past the end's due moment made the end show a late step, which
        told the release's analysts whether the epoch (and the jobs ahead of it) had ended
        (``tests/continual/test_end_behind_a_deletion.py``). Every input is fixed at the
        deletion (what is shown at it); the keys before the end's are smaller, so no cycle
        (a re-entry, never expected, counts no epochs rather than loop)."""
        found = self.dues.get(release_id)
        if found is not None:
            return found
        wait: datetime | None = None
        if release_id not in self.computing:
            own = next(
                (
                    row
                    for row in self.pending(deleted_at).rows
                    if isinstance(row, _End) and row.release_id == release_id
                ),
                None,
            )
            if own is not None:
                self.computing.add(release_id)
                try:
                    wait = self.ahead(deleted_at, _key(own))
                finally:
                    self.computing.discard(release_id)
        epochs = 0.0 if wait is None else max(0.0, (wait - deleted_at).total_seconds())
        queue = timedelta(seconds=self.queue(deleted_at, epochs))
        due = max(deleted_at + (visible_at - created_at) + queue, visible_at)
        self.dues[release_id] = due
        return due

    def quiet(self, at: datetime) -> _Point | None:
        """A list read at the first moment after ``at`` (:attr:`read`, the first read) if
        nothing that :func:`_pending` reads changed in ``(at, read]``: an epoch's
        ``visible_at`` or re-check verdict's ``reference_shown_at``, a continual release's
        ``outcome_visible_at``, a dataset's deletion (:data:`_CHANGES`, one statement)."""
        if self.read is None or at >= self.read:
            return None
        if self.changes is None:
            lowest = min((key[0] for key in self.points[self.read].keys), default=self.read)
            found = self.session.execute(
                _CHANGES, {"low": lowest, "high": self.read, "names": list(self.continual)}
            ).scalars()
            self.changes = (lowest, sorted(found))
        lowest, changes = self.changes
        if at < lowest:
            return None
        # Quiet when the last change is not after at.
        if changes and changes[-1] > at:
            return None
        return self.points[self.read]

    def ahead(self, at: datetime, key: Key | None) -> datetime | None:
        """The latest next public moment at ``at`` of the epochs pending at ``at`` whose key
        is below ``key`` (all of them: ``None``); ``None``: none."""
        pending = self.pending(at)
        end = len(pending.keys) if key is None else bisect.bisect_left(pending.keys, key)
        # The running maximum over the order, extended as far as asked (once per row).
        while len(pending.latest) < end:
            row = pending.rows[len(pending.latest)]
            visible, padding = self.moment(row)
            step = next_late_step(visible - padding, visible, at)
            before = pending.latest[-1] if pending.latest else None
            pending.latest.append(step if before is None else max(before, step))
        return pending.latest[end - 1] if end else None

    def moment(self, row: Any) -> tuple[datetime, timedelta]:
        """``(visible_at, padding)`` of the epoch of a :func:`_pending` row, or of an end
        after a deletion (:class:`_End`: its due moment, its schedule from the request)."""
        if isinstance(row, _End):
            due = self.end_due(row.release_id, row.created_at, row.visible_at, row.deleted_at)
            return due, due - row.created_at
        seq = int(row.batch_seq)
        found = self.moments.get((row.release_id, seq))
        if found is not None:
            return found
        batch = (row.batch_created_at, row.batch_rows)
        # The batch was committed before any deletion (none after it): the batch's own rows.
        act, n_rows = _act(batch, row.dataset_rows, None)
        key = _key(row)
        wait = self.ahead(key[0], key)  # computes the epoch before too, if pending
        if seq == int(row.shown):
            previous = row.previous_visible_at  # the last shown epoch's due moment
        else:
            previous = self.moments[(row.release_id, seq - 1)][0]
        facts = _Epoch(
            row.mechanism, row.k, row.params, row.visible_at, row.n_cols, n_rows, act, previous
        )
        found = self.formula(facts, key[0], wait)
        self.moments[(row.release_id, seq)] = found
        return found

    def formula(
        self, facts: _Epoch, at: datetime, wait: datetime | None
    ) -> tuple[datetime, timedelta]:
        """:func:`_moment` with the queue at point ``at`` and the epochs ahead until ``wait``
        (counted from the act, which the padding starts from)."""
        epochs = 0.0 if wait is None else max(0.0, (wait - facts.act).total_seconds())
        return _moment(self.model, facts, self.queue(at, epochs))


_LOW: BindParameter[Any] = bindparam("low")


_HIGH: BindParameter[Any] = bindparam("high")


_NAMES: BindParameter[Any] = bindparam("names", expanding=True)


_CONTINUAL_IDS = select(Release.id).where(Release.mechanism.in_(_NAMES))


#: The moments in ``(low, high]`` at which what :func:`_pending` reads changes, for the
#: continual releases (:meth:`_Chain.quiet`).
_CHANGES: CompoundSelect[Any] = union_all(
    select(ReleaseEpoch.visible_at).where(
        ReleaseEpoch.visible_at > _LOW,
        ReleaseEpoch.visible_at <= _HIGH,
        ReleaseEpoch.release_id.in_(_CONTINUAL_IDS),
    ),
    select(ReleaseEpoch.reference_shown_at).where(
        ReleaseEpoch.reference_shown_at > _LOW,
        ReleaseEpoch.reference_shown_at <= _HIGH,
        ReleaseEpoch.release_id.in_(_CONTINUAL_IDS),
    ),
    select(Release.outcome_visible_at).where(
        Release.outcome_visible_at > _LOW,
        Release.outcome_visible_at <= _HIGH,
        Release.mechanism.in_(_NAMES),
    ),
    select(Dataset.deleted_at).where(Dataset.deleted_at > _LOW, Dataset.deleted_at <= _HIGH),
)


@functools.cache
def _pending(continual: tuple[str, ...]) -> Select[Any]:
    """The continual releases requested by ``now``, their end not shown at ``now`` (nor, on a
    dataset by reference, shown ``failed`` by a changed object's verdict), with each batch
    committed by ``now`` from the first epoch's not shown at ``now`` (at the dataset's
    deletion, if before: analysts see no epoch after it) on (by release, then batch): the
    batch's ``seq``, ``(created_at, n_rows)`` and
    the last shown epoch's due moment (:func:`previous_due`). Built once per set of names."""
    now: Any = bindparam("now")
    visible = aliased(ReleaseEpoch)
    # Epochs show in order (visible_at never decreases with the epoch), and on a dataset by
    # reference none from the first whose re-check's verdict is not shown "unchanged"
    # (service.continual._shown): the shown epochs are 1 .. min(visible, first cut - 1).
    # After the dataset's deletion analysts see the epochs up to it only (service.visibility).
    seen_by = case((Dataset.deleted_at < now, Dataset.deleted_at), else_=now)
    n_visible = (
        select(func.count())
        .select_from(visible)
        .where(visible.release_id == Release.id, visible.visible_at <= seen_by)
        .correlate(Release, Dataset)
        .scalar_subquery()
    )
    cut = aliased(ReleaseEpoch)
    first_cut = (
        select(func.min(cut.epoch))
        .where(cut.release_id == Release.id, unverified(cut, now))
        .correlate(Release)
        .scalar_subquery()
    )
    # The release shown ended there (service.visibility.epoch_change_shown): the first epoch
    # cut is one whose re-check found its objects changed, that verdict shown by now.
    changed = aliased(ReleaseEpoch)
    cut_changed = (
        exists()
        .where(
            changed.release_id == Release.id,
            changed.epoch == first_cut,
            changed.reference_check == "changed",
            changed.reference_shown_at <= now,
        )
        .correlate(Release)
    )
    shown = case(
        (and_(first_cut.is_not(None), first_cut - 1 < n_visible), first_cut - 1),
        else_=n_visible,
    )
    pending = (
        select(
            Release.id.label("release_id"),
            shown.label("shown"),
        )
        .join(Dataset, Dataset.id == Release.dataset_id)
        .where(
            Release.mechanism.in_(continual),
            Release.created_at <= now,
            # The end not shown at now.
            shown_unfinished(now),
            # A dataset deleted by now too: an epoch claimed before the deletion still runs
            # (its end is in _deleted_ends).
            ~cut_changed,
        )
        .subquery()
    )
    previous = aliased(ReleaseEpoch)
    return (
        select(
            Release.id.label("release_id"),
            Release.created_at,
            pending.c.shown,
            Release.mechanism,
            Release.k,
            Release.params,
            Release.visible_at,
            Dataset.n_rows.label("dataset_rows"),
            Dataset.n_cols,
            Dataset.deleted_at,
            DatasetBatch.seq.label("batch_seq"),
            DatasetBatch.created_at.label("batch_created_at"),
            DatasetBatch.n_rows.label("batch_rows"),
            func.coalesce(previous.due_at, previous.visible_at).label("previous_visible_at"),
        )
        .join(pending, pending.c.release_id == Release.id)
        .join(Dataset, Dataset.id == Release.dataset_id)
        .join(
            DatasetBatch,
            and_(
                DatasetBatch.dataset_id == Release.dataset_id,
                DatasetBatch.seq >= pending.c.shown,
                DatasetBatch.created_at <= now,
            ),
        )
        .outerjoin(
            previous,
            and_(previous.release_id == Release.id, previous.epoch == pending.c.shown),
        )
        .order_by(Release.id, DatasetBatch.seq)
    )


@functools.cache
def _deleted_ends(
    continual: tuple[str, ...],
) -> Select[uuid.UUID, datetime, datetime | None, datetime | None]:
    """The padded continual releases requested by ``now`` whose dataset was deleted by ``now``
    and whose end is not shown at ``now`` (as :func:`_pending`): a worker claims each to store
    its end (:meth:`_Chain.ends`). Built once per set of names."""
    now: Any = bindparam("now")
    return (
        select(
            Release.id.label("release_id"),
            Release.created_at,
            Release.visible_at,
            Dataset.deleted_at,
        )
        .join(Dataset, Dataset.id == Release.dataset_id)
        .where(
            Release.mechanism.in_(continual),
            Release.created_at <= now,
            Release.visible_at.is_not(None),
            Dataset.deleted_at <= now,
            shown_unfinished(now),
        )
        .order_by(Release.id)
    )


def _with_this_chain(function):
    """The service's ``function`` run with this module's ``_Chain`` in its place."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        with mock.patch.object(padding_epochs, "_Chain", _Chain):
            return function(*args, **kwargs)

    return run


epoch_seconds = _with_this_chain(padding_epochs.epoch_seconds)
epoch_padding = _with_this_chain(padding_epochs.epoch_padding)
end_due = _with_this_chain(padding_epochs.end_due)
