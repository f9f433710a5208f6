"""Datasets by reference: ``dataset_reference_objects``, one row per object a live dataset by
reference covers, unique by the object (its resolved path, or bucket and key) and by its
content, so that two live datasets can never hold budgets on the same rows (issue 30); and
registration as a job (``datasets.registration_*``): a dataset by reference is ``registering``
until a worker has read and checked its objects (existing datasets are ``ready``).

Additive: references registered before this revision carry no content digests, so their
releases are refused (they must be registered again) and they need no rows here.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 22:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dataset_reference_objects",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("dataset_id", sa.Uuid(), nullable=False),
        sa.Column("object_key", sa.Text(), nullable=False),
        sa.Column("key_sha256", sa.String(length=64), nullable=False),
        sa.Column("content_sha256", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key_sha256", name="uq_reference_objects_key"),
        sa.UniqueConstraint("content_sha256", name="uq_reference_objects_content"),
    )
    op.create_index(
        op.f("ix_dataset_reference_objects_dataset_id"),
        "dataset_reference_objects",
        ["dataset_id"],
        unique=False,
    )
    # Plain ADD COLUMN (no batch rebuild): a rebuild of ``datasets`` would have to drop a table
    # other rows reference (as in 0005).
    op.add_column(
        "datasets",
        sa.Column(
            "registration_status", sa.String(length=12), server_default="ready", nullable=False
        ),
    )
    op.add_column("datasets", sa.Column("registration_reason", sa.Text(), nullable=True))
    op.add_column("datasets", sa.Column("registration_request", sa.JSON(), nullable=True))
    op.add_column(
        "datasets",
        sa.Column("registration_attempts", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column(
        "datasets", sa.Column("registration_lease_owner", sa.String(length=200), nullable=True)
    )
    op.add_column(
        "datasets",
        sa.Column("registration_lease_expires_at", service.db.types.UTCDateTime(), nullable=True),
    )
    op.create_index(
        op.f("ix_datasets_registration_status"), "datasets", ["registration_status"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_datasets_registration_status"), table_name="datasets")
    for name in (
        "registration_lease_expires_at",
        "registration_lease_owner",
        "registration_attempts",
        "registration_request",
        "registration_reason",
        "registration_status",
    ):
        op.drop_column("datasets", name)
    op.drop_index(
        op.f("ix_dataset_reference_objects_dataset_id"), table_name="dataset_reference_objects"
    )
    op.drop_table("dataset_reference_objects")
