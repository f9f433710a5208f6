"""Batches appended to a dataset by reference (issue 35, item 3): ``datasets.batch_status``
(``registering`` while a worker reads and checks the batch's objects, ``failed`` with
``batch_reason`` when it refused them; null otherwise) and ``batch_request`` (the URI the owner
named). The job's lease reuses ``registration_lease_*``/``registration_attempts``: a batch is
requested only on a ``ready`` dataset, whose own registration has ended. A batch is a
``dataset_batches`` row only once registered, so nothing reads it before.

Also fills in batch 0's row count where a dataset by reference was registered before its
batch row carried it (``n_rows`` 0 on the only batch): a continual release pads its first
epoch by that count, and the batches after it are numbered from it. For an uploaded dataset
with one batch the value written is the one already there.

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
    op.execute(
        "UPDATE dataset_batches SET n_rows = (SELECT datasets.n_rows FROM datasets"
        " WHERE datasets.id = dataset_batches.dataset_id)"
        " WHERE seq = 0 AND n_rows = 0"
        " AND dataset_id IN (SELECT id FROM datasets WHERE n_batches = 1)"
    )


def downgrade() -> None:
    # Batch 0's filled-in count stays: it is the true one under either schema.
    op.drop_index(op.f("ix_datasets_batch_status"), table_name="datasets")
    for name in ("batch_request", "batch_reason", "batch_status"):
        op.drop_column("datasets", name)
