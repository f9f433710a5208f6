"""``release_epochs.due_at``: an epoch's formula ``visible_at`` (what the worker's claim
computed from public inputs, :func:`service.padding_epochs.epoch_padding`), apart from the
moment it shows (``visible_at``: a step of its late schedule if it ended late).

The next epoch's moment followed the stored ``visible_at`` of the one before, which depends on
how late that one really ended, and is not public until it shows: a release requested while
two or more epochs of one release were pending could not count the later ones and was made late
by them. The next epoch now follows ``due_at`` (public: a chain of the formula over public
inputs). Null for the rows made before this revision: their ``visible_at`` stands in, as before.

Plain ADD/DROP COLUMN (no batch rebuild), as 0023.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-30 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "release_epochs", sa.Column("due_at", service.db.types.UTCDateTime(), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("release_epochs", "due_at")
