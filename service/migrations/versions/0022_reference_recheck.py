"""One-shot releases on a dataset by reference are re-checked at a public moment:
``releases.reference_check``, ``reference_checked_at`` and ``reference_shown_at``
(:mod:`service.reference_recheck`).

Whether a release read its objects before or after their owner changed one told the owner
when the job ahead of it in the shared queue ended. The outcome is now decided, for analysts
and owners, by a re-check of the objects made at or after the outcome was due. Null for the
rows made before this revision: they are shown as stored, as before.

Plain ADD/DROP COLUMN (no batch rebuild), as 0019 and 0021.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-30 03:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MOMENTS = ("reference_checked_at", "reference_shown_at")


def upgrade() -> None:
    op.add_column("releases", sa.Column("reference_check", sa.String(length=16), nullable=True))
    for name in MOMENTS:
        op.add_column("releases", sa.Column(name, service.db.types.UTCDateTime(), nullable=True))
    # Every worker's re-check thread looks for pending re-checks about once a second.
    op.create_index("ix_releases_reference_check", "releases", ["reference_check"])


def downgrade() -> None:
    op.drop_index("ix_releases_reference_check", table_name="releases")
    for name in reversed(MOMENTS):
        op.drop_column("releases", name)
    op.drop_column("releases", "reference_check")
