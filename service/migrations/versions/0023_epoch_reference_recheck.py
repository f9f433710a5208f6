"""Epochs of continual releases on a dataset by reference are re-checked at a public moment:
``release_epochs.reference_check``, ``reference_checked_at`` and ``reference_shown_at``
(:mod:`service.reference_recheck`).

Whether an epoch's job read its objects before or after their owner changed one told the owner
when the job ahead of it in the shared queue ended (the epoch shown, or the release ended). An
epoch is now shown only once a re-check made at or after its ``visible_at`` found its objects
unchanged. Null for the rows made before this revision: they are shown as stored, as before.

Plain ADD/DROP COLUMN (no batch rebuild), as 0019, 0021 and 0022.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-30 04:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MOMENTS = ("reference_checked_at", "reference_shown_at")


def upgrade() -> None:
    op.add_column(
        "release_epochs", sa.Column("reference_check", sa.String(length=16), nullable=True)
    )
    for name in MOMENTS:
        op.add_column(
            "release_epochs", sa.Column(name, service.db.types.UTCDateTime(), nullable=True)
        )
    op.create_index("ix_release_epochs_reference_check", "release_epochs", ["reference_check"])


def downgrade() -> None:
    op.drop_index("ix_release_epochs_reference_check", table_name="release_epochs")
    for name in reversed(MOMENTS):
        op.drop_column("release_epochs", name)
    op.drop_column("release_epochs", "reference_check")
