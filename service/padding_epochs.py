"""A continual epoch's public moments (:func:`epoch_padding`: what the worker computes when it
claims the epoch) and the padding's term for the pending epochs (:func:`epoch_seconds`): a job
requested while a continual release has an epoch to run waits behind that epoch, so its padding
counts the epoch until the epoch's next public moment.

Apart from :mod:`service.continual` (which imports :mod:`service.jobs`, which imports
:mod:`service.releases`, which pads with :func:`epoch_seconds`) and from
:mod:`service.padding_queue` (an epoch's own queue term, :func:`act_queue_seconds`, is
:func:`service.padding_queue.queue_seconds`). The pending list at a moment, made from the
public facts read once, comes from :mod:`service.padding_epoch_facts`.

Every input is public: the batch's commit (an owner's act) and size, the release's request and
``visible_at``, the settings and the padding model, the one-shot jobs requested by the batch's
commit, and which epochs (and whether the release's end) are *shown* at the moment asked
about. Never whether a worker claimed, ran or stored an epoch before it shows.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

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
from service.mechanisms.registry import MECHANISMS
from service.padding import PaddingModel, next_late_step
from service.padding_epoch_facts import End, Facts, Key, Point, pending_key, point
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
        self.points: dict[datetime, Point] = {}
        self.moments: dict[tuple[Any, int], tuple[datetime, timedelta]] = {}
        #: Each end's due moment after a deletion (:meth:`end_due`), and those being computed.
        self.dues: dict[Any, datetime] = {}
        self.computing: set[Any] = set()
        #: The public facts every pending list is made from (:class:`Facts`, read once).
        self.facts: Facts | None = None

    def queue(self, at: datetime, epochs: float) -> float:
        """The queue term at ``at`` (:func:`act_queue_seconds`) with ``epochs`` the epochs'.
        The one-shot queue is not read at a moment with none in it (:meth:`Facts.idle`:
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

    def pending(self, at: datetime) -> Point:
        """The epochs (and the ends after a deletion: :class:`End`) pending at ``at``, in the
        workers' order, made in Python from the facts read once (:class:`Facts`: the
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
                facts = self.facts = Facts.read(self.session, self.continual, low, high)
            found = facts.point(at)
            self.points[at] = found
        return found

    def end_due(
        self, release_id: Any, created_at: datetime, visible_at: datetime, deleted_at: datetime
    ) -> datetime:
        """The due moment of a padded continual release's end after its dataset's deletion
        (:func:`service.continual._end_visible_at`, and :meth:`moment` of an :class:`End`):
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
                    if isinstance(row, End) and row.release_id == release_id
                ),
                None,
            )
            if own is not None:
                self.computing.add(release_id)
                try:
                    wait = self.ahead(deleted_at, pending_key(own))
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
        after a deletion (:class:`End`: its due moment, its schedule from the request)."""
        if isinstance(row, End):
            due = self.end_due(row.release_id, row.created_at, row.visible_at, row.deleted_at)
            return due, due - row.created_at
        seq = int(row.batch_seq)
        found = self.moments.get((row.ident, seq))
        if found is not None:
            return found
        batch = (row.batch_created_at, row.batch_rows)
        # The batch was committed before any deletion (none after it): the batch's own rows.
        act, n_rows = _act(batch, row.dataset_rows, None)
        key = pending_key(row)
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


_ZERO = timedelta(0)


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
    end a worker stores for it (:class:`End`), by the worker's own formula
    (``tests/continual/test_probe_behind_a_deletion.py``)."""
    if not continual_names():
        return 0.0
    # Every pending epoch is before a job requested at now: the latest over all of them.
    latest = _Chain(session, settings).ahead(now, None)
    return 0.0 if latest is None else max(0.0, (latest - now).total_seconds())
