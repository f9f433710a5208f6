"""Datasets by reference: ``datasets.reference`` (JSON: URI, columns, row groups, the objects'
ETags/versions and sizes), null for every uploaded dataset, so existing rows keep their meaning.

Revision ID: 0012
Revises: 0005
Create Date: 2026-11-26 14:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("datasets", sa.Column("reference", sa.JSON(), nullable=True))


def downgrade() -> None:
    # In place (SQLite >= 3.35): a batch copy would drop ``datasets``, which other tables'
    # rows reference.
    op.drop_column("datasets", "reference")
