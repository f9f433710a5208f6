"""Releases: ``visible_at``, the earliest time analysts see a release's outcome.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 00:05:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("visible_at", service.db.types.UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("releases", schema=None) as batch_op:
        batch_op.drop_column("visible_at")
