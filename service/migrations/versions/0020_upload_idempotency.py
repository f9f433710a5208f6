"""Idempotent uploads and appends: ``datasets.idempotency_key``/``request_hash`` (unique per
owner key) and ``dataset_batches.idempotency_key``/``request_hash`` (unique per dataset).

A client whose upload's answer was lost retries with the same ``Idempotency-Key`` and gets the
dataset the first request made, not a second dataset with a second budget on the same people.
``request_hash`` is the SHA-256 of the form fields, the file's suffix and the file's SHA-256:
the same key with another body is refused (409 ``idempotency_conflict``).

Unique indexes, not constraints: SQLite adds a column but no constraint without rebuilding
``datasets``, which other tables reference. Both databases let any number of rows hold null
(every dataset and batch made before this revision, and every one sent without a key).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-29 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("datasets", "dataset_batches"):
        op.add_column(table, sa.Column("idempotency_key", sa.String(length=200), nullable=True))
        op.add_column(table, sa.Column("request_hash", sa.String(length=64), nullable=True))
    op.create_index(
        "uq_dataset_idempotency",
        "datasets",
        ["owner_key_id", "idempotency_key"],
        unique=True,
    )
    op.create_index(
        "uq_batch_idempotency",
        "dataset_batches",
        ["dataset_id", "idempotency_key"],
        unique=True,
    )


def downgrade() -> None:
    op.drop_index("uq_batch_idempotency", table_name="dataset_batches")
    op.drop_index("uq_dataset_idempotency", table_name="datasets")
    for table in ("dataset_batches", "datasets"):
        op.drop_column(table, "request_hash")
        op.drop_column(table, "idempotency_key")
