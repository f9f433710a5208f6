"""A continual epoch's public moments (:func:`epoch_padding`: what the worker computes when it
claims the epoch) and the padding's term for the pending epochs (:func:`epoch_seconds`): a job
requested while a continual release has an epoch to run waits behind that epoch, so its padding
counts the epoch until the epoch's next public moment.

Apart from :mod:`service.continual` (which imports :mod:`service.jobs`, which imports
:mod:`service.releases`, which pads with :func:`epoch_seconds`) and from
:mod:`service.padding_queue` (an epoch's own queue term, :func:`act_queue_seconds`, is
:func:`service.padding_queue.queue_seconds`).

Every input is public: the batch's commit (an owner's act) and size, the release's request and
``visible_at``, the settings and the padding model, the one-shot jobs requested by the batch's
commit, and which epochs (and whether the release's end) are *shown* at the moment asked
about. Never whether a worker claimed, ran or stored an epoch before it shows.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    bindparam,
    exists,
    false,
    or_,
    select,
)
from sqlalchemy.orm import Session

from service import commit_order
from service.config import Settings
from service.db.models import Dataset, DatasetBatch, Release, ReleaseEpoch, utcnow
from service.db.prepared import Prepared
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
        #: The public facts every pending list is made from (:class:`_Facts`, read once).
        self.facts: _Facts | None = None

    def queue(self, at: datetime, epochs: float) -> float:
        """The queue term at ``at`` (:func:`act_queue_seconds`) with ``epochs`` the epochs'.
        The one-shot queue is not read at a moment with none in it (:meth:`_Facts.idle`:
        :func:`queue_parts`' ``queued=False``); every other term of the queue still counts
        there (the registrations pending), as :func:`queue_parts` alone adds them."""
        if at not in self.queues:
            facts = self.facts
            idle = facts is not None and facts.idle(self.session, at)
            # The model prices the one-shot jobs ahead only, none at an idle point: the
            # uncalibrated one serves there, without the calibrated rates' read.
            model = self.model if idle else padding_model(self.session, self.settings, at)
            # Registrations too: one requested by the point goes first (act_queue_seconds).
            self.queues[at] = queue_parts(
                self.session, model, at, registrations=True, queued=not idle, only_one_shot=True
            )
        total, wait = self.queues[at]
        return total + max(wait, epochs)

    def pending(self, at: datetime) -> _Point:
        """The epochs (and the ends after a deletion: :class:`_End`) pending at ``at``, in the
        workers' order, made in Python from the facts read once (:class:`_Facts`: the
        continual releases whose end may be pending at any moment the chain asks about, their
        epochs and their datasets' batches), by the rule the pending list's statement applied
        at ``at`` (its text is kept as the reference in
        ``tests/continual/test_chain_sweep.py``). Why: that statement was run again at almost
        every point (546 statements for one request at 100 releases on 100 datasets), the
        chain's cost quadratic in the epochs pending (docs/benchmarks.md)."""
        found = self.points.get(at)
        if found is None:
            facts = self.facts
            if facts is None or not facts.low <= at <= facts.high:
                low = at if facts is None else min(at, facts.low)
                high = at if facts is None else max(at, facts.high)
                facts = self.facts = _Facts.read(self.session, self.continual, low, high)
            found = facts.point(at)
            self.points[at] = found
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

    def ahead(self, at: datetime, key: Key | None) -> datetime | None:
        """The latest next public moment at ``at`` of the epochs pending at ``at`` whose key
        is below ``key`` (all of them: ``None``); ``None``: none."""
        pending = self.pending(at)
        end = len(pending.keys) if key is None else bisect.bisect_left(pending.keys, key)
        # The running maximum over the order, extended as far as asked (once per row).
        while len(pending.latest) < end:
            row = pending.rows[len(pending.latest)]
            visible, padding = self.moment(row)
            # next_late_step's own answer before the visible_at (a positive padding): visible.
            if visible > at and padding > _ZERO:
                step = visible
            else:
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
        found = self.moments.get((row.ident, seq))
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
            previous = self.moments[(row.ident, seq - 1)][0]
        facts = _Epoch(
            row.mechanism, row.k, row.params, row.visible_at, row.n_cols, n_rows, act, previous
        )
        found = self.formula(facts, key[0], wait)
        self.moments[(row.ident, seq)] = found
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


_ZERO = timedelta(0)


class _Row(NamedTuple):
    """A pending epoch: the columns the pending list's statement gave (its batch's ``seq``,
    commit and rows, the release's shown epochs and the last shown one's due moment)."""

    release_id: Any
    created_at: datetime
    shown: int
    mechanism: str
    k: int
    params: dict[str, Any]
    visible_at: datetime | None
    dataset_rows: int
    n_cols: int
    deleted_at: datetime | None
    batch_seq: int
    batch_created_at: datetime
    batch_rows: int
    previous_visible_at: datetime | None
    #: The release's id as text (a cheaper key than the UUID: :meth:`_Chain.moment`).
    ident: str


@dataclass
class _Rel:
    """A continual release read by :class:`_Facts`, with its dataset's columns and its
    epochs' public moments: ``seen`` the sorted ``visible_at``, ``checks`` the re-checks
    ``(epoch, verdict, shown_at)`` by epoch, ``dues`` each epoch's due moment
    (:func:`previous_due`)."""

    id: Any
    created_at: datetime
    mechanism: str
    k: int
    params: dict[str, Any]
    visible_at: datetime | None
    outcome_visible_at: datetime | None
    status: str
    dataset_id: Any
    dataset_rows: int
    n_cols: int
    deleted_at: datetime | None
    horizon: int
    seen: list[datetime]
    checks: list[tuple[int, str, datetime | None]]
    dues: dict[int, datetime | None]
    ident: str = ""
    #: Its rows by ``(batch seq, shown)`` (:meth:`_Facts.point`).
    rows: dict[tuple[int, int], _Row] = field(default_factory=dict)

    def unfinished(self, at: datetime) -> bool:
        """Its end not shown at ``at`` (:func:`service.padding_queue.shown_unfinished`)."""
        if self.outcome_visible_at is None:
            return self.status in ("queued", "running")
        return self.outcome_visible_at > at

    def shown(self, at: datetime) -> int | None:
        """The epochs shown at ``at`` (at the deletion, if before; none from the first whose
        re-check is not shown ``unchanged``), or ``None`` when that first one's verdict is
        shown ``changed`` (the release shown ended there)."""
        seen_by = self.deleted_at if self.deleted_at is not None and self.deleted_at < at else at
        n_visible = bisect.bisect_right(self.seen, seen_by)
        for epoch, check, shown_at in self.checks:
            if check != "unchanged" or shown_at is None or shown_at > at:
                if check == "changed" and shown_at is not None and shown_at <= at:
                    return None
                return epoch - 1 if epoch - 1 < n_visible else n_visible
        return n_visible


class _Facts:
    """The public facts the chain's pending lists are made from, read once (three statements,
    a fourth or so when the releases read reach further back): every continual release
    requested by ``high`` whose end is not shown at ``low`` (so every one pending at a moment
    in ``[low, high]``), its dataset's batches committed by ``high`` and its epochs; ``low``
    lowered to the earliest request or deletion among them, so that every point the chain
    asks about (never before a pending epoch's release's request, or an end's deletion) is
    covered."""

    def __init__(
        self, rels: list[_Rel], batches: dict[Any, list[Any]], low: datetime, high: datetime
    ) -> None:
        self.low = low
        self.high = high
        self.rels = rels
        self.deleted = sorted(
            (rel for rel in rels if rel.deleted_at is not None and rel.visible_at is not None),
            key=lambda rel: str(rel.id),
        )
        items: list[tuple[Key, _Rel, Any]] = []
        for rel in rels:
            for batch in batches.get(rel.dataset_id, ()):
                seq = int(batch.seq)
                if seq + 1 <= rel.horizon:
                    at = point(batch.created_at, rel.created_at)
                    items.append(((at, rel.created_at, rel.ident, seq), rel, batch))
        items.sort(key=lambda item: item[0])
        self.items = items
        self.item_points = [item[0][0] for item in items]
        self.one_shot: list[tuple[datetime, datetime, datetime | None, str]] | None = None

    @classmethod
    def read(
        cls, session: Session, continual: tuple[str, ...], low: datetime, high: datetime
    ) -> _Facts:
        """The facts for the moments in ``[low, high]`` (lowered as the class says)."""
        statements = _facts(continual)
        while True:
            found = session.execute(statements[0], {"low": low, "high": high}).all()
            earliest = min(
                (m for row in found for m in (row.created_at, row.deleted_at) if m is not None),
                default=low,
            )
            if earliest >= low:
                break
            low = earliest
        epochs: dict[Any, list[Any]] = {}
        for row in session.execute(statements[1], {"low": low, "high": high}).all():
            epochs.setdefault(row.release_id, []).append(row)
        batches: dict[Any, list[Any]] = {}
        for row in session.execute(statements[2], {"low": low, "high": high}).all():
            batches.setdefault(row.dataset_id, []).append(row)
        rels = []
        for row in found:
            own = sorted(epochs.get(row.id, ()), key=lambda epoch: int(epoch.epoch))
            rels.append(
                _Rel(
                    row.id,
                    row.created_at,
                    row.mechanism,
                    row.k,
                    row.params,
                    row.visible_at,
                    row.outcome_visible_at,
                    row.status,
                    row.dataset_id,
                    row.dataset_rows,
                    row.n_cols,
                    row.deleted_at,
                    int(row.params.get("horizon", 0)),
                    sorted(epoch.visible_at for epoch in own if epoch.visible_at is not None),
                    [
                        (int(epoch.epoch), epoch.reference_check, epoch.reference_shown_at)
                        for epoch in own
                        if epoch.reference_check is not None
                    ],
                    {
                        int(epoch.epoch): epoch.due_at
                        if epoch.due_at is not None
                        else epoch.visible_at
                        for epoch in own
                    },
                    str(row.id),
                )
            )
        return cls(rels, batches, low, high)

    def idle(self, session: Session, at: datetime) -> bool:
        """Whether the one-shot queue (:func:`service.padding_queue.queue_parts`'
        ``only_one_shot`` statement) has no row at ``at`` in ``[low, high]``: no one-shot
        release with a ``visible_at`` requested by ``at`` whose ``visible_at`` is after ``at``
        or whose end is not shown at ``at`` (one statement, the first time: those that may be
        such a row at some moment in ``[low, high]``)."""
        if not self.low <= at <= self.high:
            return False
        if self.one_shot is None:
            names = [name for name, mechanism in MECHANISMS.items() if not mechanism.continual]
            self.one_shot = [
                (row.created_at, row.visible_at, row.outcome_visible_at, row.status)
                for row in session.execute(
                    _ONE_SHOT, {"low": self.low, "high": self.high, "names": names}
                ).all()
            ]
        for created, visible, outcome, status in self.one_shot:
            if created <= at and (
                visible > at
                or (outcome is None and status in ("queued", "running"))
                or (outcome is not None and outcome > at)
            ):
                return False
        return True

    def point(self, at: datetime) -> _Point:
        """The pending list at ``at``: the epochs of the continual releases requested by
        ``at`` whose end is not shown at ``at`` (nor cut by a changed object's verdict shown),
        on each batch committed by ``at`` from the first epoch's not shown at ``at`` on, up to
        the horizon; and the ends pending after a deletion (:class:`_End`)."""
        states: dict[int, int | None] = {}
        keys: list[Key] = []
        rows: list[Any] = []
        first: dict[str, _Row] = {}
        for key, rel, batch in self.items[: bisect.bisect_right(self.item_points, at)]:
            shown = states.get(id(rel), -1)
            if shown == -1:
                shown = states[id(rel)] = rel.shown(at) if rel.unfinished(at) else None
            if shown is None or key[3] < shown:
                continue
            row = rel.rows.get((key[3], shown))
            if row is None:
                row = rel.rows[(key[3], shown)] = _Row(
                    rel.id,
                    rel.created_at,
                    shown,
                    rel.mechanism,
                    rel.k,
                    rel.params,
                    rel.visible_at,
                    rel.dataset_rows,
                    rel.n_cols,
                    rel.deleted_at,
                    key[3],
                    batch.created_at,
                    batch.n_rows,
                    rel.dues.get(shown),
                    rel.ident,
                )
            keys.append(key)
            rows.append(row)
            if rel.deleted_at is not None:
                earlier = first.get(rel.ident)
                if earlier is None or earlier.batch_seq > key[3]:
                    first[rel.ident] = row
        ends: list[tuple[Key, _End]] = []
        for rel in self.deleted:
            assert rel.deleted_at is not None and rel.visible_at is not None
            if rel.created_at > at or rel.deleted_at > at or not rel.unfinished(at):
                continue
            epoch = first.get(rel.ident)
            came = rel.deleted_at if epoch is None else epoch.batch_created_at
            end = _End(rel.id, rel.created_at, came, _END_SEQ, rel.visible_at, rel.deleted_at)
            ends.append((_key(end), end))
        if ends:
            keyed = sorted([*zip(keys, rows, strict=True), *ends], key=lambda pair: pair[0])
            keys = [key for key, _ in keyed]
            rows = [row for _, row in keyed]
        return _Point(keys, rows, [], [key[0] for key in keys])


#: The one-shot releases that may be in the queue at a moment in ``[low, high]``
#: (:meth:`_Facts.idle`).
_ONE_SHOT: Any = select(
    Release.created_at, Release.visible_at, Release.outcome_visible_at, Release.status
).where(
    Release.mechanism.in_(bindparam("names", expanding=True)),
    Release.created_at <= bindparam("high"),
    Release.visible_at.is_not(None),
    or_(Release.visible_at > bindparam("low"), shown_unfinished(bindparam("low"))),
)


@functools.cache
def _facts(continual: tuple[str, ...]) -> tuple[Select[Any], ...]:
    """:class:`_Facts`' three statements (``low``, ``high``): the continual releases requested
    by ``high`` whose end is not shown at ``low`` with their dataset's columns, their epochs,
    and their datasets' batches committed by ``high``. Built once per set of names."""
    low: Any = bindparam("low")
    high: Any = bindparam("high")
    where = (
        Release.mechanism.in_(continual),
        Release.created_at <= high,
        shown_unfinished(low),
    )
    releases: Select[Any] = (
        select(
            Release.id,
            Release.created_at,
            Release.mechanism,
            Release.k,
            Release.params,
            Release.visible_at,
            Release.outcome_visible_at,
            Release.status,
            Release.dataset_id,
            Dataset.n_rows.label("dataset_rows"),
            Dataset.n_cols,
            Dataset.deleted_at,
        )
        .join(Dataset, Dataset.id == Release.dataset_id)
        .where(*where)
    )
    epochs: Any = select(
        ReleaseEpoch.release_id,
        ReleaseEpoch.epoch,
        ReleaseEpoch.visible_at,
        ReleaseEpoch.reference_check,
        ReleaseEpoch.reference_shown_at,
        ReleaseEpoch.due_at,
    ).where(ReleaseEpoch.release_id.in_(select(Release.id).where(*where)))
    batches: Any = select(
        DatasetBatch.dataset_id,
        DatasetBatch.seq,
        DatasetBatch.created_at,
        DatasetBatch.n_rows,
    ).where(
        DatasetBatch.dataset_id.in_(select(Release.dataset_id).where(*where)),
        DatasetBatch.created_at <= high,
    )
    return releases, epochs, batches


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
    epoch before of its own release, and other releases' (a worker runs them first).

    Computed after the point (at the claim, whenever the jobs before let the worker reach
    it): every row stamped by the point is committed before it is read
    (:func:`service.commit_order.settle`), so the answer is the same whenever it is computed."""
    commit_order.settle(session)
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
    commit_order.settle(session)  # as epoch_padding: computed after the deletion
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
    if session.autoflush:
        session.flush()  # as the session's execute would
    # Compiled once, run on the driver's cursor (service.db.prepared): every release request.
    looks = _looks_prepared(tuple(continual_names())).one(session.connection(), {"now": now})
    epochs = epoch_seconds(session, settings, now) if looks.epochs else 0.0
    return queue_seconds(
        session, model, now, registrations=looks.registrations, epochs=epochs, queued=looks.queue
    )


@functools.cache
def _looks_prepared(continual: tuple[str, ...]) -> Prepared:
    return Prepared(_looks(continual))


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
    # Not the registrations by reference pending at the act; :class:`_Chain`'s queue (an
    # epoch's at its point, an end's at the deletion) counts them: the workers take them in
    # the releases' order (:func:`service.claims.registration_ahead`), so an epoch whose point
    # comes after a registration's request waits behind its read, and padded as if it were
    # not there it showed at its visible_at if the read had ended and a step j later if not
    # (tests/continual/test_epoch_behind_a_registration.py: j 0 against 1 before). A
    # registration's moments stay on its dataset, a batch's replaced by its dataset's next
    # batch are kept in batch_moments (migration 0027), so a chain computed after that next
    # request still counts it at an earlier point
    # (tests/continual/test_epoch_behind_an_earlier_batch.py).
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
