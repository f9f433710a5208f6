"""``priors``: public bases (``d x m``, orthonormal columns) a release may be estimated inside
(issue 32, item 2). Uploaded with ``POST /v1/priors`` or stored from a request's inline
``params.prior_basis``; the bytes (little-endian float64, row-major) and their SHA-256.
Additive: no row means no prior.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29 01:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "priors",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("creator_key_id", sa.Uuid(), nullable=True),
        sa.Column("source", sa.String(length=10), nullable=False),
        sa.Column("n_rows", sa.Integer(), nullable=False),
        sa.Column("n_cols", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", service.db.types.UTCDateTime(), nullable=False),
        sa.Column("basis", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["creator_key_id"], ["api_keys.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_priors_sha256"), "priors", ["sha256"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_priors_sha256"), table_name="priors")
    op.drop_table("priors")
