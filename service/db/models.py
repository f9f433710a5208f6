"""ORM models (SQLAlchemy 2.0, typed). The schema itself is created by Alembic migrations only."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from service.db.types import ExactDecimal, UTCDateTime

#: Exact decimals for budgets: 38 digits, 30 after the point (deltas like 1e-12 stay exact).
BudgetNumeric = ExactDecimal
#: Sequence numbers: BIGINT on PostgreSQL, INTEGER (the rowid type) on SQLite.
SeqInteger = BigInteger().with_variant(Integer, "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        datetime: UTCDateTime(),
    }


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(20))
    #: SHA-256 of the secret (the secret has 256 bits of entropy, so no slow hash is needed).
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class Dataset(Base):
    __tablename__ = "datasets"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(200))
    owner_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_keys.id"))
    n_rows: Mapped[int] = mapped_column(BigInteger)
    n_cols: Mapped[int] = mapped_column(Integer)
    row_norm_bound: Mapped[float | None] = mapped_column(default=None)
    epsilon_total: Mapped[Decimal] = mapped_column(BudgetNumeric)
    delta_total: Mapped[Decimal] = mapped_column(BudgetNumeric)
    #: Path of the stored ``.npy`` relative to the datasets directory; null once purged.
    file_name: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)
    #: Batches so far (the upload is batch 0, each append one more); ``n_rows`` counts them all.
    n_batches: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    #: ``basic`` (sums of epsilon and delta), ``gaussian`` (sums of mu^2, kept as rho = mu^2/2)
    #: or ``zcdp`` (sums of rho and delta); see :mod:`service.accounting`.
    accounting: Mapped[str] = mapped_column(String(10), default="basic", server_default="basic")
    #: The filter's rho budget (``gaussian``: ``mu_total^2/2`` rounded down); null for ``basic``.
    rho_total: Mapped[Decimal | None] = mapped_column(BudgetNumeric, default=None)
    #: ``gaussian``: the GDP budget ``mu_B`` derived from (or within) the stated target.
    mu_total: Mapped[Decimal | None] = mapped_column(BudgetNumeric, default=None)
    #: ``zcdp``: the share of ``delta_total`` reserved for converting ``rho_total`` to
    #: ``(epsilon_total, delta)``; mechanisms' approximate steps may spend the rest.
    delta_conversion: Mapped[Decimal | None] = mapped_column(BudgetNumeric, default=None)
    #: ``hybrid`` (either of three filters, :class:`service.accounting.HybridState`): the
    #: shares of ``delta_total`` of filter A' (GDP; its budget is ``mu_total``), of B's
    #: approximate steps (B's conversion share is ``delta_conversion``, its budget
    #: ``rho_total``) and of filter C (basic). Null for the other accountings.
    delta_gaussian: Mapped[Decimal | None] = mapped_column(BudgetNumeric, default=None)
    delta_mechanisms: Mapped[Decimal | None] = mapped_column(BudgetNumeric, default=None)
    delta_basic: Mapped[Decimal | None] = mapped_column(BudgetNumeric, default=None)
    #: A dataset registered by reference (:mod:`service.reference`): its URI, columns, row
    #: groups and the objects' ETags/versions and sizes; null for an uploaded dataset.
    reference: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    #: ``registering`` (a dataset by reference whose objects a worker has yet to read and
    #: check: it refuses releases, grants and appends), ``ready`` or ``failed`` (with
    #: :attr:`registration_reason`). Uploads are ``ready`` at once.
    registration_status: Mapped[str] = mapped_column(
        String(12), default="ready", server_default="ready", index=True
    )
    registration_reason: Mapped[str | None] = mapped_column(Text, default=None)
    #: While registering: ``{"uri", "columns"}`` as requested (the worker's job).
    registration_request: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    #: The registration job's lease, as a release's (:mod:`service.registration`).
    registration_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    registration_lease_owner: Mapped[str | None] = mapped_column(String(200), default=None)
    registration_lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    #: A batch appended by reference (``POST /v1/dataset-references/{id}/batches``):
    #: ``registering`` while a worker reads and checks its objects (the lease is the
    #: ``registration_lease_*`` columns, free once the dataset is ``ready``), ``failed`` with
    #: :attr:`batch_reason`; null when none is pending. The batch gets its ``dataset_batches``
    #: row only once registered, so no release sees it before (:mod:`service.registration`).
    batch_status: Mapped[str | None] = mapped_column(String(12), default=None, index=True)
    batch_reason: Mapped[str | None] = mapped_column(Text, default=None)
    #: While the batch registers: ``{"uri", "key"}`` as requested (the worker's job).
    batch_request: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    #: When owners and analysts may see the registration end (:mod:`service.
    #: registration_visibility`): ``registration_visible_at`` fixed at the request from public
    #: facts (the padding floor), ``registration_shown_at`` stored at its end, the first step of
    #: the late schedule at or after it. Null: shown as stored (padding off, or older rows).
    registration_visible_at: Mapped[datetime | None] = mapped_column(default=None)
    registration_shown_at: Mapped[datetime | None] = mapped_column(default=None)
    #: The same for the pending batch by reference, with its request's moment, and the
    #: dataset's ``n_rows`` before it (set when it counted, shown until ``batch_shown_at``).
    #: The latest batch's: the next batch's request keeps them in :class:`BatchMoments` first.
    batch_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    batch_visible_at: Mapped[datetime | None] = mapped_column(default=None)
    batch_shown_at: Mapped[datetime | None] = mapped_column(default=None)
    batch_prior_rows: Mapped[int | None] = mapped_column(BigInteger, default=None)
    #: The upload's identifier column when the privacy unit is a person (issue 34): as the
    #: owner named it (a name or a 0-based index); its values are never stored, only a dense
    #: per-row unit index in the store (:mod:`service.privacy_unit`). Null: the unit is the row.
    privacy_unit_column: Mapped[str | None] = mapped_column(String(200), default=None)
    #: Distinct units (people) when ``privacy_unit_column`` is set; public, like ``n_rows``.
    n_units: Mapped[int | None] = mapped_column(BigInteger, default=None)
    #: The upload's ``Idempotency-Key`` (unique per owner key; null without one) and the
    #: SHA-256 of its form fields and file: a retry with the same key and body gets this
    #: dataset, never a second budget on the same rows (:mod:`service.upload_idempotency`).
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    request_hash: Mapped[str | None] = mapped_column(String(64), default=None)

    __table_args__ = (
        Index("uq_dataset_idempotency", "owner_key_id", "idempotency_key", unique=True),
        # The registrations and batches by reference not shown yet, read on each release
        # request (service.padding_queue.registration_seconds); partial: the datasets
        # registered or appended by upload, and those long shown, are no rows of theirs to
        # read (migration 0025).
        Index(
            "ix_datasets_registration_pending",
            "registration_shown_at",
            postgresql_where=text("registration_visible_at IS NOT NULL"),
            sqlite_where=text("registration_visible_at IS NOT NULL"),
        ),
        Index(
            "ix_datasets_batch_pending",
            "batch_shown_at",
            postgresql_where=text("batch_visible_at IS NOT NULL"),
            sqlite_where=text("batch_visible_at IS NOT NULL"),
        ),
    )


class DatasetReferenceObject(Base):
    """An object a live dataset by reference covers: one live dataset per object (its resolved
    path, or its bucket and key) and per content (the digests of the bytes its releases read),
    so that the same rows never get two budgets. Removed with the dataset's reference, when
    the dataset is deleted."""

    __tablename__ = "dataset_reference_objects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"), index=True)
    #: ``file:///resolved/path`` or ``s3://bucket/key``.
    object_key: Mapped[str] = mapped_column(Text)
    #: SHA-256 of ``object_key`` (unique: an index on a long path would not fit a B-tree page).
    key_sha256: Mapped[str] = mapped_column(String(64))
    #: SHA-256 of the object's footer digest and chunk digests (what a release reads).
    content_sha256: Mapped[str] = mapped_column(String(64))

    __table_args__ = (
        UniqueConstraint("key_sha256", name="uq_reference_objects_key"),
        UniqueConstraint("content_sha256", name="uq_reference_objects_content"),
    )


class DatasetBatch(Base):
    """One batch of a dataset: rows ``[row_offset, row_offset + n_rows)`` of ``file_name``.

    The batches of a dataset share its one data file (appends are written at its end), so a
    prefix ``batches <= s`` is one contiguous memory map: a worker reads it without a copy.
    """

    __tablename__ = "dataset_batches"

    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    n_rows: Mapped[int] = mapped_column(BigInteger)
    row_offset: Mapped[int] = mapped_column(BigInteger)
    file_name: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: An append's ``Idempotency-Key`` (unique per dataset) and the SHA-256 of its body, as
    #: :attr:`Dataset.idempotency_key`; null for batch 0 and appends sent without one.
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    request_hash: Mapped[str | None] = mapped_column(String(64), default=None)

    __table_args__ = (Index("uq_batch_idempotency", "dataset_id", "idempotency_key", unique=True),)


class BatchMoments(Base):
    """The public moments of one batch by reference a dataset's next batch replaced on its row
    (:attr:`Dataset.batch_requested_at`, ``batch_visible_at``, ``batch_shown_at``): kept, one row
    per batch, when that next batch is requested (:func:`service.registration.request_batch`),
    so that the padding's registration term at an earlier moment still counts it
    (:func:`service.padding_queue.registration_seconds`). The dataset's row holds its latest
    batch's; these rows never change (the batch was shown before its next one is requested)."""

    __tablename__ = "batch_moments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"), index=True)
    requested_at: Mapped[datetime]
    visible_at: Mapped[datetime | None] = mapped_column(default=None)
    shown_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (
        # As ix_datasets_batch_pending: the term reads the batches not shown at a moment only.
        Index(
            "ix_batch_moments_pending",
            "shown_at",
            postgresql_where=text("visible_at IS NOT NULL"),
            sqlite_where=text("visible_at IS NOT NULL"),
        ),
    )


class LedgerEntry(Base):
    """Append-only: remaining = total - sum(charges) + sum(refunds)."""

    __tablename__ = "ledger_entries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"), index=True)
    release_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("releases.id"))
    kind: Mapped[str] = mapped_column(String(10))  # "charge" | "refund"
    epsilon: Mapped[Decimal] = mapped_column(BudgetNumeric)
    delta: Mapped[Decimal] = mapped_column(BudgetNumeric)
    #: The zCDP rho (``gaussian`` datasets: ``mu^2/2``); 0 on ``basic`` datasets, whose
    #: entries move ``epsilon`` and ``delta``. On the others ``epsilon`` is 0.
    rho: Mapped[Decimal] = mapped_column(BudgetNumeric, default=Decimal(0), server_default="0")
    #: ``hybrid`` datasets: the release's GDP ``mu^2`` (filter A'; null: a step A' cannot
    #: charge) and its approximate steps' delta (filter B; null: no proven zCDP profile, and
    #: ``rho`` is then 0). ``epsilon``/``delta`` are then the single release's (filter C's).
    #: Null on the other accountings.
    gdp: Mapped[Decimal | None] = mapped_column(BudgetNumeric, default=None)
    zcdp_delta: Mapped[Decimal | None] = mapped_column(BudgetNumeric, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: The grant this entry is also charged to (or refunded to); null for a release that spent
    #: the dataset's budget directly. One entry moves both budgets, so they cannot disagree.
    grant_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("grants.id"), default=None, index=True
    )

    __table_args__ = (UniqueConstraint("release_id", "kind", name="uq_ledger_release_kind"),)


class Grant(Base):
    """A share ``(epsilon, delta)`` of a dataset's budget for one analyst key, or for every
    analyst (``analyst_key_id`` null). Spent = its ledger entries; never edited, only revoked."""

    __tablename__ = "grants"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"), index=True)
    analyst_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_keys.id"))
    epsilon: Mapped[Decimal] = mapped_column(BudgetNumeric)
    delta: Mapped[Decimal] = mapped_column(BudgetNumeric)
    #: The share in the dataset's currency when it is not ``basic`` (``gaussian``: ``mu^2/2``).
    rho: Mapped[Decimal] = mapped_column(BudgetNumeric, default=Decimal(0), server_default="0")
    #: The delta its epsilon figures are stated at (:mod:`service.spend`): the delta the owner
    #: gave it with (default the dataset's ``delta_total``); on ``gaussian`` and ``zcdp``, where
    #: ``delta`` is only what its mechanisms may spend, the one column that keeps it (a grant
    #: given in ``rho`` or ``mu``: the dataset's ``delta_total``, its epsilon is converted there).
    #: Null only for rows a migration could not fill (then the dataset's ``delta_total``).
    stated_delta: Mapped[Decimal | None] = mapped_column(BudgetNumeric, default=None)
    created_by_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_keys.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class Release(Base):
    """A release request and its job state: this table is the job queue."""

    __tablename__ = "releases"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"), index=True)
    requester_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_keys.id"))
    mechanism: Mapped[str] = mapped_column(String(64))
    k: Mapped[int] = mapped_column(Integer)
    epsilon: Mapped[Decimal] = mapped_column(BudgetNumeric)
    delta: Mapped[Decimal] = mapped_column(BudgetNumeric)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    #: What the release was charged on a ``gaussian`` or ``zcdp`` dataset (null on ``basic``,
    #: where ``epsilon``/``delta`` are the charge; otherwise they are the single-release target
    #: the mechanism was calibrated to, i.e. what a ``basic`` dataset would charge).
    cost_rho: Mapped[Decimal | None] = mapped_column(BudgetNumeric, default=None)
    cost_delta: Mapped[Decimal | None] = mapped_column(BudgetNumeric, default=None)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    #: ``reason`` and ``result_extras`` (the ``outcome`` group), whose sizes depend on the
    #: outcome (an ``analyze_gauss`` centre alone is ``d`` numbers), are deferred: a read of a
    #: release whose outcome the caller may not see yet loads neither, so it takes the same
    #: time whatever the worker stored (:func:`service.visibility.load_outcomes`).
    reason: Mapped[str | None] = mapped_column(
        Text, default=None, deferred=True, deferred_group="outcome"
    )
    refunded: Mapped[bool] = mapped_column(default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(200), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: Analysts see the outcome no earlier than this: ``created_at`` plus a padding computed
    #: from public facts, so polling does not reveal the run time within the padding.
    visible_at: Mapped[datetime | None] = mapped_column(default=None)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    #: Emptied by migration 0007 and no longer written: the basis is in ``release_bases``.
    result_basis: Mapped[bytes | None] = mapped_column(LargeBinary, default=None, deferred=True)
    result_shape: Mapped[list[int] | None] = mapped_column(JSON, default=None)
    result_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    result_extras: Mapped[dict[str, Any] | None] = mapped_column(
        JSON, default=None, deferred=True, deferred_group="outcome"
    )
    #: The prefix of the dataset a one-shot release reads, fixed at request time (the public
    #: ``n`` its parameters were prepared with); null for continual releases.
    n_rows_read: Mapped[int | None] = mapped_column(BigInteger, default=None)
    batches_read: Mapped[int | None] = mapped_column(Integer, default=None)
    #: Continual releases: epochs released so far, and the serialized mechanism state (the
    #: tree's closed nodes with their noise). Private: never in a response, log or event.
    #: The state lives in ``release_states`` (this column was emptied by migration 0007): it
    #: grows as epochs are stored, and an analyst's read of the row must take the same time
    #: before an epoch is visible. The key is not loaded with the row either.
    epochs_done: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    continual_state: Mapped[bytes | None] = mapped_column(LargeBinary, default=None, deferred=True)
    #: The 256-bit key of the release's CSPRNG: epoch t draws from ChaCha20 keyed with
    #: SHA-256(key, t), so an epoch computed again after a crash draws the same noise.
    continual_key: Mapped[bytes | None] = mapped_column(LargeBinary, default=None, deferred=True)
    #: The W3C ``traceparent`` of the request that queued the release (random trace and span
    #: ids, nothing else), so that the worker's spans join the request's trace; null when
    #: tracing is off. Never in a response.
    traceparent: Mapped[str | None] = mapped_column(String(55), default=None)
    #: Continual releases: analysts see the release's end no earlier than this (the moment the
    #: epoch it ended at would have become visible, fixed from public facts before it ran);
    #: null: from ``visible_at`` and once every stored epoch is visible.
    outcome_visible_at: Mapped[datetime | None] = mapped_column(default=None)
    #: Releases on a dataset by reference (:mod:`service.reference_recheck`; a continual one's
    #: end, its epochs have their own): the
    #: re-check of the dataset's objects made at or after the outcome was due, ``pending``
    #: (set with the end), then ``unchanged`` or ``changed``; null for every other release.
    #: ``reference_checked_at`` is when it ran (admins' eyes only), ``reference_shown_at`` when
    #: analysts and owners are shown its verdict: a public moment (the due moment plus a public
    #: grace, or a step of the late schedule).
    reference_check: Mapped[str | None] = mapped_column(String(16), default=None)
    reference_checked_at: Mapped[datetime | None] = mapped_column(default=None)
    reference_shown_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (
        UniqueConstraint("requester_key_id", "idempotency_key", name="uq_release_idempotency"),
        Index("ix_releases_claim", "status", "created_at"),
        # The re-check thread of every worker looks for pending re-checks about once a second.
        Index("ix_releases_reference_check", "reference_check"),
    )


class ReleaseEpoch(Base):
    """One epoch of a continual release: the basis released after batch ``batch_seq``."""

    __tablename__ = "release_epochs"

    release_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("releases.id"), primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    batch_seq: Mapped[int] = mapped_column(Integer)
    n_rows_read: Mapped[int] = mapped_column(BigInteger)
    #: Emptied by migration 0007 and no longer written: the basis is in ``release_bases``.
    basis: Mapped[bytes | None] = mapped_column(LargeBinary, default=None, deferred=True)
    basis_shape: Mapped[list[int] | None] = mapped_column(JSON, default=None)
    basis_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    extras: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: Analysts see the epoch no earlier than this: its batch's commit time plus a padding from
    #: public facts (and not before the release's ``visible_at``), so that polling does not
    #: reveal how long the epoch took.
    visible_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: The ``visible_at`` the worker's claim computed from public inputs
    #: (:func:`service.padding_epochs.epoch_padding`), before any late step: the next epoch's
    #: moment follows it, so a chain over pending epochs is public before they show (null:
    #: stored before migration 0026; ``visible_at`` stands in).
    due_at: Mapped[datetime | None] = mapped_column(default=None)
    #: Epochs of a padded continual release on a dataset by reference
    #: (:mod:`service.reference_recheck`): the re-check of the objects this epoch read, made at
    #: or after its ``visible_at``, as ``releases.reference_check`` for a one-shot release
    #: (``pending``, then ``unchanged`` or ``changed``); null for every other epoch.
    reference_check: Mapped[str | None] = mapped_column(String(16), default=None)
    reference_checked_at: Mapped[datetime | None] = mapped_column(default=None)
    reference_shown_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (
        # The re-check thread of every worker looks for pending epoch re-checks too.
        Index("ix_release_epochs_reference_check", "reference_check"),
    )


class ReleaseBasis(Base):
    """A released basis, little-endian float64 row-major ``d x k``, written once.

    Kept apart from ``releases`` and ``release_epochs``, whose rows every read of a release
    touches: a large value stored in them made those reads slower once a worker stored it
    (SQLite reaches the columns after a large value by walking its overflow pages), which told
    an analyst when the job finished before ``visible_at``. A basis is read only when shown.
    """

    __tablename__ = "release_bases"

    release_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("releases.id"), primary_key=True)
    #: 0: the release's result; ``t >= 1``: epoch ``t`` of a continual release.
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    basis: Mapped[bytes] = mapped_column(LargeBinary)


class Prior(Base):
    """A public basis (``d x m``, orthonormal columns) that releases may name with
    ``params.prior_id``: uploaded with ``POST /v1/priors`` or stored from a request's inline
    ``params.prior_basis`` (see :mod:`service.priors`). Public data: never derived from a
    dataset's rows. ``basis`` is little-endian float64 row-major and ``sha256`` its digest;
    the bytes are deferred so that listing priors never reads them."""

    __tablename__ = "priors"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str | None] = mapped_column(String(200), default=None)
    #: The key that stored it (an upload, or the analyst whose request carried it inline).
    creator_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_keys.id"))
    #: ``upload`` or ``inline``.
    source: Mapped[str] = mapped_column(String(10))
    n_rows: Mapped[int] = mapped_column(Integer)
    n_cols: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    basis: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)


class WorkerHeartbeat(Base):
    """One worker process, renewed every ``DPSS_WORKER_HEARTBEAT_SECONDS`` while it runs
    (busy or idle) and removed when it stops; a row not renewed within the lease time is a
    worker that died. Read by the admins' workers view and the ``dpss_workers_alive`` metric."""

    __tablename__ = "worker_heartbeats"

    worker_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)


class ReleaseState(Base):
    """A continual release's private state after its latest epoch (see
    :mod:`service.continual`), apart from ``releases`` for the reason :class:`ReleaseBasis` is."""

    __tablename__ = "release_states"

    release_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("releases.id"), primary_key=True)
    state: Mapped[bytes] = mapped_column(LargeBinary)


class AuditEvent(Base):
    """Append-only, hash-chained: ``hash = SHA-256(prev_hash || canonical JSON of the event)``."""

    __tablename__ = "audit_events"

    seq: Mapped[int] = mapped_column(SeqInteger, primary_key=True, autoincrement=False)
    event_type: Mapped[str] = mapped_column(String(40))
    actor_key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, default=None)
    dataset_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, default=None)
    release_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    details: Mapped[dict[str, Any]] = mapped_column(JSON)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    #: ``HMAC-SHA256(DPSS_AUDIT_HMAC_KEY, hash)`` when the writing process held the key, else
    #: null. The hash covers every earlier event, so one valid MAC vouches for the whole prefix.
    mac: Mapped[str | None] = mapped_column(String(64), default=None)


class RestoreHold(Base):
    """At most one row (``id`` 1): a restore from an older backup was detected against the
    audit anchors and no admin has accepted it yet (``dpss audit accept-restore``). While it
    exists the API refuses charges and key use (:class:`service.errors.RestoreUnaccepted`)."""

    __tablename__ = "restore_hold"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    detected_at: Mapped[datetime] = mapped_column(default=utcnow)
    problem: Mapped[str] = mapped_column(String(2000))


class AuditHead(Base):
    """One row: the chain's last ``seq`` and ``hash``. Locking it serialises appends, and it
    lets ``verify`` notice a removed tail."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    last_seq: Mapped[int] = mapped_column(SeqInteger)
    last_hash: Mapped[str] = mapped_column(String(64))


class MachineRate(Base):
    """A worker's measured speed for one mechanism at one dimension: work units (see
    :mod:`service.padding`) per second, timed on public random data, never on a dataset. The
    API reads the slowest recent rate of every worker to set a new release's ``visible_at``."""

    __tablename__ = "machine_rates"

    worker_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    mechanism: Mapped[str] = mapped_column(String(40), primary_key=True)
    d: Mapped[int] = mapped_column(Integer, primary_key=True)
    rate: Mapped[float] = mapped_column(Float)
    measured_at: Mapped[datetime] = mapped_column(default=utcnow)
