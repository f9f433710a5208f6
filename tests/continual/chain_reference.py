"""The epoch chain as it was before the one-read sweep (``service/padding_epochs.py`` at commit
1b025ea, its chain and the pending list's statements verbatim, the rest imported; with
wip/privreg's one change, the queue term counting the registrations pending at a point): the slow
reference ``tests/continual/test_chain_sweep.py`` compares the service's chain with, figure for
figure. Not imported by the service."""

# ruff: noqa
# mypy: ignore-errors
from __future__ import annotations

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


def continual_names() -> list[str]:
    """The registered continual mechanisms."""
    return [name for name, mechanism in MECHANISMS.items() if mechanism.continual]


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


def unverified(epoch: Any, by: datetime | ColumnElement[Any]) -> ColumnElement[bool]:
    """Whether ``epoch`` (:class:`ReleaseEpoch` or an alias of it) waits for, or failed, the
    re-check of the objects it read (:mod:`service.reference_recheck`) at ``by``: a re-check
    pending, a verdict not yet shown, or ``changed``. Never for an epoch without a re-check
    (null: an upload's, an unpadded release's, or one stored before re-checks existed)."""
    return and_(
        epoch.reference_check.is_not(None),
        or_(
            epoch.reference_check != "unchanged",
            epoch.reference_shown_at.is_(None),
            epoch.reference_shown_at > by,
        ),
    )


@dataclass(frozen=True)
class _Epoch:
    """The public facts an epoch's moments follow: the release's mechanism, ``k``, params and
    ``visible_at``, the dataset's ``d``, the batch's commit and rows (the act: the later of
    the commit and the dataset's deletion) and the epoch before's due moment
    (:func:`previous_due`)."""

    mechanism: str
    k: int
    params: dict[str, Any]
    release_visible_at: datetime | None
    n_cols: int
    n_rows: int
    act: datetime
    previous_visible_at: datetime | None


def _act(
    batch: tuple[datetime, int] | None, dataset_rows: int, deleted_at: datetime | None
) -> tuple[datetime, int]:
    """``(act, n_rows)`` of the epoch on ``batch`` (``(created_at, n_rows)``; ``None``: no such
    batch, the dataset's rows): the later of the batch's commit and the dataset's deletion."""
    n_rows = batch[1] if batch is not None else dataset_rows
    moments = [moment for moment in (batch[0] if batch else None, deleted_at) if moment]
    return (max(moments) if moments else utcnow()), n_rows


def _moment(model: PaddingModel, epoch: _Epoch, queue_seconds: float) -> tuple[datetime, timedelta]:
    """An epoch's ``(visible_at, padding)``, with ``queue_seconds`` its queue term at its act
    (:class:`_Chain`: the one-shot jobs ahead and the epochs ahead). The one formula of the
    worker's claim and of :func:`epoch_seconds`, so both compute the same moment."""
    padding = model.padding(
        epoch.mechanism, epoch.n_rows, epoch.n_cols, epoch.k, epoch.params, queue_seconds
    )
    visible = epoch_visible_at(
        epoch.release_visible_at, epoch.act, padding, epoch.previous_visible_at
    )
    return visible, padding


#: An epoch's place in the workers' order: its point (the later of its batch's commit and its
#: release's request: :func:`point`), its release's request and id, its batch. A worker takes
#: the waiting job of the earliest point first (:data:`service.continual.WORK_SINCE`), and
#: continues a release with its next epoch only if nothing claimable comes before that epoch
#: (:func:`service.continual.next_input`), so an epoch runs after exactly the epochs of a
#: smaller key that are not finished, and never after a job requested after its point.
Key = tuple[datetime, datetime, str, int]


def point(act: datetime, requested: datetime) -> datetime:
    """The moment an epoch's work comes (its order among the jobs, and the moment its queue is
    read at): the later of its act (the batch's commit) and its release's request."""
    return max(act, requested)


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


#: An end's ``batch_seq`` in its :data:`Key`: after every epoch of its release at its point.
_END_SEQ = 1 << 30


@dataclass(frozen=True)
class _End:
    """A continual release's end after its dataset's deletion, as :meth:`_Chain.ends` counts
    it: the :data:`Key` fields of a :func:`_pending` row, the release's ``visible_at`` and the
    deletion (its due moment: :meth:`_Chain.end_due`)."""

    release_id: Any
    created_at: datetime
    batch_created_at: datetime
    batch_seq: int
    visible_at: datetime
    deleted_at: datetime


@dataclass
class _Point:
    """The epochs pending at one moment in the workers' order, and the running maximum of
    their next public moments (as far as computed)."""

    keys: list[Key]
    rows: list[Any]
    latest: list[datetime]
    points: list[datetime]


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


def _key(row: Any) -> Key:
    """A :func:`_pending` row's :data:`Key`."""
    return (
        point(row.batch_created_at, row.created_at),
        row.created_at,
        str(row.release_id),
        int(row.batch_seq),
    )


def epoch_padding(
    session: Session, settings: Settings, release: Release, dataset: Dataset, epoch: int
) -> tuple[datetime, timedelta]:
    """:func:`service.continual.pending_padding` of epoch ``epoch`` (its batch ``epoch - 1``,
    after epoch ``epoch - 1``): what the worker computes when it claims that epoch, from public
    facts only. The epoch before is stored before a worker claims this one, but maybe not shown
    (nor on time): this one follows its formula moment (``due_at``, :func:`previous_due`), not
    the step it shows at, so that a chain of the formula over the pending epochs is public
    (:func:`epoch_seconds`). Its queue term counts the one-shot jobs requested by its point and
    every epoch before it in the workers' order not shown at its point (:class:`_Chain`): the
    epoch before of its own release, and other releases' (a worker runs them first)."""
    row = session.get(DatasetBatch, (dataset.id, epoch - 1))
    batch = (row.created_at, row.n_rows) if row is not None else None
    act, n_rows = _act(batch, dataset.n_rows, dataset.deleted_at)
    previous = session.get(ReleaseEpoch, (release.id, epoch - 1)) if epoch > 1 else None
    facts = _Epoch(
        release.mechanism,
        release.k,
        release.params,
        release.visible_at,
        dataset.n_cols,
        n_rows,
        act,
        previous_due(previous),
    )
    chain = _Chain(session, settings)
    at = point(act, release.created_at)
    key = (at, release.created_at, str(release.id), epoch - 1)
    return chain.formula(facts, at, chain.ahead(at, key))


def end_due(
    session: Session, settings: Settings, release: Release, deleted_at: datetime
) -> datetime:
    """The due moment of padded ``release``'s end after its dataset's deletion at
    ``deleted_at``, as the pending epochs' term counts it (:meth:`_Chain.end_due`): the
    worker's formula (:func:`service.continual._end_visible_at`)."""
    assert release.visible_at is not None  # padded
    chain = _Chain(session, settings)
    return chain.end_due(release.id, release.created_at, release.visible_at, deleted_at)


def previous_due(previous: ReleaseEpoch | None) -> datetime | None:
    """The moment the next epoch follows: the epoch's formula ``visible_at`` (``due_at``; its
    stored ``visible_at`` for a row made before migration 0026, as before)."""
    if previous is None:
        return None
    return previous.due_at if previous.due_at is not None else previous.visible_at


def in_order(session: Session, release_id: Any, epoch: int, moment: datetime) -> datetime:
    """When what epoch ``epoch`` brings (the epoch or the release's end) shows: ``moment``, not
    before the epoch before shows (its stored ``visible_at``, possibly a late step), so that
    epochs and the end still appear in order now that the epoch's formula moment follows the
    one before's ``due_at`` (:func:`previous_due`) rather than its shown moment. That one is
    public by then: it shows no later than this."""
    previous = session.get(ReleaseEpoch, (release_id, epoch - 1)) if epoch > 1 else None
    return moment if previous is None else max(moment, previous.visible_at)


def request_queue_seconds(
    session: Session, settings: Settings, model: PaddingModel, now: datetime
) -> float:
    """The padding's queue term of a job requested at ``now`` (a release or a registration
    by reference) under ``model``: :func:`service.padding_queue.queue_seconds` with the
    registrations and the pending epochs (:func:`epoch_seconds`), the same figure, with one
    statement first saying which of the three looks has a row at ``now`` (:func:`_looks`): a
    look with none is not made. Why: each request made all three, and most find nothing (no
    job ahead, nothing registering, no continual release): two statements less per release
    request (``bench/bench_release_cpu.py``). The guard asks the looks' own predicates (a
    wider one for the epochs): a look with a row is always made, so the figure is the one the
    looks give; it reads only the public facts they read."""
    looks = session.execute(_looks(tuple(continual_names())), {"now": now}).one()
    epochs = epoch_seconds(session, settings, now) if looks.epochs else 0.0
    return queue_seconds(
        session, model, now, registrations=looks.registrations, epochs=epochs, queued=looks.queue
    )


@functools.cache
def _looks(continual: tuple[str, ...]) -> Select[bool, bool, bool]:
    """Whether each look of :func:`request_queue_seconds` may have a row at ``now``: the jobs
    ahead and the late ones (:data:`service.padding_queue.QUEUE`) and the registrations by
    reference not shown (``REGISTRATIONS``), as ``EXISTS`` of those very statements (each
    stops at its first row); and for the pending epochs (:func:`_pending`) a continual release
    requested by ``now`` whose end is not shown at ``now``, which every row of that look has
    (a wider question: when it finds one the look itself runs and decides). Built once; its
    text stays under psycopg's 4,096 characters, above which psycopg parses a statement's
    placeholders again on every execution (:data:`_pending`'s whole text in it cost 0.3 ms of
    the API's CPU on PostgreSQL)."""
    now: Any = bindparam("now")
    epochs = (
        exists().where(
            Release.mechanism.in_(continual),
            Release.created_at <= now,
            shown_unfinished(now),
        )
        if continual
        else false()
    )
    return select(
        QUEUE.exists().label("queue"),
        REGISTRATIONS.exists().label("registrations"),
        epochs.label("epochs"),
    )


def act_queue_seconds(session: Session, settings: Settings, act: datetime) -> float:
    """The padding's queue term at ``act`` (an owner's deletion, which gives a waiting
    continual release its end): the modelled time of the one-shot releases requested by
    then and not yet past their own ``visible_at`` (:func:`service.padding_queue.
    queue_seconds`; every input fixed when they were requested, so the worker computes the same
    later). An epoch's term adds the epochs ahead of it (:class:`_Chain`). The epoch runs
    behind them on the workers' one queue: padded as if they were not there, it showed late
    exactly when one of them (any dataset's, its run time possibly depending on one row) had
    not yet ended, long before that one's own ``visible_at``
    (``tests/continual/test_epoch_behind_a_long_job.py``)."""
    # Not the registrations by reference pending at the act (:func:`service.padding_queue.
    # registration_seconds`): a batch's moments are overwritten by the dataset's next batch,
    # so a worker computing this after that request would not see what was pending at the act
    # and the epoch's visible_at would follow when the worker got to it. The gap is in
    # docs/security.md.
    return queue_seconds(session, padding_model(session, settings, act), act, registrations=False)


def epoch_seconds(session: Session, settings: Settings, now: datetime) -> float:
    """Until the next public moment of the latest pending epoch at ``now``: for each
    continual release requested by ``now`` whose end is not shown at ``now``, every epoch after
    the ones shown at ``now`` (at its dataset's deletion, if before) whose batch was committed by
    ``now`` (up to the horizon). An epoch's moment is its ``visible_at``, or past it the next
    step of its late schedule, both from :func:`_moment` through :class:`_Chain`, the formula
    the worker applies when it claims the epoch: public facts fixed at the epoch's point (the
    one-shot jobs requested by then and the epochs before it in the workers' order, never a job
    requested after it, so no cycle with this term) and the ``due_at`` of the epoch before: the
    shown one's as stored, a pending one's as the chain computes it (the worker's formula,
    never how late that epoch ended). It is the same whether the epochs are queued, running,
    stored or ended the release: what is stored counts only once it shows.

    Why: a worker takes a pending epoch before any one-shot job requested after its batch
    (:func:`service.claims.waiting_ahead`), and a queued continual release's first epochs
    before the jobs requested after it, so a release requested meanwhile waits behind the
    epoch. Padded as if it were not there (an epoch on a large batch is padded far more than a
    cheap probe), a probe showed at its ``visible_at`` if the epoch had ended (or had not
    begun: a job ahead of it still ran) and a step later if the worker was still on it:
    anyone read the epoch's real end, and through it whether the jobs ahead of it had ended
    (``tests/continual/test_probe_behind_an_epoch.py``).

    Several epochs pending (batches appended back to back, several releases): the worker runs
    them all before the probe, so each counts (``tests/continual/test_probe_behind_two_epochs.
    py``). After a dataset's deletion (public), until its release's end shows: the epochs
    pending at the deletion (a worker that claimed one before it runs it to its end) and the
    end a worker stores for it (:class:`_End`), by the worker's own formula
    (``tests/continual/test_probe_behind_a_deletion.py``)."""
    if not continual_names():
        return 0.0
    # Every pending epoch is before a job requested at now: the latest over all of them.
    latest = _Chain(session, settings).ahead(now, None)
    return 0.0 if latest is None else max(0.0, (latest - now).total_seconds())


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
