"""Datasets: ingestion, visibility, deletion. Metadata never includes data values."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api_schemas.common import BUDGET_CONTEXT
from api_schemas.datasets import DatasetCreate
from service import (
    accounting,
    advice,
    audit,
    commit_order,
    ledger,
    privacy_unit,
    registration_visibility,
    row_locks,
    upload_idempotency,
    wake,
)
from service.auth import Principal, require_role
from service.config import Settings
from service.db.models import Dataset, DatasetBatch, DatasetReferenceObject, utcnow
from service.errors import (
    DatasetGone,
    DatasetNotReady,
    InvalidInput,
    NotFound,
    ObjectRegistered,
)
from service.mechanisms.linalg import count_rows_above
from service.pagination import Page, list_scope, parse_time_id_cursor, time_id_cursor
from service.reference import Reference
from service.store import DatasetStore, StoredMatrix


def create_dataset(
    session: Session,
    store: DatasetStore,
    principal: Principal,
    form: DatasetCreate,
    upload_path: Path,
    suffix: str,
    default_accounting: str,
) -> Dataset:
    """Validate and store an uploaded file and register it with its budget.

    ``default_accounting`` is the accounting a form that names none gets (the service passes
    ``Settings.default_accounting``; no literal default here, so a caller cannot silently get
    another accounting than the product's).

    If anything fails after the file was stored, the file is removed: no file is kept for a
    refused upload (the transaction is rolled back by the caller). The API does the two steps
    apart (:meth:`DatasetStore.ingest` with no session open, then :func:`register_dataset` in a
    short transaction) so that no connection is held while a file is parsed.
    """
    require_role(principal, "owner")
    check_budgets(form, default_accounting)
    stored = store.ingest(upload_path, suffix)
    return register_dataset(session, store, principal, form, stored, default_accounting)


def file_registered(session: Session, file_name: str) -> bool:
    """Whether a dataset names the stored file ``file_name``, once every audited change in
    flight has ended (:func:`service.audit.wait_for_writers`): the answer is then final for a
    registration that failed, whether its failure came before or after its commit."""
    audit.wait_for_writers(session)
    found = session.execute(select(Dataset.id).where(Dataset.file_name == file_name).limit(1))
    return found.first() is not None


def rows_above_bound(store: DatasetStore, stored: StoredMatrix, bound: float | None) -> int | None:
    """How many stored rows exceed the declared bound (for the uploading owner only; never
    stored or logged), or None without a bound."""
    if bound is None or stored.n_rows == 0:
        return None if bound is None else 0
    return count_rows_above(store.open(stored.file_name), bound)


@dataclass(frozen=True)
class BudgetTerms:
    """A dataset's accounting and its derived budget (see :mod:`service.accounting`)."""

    accounting: str
    rho_total: Decimal | None = None
    mu_total: Decimal | None = None
    delta_conversion: Decimal | None = None
    delta_gaussian: Decimal | None = None
    delta_mechanisms: Decimal | None = None
    delta_basic: Decimal | None = None


def planned_mechanisms(form: DatasetCreate) -> list[str]:
    """The upload's ``planned_mechanisms`` as registered names; :class:`InvalidInput` names the
    field for an unknown one (before any file is parsed)."""
    try:
        return advice.parse_planned(form.planned_mechanisms)
    except ValueError as exc:
        raise InvalidInput("planned_mechanisms", str(exc)) from None


def recommended_accounting(form: DatasetCreate) -> advice.Advice:
    """The accounting that fits the mechanisms the upload says the owner plans to use
    (:func:`service.advice.recommend`; all of them when it names none); ``basic`` for a
    ``delta_budget`` so small that every share of a hybrid budget's delta would round to 0
    (:func:`service.advice.too_small_for_hybrid`), whatever the upload's accounting."""
    if form.delta_budget > 0:
        hybrid = accounting.hybrid_budget(form.epsilon_budget, form.delta_budget)
        if advice.hybrid_holds_no_delta(
            "hybrid", hybrid.mu_total, hybrid.rho_total, hybrid.delta_basic
        ):
            return advice.too_small_for_hybrid(form.delta_budget)
    return advice.recommend(planned_mechanisms(form))


def check_budgets(form: DatasetCreate, default_accounting: str) -> BudgetTerms:
    """Refuse budgets the ledger could not store exactly (they would be rounded), before any
    file is parsed, and derive the accounting's budget; :class:`InvalidInput` names the field.

    ``gaussian``: ``mu_total`` is the largest ``mu`` (30 places, rounded down) with
    ``delta_G(mu, epsilon_budget) <= delta_budget``, or the owner's ``mu_budget`` if it is not
    larger. ``zcdp``: ``delta_conversion`` (default half of ``delta_budget``) and the largest
    ``rho`` whose CKS conversion is within ``(epsilon_budget, delta_conversion)``, or the owner's
    ``rho_budget`` if not larger. ``hybrid``: the three filters' budgets at the measured
    default shares (:func:`service.accounting.hybrid_budget`). Pure budgets (``delta_budget =
    0``) are ``basic``.
    """
    fields = [
        ("epsilon_budget", form.epsilon_budget),
        ("delta_budget", form.delta_budget),
        ("mu_budget", form.mu_budget),
        ("rho_budget", form.rho_budget),
        ("delta_conversion", form.delta_conversion),
    ]
    for name, value in fields:
        if value is not None:
            ledger.check_storable(name, value)
    planned_mechanisms(form)
    chosen = form.accounting
    if chosen is None:
        chosen = "basic" if form.delta_budget == 0 else default_accounting  # type: ignore[assignment]
    if chosen != "gaussian" and form.mu_budget is not None:
        raise InvalidInput("mu_budget", "only with accounting gaussian")
    if chosen != "zcdp":
        for name, value in (
            ("rho_budget", form.rho_budget),
            ("delta_conversion", form.delta_conversion),
        ):
            if value is not None:
                raise InvalidInput(name, "only with accounting zcdp")
    if chosen == "basic":
        return BudgetTerms("basic")
    if form.delta_budget == 0:
        raise InvalidInput(
            "accounting",
            f"{chosen} needs delta_budget > 0 (a pure budget composes exactly under basic)",
        )
    if chosen == "gaussian":
        mu = accounting.mu_budget(form.epsilon_budget, form.delta_budget)
        if form.mu_budget is not None:
            if form.mu_budget > mu:
                raise InvalidInput(
                    "mu_budget",
                    f"must be at most {mu}, the largest mu within (epsilon_budget, delta_budget)",
                )
            mu = form.mu_budget
        return BudgetTerms("gaussian", accounting.budget_rho_of_mu(mu), mu_total=mu)
    if chosen == "hybrid":
        hybrid = accounting.hybrid_budget(form.epsilon_budget, form.delta_budget)
        return BudgetTerms(
            "hybrid",
            hybrid.rho_total,
            mu_total=hybrid.mu_total,
            delta_conversion=hybrid.delta_conversion,
            delta_gaussian=hybrid.delta_gaussian,
            delta_mechanisms=hybrid.delta_mechanisms,
            delta_basic=hybrid.delta_basic,
        )
    conversion = form.delta_conversion
    if conversion is None:
        conversion = accounting.round_down(
            BUDGET_CONTEXT.multiply(form.delta_budget, accounting.DEFAULT_CONVERSION_SHARE)
        )
    if not 0 < conversion <= form.delta_budget:
        raise InvalidInput("delta_conversion", "must be > 0 and at most delta_budget")
    rho = accounting.rho_budget(form.epsilon_budget, conversion)
    if rho == 0 and form.rho_budget is None:
        raise InvalidInput(
            "epsilon_budget",
            f"{form.epsilon_budget} is too small for zcdp accounting at delta_conversion "
            f"{conversion}: its zCDP budget (the largest rho whose conversion the service "
            "certifies within it) is 0, so no release could run; raise epsilon_budget or "
            "delta_budget, or use hybrid or basic accounting",
        )
    if form.rho_budget is not None:
        if form.rho_budget > rho:
            raise InvalidInput(
                "rho_budget",
                f"must be at most {rho}, the largest rho whose conversion is within "
                "(epsilon_budget, delta_conversion)",
            )
        rho = form.rho_budget
    return BudgetTerms("zcdp", rho, delta_conversion=conversion)


def check_delta_bound(form: DatasetCreate, n_rows: int) -> None:
    """Refuse ``delta_budget > 1/n`` (:class:`InvalidInput` naming ``delta_budget``) unless
    ``allow_large_delta``: a mechanism that publishes one of the ``n`` rows at random is
    ``(0, 1/n)``-DP, so such a delta allows releasing whole rows. ``n`` is the rows at upload
    or registration (appends do not re-check it)."""
    if form.allow_large_delta or n_rows < 1:
        return
    if form.delta_budget * n_rows > 1:
        raise InvalidInput(
            "delta_budget",
            f"{form.delta_budget} is above 1/n = 1/{n_rows} (n: the dataset's rows): a delta "
            "that large offers no protection (publishing one row in n at random is "
            "(0, 1/n)-DP); use a delta well below 1/n (e.g. 1/n^2 or 1e-6), or send "
            "`allow_large_delta=true` to accept it anyway",
        )


def register_dataset(
    session: Session,
    store: DatasetStore,
    principal: Principal,
    form: DatasetCreate,
    stored: StoredMatrix,
    default_accounting: str,
    *,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
) -> Dataset:
    """Register a file already in the store with its budget; the file is removed on failure.
    With ``idempotency_key`` the dataset is the key's (:mod:`service.upload_idempotency`)."""
    try:
        terms = check_budgets(form, default_accounting)
        # Also with a privacy unit: 1/n over rows is below 1/n over people, so it is the
        # stricter bound of the two.
        check_delta_bound(form, stored.n_rows)
        require_role(principal, "owner")
        dataset = Dataset(
            id=uuid.uuid4(),
            # In the commit order (service.commit_order): a registration by reference counts
            # in every term for a point after its request (padding_queue.registration_seconds).
            created_at=commit_order.stamp(session),
            name=form.name,
            owner_key_id=principal.key_id,
            n_rows=stored.n_rows,
            n_cols=stored.n_cols,
            row_norm_bound=form.row_norm_bound,
            epsilon_total=form.epsilon_budget,
            delta_total=form.delta_budget,
            accounting=terms.accounting,
            rho_total=terms.rho_total,
            mu_total=terms.mu_total,
            delta_conversion=terms.delta_conversion,
            delta_gaussian=terms.delta_gaussian,
            delta_mechanisms=terms.delta_mechanisms,
            delta_basic=terms.delta_basic,
            file_name=stored.file_name,
            privacy_unit_column=(
                None
                if form.privacy_unit_column is None
                else privacy_unit.describe_column(form.privacy_unit_column)
            ),
            n_units=stored.n_units,
            idempotency_key=idempotency_key,
            request_hash=request_hash if idempotency_key is not None else None,
        )
        session.add(dataset)
        session.flush()
        session.add(
            DatasetBatch(
                dataset_id=dataset.id,
                seq=0,
                n_rows=stored.n_rows,
                row_offset=0,
                file_name=stored.file_name,
                created_at=dataset.created_at,
            )
        )
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
                # The unit and how many: public facts like n_rows; never an identifier.
                "privacy_unit": privacy_unit.ROW if stored.n_units is None else privacy_unit.PERSON,
                **({} if stored.n_units is None else {"n_units": stored.n_units}),
            },
        )
        audit.record(
            session,
            "budget_set",
            actor_key_id=principal.key_id,
            dataset_id=dataset.id,
            details={
                "epsilon_total": form.epsilon_budget,
                "delta_total": form.delta_budget,
                "accounting": terms.accounting,
                "rho_total": terms.rho_total,
                "mu_total": terms.mu_total,
                "delta_conversion": terms.delta_conversion,
                # hybrid's other shares of delta (A', B's steps, C), only there.
                **(
                    {
                        "delta_gaussian": terms.delta_gaussian,
                        "delta_mechanisms": terms.delta_mechanisms,
                        "delta_basic": terms.delta_basic,
                    }
                    if terms.accounting == "hybrid"
                    else {}
                ),
                # The owner's override of the 1/n bound, on the record when used.
                **({"allow_large_delta": True} if form.allow_large_delta else {}),
            },
        )
    except BaseException:
        store.purge(stored.file_name)
        raise
    return dataset


def cover_objects(session: Session, dataset_id: uuid.UUID, reference: Reference) -> None:
    """Record the objects ``reference`` covers, refusing (409) one that a live dataset covers
    already, by name, by content or by an alias (the same file by another path, its columns in
    another order, some of its rows in any order:
    :meth:`~service.reference.integrity.Reference.covered_named`): two datasets on the same
    rows would double what can be learned about the people in them, and a batch repeating an
    earlier batch's rows (``dataset_id`` covers them) would count those people twice in one.
    The refusal says which (this dataset or another) and names the object, never a value. The
    unique constraints decide between concurrent registrations; the query before them names
    the object."""
    named = reference.covered_named()
    covered = [(key, key_sha, content) for key, key_sha, content, _ in named]
    for start in range(0, len(named), 400):
        part = named[start : start + 400]
        # A refusal names the object (an alias row stands for one: a hard link, a reordering).
        keys = {key_sha: name for _, key_sha, _, name in part}
        contents = {content: name for _, _, content, name in part}
        own = DatasetReferenceObject.dataset_id == dataset_id
        taken = session.execute(
            select(
                DatasetReferenceObject.key_sha256,
                DatasetReferenceObject.content_sha256,
                own,
            )
            .where(
                or_(
                    DatasetReferenceObject.key_sha256.in_(keys),
                    DatasetReferenceObject.content_sha256.in_(contents),
                )
            )
            .order_by(own.desc())  # this dataset's own first: the nearer reason
            .limit(1)
        ).first()
        if taken is not None:
            name = keys.get(taken[0]) or contents[taken[1]]
            raise _covered_by_this(name) if taken[2] else _registered(name)
    session.add_all(
        DatasetReferenceObject(
            dataset_id=dataset_id, object_key=key, key_sha256=key_sha, content_sha256=content
        )
        for key, key_sha, content in covered
    )
    try:
        session.flush()
    except IntegrityError:
        # A concurrent registration of the same objects committed first.
        raise _registered(covered[0][0]) from None


#: What an object's cover stands for besides its key (:func:`cover_objects`'s refusals).
_ALIASES = (
    "(or the same file by another path, its columns in another order, a copy of its bytes, a "
    "column's values written again, or some of its rows in any order)"
)


def _registered(key: str) -> ObjectRegistered:
    return ObjectRegistered(
        f"uri: {key} {_ALIASES} is already covered by another live dataset; one dataset per "
        "object, so that its rows have one budget (delete that dataset first to register it "
        "again)"
    )


def _covered_by_this(key: str) -> ObjectRegistered:
    return ObjectRegistered(
        f"uri: {key} {_ALIASES} is already covered by this dataset (an earlier batch); its "
        "rows would count twice in it, the same people twice: a batch holds only new rows"
    )


def require_ready(dataset: Dataset) -> None:
    """409 ``dataset_not_ready`` unless the dataset's registration finished ``ready`` and is
    shown so (:mod:`service.registration_visibility`: else the answer would tell when a worker
    ended it): a dataset by reference has no checked rows (and no public ``n_rows``) before,
    and none after a failed registration."""
    status = registration_visibility.shown(dataset, None, utcnow()).registration_status
    if status == "registering":
        raise DatasetNotReady(
            f"dataset {dataset.id} is still registering: a worker is reading and checking its "
            "objects; poll GET /v1/datasets/{id} until registration_status is ready"
        )
    if status != "ready":
        # Not the reason: this answer also goes to analysts, and the reason is the owner's.
        raise DatasetNotReady(
            f"dataset {dataset.id}'s registration failed; its owner sees why in GET "
            "/v1/datasets/{id} (delete it and register again)"
        )


def lock_own_dataset(session: Session, principal: Principal, dataset_id: uuid.UUID) -> Dataset:
    """The owner's live dataset, locked (``FOR UPDATE``; SQLite: the write lock): appends and
    releases of one dataset are serialised, so each sees a whole number of batches."""
    require_role(principal, "owner")
    dataset: Dataset | None = row_locks.lock_one(
        session,
        select(Dataset)
        .where(Dataset.id == dataset_id, Dataset.owner_key_id == principal.key_id)
        .with_for_update(),
    )
    if dataset is None:
        raise NotFound(f"no dataset {dataset_id}")
    if dataset.deleted_at is not None or dataset.file_name is None:
        raise DatasetGone(f"dataset {dataset_id} was deleted; its rows are gone")
    require_ready(dataset)
    return dataset


def check_append_unit(person_level: bool, column: object, has_secret: bool) -> None:
    """422 naming ``privacy_unit_column`` when a batch's identifier column does not match its
    dataset's unit: a person-level dataset's batch must name it (so a person who reappears
    keeps their unit index, :mod:`service.unit_keys`), a row-level dataset's must not; a
    person-level dataset uploaded before appends per person existed has no secret to map
    identifiers with and takes none."""
    if person_level and column is None:
        raise InvalidInput(
            privacy_unit.FIELD,
            "this dataset's privacy unit is a person: name the batch's identifier column "
            "(privacy_unit_column), so that a person who reappears keeps one unit",
        )
    if not person_level and column is not None:
        raise InvalidInput(
            privacy_unit.FIELD,
            "this dataset's privacy unit is the row: a batch cannot name an identifier column",
        )
    if person_level and not has_secret:
        raise InvalidInput(
            privacy_unit.FIELD,
            "this person-level dataset was uploaded before appends per person existed and "
            "keeps no keyed identifiers to recognise a returning person; upload the grown "
            "dataset as a new dataset",
        )


def append_batch(
    session: Session,
    store: DatasetStore,
    principal: Principal,
    dataset_id: uuid.UUID,
    batch: StoredMatrix,
    settings: Settings,
    *,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
) -> tuple[DatasetBatch, bool]:
    """Append an ingested batch (``store.ingest(..., batch=True)``) to the owner's dataset;
    the batch row and whether it was appended now (``False``: an earlier append with the same
    ``idempotency_key`` and body made it, found under the lock, and nothing is appended).

    Under the dataset's lock: the width is checked (422 naming ``file``) and the decoded size of
    the dataset with the batch (413, ``DPSS_MAX_DATASET_BYTES``), the rows are written
    after the committed ones and fsynced, then the batch row, the new ``n_rows``/``n_batches``
    and a ``dataset_rows_appended`` event are added to the caller's transaction. A batch is
    visible to nobody until that commits; if it does not, :func:`trim_uncommitted` cuts the
    rows off again (and the next append would anyway). ``batch``'s file is removed in every case.
    """
    try:
        dataset = lock_own_dataset(session, principal, dataset_id)
    except row_locks.RowBusy:
        # Nothing done yet; the API runs this again with the same batch (service.row_locks),
        # and discards it itself if it gives up.
        raise
    except BaseException:
        store.discard(batch.file_name)
        raise
    try:
        # Under the lock, which serialises a dataset's appends: a concurrent retry with the
        # same key has committed its batch or not started it.
        earlier = upload_idempotency.find_batch(
            session, dataset.id, idempotency_key, request_hash or ""
        )
        if earlier is not None:
            return earlier, False
        person_level = dataset.privacy_unit_column is not None
        if person_level != (batch.unit_digests is not None):
            check_append_unit(person_level, batch.unit_digests, True)
        if batch.n_cols != dataset.n_cols:
            raise InvalidInput(
                "file",
                f"the batch has {batch.n_cols} columns; this dataset has {dataset.n_cols}",
            )
        if dataset.reference is not None:
            raise InvalidInput(
                "file",
                "a dataset registered by reference grows by objects, not rows: append a batch "
                "with POST /v1/dataset-references/{id}/batches",
            )
        store.limits.check_size(
            dataset.n_rows + batch.n_rows, dataset.n_cols, "the dataset with this batch"
        )
        assert dataset.file_name is not None  # checked by the lock
        if batch.unit_digests is not None:
            # The unit index first (entries past the committed rows are never read), so the
            # rows are never there without their units; a person keeps their index.
            dataset.n_units, _ = store.append_units(
                dataset.file_name, batch.unit_digests, dataset.n_rows, dataset.n_units or 0
            )
        store.append(dataset.file_name, batch.file_name, dataset.n_rows)
    finally:
        store.discard(batch.file_name)
    row = DatasetBatch(
        dataset_id=dataset.id,
        seq=dataset.n_batches,
        n_rows=batch.n_rows,
        row_offset=dataset.n_rows,
        file_name=dataset.file_name,
        # The epochs' point: in the commit order (service.commit_order).
        created_at=commit_order.stamp(session),
        idempotency_key=idempotency_key,
        request_hash=request_hash if idempotency_key is not None else None,
    )
    session.add(row)
    dataset.n_rows += batch.n_rows
    dataset.n_batches += 1
    audit.record(
        session,
        "dataset_rows_appended",
        actor_key_id=principal.key_id,
        dataset_id=dataset.id,
        details={"seq": row.seq, "n_rows": batch.n_rows, "n_rows_total": dataset.n_rows},
    )
    # A continual release waiting for this batch is a job again: wake idle workers at commit
    # (a hint, as for a queued release; without it they find the batch at their next poll).
    wake.announce(session, settings)
    session.flush()
    return row, True


def trim_uncommitted(session: Session, store: DatasetStore, dataset_id: uuid.UUID) -> None:
    """After a failed append: under the dataset's lock, cut its file back to the committed
    rows (the database's ``n_rows``), so no uncommitted row stays on disk."""
    dataset: Dataset | None = row_locks.lock_one(
        session, select(Dataset).where(Dataset.id == dataset_id).with_for_update()
    )
    if dataset is not None and dataset.file_name is not None:
        store.trim(dataset.file_name, dataset.n_rows)


def _visible_to(
    role: str,
    owner_key_id: uuid.UUID | ColumnElement[Any],
    now: datetime | ColumnElement[Any],
) -> list[ColumnElement[bool]]:
    """Owners see the datasets they uploaded; analysts see every ready dataset's metadata. On the
    table's columns, so that a Core statement (:data:`_BUDGET_READS`) can use them too."""
    columns = Dataset.__table__.c
    conditions: list[ColumnElement[bool]] = [columns.deleted_at.is_(None)]
    if role == "owner":
        conditions.append(columns.owner_key_id == owner_key_id)
    else:
        # A dataset by reference reaches analysts once registered: before, it has no rows, and
        # a failed registration's reason (a row number, an object's name) is the owner's.
        # (From the moment its registration shows: registration_visibility.)
        conditions.append(registration_visibility.listed_when_ready(now))
    return conditions


def _visible(principal: Principal) -> list[ColumnElement[bool]]:
    require_role(principal, "owner", "analyst")
    return _visible_to(principal.role, principal.key_id, utcnow())


def get_dataset(session: Session, principal: Principal, dataset_id: uuid.UUID) -> Dataset:
    dataset = session.execute(
        select(Dataset).where(Dataset.id == dataset_id, *_visible(principal))
    ).scalar_one_or_none()
    if dataset is None:
        raise NotFound(f"no dataset {dataset_id}")
    return dataset


#: The budget read's statements (:func:`service.ledger.budget_select`), by dialect shape and
#: role, built once: with bound parameters ``dataset_id``, ``owner_key_id`` (owners) and
#: ``now``, and the visibility rule of :func:`get_dataset`.
_BUDGET_READS = {
    (dialect, role): ledger.budget_select(
        dialect,
        [
            Dataset.__table__.c.id == bindparam("dataset_id"),
            *_visible_to(role, bindparam("owner_key_id"), bindparam("now")),
        ],
    )
    for dialect in ("postgresql", "sqlite")
    for role in ("owner", "analyst")
}


def get_budget(
    session: Session, principal: Principal, dataset_id: uuid.UUID
) -> tuple[ledger.Totals, ledger.BudgetState]:
    """The budget of a dataset ``principal`` may see (as :func:`get_dataset`) in one statement,
    with no ORM object: the dataset's totals and what its ledger spent, refunds counted from
    when they take effect (:func:`service.ledger.in_effect`)."""
    require_role(principal, "owner", "analyst")
    dialect = ledger.dialect_of(session)
    parameters: dict[str, Any] = {"dataset_id": dataset_id, "now": utcnow()}
    if principal.role == "owner":
        parameters["owner_key_id"] = principal.key_id
    rows = session.execute(_BUDGET_READS[dialect, principal.role], parameters).all()
    found = ledger.budget_row_of(dialect, rows)
    if found is None:
        raise NotFound(f"no dataset {dataset_id}")
    return found


DATASET_CURSOR = "dataset"
DATASET_SCOPE = list_scope("datasets")


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
        created_at, dataset_id = parse_time_id_cursor(cursor, DATASET_CURSOR, DATASET_SCOPE)
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
    following = (
        time_id_cursor(DATASET_CURSOR, DATASET_SCOPE, rows[-1].created_at, rows[-1].id)
        if more
        else None
    )
    return Page(items=rows, total=total, next=following)


def delete_dataset(
    session: Session, store: DatasetStore, principal: Principal, dataset_id: uuid.UUID
) -> None:
    """Purge the rows; the ledger and the audit log stay. A dataset by reference loses its
    reference only: the owner's objects are not touched (the event's ``objects_kept`` says so).

    The file is removed before the transaction commits: if the commit then failed, the row would
    point at a missing file and any queued release would fail with a refund, which is safe; the
    other order could leave raw rows on disk.
    """
    require_role(principal, "owner")
    # An act the chain counts from (an end's due moment): in the commit order, the row locked
    # first (a creator must not wait for a row while it holds the order's lock), and before
    # anything is written (the reference's UPDATE below would wait for the row unbounded by an
    # attempt; a unit of work that waits for the row is run again: service.row_locks). Before
    # the dataset is read, too: read first, a deletion committed while this one waited for the
    # row went unseen (PostgreSQL), and this one deleted it again, moving its deleted_at.
    row_locks.lock_one(
        session,
        select(Dataset.id)
        .where(Dataset.id == dataset_id, Dataset.owner_key_id == principal.key_id)
        .with_for_update(),
    )
    dataset = get_dataset(session, principal, dataset_id)
    file_name = dataset.file_name
    # By reference: the service forgets where the objects are; it never deletes them.
    referenced = None if dataset.reference is None else str(dataset.reference["uri"])
    if referenced is not None and dataset.registration_request is None:
        # Registered before its request was kept (migration 0014): the request, never cleared,
        # is what tells a release ending after this deletion that it awaits the re-check as
        # one ending before it does (service.reference_recheck.awaits_recheck).
        dataset.registration_request = {"uri": referenced}
    dataset.reference = None
    session.execute(
        delete(DatasetReferenceObject).where(DatasetReferenceObject.dataset_id == dataset.id)
    )
    dataset.deleted_at = commit_order.stamp(session)
    dataset.file_name = None
    session.execute(
        update(DatasetBatch).where(DatasetBatch.dataset_id == dataset.id).values(file_name=None)
    )
    audit.record(
        session,
        "dataset_deleted",
        actor_key_id=principal.key_id,
        dataset_id=dataset.id,
        details={"name": dataset.name}
        | ({} if referenced is None else {"objects_kept": referenced}),
    )
    session.flush()
    if file_name and referenced is None:
        store.purge(file_name)
