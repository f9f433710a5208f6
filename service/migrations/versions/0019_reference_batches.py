"""Batches appended to a dataset by reference (issue 35, item 3): ``datasets.batch_status``
(``registering`` while a worker reads and checks the batch's objects, ``failed`` with
``batch_reason`` when it refused them; null otherwise) and ``batch_request`` (the URI the owner
named). The job's lease reuses ``registration_lease_*``/``registration_attempts``: a batch is
requested only on a ``ready`` dataset, whose own registration has ended. A batch is a
``dataset_batches`` row only once registered, so nothing reads it before.

Plain ADD/DROP COLUMN (no batch rebuild): a rebuild of ``datasets`` would drop a table other
rows reference. Additive: every existing dataset has no batch pending (null).

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-29 07:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("datasets", sa.Column("batch_status", sa.String(length=12), nullable=True))
    op.add_column("datasets", sa.Column("batch_reason", sa.Text(), nullable=True))
    op.add_column("datasets", sa.Column("batch_request", sa.JSON(), nullable=True))
    op.create_index(op.f("ix_datasets_batch_status"), "datasets", ["batch_status"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_datasets_batch_status"), table_name="datasets")
    for name in ("batch_request", "batch_reason", "batch_status"):
        op.drop_column("datasets", name)
