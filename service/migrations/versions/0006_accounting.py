"""Accounting across releases (issue 23): each dataset's ``accounting`` (``basic``, ``gaussian``
or ``zcdp``) with its derived budget (``rho_total``; ``mu_total`` for ``gaussian``;
``delta_conversion`` for ``zcdp``), and a ``rho`` amount on ledger entries, grants and releases.

Existing datasets become ``basic`` with no derived budget, and existing entries, grants and
releases get ``rho = 0``: every number they had keeps its meaning (sums of ``(epsilon, delta)``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 14:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN (no batch rebuild), as in 0005: tables other rows reference stay.
    op.add_column(
        "datasets",
        sa.Column("accounting", sa.String(length=10), nullable=False, server_default="basic"),
    )
    for column in ("rho_total", "mu_total", "delta_conversion"):
        op.add_column("datasets", sa.Column(column, service.db.types.ExactDecimal, nullable=True))
    for table in ("ledger_entries", "grants"):
        op.add_column(
            table,
            sa.Column("rho", service.db.types.ExactDecimal, nullable=False, server_default="0"),
        )
    op.add_column("releases", sa.Column("cost_rho", service.db.types.ExactDecimal, nullable=True))
    op.add_column("releases", sa.Column("cost_delta", service.db.types.ExactDecimal, nullable=True))


def downgrade() -> None:
    op.drop_column("releases", "cost_delta")
    op.drop_column("releases", "cost_rho")
    for table in ("grants", "ledger_entries"):
        op.drop_column(table, "rho")
    for column in ("delta_conversion", "mu_total", "rho_total", "accounting"):
        op.drop_column("datasets", column)
