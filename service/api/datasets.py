"""Datasets: upload, metadata, budget, delete."""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api_schemas.common import ErrorBody, IdempotencyKey
from api_schemas.datasets import (
    Budget,
    Dataset,
    DatasetBatch,
    DatasetCreate,
    DatasetCreated,
    DatasetList,
    DatasetReferenceBatchCreate,
    DatasetReferenceCreate,
)
from service import datasets, privacy_unit, registration, row_locks, upload_idempotency
from service.api.deps import (
    Cursor,
    Database,
    DatasetId,
    Limit,
    Offset,
    SettingsDep,
    StoreDep,
    UnitOfWorkDep,
    roles_before_body,
)
from service.api.multipart import form_body, receive_upload
from service.api.presenters import budget_out, dataset_out, datasets_out
from service.api.routing import GuardedRoute
from service.auth import Principal, require_role
from service.db.models import DatasetBatch as DatasetBatchRow
from service.errors import InvalidInput
from service.mechanisms.linalg import count_rows_above
from service.store import DatasetStore

log = logging.getLogger("dpss.api")

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], route_class=GuardedRoute)
#: ``POST /v1/dataset-references``: not under ``/v1/datasets/``, whose ``/{dataset_id}`` routes
#: would also match a fixed name there.
references = APIRouter(prefix="/v1/dataset-references", tags=["datasets"], route_class=GuardedRoute)

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or invalid API key."},
    403: {"model": ErrorBody, "description": "The key's role may not do this."},
    404: {"model": ErrorBody, "description": "No such dataset (or not yours)."},
}

UPLOAD_BODY = form_body(
    "The matrix, one row per individual: .csv (numeric, header optional), .npy (2-D numeric, "
    "no pickles) or .parquet (numeric columns). The file name's suffix selects the format.",
    {name: info.description for name, info in DatasetCreate.model_fields.items()},
    required=("file", "name", "epsilon_budget", "delta_budget"),
)


@router.post(
    "",
    status_code=201,
    response_model=DatasetCreated,
    summary="Upload a dataset with its privacy budget (owner).",
    openapi_extra=UPLOAD_BODY,
    responses={
        **ERRORS,
        408: {"model": ErrorBody, "description": "Body not received within the body timeout."},
        413: {
            "model": ErrorBody,
            "description": (
                "Larger than DPSS_MAX_UPLOAD_MB, or decodes past DPSS_MAX_DATASET_BYTES."
            ),
        },
        200: {
            "model": DatasetCreated,
            "description": (
                "A retry with the same `Idempotency-Key` and body: the dataset the first request "
                "made, as it is now; nothing new is stored."
            ),
        },
        409: {
            "model": ErrorBody,
            "description": "`idempotency_conflict`: the key was used with another body.",
        },
        422: {"model": ErrorBody, "description": "Invalid file or form field; nothing is kept."},
    },
)
async def create_dataset(
    request: Request,
    uow: UnitOfWorkDep,
    store: StoreDep,
    settings: SettingsDep,
    idempotency_key: IdempotencyKey | None = Header(
        default=None, description=upload_idempotency.UPLOAD_DESCRIPTION
    ),
) -> DatasetCreated | JSONResponse:
    """Four steps, none holding a connection while it waits for anything else:

    1. the key and its role are checked in a short transaction, before a byte of the body is
       read (an anonymous or analyst client cannot make the service store anything);
    2. the body streams into ``incoming/`` with no session open, bounded by
       ``DPSS_MAX_UPLOAD_MB`` and ``DPSS_BODY_TIMEOUT_SECONDS`` (see ``GuardedRoute``);
    3. the file is parsed and converted in a thread, with no session open;
    4. a short transaction registers it (checking the key again) and commits before the
       response; if that fails, the stored file is removed unless a dataset names it (the
       failure came after the commit: :func:`purge_unless_registered`).
    """
    require_role(await uow.principal_before_body(), "owner")
    upload_idempotency.check_key(idempotency_key)
    form = await receive_upload(
        request, store, settings.max_upload_bytes, digest=idempotency_key is not None
    )
    try:
        try:
            fields = DatasetCreate.model_validate(form.fields)
        except ValidationError as exc:
            raise InvalidInput.from_validation(exc, fallback="form") from None
        datasets.check_budgets(fields, settings.default_accounting)
        unit_column = privacy_unit.parse_column(fields.privacy_unit_column)
        assert form.file_path is not None
        request_hash = upload_idempotency.fingerprint(
            fields.model_dump(mode="json"), form.file_suffix, form.file_sha256
        )
        if idempotency_key is not None:
            # A retry is answered before its file is parsed: a hash, not a decode.
            found = await uow(
                lambda session, principal: _replay(
                    session, principal, idempotency_key, request_hash, fields
                )
            )
            if found is not None:
                return await _replayed(store, found)
        stored = await anyio.to_thread.run_sync(
            functools.partial(
                store.ingest, form.file_path, form.file_suffix, unit_column=unit_column
            )
        )
    finally:
        form.discard()
    try:
        above = await anyio.to_thread.run_sync(
            datasets.rows_above_bound, store, stored, fields.row_norm_bound
        )
    except BaseException:
        store.purge(stored.file_name)
        raise

    def register(session: Session, principal: Principal) -> DatasetCreated | _Replay:
        # Again in this transaction: a concurrent retry with the same key may have committed.
        found = _replay(session, principal, idempotency_key, request_hash, fields)
        if found is not None:
            return found
        try:
            with session.begin_nested():
                dataset = datasets.register_dataset(
                    session,
                    store,
                    principal,
                    fields,
                    stored,
                    settings.default_accounting,
                    idempotency_key=idempotency_key,
                    request_hash=request_hash,
                )
        except IntegrityError as exc:
            # PostgreSQL: the retry committed between the lookup and this insert (the unique
            # index waited for it); this request's file is already purged.
            if not upload_idempotency.is_key_race(exc):
                raise
            found = _replay(session, principal, idempotency_key, request_hash, fields)
            if found is None:
                raise
            return found
        out = dataset_out(session, dataset, principal.key_id)
        person = stored.n_units is not None
        fits = datasets.recommended_accounting(fields)
        return DatasetCreated(
            **out.model_dump(),
            rows_above_bound=above,
            rows_per_unit=stored.rows_per_unit,
            rows_dropped_by_bound=0 if person else None,
            recommended_accounting=fits.accounting,
            recommendation_reason=fits.reason,
        )

    try:
        answer = await uow(register)
    except BaseException:
        await purge_unless_registered(uow.database, store, stored.file_name)
        raise
    if isinstance(answer, _Replay):
        # A retry's answer: this request's own file names no dataset.
        await purge_unless_registered(uow.database, store, stored.file_name)
        return await _replayed(store, answer)
    return answer


@dataclass(frozen=True)
class _Replay:
    """A retried upload's answer as its transaction read it (:func:`_replay`); what it says of
    the rows is read after that transaction (:func:`_replayed`)."""

    created: DatasetCreated
    #: Batch 0's file, ``None`` once the dataset is deleted (then nothing is said of the rows).
    file_name: str | None
    row_norm_bound: Any
    person: bool


def _replay(
    session: Session,
    principal: Principal,
    key: str | None,
    request_hash: str,
    fields: DatasetCreate,
) -> _Replay | None:
    """The retry of an upload's answer (the dataset it made, as it is now), None when no upload
    used ``key``; 409 when one did with another body. Reads the database only: see
    :func:`_replayed` for the rows."""
    dataset = upload_idempotency.find_dataset(session, principal, key, request_hash)
    if dataset is None:
        return None
    out = dataset_out(session, dataset, principal.key_id)
    fits = datasets.recommended_accounting(fields)
    person = dataset.privacy_unit_column is not None
    created = DatasetCreated(
        **out.model_dump(),
        rows_above_bound=None,
        rows_per_unit=None,
        rows_dropped_by_bound=0 if person else None,
        recommended_accounting=fits.accounting,
        recommendation_reason=fits.reason,
    )
    live = dataset.file_name is not None and dataset.deleted_at is None
    return _Replay(created, dataset.file_name if live else None, dataset.row_norm_bound, person)


async def _replayed(store: DatasetStore, replay: _Replay) -> JSONResponse:
    """The 200 answer to a retried upload. What the first answer told the owner alone about
    the rows (``rows_above_bound``, ``rows_per_unit``) is read again from batch 0's rows, which
    are the same rows (the first answer may never have arrived).

    Read here, in a thread and outside any transaction: a pass over every row (up to
    ``DPSS_MAX_DATASET_BYTES``) inside the unit of work held its database slot and connection
    for as long as the disk took, and on SQLite the database's write lock (every transaction
    begins ``IMMEDIATE``), stopping every other writer, workers' finishes included. Batch 0's
    rows never change; a deletion meanwhile makes the read fail, and the facts null."""
    above, per_unit = await anyio.to_thread.run_sync(
        _first_answer_facts, store, replay.file_name, replay.row_norm_bound, replay.person
    )
    created = replay.created.model_copy(
        update={"rows_above_bound": above, "rows_per_unit": per_unit}
    )
    return JSONResponse(created.model_dump(mode="json"), status_code=200)


def _first_answer_facts(
    store: DatasetStore, file_name: str | None, row_norm_bound: Any, person: bool
) -> tuple[int | None, dict[str, int] | None]:
    """``rows_above_bound`` and ``rows_per_unit`` of batch 0 (the upload's rows; null when
    they are deleted)."""
    if file_name is None:
        return None, None
    try:
        rows = store.open(file_name)  # batch 0: the rows the .npy header records
        above = None if row_norm_bound is None else count_rows_above(rows, row_norm_bound)
        per_unit = None
        if person:
            units = np.asarray(store.open_units(file_name, len(rows)))
            per_unit = privacy_unit.rows_per_unit_buckets(units)
    except (OSError, ValueError):
        return None, None
    return above, per_unit


async def purge_unless_registered(database: Database, store: DatasetStore, file_name: str) -> None:
    """After the unit of work registering ``file_name`` failed: remove the file only when no
    dataset provably names it (:func:`service.datasets.file_registered`, in a transaction of
    its own).

    The failure may come after the commit succeeded: the connection lost during COMMIT's
    acknowledgement, or anything raised once it committed. Removing the file then (as before)
    left a dataset without its rows: the owner, answered 503, saw it in their list, and every
    release on it failed (refunded). When the database cannot tell now, the file stays: an
    orphan is recoverable and ``dpss audit verify`` names it (:mod:`service.datadir`); a
    dataset whose rows are gone is not."""
    # Shielded: a cancelled request (client gone) must still settle its file.
    with anyio.CancelScope(shield=True):
        try:
            registered = await database.run(
                functools.partial(datasets.file_registered, file_name=file_name)
            )
        except Exception as exc:
            log.warning(
                "upload: could not tell whether stored file %s was registered (%s); kept "
                "(dpss audit verify reports it if no dataset names it)",
                file_name,
                type(exc).__name__,
            )
            return
    if not registered:
        store.purge(file_name)


@references.post(
    "",
    status_code=202,
    dependencies=[roles_before_body("owner")],
    response_model=Dataset,
    summary="Register a Parquet dataset by reference, with its privacy budget (owner).",
    description=(
        "The objects stay where they are (S3-compatible storage or a shared filesystem, under "
        "DPSS_REFERENCE_ROOTS) and are read with the deployment's credentials. The request "
        "checks what needs no read (fields, budget, the URI's form and roots, the columns; a URI "
        "that is an object another live dataset covers, or a prefix holding one, compared with "
        "the recorded objects' names, nothing listed) and answers 202 with the dataset in "
        "`registration_status: registering`; a worker then reads every value of the chosen "
        "columns, counts the rows against the pages, records each object's identity (ETag, "
        "version, or size and modification time) and the SHA-256 of the bytes releases read, "
        "and ends it `ready` (with n_rows) or `failed` (with `registration_reason`, the "
        "message a refusal gives: an object another live dataset covers, a non-finite value, "
        "a size above DPSS_MAX_DATASET_BYTES...). Poll `GET /v1/datasets/{id}`. Until "
        "`ready` the dataset takes no release, grant or batch (409 `dataset_not_ready`). "
        "Deleting the dataset removes the reference, never the objects."
    ),
    responses={
        **ERRORS,
        409: {
            "model": ErrorBody,
            "description": (
                "`object_registered`: the URI is an object another live dataset covers or a "
                "prefix (a directory) holding one, or it overlaps a registration still in "
                "progress; `detail` names `uri` and the covered object. Nothing is kept."
            ),
        },
        422: {"model": ErrorBody, "description": "Invalid field, URI or column."},
    },
)
async def register_reference(
    body: DatasetReferenceCreate, uow: UnitOfWorkDep, store: StoreDep, settings: SettingsDep
) -> Dataset:
    """The role is checked first; one short transaction checks what needs no read and queues
    the registration for a worker (:mod:`service.registration`)."""
    require_role(await uow.principal_before_body(), "owner")
    datasets.check_budgets(body, settings.default_accounting)
    if body.privacy_unit_column is not None:
        raise InvalidInput(
            privacy_unit.FIELD,
            "not supported for datasets registered by reference: their rows are read from "
            "the objects at each release and the service keeps no unit index beside them, so "
            "no release could bound a person's rows; upload the file with "
            "privacy_unit_column, or register it without one (the unit is then the row)",
        )

    def request(session: Session, principal: Principal) -> Dataset:
        return dataset_out(
            session,
            registration.request_registration(session, store, principal, body, settings),
            principal.key_id,
        )

    return await uow(request)


@references.post(
    "/{dataset_id}/batches",
    status_code=202,
    dependencies=[roles_before_body("owner")],
    response_model=Dataset,
    summary="Append a batch of Parquet objects to a dataset by reference (owner).",
    description=(
        "The by-reference counterpart of `POST /v1/datasets/{id}/rows`: the new objects stay where "
        "they are and are checked as at registration. The request checks what needs no read, "
        "refusing with a 4xx that names the field and changes nothing (no job, no batch, no audit "
        "event, no charge): the URI's form and roots, the same kind of storage as the dataset, its "
        "columns; a URI that is an object this dataset (batch 0 or a later batch) or another live "
        "dataset covers, or a prefix holding one (batch 0's prefix again, a prefix over an earlier "
        "batch's objects), compared with the recorded objects' names (409 `object_registered`; a "
        "new prefix under batch 0's holding only new objects is a batch); a dataset that can take "
        "no batch at all (422 at 10,000 objects, 413 when 2 more rows would exceed "
        "DPSS_MAX_DATASET_BYTES). Otherwise it answers 202 with the dataset in `batch_status: "
        "registering`; a worker then reads every value, records each object's identity and "
        "digests, and adds the batch (the next `seq`; `n_rows` and `n_batches` grow, "
        "`batch_status` is null again) or ends it `failed` with `batch_reason` (the dataset "
        "unchanged): what only a read shows (a prefix holding no `*.parquet` object or fewer than "
        "2 rows, values, a copy of a covered object's bytes) and objects another registration came "
        "to cover after the request. Until then no release sees the batch: the dataset takes "
        "releases on its registered batches meanwhile, and once it is added releases requested "
        "later read it, every object of every batch checked unchanged, and waiting continual "
        "releases release their next epoch from it. Its rows count in this batch (the privacy unit "
        "is the row). One batch registers at a time."
    ),
    responses={
        **ERRORS,
        409: {
            "model": ErrorBody,
            "description": (
                "`batch_registering`: a batch of this dataset is still registering; "
                "`object_registered`: the URI is an object this or another live dataset "
                "covers, or a prefix (a directory) holding one (`detail` names `uri`, the "
                "object and, for this dataset's, its batch), or overlaps a registration in "
                "progress; `dataset_not_ready` or `dataset_deleted`. Nothing is kept."
            ),
        },
        413: {
            "model": ErrorBody,
            "description": (
                "`uri`: the dataset with any batch (2 more rows) would exceed "
                "DPSS_MAX_DATASET_BYTES; nothing is kept."
            ),
        },
        422: {
            "model": ErrorBody,
            "description": (
                "Invalid field, URI or column (`columns` other than the dataset's), a "
                "dataset that was uploaded (`uri`: append rows instead), or one that covers "
                "10,000 objects already (`uri`: no batch fits). Nothing is kept."
            ),
        },
    },
)
async def append_reference_batch(
    dataset_id: DatasetId,
    body: DatasetReferenceBatchCreate,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
) -> Dataset:
    """The role is checked first; one short transaction, under the dataset's lock, checks
    what needs no read and queues the batch's registration for a worker."""
    require_role(await uow.principal_before_body(), "owner")

    def request(session: Session, principal: Principal) -> Dataset:
        dataset = registration.request_batch(session, principal, dataset_id, body, settings)
        return dataset_out(session, dataset, principal.key_id)

    return await uow(request)


@router.get(
    "",
    response_model=DatasetList,
    summary="List datasets (owner: own; analyst: all).",
    responses=ERRORS,
)
async def list_datasets(
    uow: UnitOfWorkDep, limit: Limit = 100, offset: Offset = 0, cursor: Cursor = None
) -> DatasetList:
    def work(session: Session, principal: Principal) -> DatasetList:
        page = datasets.page_datasets(session, principal, limit, offset, cursor)
        return DatasetList(
            items=datasets_out(session, page.items, principal.key_id),
            total=page.total,
            next=page.next,
        )

    return await uow(work)


@router.get(
    "/{dataset_id}",
    response_model=Dataset,
    summary="Dataset metadata (never data values).",
    responses=ERRORS,
)
async def get_dataset(dataset_id: DatasetId, uow: UnitOfWorkDep) -> Dataset:
    def work(session: Session, principal: Principal) -> Dataset:
        return dataset_out(
            session, datasets.get_dataset(session, principal, dataset_id), principal.key_id
        )

    return await uow(work)


@router.get(
    "/{dataset_id}/budget",
    response_model=Budget,
    summary="The dataset's privacy budget.",
    responses=ERRORS,
)
async def get_budget(dataset_id: DatasetId, uow: UnitOfWorkDep) -> Budget:
    def work(session: Session, principal: Principal) -> Budget:
        return budget_out(*datasets.get_budget(session, principal, dataset_id))

    return await uow(work, single_statement=True)


@router.delete(
    "/{dataset_id}",
    status_code=204,
    summary="Delete a dataset's rows (owner); the ledger and audit log stay.",
    description=(
        "A dataset registered by reference loses its reference only: the service never deletes "
        "the owner's objects (the `dataset_deleted` audit event names them in `objects_kept`)."
    ),
    responses=ERRORS,
)
async def delete_dataset(dataset_id: DatasetId, uow: UnitOfWorkDep, store: StoreDep) -> Response:
    def work(session: Session, principal: Principal) -> None:
        datasets.delete_dataset(session, store, principal, dataset_id)

    await uow(work)
    return Response(status_code=204)


APPEND_BODY = form_body(
    "The rows to append, in the formats and with the checks of an upload (.csv, .npy or "
    ".parquet, at least 2 rows), with the dataset's number of columns.",
    {
        "privacy_unit_column": (
            "Required for a dataset uploaded with privacy_unit_column, refused otherwise: the "
            "batch's identifier column (a name, or a 0-based index), removed from the features "
            "and never stored; a person already in the dataset keeps their unit, so every "
            "bound holds over all batches."
        )
    },
)


@router.post(
    "/{dataset_id}/rows",
    status_code=201,
    response_model=DatasetBatch,
    summary="Append a batch of rows to a dataset (owner); all of it or nothing.",
    description=(
        "The batch gets the next sequence number. Releases already requested keep reading the "
        "rows present when they were requested; continual releases release their next epoch."
    ),
    openapi_extra=APPEND_BODY,
    responses={
        **ERRORS,
        408: {"model": ErrorBody, "description": "Body not received within the body timeout."},
        200: {
            "model": DatasetBatch,
            "description": (
                "A retry with the same `Idempotency-Key` and body: the batch the first request "
                "appended (`n_rows_total` and `n_batches` as they are now); nothing is appended."
            ),
        },
        409: {
            "model": ErrorBody,
            "description": "`dataset_deleted`: the dataset's rows are gone; "
            "`idempotency_conflict`: the key was used with another body.",
        },
        413: {
            "model": ErrorBody,
            "description": (
                "Larger than DPSS_MAX_UPLOAD_MB, or decodes past DPSS_MAX_DATASET_BYTES."
            ),
        },
        422: {
            "model": ErrorBody,
            "description": "Invalid file, or a column count other than the dataset's (field "
            "`file`); nothing is kept.",
        },
    },
)
async def append_rows(
    dataset_id: DatasetId,
    request: Request,
    uow: UnitOfWorkDep,
    store: StoreDep,
    settings: SettingsDep,
    idempotency_key: IdempotencyKey | None = Header(
        default=None, description=upload_idempotency.UPLOAD_DESCRIPTION
    ),
) -> DatasetBatch | JSONResponse:
    """As an upload: the role is checked before the body is read, the file is parsed with no
    session open, then one short transaction appends it under the dataset's lock."""
    require_role(await uow.principal_before_body(), "owner")
    upload_idempotency.check_key(idempotency_key)

    def unit_file(session: Session, principal: Principal) -> str | None:
        dataset = datasets.get_dataset(session, principal, dataset_id)
        return dataset.file_name if dataset.privacy_unit_column is not None else None

    # Whether the batch must name an identifier column (a person-level dataset: its people
    # keep their unit across batches, service.unit_keys); append_batch checks under the lock.
    person_file = await uow(unit_file)
    form = await receive_upload(
        request, store, settings.max_upload_bytes, digest=idempotency_key is not None
    )
    try:
        unknown = sorted(set(form.fields) - {privacy_unit.FIELD})
        if unknown:
            raise InvalidInput(
                unknown[0], "unknown form field; send only `file` (and privacy_unit_column)"
            )
        if form.file_path is None:
            raise InvalidInput("file", "required")
        column = privacy_unit.parse_column(form.fields.get(privacy_unit.FIELD))
        request_hash = upload_idempotency.fingerprint(
            {privacy_unit.FIELD: form.fields.get(privacy_unit.FIELD)},
            form.file_suffix,
            form.file_sha256,
        )
        if idempotency_key is not None:
            # A retry is answered before its file is parsed: a hash, not a decode.
            def earlier(session: Session, principal: Principal) -> JSONResponse | None:
                datasets.get_dataset(session, principal, dataset_id)  # the owner's, or 404
                row = upload_idempotency.find_batch(
                    session, dataset_id, idempotency_key, request_hash
                )
                return None if row is None else _batch_replay(session, principal, row)

            found = await uow(earlier)
            if found is not None:
                return found
        secret = None
        if person_file is not None:
            with contextlib.suppress(FileNotFoundError, ValueError):
                secret = store.unit_secret(person_file)
        datasets.check_append_unit(person_file is not None, column, secret is not None)
        stored = await anyio.to_thread.run_sync(
            functools.partial(
                store.ingest,
                form.file_path,
                form.file_suffix,
                batch=True,
                unit_column=column,
                unit_secret=secret,
            )
        )
    finally:
        form.discard()

    # Whether an attempt got past the dataset's lock (from there it may write the file): one
    # that never did (a row held elsewhere until the 503, service.row_locks) has nothing to
    # trim, and waiting for the row again to trim it doubled the 503's wait.
    past_lock: list[bool] = []

    def append(session: Session, principal: Principal) -> DatasetBatch | JSONResponse:
        try:
            row, appended = datasets.append_batch(
                session,
                store,
                principal,
                dataset_id,
                stored,
                settings,
                idempotency_key=idempotency_key,
                request_hash=request_hash,
            )
        except row_locks.RowBusy:
            raise
        except BaseException:
            past_lock.append(True)
            raise
        past_lock.append(True)
        if not appended:
            return _batch_replay(session, principal, row)
        dataset = datasets.get_dataset(session, principal, dataset_id)
        return DatasetBatch(
            dataset_id=dataset_id,
            seq=row.seq,
            n_rows=row.n_rows,
            n_rows_total=dataset.n_rows,
            n_batches=dataset.n_batches,
            created_at=row.created_at,
        )

    try:
        return await uow(append)
    except BaseException:
        # Also when the commit itself failed: cut the rows off again, under the lock.
        store.discard(stored.file_name)
        if not past_lock:
            raise
        # Best effort: if the database is away now, the next append cuts them off first.
        with contextlib.suppress(Exception):
            await uow(
                lambda session, _principal: datasets.trim_uncommitted(session, store, dataset_id)
            )
        raise


def _batch_replay(session: Session, principal: Principal, row: DatasetBatchRow) -> JSONResponse:
    """The 200 answer to a retried append: the batch the first request appended."""
    dataset = datasets.get_dataset(session, principal, row.dataset_id)
    batch = DatasetBatch(
        dataset_id=row.dataset_id,
        seq=row.seq,
        n_rows=row.n_rows,
        n_rows_total=dataset.n_rows,
        n_batches=dataset.n_batches,
        created_at=row.created_at,
    )
    return JSONResponse(batch.model_dump(mode="json"), status_code=200)
