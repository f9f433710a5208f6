"""Registering a dataset by reference as a job the owner polls (issue 30, item 8).

Reading and digesting the objects takes minutes for gigabytes (117-146 s for 3.7 GiB), too
long for one HTTP request: a proxy time-out or a client that disconnects could cut it.

**Request** (:func:`request_registration`, one short transaction in the API): what needs no
read is checked at once and refused with 4xx, nothing kept: the fields and budgets, the URI's
form, NUL bytes, containment under ``DPSS_REFERENCE_ROOTS``, the columns, and the duplicates
decidable without reading (the URI is an object another live dataset covers, or a prefix
holding one, by the recorded objects' names: nothing is listed; or it overlaps a registration
still running). The dataset is created ``registering`` (``n_rows`` 0,
``n_cols`` the columns named) with its ``dataset_created`` and ``budget_set`` events (the
audit log's every dataset has both), and the answer is 202.

**Job**: the datasets table is the queue, as the releases table is for releases. A worker
claims a ``registering`` dataset whose lease is free or expired (``FOR UPDATE SKIP LOCKED`` on
PostgreSQL), heartbeats its lease while :func:`service.reference.inspect` reads, digests and
checks every object (in the worker's run process when it isolates runs), and ends it in one
transaction, only if it still holds the lease and the dataset is live and ``registering``:

- ``ready``: ``n_rows``, ``n_cols``, the reference and the objects it covers (the unique
  constraints decide between racing registrations), with a ``dataset_referenced`` event;
- ``failed`` with the reason the synchronous 4xx gave (``"uri: ..."``, ``"columns: ..."``),
  never a value, with a ``dataset_registration_failed`` event. A failed dataset takes no
  release, grant or batch (409 ``dataset_not_ready``, as a registering one); its owner sees
  the reason and deletes it.

**Batches** (:func:`request_batch`, ``POST /v1/dataset-references/{id}/batches``): a ``ready``
dataset by reference grows by a batch of new objects, registered the same way before it counts.
The request checks what needs no read (the URI under the roots, on the dataset's kind of
storage, with the dataset's columns; not an object this or another live dataset covers nor a
prefix holding one, such as batch 0's prefix again, nor overlapping a registration running; a
dataset with room for a batch at all), refusing with a 4xx that keeps nothing, and marks the
dataset ``batch_status = registering`` (one batch at a time, 409 ``batch_registering``); the
dataset stays usable meanwhile. The same workers claim it with the same lease columns (free:
the dataset's own registration has ended) and :func:`service.reference.inspect` reads its
objects. Only at the end, in one transaction, does it become a batch: its objects and row
groups join ``datasets.reference`` (the rows numbered after the dataset's), its
``dataset_batches`` row is added with ``n_rows``/``n_batches``, the objects are covered, and a
``dataset_batch_referenced`` event written; so releases and continual epochs never see it
registering, and waiting continual releases are woken. A refusal leaves the dataset as it was,
``batch_status = failed`` with ``batch_reason`` (the owner's only): what only a read shows (no
``*.parquet`` object under a prefix, fewer than 2 rows, a value, a copy of a covered object)
and, the backstop, objects another registration came to cover after the request.

A worker that dies mid-read leaves the job to its lease; after ``DPSS_WORKER_MAX_ATTEMPTS``
claims it ends ``failed`` (:data:`ABANDONED_REASON`). Nothing of the data leaves this module
but the public shape and the digests (the registration's reason names a field, an object, a
row number or a count, as the 4xx answers did).
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, func, or_, select, update
from sqlalchemy.orm import Session

from api_schemas.datasets import DatasetReferenceBatchCreate, DatasetReferenceCreate
from service import audit, commit_order, reference, wake
from service import registration_visibility as shown
from service.audit_events import record_digest
from service.auth import Principal
from service.config import Settings
from service.datasets import cover_objects, lock_own_dataset, register_dataset
from service.db.clock import db_now, lease_end
from service.db.models import (
    BatchMoments,
    Dataset,
    DatasetBatch,
    DatasetReferenceObject,
    utcnow,
)
from service.errors import (
    BatchRegistering,
    DomainError,
    InvalidInput,
    ObjectRegistered,
    PayloadTooLarge,
    safe_traceback,
)
from service.jobs import JobRunner
from service.padding_epochs import request_queue_seconds
from service.padding_queue import padding_model
from service.store import DatasetStore, StoredMatrix

#: The key of ``dataset_referenced`` and ``dataset_batch_referenced`` events holding the digest
#: (:func:`~service.audit_events.record_digest`) of the whole ``datasets.reference`` after the
#: event: every object, row group and chunk digest the budget is bound to, which ``dpss audit
#: verify`` compares with the stored record (events written before it carry the objects only).
REFERENCE_DIGEST_FIELD: str | None = "reference_sha256"

log = logging.getLogger("dpss.registration")

REGISTERING, READY, FAILED = "registering", "ready", "failed"
ABANDONED_REASON = (
    "uri: the registration was abandoned after {attempts} attempts (its worker kept stopping "
    "while reading the objects); nothing is registered"
)
BUG_REASON = "uri: the objects could not be checked (an internal error); nothing is registered"


def request_registration(
    session: Session,
    store: DatasetStore,
    principal: Principal,
    form: DatasetReferenceCreate,
    settings: Settings,
) -> Dataset:
    """Check what needs no read and create the dataset ``registering`` (module docstring)."""
    location, path = reference.check_request(form.uri, form.columns, settings)
    key = reference.object_key(location, path)
    _refuse_taken(session, key)
    stored = StoredMatrix(
        file_name=reference.REFERENCE_FILE_NAME, n_rows=0, n_cols=len(form.columns)
    )
    dataset = register_dataset(session, store, principal, form, stored, settings.default_accounting)
    dataset.registration_status = REGISTERING
    dataset.registration_request = {"uri": form.uri, "columns": list(form.columns), "key": key}
    # Its end shows at a public moment, not when a worker (free once no release waits) ends it.
    dataset.registration_visible_at = shown.visible_at(
        dataset.created_at, settings, _queue_seconds(session, settings, dataset.created_at)
    )
    audit.record(
        session,
        "dataset_registration_requested",
        actor_key_id=principal.key_id,
        dataset_id=dataset.id,
        details={"uri": form.uri, "columns": list(form.columns)},
    )
    wake.announce(session, settings)  # idle workers look for jobs at commit
    session.flush()
    return dataset


def _queue_seconds(session: Session, settings: Settings, now: datetime) -> float:
    """The modelled time of the one-shot releases ahead of a registration requested at
    ``now`` (:func:`service.padding_queue.queue_seconds`): public facts fixed at the request."""
    model = padding_model(session, settings, now)
    return request_queue_seconds(session, settings, model, now)


def _refuse_taken(session: Session, key: str, dataset: Dataset | None = None) -> None:
    """409 ``object_registered`` for a URI that is an object a live dataset covers, or a prefix
    (a directory) holding one, or that overlaps a registration (of a dataset or of a batch)
    still running. ``dataset``: the dataset a batch is for (its own objects are named as such).

    What a URI names is decided without a read: every object it lists is ``key`` itself or
    under ``key + "/"`` (S3's listing under a prefix, a walk of a resolved directory whose
    objects are recorded by resolved path), so a recorded object named so would be listed,
    and refused by :func:`service.datasets.cover_objects` when the worker ends the job.
    Refused here, nothing is kept; that refusal stays the backstop for registrations that
    race (and for copies of an object's bytes, which only a read finds)."""
    # First, registrations in progress *as shown* (really, or ended and not yet shown): a
    # registration's objects are recorded when a worker ends it, and it may fail; deciding by
    # the recorded objects or the real status would tell the requester when the worker
    # reached it, that is when the releases ahead of it (on any dataset) ended. Every object a
    # registration records lies at or under its request's key, so a URI naming one overlaps
    # that key: refused here in the same words, whatever the worker did.
    registering, batch_registering = shown.registering_as_shown(utcnow())
    running = [
        *session.execute(
            select(Dataset.registration_request).where(registering, Dataset.deleted_at.is_(None))
        ).scalars(),
        *session.execute(
            select(Dataset.batch_request).where(batch_registering, Dataset.deleted_at.is_(None))
        ).scalars(),
    ]
    for request in running:
        if request is None or request.get("key") is None:
            continue
        other = str(request["key"])
        if other == key or other.startswith(key + "/") or key.startswith(other + "/"):
            raise ObjectRegistered(
                f"uri: {key} overlaps a registration still in progress ({other}); wait for it "
                "to end (or delete its dataset)"
            )
    taken = session.execute(
        select(DatasetReferenceObject.object_key, DatasetReferenceObject.dataset_id).where(
            DatasetReferenceObject.key_sha256 == reference.key_digest(key)
        )
    ).first()
    if taken is None:
        # Exact prefix comparison (substr, not LIKE: SQLite's LIKE ignores ASCII case, and
        # '_' and '%' may be in keys). A scan of the covered objects' keys, an owner's
        # occasional request; the keys are not indexed (a long path would not fit a B-tree
        # page, DatasetReferenceObject).
        prefix = key if key.endswith("/") else key + "/"
        taken = session.execute(
            select(DatasetReferenceObject.object_key, DatasetReferenceObject.dataset_id)
            .where(func.substr(DatasetReferenceObject.object_key, 1, len(prefix)) == prefix)
            .order_by(DatasetReferenceObject.object_key)
            .limit(1)
        ).first()
    if taken is not None:
        covered, owner = str(taken[0]), taken[1]
        named = key if covered == key else f"{key} holds {covered}, which"
        if dataset is not None and owner == dataset.id:
            seq = _batch_holding(session, dataset, covered)
            raise ObjectRegistered(
                f"uri: {named} is already covered by this dataset "
                f"({'an earlier batch' if seq is None else f'batch {seq}'}); a batch names only "
                "new objects: their keys, or a prefix holding no object the dataset covers"
            )
        raise ObjectRegistered(
            f"uri: {named} is already covered by another live dataset; one dataset per object, "
            "so that its rows have one budget (delete that dataset first to register it again)"
        )


def _batch_holding(session: Session, dataset: Dataset, key: str) -> int | None:
    """The sequence number of the batch of ``dataset`` whose rows ``key``'s object holds (its
    first row group's offset among the batches' row ranges); None for an object without rows."""
    assert dataset.reference is not None
    location = reference.Location(str(dataset.reference["protocol"]))
    offsets = [
        int(piece[2])
        for piece in dataset.reference.get("pieces", [])
        if reference.object_key(location, str(piece[0])) == key
    ]
    if not offsets:
        return None
    seq = session.execute(
        select(DatasetBatch.seq)
        .where(DatasetBatch.dataset_id == dataset.id, DatasetBatch.row_offset <= min(offsets))
        .order_by(DatasetBatch.seq.desc())
        .limit(1)
    ).scalar_one_or_none()
    return None if seq is None else int(seq)


def request_batch(
    session: Session,
    principal: Principal,
    dataset_id: uuid.UUID,
    form: DatasetReferenceBatchCreate,
    settings: Settings,
) -> Dataset:
    """Check what needs no read and mark the owner's dataset's next batch ``registering``
    (module docstring, Batches); under the dataset's lock, as a stored append."""
    dataset = lock_own_dataset(session, principal, dataset_id)  # owner, live, ready
    if dataset.reference is None:
        raise InvalidInput(
            "uri",
            f"dataset {dataset_id} was uploaded, not registered by reference: append its rows "
            "with POST /v1/datasets/{id}/rows",
        )
    if dataset.batch_status == REGISTERING or shown.batch_hidden(dataset, utcnow()):
        # A batch that ended but is not shown yet is still registering to the owner: else
        # this answer would tell when it ended.
        raise BatchRegistering(
            f"dataset {dataset_id} has a batch still registering; poll GET /v1/datasets/{{id}} "
            "until batch_status is no longer registering, then append the next one"
        )
    columns = [str(c) for c in dataset.reference["columns"]]
    if form.columns is not None and list(form.columns) != columns:
        raise InvalidInput(
            "columns", f"a batch has the dataset's columns, in its order: {', '.join(columns)}"
        )
    location, path = reference.check_request(form.uri, columns, settings)
    if location.protocol != dataset.reference["protocol"]:
        raise InvalidInput(
            "uri",
            f"the dataset's objects are on {dataset.reference['protocol']!r} storage; a batch "
            "is on the same",
        )
    key = reference.object_key(location, path)
    _refuse_taken(session, key, dataset)
    _refuse_full(dataset, settings)
    if dataset.batch_requested_at is not None:
        # The batch before keeps its moments (shown by now, so fixed): the padding's term at a
        # moment it was pending still counts it (a chain computed late, at an earlier point).
        session.add(
            BatchMoments(
                dataset_id=dataset.id,
                requested_at=dataset.batch_requested_at,
                visible_at=dataset.batch_visible_at,
                shown_at=dataset.batch_shown_at,
            )
        )
    dataset.batch_status = REGISTERING
    dataset.batch_reason = None
    dataset.batch_request = {"uri": form.uri, "key": key}
    requested_at = commit_order.stamp(session)  # in the commit order (service.commit_order)
    dataset.batch_requested_at = requested_at
    dataset.batch_visible_at = shown.visible_at(
        requested_at, settings, _queue_seconds(session, settings, requested_at)
    )
    dataset.batch_shown_at = None
    dataset.batch_prior_rows = None
    dataset.registration_attempts = 0
    dataset.registration_lease_owner = None
    dataset.registration_lease_expires_at = None
    audit.record(
        session,
        "dataset_batch_requested",
        actor_key_id=principal.key_id,
        dataset_id=dataset.id,
        details={"uri": form.uri, "seq": dataset.n_batches},
    )
    wake.announce(session, settings)
    session.flush()
    return dataset


def _refuse_full(dataset: Dataset, settings: Settings) -> None:
    """Refuse (naming ``uri``) a batch that no objects could make fit: a batch holds at least
    one object and at least 2 rows (:func:`service.reference.inspect`), and
    :func:`_finish_batch` refuses a dataset that would then cover more than ``MAX_OBJECTS``
    objects (422 here, as a registration listing more) or exceed ``DPSS_MAX_DATASET_BYTES``
    (413 here, as a stored append or a registration past it); its checks stay for the batch's
    real size."""
    assert dataset.reference is not None
    objects = len(dataset.reference.get("objects", []))
    if objects >= reference.MAX_OBJECTS:
        raise InvalidInput(
            "uri",
            f"the dataset covers {objects} objects, the most a dataset by reference may "
            f"({reference.MAX_OBJECTS}); register the data as a new dataset",
        )
    least = dataset.n_rows + 2
    if 8 * least * dataset.n_cols > settings.max_dataset_bytes:
        raise PayloadTooLarge(
            f"uri: the dataset with any batch (at least {least} rows x {dataset.n_cols} columns "
            f"x 8 bytes) is larger than {settings.max_dataset_bytes} bytes "
            "(DPSS_MAX_DATASET_BYTES); register the data as a new dataset",
        )


# -- the job ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegistrationJob:
    dataset_id: uuid.UUID
    attempt: int
    uri: str
    columns: list[str]
    #: A batch of a ready dataset (``batch_status``), not the dataset's own registration.
    batch: bool = False


@dataclass(frozen=True)
class Checked:
    """What reading the objects ended with: the reference to store, or the 4xx-style reason
    (picklable: it comes back from the worker's run process)."""

    reference: dict[str, Any] | None = None
    reason: str | None = None


#: What makes a registration claimable (bound: ``worker_id``; leases on the database's clock,
#: :mod:`service.db.clock`): :data:`_CLAIMABLE`'s conditions, which the worker's idle look
#: (:meth:`service.worker.Worker.idle_look`) asks too.
CLAIMABLE = (
    or_(Dataset.registration_status == REGISTERING, Dataset.batch_status == REGISTERING),
    Dataset.deleted_at.is_(None),
    or_(
        Dataset.registration_lease_owner.is_(None),
        Dataset.registration_lease_expires_at < db_now(),
        Dataset.registration_lease_owner == bindparam("worker_id"),
    ),
)
#: The claimable registration requested first (its batch's request for a batch: ordered by the
#: dataset's creation, a batch on an old dataset went before registrations requested before it),
#: built once: an idle worker looks after every job.
_CLAIMABLE = (
    select(Dataset)
    .where(*CLAIMABLE)
    .order_by(shown.REQUESTED, Dataset.created_at)
    .limit(1)
    .with_for_update(skip_locked=True)
)


def claim(worker: JobRunner) -> RegistrationJob | None:
    """The ``registering`` dataset (or batch) requested first whose lease is free, expired or
    this worker's."""
    lease = timedelta(seconds=worker.settings.worker_lease_seconds)
    while True:
        with worker.session_factory.begin() as session:
            dataset = session.execute(
                _CLAIMABLE, {"worker_id": worker.worker_id}
            ).scalar_one_or_none()
            if dataset is None:
                return None
            batch = dataset.registration_status != REGISTERING
            if dataset.registration_attempts >= worker.settings.worker_max_attempts:
                reason = ABANDONED_REASON.format(attempts=dataset.registration_attempts)
                (_fail_batch if batch else _fail)(session, dataset, reason)
                continue
            request = (dataset.batch_request if batch else dataset.registration_request) or {}
            columns = (dataset.reference or {}).get("columns", []) if batch else None
            dataset.registration_attempts += 1
            dataset.registration_lease_owner = worker.worker_id
            dataset.registration_lease_expires_at = lease_end(lease.total_seconds())
            return RegistrationJob(
                dataset_id=dataset.id,
                attempt=dataset.registration_attempts,
                uri=str(request.get("uri", "")),
                columns=[
                    str(c) for c in (request.get("columns", []) if columns is None else columns)
                ],
                batch=batch,
            )


def check(job: RegistrationJob, settings: Settings) -> Checked:
    """Read, digest and check the objects (:func:`service.reference.inspect`); never raises an
    ``Exception``: a refusal becomes its reason, a bug a fixed reason."""
    try:
        found = reference.inspect(job.uri, job.columns, settings)
    except DomainError as refused:
        return Checked(reason=refused.detail)
    except Exception as exc:
        log.error("BUG: registration of %s: %s", job.dataset_id, safe_traceback(exc))
        return Checked(reason=BUG_REASON)
    return Checked(reference=found.to_json())


def process(worker: JobRunner, job: RegistrationJob) -> str:
    """Run a claimed registration to its end; the status stored (or ``lost``/``unstored``)."""
    done = threading.Event()
    beat = threading.Thread(target=_beat, args=(worker, job, done), daemon=True)
    beat.start()
    try:
        # A picklable call (the worker's run process takes only those).
        work: Callable[[], Checked] = functools.partial(check, job, worker.settings)
        checked = (
            worker.isolated(f"registration {job.dataset_id}", work) if worker.isolate else work()
        )
    finally:
        done.set()
        beat.join()
    if checked is None:
        return "unstored"  # the child died: left to the lease, counted as an attempt
    try:
        return worker.with_db_retry("registration", lambda: _finish(worker, job, checked))
    except ObjectRegistered as refused:
        # The objects' cover lost to a concurrent registration: a failure of its own.
        conflict = Checked(reason=refused.detail)
        return worker.with_db_retry("registration", lambda: _finish(worker, job, conflict))


def _heartbeat(worker: JobRunner, job: RegistrationJob) -> bool:
    with worker.session_factory.begin() as session:
        result = session.execute(
            update(Dataset)
            .where(
                and_(
                    Dataset.id == job.dataset_id,
                    Dataset.registration_lease_owner == worker.worker_id,
                    Dataset.registration_attempts == job.attempt,
                    (Dataset.batch_status if job.batch else Dataset.registration_status)
                    == REGISTERING,
                )
            )
            .values(registration_lease_expires_at=lease_end(worker.settings.worker_lease_seconds))
        )
        return bool(getattr(result, "rowcount", 0) == 1)


def _beat(worker: JobRunner, job: RegistrationJob, done: threading.Event) -> None:
    while not done.wait(worker.settings.worker_heartbeat_seconds):
        try:
            held = worker.with_db_retry(
                "registration heartbeat",
                lambda: _heartbeat(worker, job),
                lambda seconds: done.wait(seconds) or worker.stop.is_set(),
            )
        except Exception:
            return
        if not held:
            return


def _finish(worker: JobRunner, job: RegistrationJob, checked: Checked) -> str:
    """One transaction: ``ready`` or ``failed``, if this attempt still holds the lease."""
    with worker.session_factory.begin() as session:
        dataset = session.execute(
            select(Dataset).where(Dataset.id == job.dataset_id).with_for_update()
        ).scalar_one_or_none()
        status = (
            None
            if dataset is None
            else (dataset.batch_status if job.batch else dataset.registration_status)
        )
        if (
            dataset is None
            or dataset.deleted_at is not None
            or status != REGISTERING
            or dataset.registration_lease_owner != worker.worker_id
            or dataset.registration_attempts != job.attempt
        ):
            return "lost"
        if job.batch:
            return _finish_batch(session, worker.settings, dataset, checked)
        if checked.reference is None:
            _fail(session, dataset, checked.reason or BUG_REASON)
            return FAILED
        found = reference.Reference.from_json(checked.reference, worker.settings)
        n_rows, n_cols = found.shape
        dataset.n_rows, dataset.n_cols = n_rows, n_cols
        # Batch 0 is the whole reference (a continual release's first leaf and its padding).
        first = session.get(DatasetBatch, (dataset.id, 0))
        if first is not None:
            first.n_rows = n_rows
        dataset.reference = checked.reference
        cover_objects(session, dataset.id, found)  # ObjectRegistered rolls all of it back
        _end(dataset, READY, None)
        audit.record(
            session,
            "dataset_referenced",
            actor_key_id=None,
            dataset_id=dataset.id,
            details={
                "uri": found.uri,
                "columns": found.columns,
                "objects": found.objects,
                "n_rows": n_rows,
                "n_cols": n_cols,
                **_reference_digest(dataset.reference),
            },
        )
        return READY


def _reference_digest(raw: dict[str, Any] | None) -> dict[str, str]:
    """The event's record of ``datasets.reference`` as it stands after the event (its digest:
    the record holds a digest per column chunk, too large to copy into every event)."""
    if REFERENCE_DIGEST_FIELD is None or raw is None:
        return {}
    return {REFERENCE_DIGEST_FIELD: record_digest(raw)}


def _end(dataset: Dataset, status: str, reason: str | None) -> None:
    # Shown from the late schedule's first step at or after now (registration_visibility).
    dataset.registration_shown_at = shown.shown_at(
        dataset.created_at, dataset.registration_visible_at, utcnow()
    )
    dataset.registration_status = status
    dataset.registration_reason = reason
    dataset.registration_lease_owner = None
    dataset.registration_lease_expires_at = None


def _fail(session: Session, dataset: Dataset, reason: str) -> None:
    _end(dataset, FAILED, reason)
    audit.record(
        session,
        "dataset_registration_failed",
        actor_key_id=None,
        dataset_id=dataset.id,
        details={"reason": reason},
    )


# -- a batch's end ------------------------------------------------------------------------------


def _end_batch(dataset: Dataset, status: str | None, reason: str | None) -> None:
    """The batch's job ends (``status`` None: the batch counts; ``failed``: refused), its
    lease released, as :func:`_end` for a dataset's own registration."""
    now = utcnow()
    dataset.batch_shown_at = shown.shown_at(
        dataset.batch_requested_at or now, dataset.batch_visible_at, now
    )
    dataset.batch_status = status
    dataset.batch_reason = reason
    dataset.registration_lease_owner = None
    dataset.registration_lease_expires_at = None


def _fail_batch(session: Session, dataset: Dataset, reason: str) -> None:
    """The batch refused: the dataset as it was, ``batch_status = failed`` with the reason."""
    _end_batch(dataset, FAILED, reason)
    audit.record(
        session,
        "dataset_batch_failed",
        actor_key_id=None,
        dataset_id=dataset.id,
        details={"reason": reason},
    )


def _finish_batch(session: Session, settings: Settings, dataset: Dataset, checked: Checked) -> str:
    """The checked batch becomes the dataset's next one, in the caller's transaction (the
    dataset locked, the lease still this attempt's): its objects and row groups join the
    reference, its rows numbered after the dataset's (:class:`ObjectRegistered` from the cover
    rolls all of it back), or the batch ends ``failed``."""
    if checked.reference is None:
        _fail_batch(session, dataset, checked.reason or BUG_REASON)
        return FAILED
    assert dataset.reference is not None  # a batch is requested only on a dataset by reference
    current = reference.Reference.from_json(dataset.reference, settings)
    found = reference.Reference.from_json(checked.reference, settings)
    n_rows = found.shape[0]
    total = dataset.n_rows + n_rows
    reason = None
    if 8 * total * dataset.n_cols > settings.max_dataset_bytes:
        reason = (
            f"uri: the dataset with this batch ({total} rows x {dataset.n_cols} columns x 8 "
            f"bytes) is larger than {settings.max_dataset_bytes} bytes (DPSS_MAX_DATASET_BYTES)"
        )
    elif len(current.objects) + len(found.objects) > reference.MAX_OBJECTS:
        reason = (
            f"uri: the dataset with this batch would cover more than {reference.MAX_OBJECTS} "
            "objects; register the data as a new dataset"
        )
    if reason is not None:
        _fail_batch(session, dataset, reason)
        return FAILED
    cover_objects(session, dataset.id, found)  # ObjectRegistered: the caller's failure
    seq, offset = dataset.n_batches, dataset.n_rows
    ended_at = utcnow()
    # The batch counts for owners, analysts and releases from a public moment: its row's
    # created_at (from which a continual release's epoch on it is padded) is that moment, not
    # the end of a job that waited for other datasets' releases.
    shown_from = shown.shown_at(
        dataset.batch_requested_at or ended_at, dataset.batch_visible_at, ended_at
    )
    current.objects.extend(found.objects)
    current.pieces.extend(
        reference.Piece(p.path, p.row_group, offset + p.offset, p.rows, p.chunks)
        for p in found.pieces
    )
    dataset.reference = current.to_json()
    session.add(
        DatasetBatch(
            dataset_id=dataset.id,
            seq=seq,
            n_rows=n_rows,
            row_offset=offset,
            file_name=dataset.file_name,
            created_at=shown_from,
        )
    )
    dataset.batch_prior_rows = offset  # shown (and read by releases) until batch_shown_at
    dataset.n_rows = total
    dataset.n_batches = seq + 1
    _end_batch(dataset, None, None)
    dataset.batch_shown_at = shown_from
    # batch_request is kept until the next batch: until batch_shown_at a URI overlapping it is
    # refused as a registration in progress (_refuse_taken), whatever the worker did.
    audit.record(
        session,
        "dataset_batch_referenced",
        actor_key_id=None,
        dataset_id=dataset.id,
        details={
            "uri": found.uri,
            "objects": found.objects,
            "seq": seq,
            "n_rows": n_rows,
            "n_rows_total": total,
            **_reference_digest(dataset.reference),
        },
    )
    # A continual release waiting for this batch is a job again (as for a stored append).
    wake.announce(session, settings)
    return READY
