"""Calibrated machine rates: ``machine_rates`` (one row per worker, mechanism and calibrated
dimension: work units per second timed on public random data), read by the API to set a new
release's ``visible_at``. Additive: without rows the padding keeps its configured defaults, and
existing releases keep the ``visible_at`` they were given.

Revision ID: 0010
Revises: 0005
Create Date: 2026-11-26 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0010"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "machine_rates",
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("mechanism", sa.String(length=40), nullable=False),
        sa.Column("d", sa.Integer(), nullable=False),
        sa.Column("rate", sa.Float(), nullable=False),
        sa.Column("measured_at", service.db.types.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", "mechanism", "d"),
    )


def downgrade() -> None:
    op.drop_table("machine_rates")
