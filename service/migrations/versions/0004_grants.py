"""Grants: an owner's share of a dataset's budget for one analyst key or for every analyst, and
``ledger_entries.grant_id``, the grant a charge (or refund) also moves.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 01:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BUDGET = sa.Numeric(precision=38, scale=30).with_variant(
    service.db.types.DecimalText(length=64), "sqlite"
)


def upgrade() -> None:
    op.create_table(
        "grants",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("dataset_id", sa.Uuid(), nullable=False),
        sa.Column("analyst_key_id", sa.Uuid(), nullable=True),
        sa.Column("epsilon", _BUDGET, nullable=False),
        sa.Column("delta", _BUDGET, nullable=False),
        sa.Column("created_by_key_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", service.db.types.UTCDateTime(), nullable=False),
        sa.Column("revoked_at", service.db.types.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(["analyst_key_id"], ["api_keys.id"]),
        sa.ForeignKeyConstraint(["created_by_key_id"], ["api_keys.id"]),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_grants_dataset_id"), "grants", ["dataset_id"], unique=False)
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("grant_id", sa.Uuid(), nullable=True))
        batch_op.create_index(batch_op.f("ix_ledger_entries_grant_id"), ["grant_id"], unique=False)
        batch_op.create_foreign_key(
            "fk_ledger_entries_grant_id_grants", "grants", ["grant_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_constraint("fk_ledger_entries_grant_id_grants", type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_ledger_entries_grant_id"))
        batch_op.drop_column("grant_id")
    op.drop_index(op.f("ix_grants_dataset_id"), table_name="grants")
    op.drop_table("grants")
