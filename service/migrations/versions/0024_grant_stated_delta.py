"""``grants.stated_delta``: the delta a grant's epsilon figures are stated at, the one its owner
gave it with (:mod:`service.spend`).

On ``gaussian`` and ``zcdp`` datasets a grant given in ``(epsilon, delta)`` kept only the delta
its mechanisms may spend (0 on ``gaussian``), so its figures were stated at the dataset's
``delta_total``: a ``(1, 1e-6)`` grant on a ``(3, 1e-5)`` dataset, its ``mu`` all spent, said
0.86 spent and 0.14 left of 1 (its total at ``1e-6``, its spend at ``1e-5``) while it refused
everything. Existing rows get the delta :func:`service.grant_terms.legacy_stated_delta` derives
(``basic``/``hybrid``: their ``delta``; native grants: the dataset's ``delta_total``; grants
given in epsilon: the delta they were asked with where it is exact, else the smallest delta at
which their native budget is within their epsilon), computed in exact decimals here, not by
the database (SQLite would add the stored text as binary floats).

Plain ADD/DROP COLUMN (no batch rebuild), as 0019, 0021 and 0022.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-30 10:00:00
"""

from collections.abc import Sequence
from decimal import Decimal

import sqlalchemy as sa
from alembic import op

import service.db.types
from service.grant_terms import legacy_stated_delta

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DECIMAL = service.db.types.ExactDecimal


def upgrade() -> None:
    op.add_column("grants", sa.Column("stated_delta", _DECIMAL, nullable=True))
    grants = sa.table(
        "grants",
        sa.column("id", sa.Uuid()),
        sa.column("dataset_id", sa.Uuid()),
        sa.column("epsilon", _DECIMAL),
        sa.column("delta", _DECIMAL),
        sa.column("rho", _DECIMAL),
        sa.column("stated_delta", _DECIMAL),
    )
    datasets = sa.table(
        "datasets",
        sa.column("id", sa.Uuid()),
        sa.column("accounting", sa.String()),
        sa.column("delta_total", _DECIMAL),
        sa.column("delta_conversion", _DECIMAL),
    )
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(
            grants.c.id,
            grants.c.epsilon,
            grants.c.delta,
            grants.c.rho,
            datasets.c.accounting,
            datasets.c.delta_total,
            datasets.c.delta_conversion,
        ).select_from(grants.join(datasets, datasets.c.id == grants.c.dataset_id))
    ).all()
    for row in rows:
        stated = legacy_stated_delta(
            row.accounting or "basic",
            row.epsilon,
            row.delta,
            row.rho if row.rho is not None else Decimal(0),
            row.delta_total,
            row.delta_conversion,
        )
        connection.execute(grants.update().where(grants.c.id == row.id).values(stated_delta=stated))


def downgrade() -> None:
    op.drop_column("grants", "stated_delta")
