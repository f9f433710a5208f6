"""What a worker's claims look for: statements built once per process from the job kinds'
public, fixed conditions (never from a job's data).

:data:`~service.jobs.QUEUED_LOOK` takes a queued or expired job; :func:`waiting_look` a job of
one kind that waits with its lease given up and has work again (a continual release with a new
batch); :func:`idle_look` asks, in the transaction that stores a job's end, whether any of
those or a registration (:data:`service.registration.CLAIMABLE`) is claimable, so that an idle
worker need not run an empty claim and an empty registration look after each job.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from sqlalchemy import ColumnElement, Select, bindparam, exists, false, func, or_, select
from sqlalchemy.orm import Session

from service import registration
from service.continual import CONTINUAL, NEXT_BATCH, WORK_SINCE
from service.db.models import Dataset, DatasetBatch, Release
from service.db.prepared import Prepared
from service.jobs import (
    LOCKED_END_COLUMNS,
    QUEUED_CLAIMABLE,
    QUEUED_LOOK,
    JobKind,
    LockedRelease,
)
from service.oneshot import ONE_SHOT
from service.registration_visibility import REQUESTED

#: The job kinds under the worker; a waiting job is looked for in this order.
KINDS: tuple[JobKind[Any, Any], ...] = (ONE_SHOT, CONTINUAL)


def waiting_claimable(kind: JobKind[Any, Any]) -> list[ColumnElement[bool]] | None:
    """What makes a waiting job of ``kind`` claimable (``None``: its jobs never wait)."""
    ready = kind.waiting_claimable()
    if ready is None:
        return None
    return [Release.status == "running", Release.lease_owner.is_(None), *ready]


def waiting_look(kind: JobKind[Any, Any]) -> Select[Any] | None:
    """The oldest claimable waiting job of ``kind`` (one of :data:`KINDS`), locked (skipping
    rows another worker holds); ``None`` when the kind's jobs never wait."""
    return _waiting_looks()[KINDS.index(kind)]


#: :data:`service.continual.WORK_SINCE` and :data:`service.continual.NEXT_BATCH`.
_WORK_SINCE = WORK_SINCE
_NEXT_BATCH = NEXT_BATCH


@functools.cache
def _waiting_looks() -> tuple[Select[Any] | None, ...]:
    looks: list[Select[Any] | None] = []
    for kind in KINDS:
        ready = waiting_claimable(kind)
        looks.append(
            None
            if ready is None
            else select(Release)
            .join(Dataset, Dataset.id == Release.dataset_id)
            .outerjoin(DatasetBatch, _NEXT_BATCH)
            .where(*ready)
            .order_by(_WORK_SINCE, Release.created_at)
            .limit(1)
            .with_for_update(of=Release, skip_locked=True)
        )
    return tuple(looks)


@functools.cache
def waiting_ahead() -> Select[Any]:
    """One statement (bound ``worker_id``): does a waiting job have work that came before the
    oldest queued job was requested? Then the worker takes it first (:meth:`service.worker.
    Worker.claim`).

    Why: a continual release's next epoch is padded from its batch's commit (or its end from
    the deletion) with the queue at that moment (:func:`service.continual.act_queue_seconds`):
    the jobs requested before it. Taken after every queued job, it waited behind jobs requested
    *after* it too, which no padding fixed at the act could count, and whether it showed at its
    ``visible_at`` or a step later told its owner and analysts whether a job requested after
    the batch (any dataset's, its run time possibly depending on one row) had really ended
    (``tests/continual/test_epoch_behind_a_long_job.py``)."""
    oldest = (
        select(func.min(Release.created_at))
        .where(QUEUED_CLAIMABLE)
        .correlate(None)
        .scalar_subquery()
    )
    looks = [
        exists()
        .select_from(
            Release.__table__.join(Dataset.__table__).outerjoin(DatasetBatch.__table__, _NEXT_BATCH)
        )
        .where(*ready, oldest >= _WORK_SINCE)
        # Never correlated: asked as a column of the queued look (:func:`queued_look`), whose
        # own releases and datasets it must not take for its own.
        .correlate(None)
        for ready in (waiting_claimable(kind) for kind in KINDS)
        if ready is not None
    ]
    return select(or_(*looks)) if looks else select(false())


@functools.cache
def registration_ahead() -> Select[Any]:
    """One statement (bound ``worker_id``): is a claimable registration (or batch) by reference
    requested no later than the oldest queued job and before every claimable waiting job's
    work? Then the worker takes it first: :meth:`service.worker.Worker.claim` answers
    ``None`` and the loops run :func:`service.registration.claim`, which takes the
    registration requested first.

    Why: a worker took a registration only when no release waited, so releases requested
    *after* it (any dataset's) ran first. Its padding, fixed at its request, could not count
    them, and whether it showed at its ``visible_at`` or at a step ``j`` of its late schedule
    told its owner (and every analyst, who list the dataset from then) how long those
    releases really ran (``tests/reference/test_registration_behind_later_releases.py``).
    Now every job goes in one public order, the request's moment (a waiting job's: its
    work's, :data:`service.continual.WORK_SINCE`): a release requested behind a registration
    is padded for it (:func:`service.padding_queue.registration_seconds`), a registration
    for the releases and epochs requested before it, and a continual epoch whose point comes
    after it for it (:meth:`service.padding_epochs._Chain.queue`)."""
    oldest = (
        select(func.min(Release.created_at))
        .where(QUEUED_CLAIMABLE)
        .correlate(None)
        .scalar_subquery()
    )
    # The first waiting work of each kind: subqueries of their own (never correlated), so
    # that their datasets are not the registration's.
    firsts = [
        select(func.min(_WORK_SINCE))
        .select_from(
            Release.__table__.join(Dataset.__table__).outerjoin(DatasetBatch.__table__, _NEXT_BATCH)
        )
        .where(*ready)
        .correlate(None)
        .scalar_subquery()
        for ready in (waiting_claimable(kind) for kind in KINDS)
        if ready is not None
    ]
    return select(
        exists()
        .where(
            *registration.CLAIMABLE,
            or_(oldest.is_(None), oldest >= REQUESTED),
            *(or_(first.is_(None), first >= REQUESTED) for first in firsts),
        )
        .correlate(None)
    )


def registration_first(session: Session, found: Any, worker_id: str) -> bool:
    """Whether a registration goes before the claim's jobs (:func:`registration_ahead`):
    ``found``'s column when the queued look found a job (one statement), else asked."""
    if found is not None:
        return bool(found.registration_ahead)
    return bool(
        session.connection().execute(registration_ahead(), {"worker_id": worker_id}).scalar()
    )


@functools.cache
def queued_look() -> Select[Any]:
    """:data:`~service.jobs.QUEUED_LOOK` with :func:`waiting_ahead`'s answer as its column
    ``waiting_ahead``: the claim's first two questions in one statement (one snapshot), read
    on the claim's connection (:meth:`service.worker.Worker.claim`).

    Why one: the claim asked them as two statements on every release; the second cost about
    a third of the claim's CPU at 50,000 x 100 (``bench/bench_release_cpu.py``,
    docs/benchmarks.md, "Release fixed cost, fifth pass"). When no queued job is found the
    answer does not matter: the waiting looks come next either way."""
    return QUEUED_LOOK.add_columns(
        waiting_ahead().scalar_subquery().label("waiting_ahead"),
        registration_ahead().scalar_subquery().label("registration_ahead"),
    )


@functools.cache
def _queued_prepared() -> Prepared:
    return Prepared(queued_look())


def queued(session: Session, worker_id: str) -> Any:
    """:func:`queued_look`'s row (columns, not ORM objects), or ``None``, on the claim's
    connection (:mod:`service.db.prepared`: compiled once, run on the driver's cursor)."""
    return _queued_prepared().first(session.connection(), {"worker_id": worker_id})


@functools.cache
def idle_look() -> Select[Any]:
    """One statement: is anything claimable besides the release ``release_id``? True when
    the queued look, a waiting look (any kind) or :func:`service.registration.claim` would
    find a job now (the same conditions, bound ``worker_id``).

    Asked in the transaction that stores a job's end
    (:meth:`service.worker.Worker._store`): when it answers false, the loops wait at once
    instead of running an empty claim and an empty registration look, two transactions that
    were a fifth of the worker's bookkeeping per small release (``bench/bench_release_cpu.py``,
    docs/benchmarks.md). It locks nothing and only decides whether to look now: a job it
    misses (queued after its snapshot) wakes the idle wait that follows (:mod:`service.wake`)
    or is found at the next poll, as one queued after an empty claim always was; one it sees
    but another worker takes first costs the claim it saves."""
    # Never correlated: asked as a column of the store's lock of its release too
    # (:func:`locked_end_look`), whose release it must not take for its own.
    looks = [
        exists().where(QUEUED_CLAIMABLE, Release.id != bindparam("release_id")).correlate(None)
    ]
    for kind in KINDS:
        ready = waiting_claimable(kind)
        if ready is not None:
            looks.append(
                exists()
                .select_from(Release.__table__.join(Dataset.__table__))
                .where(*ready, Release.id != bindparam("release_id"))
                .correlate(None)
            )
    looks.append(exists().where(*registration.CLAIMABLE).correlate(None))
    return select(or_(*looks)).correlate(None)


@functools.cache
def locked_end_look() -> Select[Any]:
    """:data:`~service.jobs.LOCKED_END_COLUMNS` (the release ``release_id`` locked, as the
    columns its one-shot end is recorded from) with :func:`idle_look`'s answer as its column
    ``anything_claimable`` (bound ``worker_id``): the store transaction's first and last
    questions in one statement (:meth:`service.worker.Worker._stored`).

    Why one: each statement costs the store a tenth of a millisecond or more of its own
    (``bench/bench_release_cpu.py``, docs/benchmarks.md, "Release fixed cost, sixth pass").
    Asked at the transaction's start rather than its end: on SQLite the transaction holds
    the write lock from its start, so no other writer commits in between; on PostgreSQL
    each statement reads its own snapshot either way, and a job queued after it is found as
    :func:`idle_look` says (the idle wait's wake, or the next poll). It locks the release
    alone (``FOR UPDATE OF releases``), never the rows the look reads."""
    return LOCKED_END_COLUMNS.add_columns(idle_look().scalar_subquery().label("anything_claimable"))


@functools.cache
def _locked_end_prepared() -> Prepared:
    return Prepared(locked_end_look())


def locked_end(
    session: Session, release_id: uuid.UUID, worker_id: str
) -> tuple[LockedRelease, bool]:
    """:func:`locked_end_look` on the transaction's connection (:mod:`service.db.prepared`):
    the locked release and whether anything besides it is claimable now."""
    row = _locked_end_prepared().one(
        session.connection(), {"release_id": release_id, "worker_id": worker_id}
    )
    return LockedRelease(row), bool(row.anything_claimable)
