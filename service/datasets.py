"""Datasets: ingestion, visibility, deletion. Metadata never includes data values."""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import Session

from api_schemas.datasets import DatasetCreate
from service import audit, ledger
from service.auth import Principal, require_role
from service.db.models import Dataset, utcnow
from service.errors import NotFound
from service.pagination import Page, parse_time_id_cursor, time_id_cursor
from service.store import DatasetStore, StoredMatrix


def create_dataset(
    session: Session,
    store: DatasetStore,
    principal: Principal,
    form: DatasetCreate,
    upload_path: Path,
    suffix: str,
) -> Dataset:
    """Validate and store an uploaded file and register it with its budget.

    If anything fails after the file was stored, the file is removed: no file is kept for a
    refused upload (the transaction is rolled back by the caller). The API does the two steps
    apart (:meth:`DatasetStore.ingest` with no session open, then :func:`register_dataset` in a
    short transaction) so that no connection is held while a file is parsed.
    """
    require_role(principal, "owner")
    check_budgets(form)
    return register_dataset(session, store, principal, form, store.ingest(upload_path, suffix))


def check_budgets(form: DatasetCreate) -> None:
    """Refuse budgets the ledger could not store exactly (they would be rounded), before any
    file is parsed; :class:`InvalidInput` names the field."""
    ledger.check_storable("epsilon_budget", form.epsilon_budget)
    ledger.check_storable("delta_budget", form.delta_budget)


def register_dataset(
    session: Session,
    store: DatasetStore,
    principal: Principal,
    form: DatasetCreate,
    stored: StoredMatrix,
) -> Dataset:
    """Register a file already in the store with its budget; the file is removed on failure."""
    check_budgets(form)
    try:
        require_role(principal, "owner")
        dataset = Dataset(
            id=uuid.uuid4(),
            name=form.name,
            owner_key_id=principal.key_id,
            n_rows=stored.n_rows,
            n_cols=stored.n_cols,
            row_norm_bound=form.row_norm_bound,
            epsilon_total=form.epsilon_budget,
            delta_total=form.delta_budget,
            file_name=stored.file_name,
        )
        session.add(dataset)
        session.flush()
        audit.record(
            session,
            "dataset_created",
            actor_key_id=principal.key_id,
            dataset_id=dataset.id,
            details={
                "name": form.name,
                "n_rows": stored.n_rows,
                "n_cols": stored.n_cols,
                "row_norm_bound": form.row_norm_bound,
            },
        )
        audit.record(
            session,
            "budget_set",
            actor_key_id=principal.key_id,
            dataset_id=dataset.id,
            details={"epsilon_total": form.epsilon_budget, "delta_total": form.delta_budget},
        )
    except BaseException:
        store.purge(stored.file_name)
        raise
    return dataset


def _visible(principal: Principal) -> list[ColumnElement[bool]]:
    """Owners see the datasets they uploaded; analysts see every dataset's metadata."""
    require_role(principal, "owner", "analyst")
    conditions: list[ColumnElement[bool]] = [Dataset.deleted_at.is_(None)]
    if principal.role == "owner":
        conditions.append(Dataset.owner_key_id == principal.key_id)
    return conditions


def get_dataset(session: Session, principal: Principal, dataset_id: uuid.UUID) -> Dataset:
    dataset = session.execute(
        select(Dataset).where(Dataset.id == dataset_id, *_visible(principal))
    ).scalar_one_or_none()
    if dataset is None:
        raise NotFound(f"no dataset {dataset_id}")
    return dataset


DATASET_CURSOR = "dataset"


def page_datasets(
    session: Session, principal: Principal, limit: int, offset: int, cursor: str | None
) -> Page[Dataset]:
    """Newest first by ``(created_at desc, id)``, after ``cursor`` (keyset) or ``offset`` rows.

    ``offset`` stays for old clients; the cursor does not shift when datasets are added.
    """
    conditions = _visible(principal)
    total = session.execute(
        select(func.count()).select_from(Dataset).where(*conditions)
    ).scalar_one()
    query = select(Dataset).where(*conditions)
    if cursor is not None:
        created_at, dataset_id = parse_time_id_cursor(cursor, DATASET_CURSOR)
        query = query.where(
            or_(
                Dataset.created_at < created_at,
                and_(Dataset.created_at == created_at, Dataset.id > dataset_id),
            )
        )
    rows = list(
        session.execute(
            query.order_by(Dataset.created_at.desc(), Dataset.id).limit(limit + 1).offset(offset)
        ).scalars()
    )
    more = len(rows) > limit
    rows = rows[:limit]
    following = time_id_cursor(DATASET_CURSOR, rows[-1].created_at, rows[-1].id) if more else None
    return Page(items=rows, total=total, next=following)


def delete_dataset(
    session: Session, store: DatasetStore, principal: Principal, dataset_id: uuid.UUID
) -> None:
    """Purge the rows; the ledger and the audit log stay.

    The file is removed before the transaction commits: if the commit then failed, the row would
    point at a missing file and any queued release would fail with a refund, which is safe; the
    other order could leave raw rows on disk.
    """
    require_role(principal, "owner")
    dataset = get_dataset(session, principal, dataset_id)
    file_name = dataset.file_name
    dataset.deleted_at = utcnow()
    dataset.file_name = None
    audit.record(
        session,
        "dataset_deleted",
        actor_key_id=principal.key_id,
        dataset_id=dataset.id,
        details={"name": dataset.name},
    )
    session.flush()
    if file_name:
        store.purge(file_name)
