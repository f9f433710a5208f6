"""Registrations by reference are padded as releases are: ``datasets.registration_visible_at``
and ``registration_shown_at`` (the dataset's own registration), ``batch_requested_at``,
``batch_visible_at``, ``batch_shown_at`` and ``batch_prior_rows`` (a batch by reference).

A worker takes a registration only when no release waits, so the moment it ends follows the
end of other datasets' releases, whose run time may depend on their rows. Owners and analysts
now see it end at a public moment (:mod:`service.registration_visibility`). Null everywhere for
the rows made before this revision: they are shown as stored, as before.

Plain ADD/DROP COLUMN (no batch rebuild), as 0019: a rebuild of ``datasets`` drops a table
other rows reference, which SQLite refuses with foreign keys on.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-29 22:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MOMENTS = (
    "registration_visible_at",
    "registration_shown_at",
    "batch_requested_at",
    "batch_visible_at",
    "batch_shown_at",
)


def upgrade() -> None:
    for name in MOMENTS:
        op.add_column("datasets", sa.Column(name, service.db.types.UTCDateTime(), nullable=True))
    op.add_column("datasets", sa.Column("batch_prior_rows", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("datasets", "batch_prior_rows")
    for name in reversed(MOMENTS):
        op.drop_column("datasets", name)
