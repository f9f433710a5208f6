"""What a claimed job is, what it ends with, and what a kind of job is: the layer under
:mod:`service.worker` and its job kinds (:mod:`service.oneshot`, :mod:`service.continual`).

The worker owns a job from claim to end: the claim and the lease, the heartbeat, the process a
run is isolated in, the retries while the database is away, the transaction that stores a
result and the recording of the outcome. What differs between one-shot and continual releases
is a :class:`JobKind`, called by the worker and never calling back (neither kind imports
:mod:`service.worker`; ``tests/test_layers.py`` checks it). A job's path, read straight down
in :meth:`service.worker.Worker.process`:

1. ``kind.first(job)``: from the claim alone, the first work, the job's :class:`End`, or
   ``None`` (ask :meth:`JobKind.load`);
2. ``kind.load(session, release, job)``, in a transaction of the worker that holds the release
   locked and leased to it: the next work, the job's end, or :data:`WAITING` (nothing to do
   now: the worker gives the lease up);
3. ``kind.run(work, context)``, in the isolated process (a picklable call): the result, never
   an ``Exception``;
4. ``kind.save(session, release, job, work, result)``, in the worker's transaction, after the
   worker checked that it still holds the lease: :data:`STORED` (go on at 2), :data:`LOST`, or
   the job's :class:`End`, which the worker records (status, basis, refund, audit event, wake).

:class:`JobRunner` is what :mod:`service.registration` (a job on the datasets table) uses of a
worker.
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import sys
import threading
import typing
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Generic, Literal, Protocol, TypeVar

import numpy as np
from sqlalchemy import ColumnElement, Table, and_, bindparam, insert, or_, select, update
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.attributes import set_committed_value
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from service.config import Settings
from service.db.clock import db_now, lease_end
from service.db.models import Dataset, Release, ReleaseBasis
from service.db.prepared import Prepared
from service.mechanisms.base import MechanismOutput
from service.release_calibration import float_not_above
from service.releases import encode_basis
from service.store import DatasetStore

T = TypeVar("T")

#: The one reason of a release whose mechanism raised (a bug): fixed, so it carries no data.
NO_RELEASE_REASON = "the mechanism produced no release"
DATASET_DELETED_REASON = "the dataset was deleted before the release ran"
#: A fault of the data directory (a restore, a lost volume), not of the data: the file is
#: missing, or shorter than the database says, so nothing was read and the cost is refunded.
DATASET_FILE_FAULT_REASON = (
    "the dataset's file is missing or incomplete in the data directory; nothing was read"
)
REFUSED_AT_RUN_REASON = "the release's parameters were refused when it ran"
NO_MECHANISM_REASON = "this service no longer has the mechanism"
ABANDONED_REASON = "the release stopped its worker repeatedly and was abandoned"

FINISHED = ("succeeded", "no_result", "failed")
#: What :meth:`JobKind.load` and :meth:`JobKind.save` answer besides work and ends.
WAITING = "waiting"
LOST = "lost"
STORED = "stored"


#: What makes a release claimable by :data:`QUEUED_LOOK` (bound: ``worker_id``; a lease expires
#: on the database's clock, :mod:`service.db.clock`, as it was set); the worker's idle look
#: (:meth:`service.worker.Worker.idle_look`) asks the same.
QUEUED_CLAIMABLE = or_(
    Release.status == "queued",
    and_(
        Release.status == "running",
        or_(
            Release.lease_expires_at < db_now(),
            Release.lease_owner == bindparam("worker_id"),
        ),
    ),
)
#: The claim's look for a queued job or an expired (or this worker's) lease, with the dataset's
#: columns (the lease reads its file name), locked; what :func:`queued_claim` reads. Columns,
#: not ORM objects: building a release and a dataset object and flushing the release's changes
#: at the commit was about half of a claim's CPU (``bench/bench_release_cpu.py``); the abandoned
#: job, rare, still goes through the ORM (:meth:`service.worker.Worker._queued`). Statements of
#: every release are built once, with bound parameters: building one anew cost about a third of
#: running it.
QUEUED_LOOK = (
    select(
        Release.id,
        Release.dataset_id,
        Release.mechanism,
        Release.k,
        Release.epsilon,
        Release.delta,
        Release.params,
        Release.attempts,
        Release.n_rows_read,
        Release.traceparent,
        Release.created_at,
        Dataset.id.label("dataset_found"),
        Dataset.file_name,
        Dataset.reference,
        Dataset.privacy_unit_column,
    )
    .outerjoin(Dataset, Dataset.id == Release.dataset_id)
    .where(QUEUED_CLAIMABLE)
    .order_by(Release.created_at)
    .limit(1)
    .with_for_update(of=Release.__table__, skip_locked=True)
)


def lease_update(seconds: float) -> Any:
    """The claim's write of a queued release's lease (bound: ``release_id``, ``attempts``,
    ``worker_id``, ``started_at``): what :func:`take_lease` sets on a release object, as one
    statement built once per worker (the lease's length is the worker's setting)."""
    return (
        update(Release)
        .where(Release.id == bindparam("release_id"))
        .values(
            status="running",
            attempts=bindparam("attempts"),
            lease_owner=bindparam("worker_id"),
            lease_expires_at=lease_end(seconds),
            started_at=bindparam("started_at"),
        )
    )


def queued_claim(
    session: Session, found: Any, worker_id: str, now: datetime, lease_write: Prepared
) -> ClaimedJob:
    """Lease the release of the row ``found`` (:data:`QUEUED_LOOK`, locked by that look)
    to ``worker_id`` and describe the job: :func:`take_lease` on the row's columns, one
    ``UPDATE`` on the claim's connection (``lease_write``: :func:`lease_update`, prepared,
    :mod:`service.db.prepared`). One more attempt is counted."""
    attempt = found.attempts + 1
    lease_write.run(
        session.connection(),
        {"release_id": found.id, "attempts": attempt, "worker_id": worker_id, "started_at": now},
    )
    dataset = found.dataset_found is not None
    return ClaimedJob(
        release_id=found.id,
        dataset_id=found.dataset_id,
        mechanism=found.mechanism,
        k=found.k,
        epsilon=float_not_above(found.epsilon),
        delta=float_not_above(found.delta),
        params=dict(found.params),
        file_name=found.file_name if dataset else None,
        attempt=attempt,
        n_rows=found.n_rows_read,
        reference=found.reference if dataset else None,
        traceparent=found.traceparent,
        queued_at=found.created_at,
        claimed_at=now,
        person_level=dataset and found.privacy_unit_column is not None,
    )


#: A claimed release, locked for the transaction that stores its outcome or loads its work.
LOCKED_RELEASE = select(Release).where(Release.id == bindparam("release_id")).with_for_update()

_RELEASES = typing.cast(Table, Release.__table__)
#: The columns a one-shot job's end is recorded from (:meth:`service.worker.Worker._record`):
#: the lease check, the audit event's details, the visibility schedule.
_END_COLUMNS = (
    "id",
    "dataset_id",
    "mechanism",
    "k",
    "epsilon",
    "delta",
    "cost_rho",
    "cost_delta",
    "status",
    "attempts",
    "lease_owner",
    "created_at",
    "visible_at",
    "outcome_visible_at",
    "result_sha256",
)
#: :data:`LOCKED_RELEASE` as those columns (the same row lock, the same bound ``release_id``).
LOCKED_END_COLUMNS = (
    select(*(_RELEASES.c[name] for name in _END_COLUMNS))
    .where(_RELEASES.c.id == bindparam("release_id"))
    .with_for_update(of=_RELEASES)
)


class LockedRelease:
    """A locked release's :data:`_END_COLUMNS` as plain attributes, for recording a one-shot
    job's end without an ORM object (:meth:`service.worker.Worker._stored`).

    Why: loading the release as an ORM object (its row's 36 columns through the identity map)
    cost the store transaction 0.2-0.3 ms, about a tenth of it (``bench/bench_release_cpu.py``,
    docs/benchmarks.md, "Release fixed cost, sixth pass"). Everything
    written to it goes through :class:`ReleaseEnd`, which writes the row at once; nothing is
    left for the ORM to flush. Read where ``_record`` reads a :class:`Release` (the same
    attribute names and values: the columns' own types)."""

    id: uuid.UUID
    dataset_id: uuid.UUID
    mechanism: str
    k: int
    epsilon: Decimal
    delta: Decimal
    cost_rho: Decimal | None
    cost_delta: Decimal | None
    status: str
    attempts: int
    lease_owner: str | None
    created_at: datetime
    visible_at: datetime | None
    outcome_visible_at: datetime | None
    result_sha256: str | None

    def __init__(self, row: Any) -> None:
        for name in _END_COLUMNS:
            setattr(self, name, getattr(row, name))


#: A stored basis's row, built once (:func:`add_basis`).
_INSERT_BASIS = Prepared(insert(typing.cast(Table, ReleaseBasis.__table__)))


def add_basis(session: Session, release_id: uuid.UUID, epoch: int, basis: bytes) -> None:
    """Write a release's basis row at once on the transaction's connection (its release row
    exists and is locked): an ORM object flushed with the release's end cost the store about
    a millisecond (``bench/bench_release_cpu.py``)."""
    _INSERT_BASIS.run(
        session.connection(), {"release_id": release_id, "epoch": epoch, "basis": basis}
    )


class ReleaseEnd:
    """The columns a job's end sets on its release (:meth:`service.worker.Worker._record`),
    each held on the object as written (``set_committed_value``: nothing for the ORM to flush)
    and written at once by :meth:`write` as one ``UPDATE`` built once per set of columns.

    Why: the ORM's flush of the release's end, the unit of work around one ``UPDATE``, was
    about a fifth of the store transaction's CPU at 50,000 x 100 (``bench/
    bench_release_cpu.py``, docs/benchmarks.md, "Release fixed cost, fifth pass"). Changes an
    earlier step left pending on the object (a continual save's, an abandoned job's lease
    owner) are flushed by the ORM as before; a column set here again is written here only."""

    def __init__(self, release: Release | LockedRelease) -> None:
        self.release = release
        self.values: dict[str, Any] = {}
        #: A basis row held for :meth:`write` (PostgreSQL: :meth:`add_basis`).
        self.basis: dict[str, Any] | None = None

    def add_basis(self, session: Session, basis: bytes) -> None:
        """The release's basis row (epoch 0): on PostgreSQL written by :meth:`write` in the
        same statement as the end (a data-modifying ``WITH``: one statement's overhead less
        per release, docs/benchmarks.md, "Release fixed cost, sixth pass"); elsewhere at once
        (:func:`add_basis`). Either way the basis precedes the end's ``UPDATE`` or goes with
        it, before the audit chain's head is locked."""
        if session.get_bind().dialect.name == "postgresql":
            self.basis = {
                "basis_release_id": self.release.id,
                "basis_epoch": 0,
                "basis_bytes": basis,
            }
        else:
            add_basis(session, self.release.id, 0, basis)

    def __setitem__(self, key: str, value: Any) -> None:
        self.values[key] = value
        if isinstance(self.release, LockedRelease):
            setattr(self.release, key, value)
        else:
            set_committed_value(self.release, key, value)

    def write(self, session: Session) -> None:
        """The ``UPDATE`` on the transaction's connection (the row is locked: the store's
        first statement); before the audit chain's head is locked, as the flush it replaces."""
        if self.basis is not None:
            _END_UPDATE_WITH_BASIS.run(
                session.connection(), {**self.values, **self.basis, "id_": self.release.id}
            )
        elif self.values:
            _END_UPDATE.run(session.connection(), {**self.values, "id_": self.release.id})


#: :class:`ReleaseEnd`'s ``UPDATE``: its ``SET`` clause is the columns given (one form per
#: set of columns, each compiled once: :mod:`service.db.prepared`).
_END_UPDATE_STATEMENT = update(typing.cast(Table, Release.__table__)).where(
    typing.cast(Table, Release.__table__).c.id == bindparam("id_")
)
_END_UPDATE = Prepared(_END_UPDATE_STATEMENT)
_BASES = typing.cast(Table, ReleaseBasis.__table__)
#: PostgreSQL: :data:`_END_UPDATE` with the basis row's insert (:meth:`ReleaseEnd.add_basis`).
_END_UPDATE_WITH_BASIS = Prepared(
    _END_UPDATE_STATEMENT.add_cte(
        insert(_BASES)
        .values(
            release_id=bindparam("basis_release_id", type_=_BASES.c.release_id.type),
            epoch=bindparam("basis_epoch", type_=_BASES.c.epoch.type),
            basis=bindparam("basis_bytes", type_=_BASES.c.basis.type),
        )
        .cte("stored_basis")
    )
)


@dataclass(frozen=True)
class ClaimedJob:
    release_id: uuid.UUID
    dataset_id: uuid.UUID
    mechanism: str
    k: int
    epsilon: float
    delta: float
    params: dict[str, Any]
    file_name: str | None
    attempt: int
    #: The prefix of the dataset a one-shot release reads (rows present at its request); null
    #: for releases made before datasets could grow (they read the upload's rows).
    n_rows: int | None = None
    #: ``datasets.reference`` of a dataset registered by reference (:mod:`service.reference`).
    reference: dict[str, Any] | None = None
    #: The request's trace context and times, for the worker's spans (service.tracing).
    traceparent: str | None = None
    queued_at: datetime | None = None
    claimed_at: datetime | None = None
    #: The dataset's privacy unit is a person (``privacy_unit_column``): the worker bounds each
    #: person's contribution before the mechanism reads the rows (:mod:`service.privacy_unit`).
    person_level: bool = False


def take_lease(
    session: Session,
    release: Release,
    worker_id: str,
    now: datetime,
    lease: timedelta,
    n_rows: int | None,
) -> ClaimedJob:
    """Lease ``release`` (locked by the caller's claim query) to ``worker_id`` and describe the
    job; one more attempt is counted. Shared by one-shot and continual claims."""
    dataset = session.get(Dataset, release.dataset_id)
    release.attempts += 1
    release.lease_owner = worker_id
    # The database's clock, as every lease check uses (service.db.clock); ``now`` (this
    # worker's clock) only stamps when it started.
    release.lease_expires_at = lease_end(lease.total_seconds())
    release.started_at = now
    return ClaimedJob(
        release_id=release.id,
        dataset_id=release.dataset_id,
        mechanism=release.mechanism,
        k=release.k,
        epsilon=float_not_above(release.epsilon),
        delta=float_not_above(release.delta),
        params=dict(release.params),
        file_name=dataset.file_name if dataset is not None else None,
        attempt=release.attempts,
        n_rows=n_rows,
        reference=dataset.reference if dataset is not None else None,
        traceparent=release.traceparent,
        queued_at=release.created_at,
        claimed_at=now,
        person_level=dataset is not None and dataset.privacy_unit_column is not None,
    )


@dataclass(frozen=True)
class Outcome:
    """What a run ends with, ready to store: computed once, kept while the database is away."""

    status: Literal["succeeded", "no_result", "failed"]
    reason: str | None = None
    refund: bool = False
    #: ``(bytes, shape, sha256)`` of the basis, encoded before any transaction opens.
    basis: tuple[bytes, list[int], str] | None = None
    extras: dict[str, Any] | None = None

    @classmethod
    def failed(cls, reason: str, *, refund: bool = False) -> Outcome:
        return cls(status="failed", reason=reason, refund=refund)

    @classmethod
    def of(cls, output: MechanismOutput) -> Outcome:
        extras = json_safe(output.extras)
        if output.no_result_reason is not None:
            return cls(status="no_result", reason=output.no_result_reason, extras=extras)
        basis = encode_basis(output.basis) if output.basis is not None else None
        return cls(status="succeeded", basis=basis, extras=extras)


class WorkerStopping(Exception):
    """A stop was requested while a database operation was being retried."""


def json_safe(value: Any) -> Any:
    """Extras as JSON values: numpy to Python, non-finite floats to null."""
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, np.generic):
        return json_safe(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def die_with_parent(parent: int) -> None:
    """Make this (forked) process end when its parent does: a SIGKILLed worker must not leave
    a run computing on (Linux: ``PR_SET_PDEATHSIG``; elsewhere the run ends at its result)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the call above
        os._exit(1)


@contextmanager
def blas_threads(settings: Settings) -> Iterator[None]:
    """BLAS limited to ``DPSS_WORKER_BLAS_THREADS`` threads (0: unchanged) while inside: in a
    worker's isolated runs and in its calibration alike, so that the padding's model
    (:mod:`service.padding`) is timed as the runs it covers are run."""
    threads = settings.worker_blas_threads
    with threadpool_limits(limits=threads, user_api="blas") if threads > 0 else nullcontext():
        yield


@dataclass(frozen=True)
class End:
    """A job's end: ``outcome``, shown to analysts from ``visible_at`` on (``None``: when the
    job's kind says, :meth:`JobKind.shown_at`)."""

    outcome: Outcome
    visible_at: datetime | None = None


@dataclass(frozen=True)
class RunContext:
    """What a run may use besides its work: the worker's store and settings (the isolated
    process has them from the fork) and a label for logs."""

    store: DatasetStore
    settings: Settings
    label: str


W = TypeVar("W")
R = TypeVar("R")


@dataclass(frozen=True)
class Run(Generic[W, R]):
    """``kind.run(work, context)`` as a picklable call for the isolated process (the kind is a
    module-level object, pickled by reference)."""

    kind: JobKind[W, R]
    work: W
    context: RunContext

    def __call__(self) -> R:
        return self.kind.run(self.work, self.context)


class JobKind(Protocol[W, R]):
    """A kind of release job, below the worker (module docstring). ``W`` is a unit of work
    (picklable), ``R`` what running it gives (picklable)."""

    #: Whether the job can wait between works with its lease given up (continual releases).
    resumable: bool

    def first(self, job: ClaimedJob, context: RunContext) -> W | End | None: ...

    def load(
        self, session: Session, release: Release, job: ClaimedJob, settings: Settings
    ) -> W | End | str: ...

    def run(self, work: W, context: RunContext) -> R: ...

    def save(
        self,
        session: Session,
        release: Release,
        job: ClaimedJob,
        work: W,
        result: R,
        settings: Settings,
    ) -> End | str: ...

    def saved(self, job: ClaimedJob, work: W) -> None:
        """After a :data:`STORED` commit (a log line; the fault tests stop a worker here)."""

    def shown_at(self, release: Release, ended_at: datetime) -> datetime | None:
        """``outcome_visible_at`` of a release of this kind ending at ``ended_at`` without a
        moment of its own (:attr:`End.visible_at` ``None``)."""
        ...

    def late(self, release: Release, ended_at: datetime) -> bool:
        """Whether ending at ``ended_at`` is late, past the moment promised at the request (the
        worker logs it once per release: :meth:`service.worker.Worker._record`)."""
        ...

    def abandoned(self, session: Session, release: Release, settings: Settings) -> End:
        """The end of a job of this kind abandoned after too many attempts."""
        ...

    def waiting_claimable(self) -> list[ColumnElement[bool]] | None:
        """Where a waiting job of this kind has work again (claim conditions on ``Release``
        joined with ``Dataset``); ``None``: jobs of this kind never wait."""
        ...


class JobRunner(Protocol):
    """What :mod:`service.registration` uses of a :class:`service.worker.Worker`."""

    session_factory: sessionmaker[Session]
    store: DatasetStore
    settings: Settings
    worker_id: str
    stop: threading.Event
    isolate: bool

    def with_db_retry(
        self,
        operation: str,
        attempt: Callable[[], T],
        wait: Callable[[float], bool] | None = None,
    ) -> T: ...

    def isolated(self, what: str, work: Callable[[], T]) -> T | None: ...
