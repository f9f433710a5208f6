"""The ``hybrid`` accounting (issue 31, item 5): a dataset admits a release iff one of three
filters would (GDP A', approximate zCDP B, basic C; :class:`service.accounting.HybridState`).

``datasets`` gets the filters' shares of ``delta_total`` that no column held yet
(``delta_gaussian`` for A', ``delta_mechanisms`` for B's approximate steps, ``delta_basic`` for
C; B's conversion share is ``delta_conversion``); ``ledger_entries`` gets a release's GDP
``mu^2`` (``gdp``) and its approximate steps' delta under B (``zcdp_delta``), null where the
filter cannot charge the release. Additive: every existing row is of another accounting and
keeps its meaning (the new columns stay null).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-29 03:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DATASET_COLUMNS = ("delta_gaussian", "delta_mechanisms", "delta_basic")
LEDGER_COLUMNS = ("gdp", "zcdp_delta")


def upgrade() -> None:
    # Plain ADD/DROP COLUMN (SQLite >= 3.35), no batch rebuild: a rebuild of ``datasets`` would
    # drop a table other tables' foreign keys point at (as in 0014 and 0017).
    for column in DATASET_COLUMNS:
        op.add_column("datasets", sa.Column(column, service.db.types.ExactDecimal, nullable=True))
    for column in LEDGER_COLUMNS:
        op.add_column(
            "ledger_entries", sa.Column(column, service.db.types.ExactDecimal, nullable=True)
        )


def downgrade() -> None:
    for column in reversed(LEDGER_COLUMNS):
        op.drop_column("ledger_entries", column)
    for column in reversed(DATASET_COLUMNS):
        op.drop_column("datasets", column)
