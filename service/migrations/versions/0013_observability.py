"""Observability: ``worker_heartbeats`` (one row per worker process, renewed while it lives, so
operators see idle workers too) and ``releases.traceparent`` (the W3C trace context of the
request that queued a release, so the worker's spans join the request's trace).

Both are additive: existing releases have no trace context (their worker spans start a trace
of their own) and no worker has beaten yet.

Revision ID: 0013
Revises: 0005
Create Date: 2026-11-26 14:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "worker_heartbeats",
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("started_at", service.db.types.UTCDateTime(), nullable=False),
        sa.Column("last_seen_at", service.db.types.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id"),
    )
    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("traceparent", sa.String(length=55), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite >= 3.35), not a batch copy of ``releases``: the copy would
    # drop a table that ``release_bases`` (0007) references.
    op.drop_column("releases", "traceparent")
    op.drop_table("worker_heartbeats")
