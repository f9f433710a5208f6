"""``restore_hold``: a restore from an older backup detected against the audit anchors and not
yet accepted by an admin (``dpss audit accept-restore``); while its row exists the API refuses
charges and key use. Additive: no row means no hold.

Revision ID: 0015
Revises: 0013
Create Date: 2026-11-28 22:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "restore_hold",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("detected_at", service.db.types.UTCDateTime(), nullable=False),
        sa.Column("problem", sa.String(length=2000), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("restore_hold")
