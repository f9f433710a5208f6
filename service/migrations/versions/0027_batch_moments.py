"""``batch_moments``: the public moments (request, ``visible_at``, ``shown_at``) of each batch by
reference a dataset's next batch replaced on its row.

A batch's moments lived on its dataset's row only (``datasets.batch_requested_at``,
``batch_visible_at``, ``batch_shown_at``, 0021) and its dataset's next batch (requested once it
shows) overwrote them. The padding's registration term at an earlier moment (a continual
epoch's chain at its point, computed when a worker claims the epoch, possibly late) then no
longer counted the batch, and the epoch's ``visible_at`` followed whether a worker reached its
claim before that next request (:func:`service.padding_queue.registration_seconds`). Now
:func:`service.registration.request_batch` keeps the replaced batch's moments here first.

Nothing to backfill: each dataset's row still holds its latest batch's moments, and the ones
replaced before this revision are gone. A partial index on ``shown_at`` among the rows with a
``visible_at``, as 0025's: the term reads the rows not shown at a moment only.

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-30 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "batch_moments",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("dataset_id", sa.Uuid(), nullable=False),
        sa.Column("requested_at", service.db.types.UTCDateTime(), nullable=False),
        sa.Column("visible_at", service.db.types.UTCDateTime(), nullable=True),
        sa.Column("shown_at", service.db.types.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_batch_moments_dataset_id", "batch_moments", ["dataset_id"])
    where = sa.text("visible_at IS NOT NULL")
    op.create_index(
        "ix_batch_moments_pending",
        "batch_moments",
        ["shown_at"],
        postgresql_where=where,
        sqlite_where=where,
    )


def downgrade() -> None:
    op.drop_index("ix_batch_moments_pending", table_name="batch_moments")
    op.drop_index("ix_batch_moments_dataset_id", table_name="batch_moments")
    op.drop_table("batch_moments")
