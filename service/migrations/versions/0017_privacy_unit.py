"""``datasets.privacy_unit_column`` and ``datasets.n_units``: a dataset whose privacy unit is a
person (several rows each) names the upload's identifier column (removed from the features; its
values are never stored, only a dense per-row unit index in the store) and counts its units.
Additive: null means the unit is the row, as before.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29 01:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD/DROP COLUMN (SQLite >= 3.35), no batch rebuild: a rebuild of ``datasets`` would
    # drop a table other tables' foreign keys point at (as in 0014).
    op.add_column(
        "datasets", sa.Column("privacy_unit_column", sa.String(length=200), nullable=True)
    )
    op.add_column("datasets", sa.Column("n_units", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("datasets", "n_units")
    op.drop_column("datasets", "privacy_unit_column")
