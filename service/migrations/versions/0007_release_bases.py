"""Released bases and continual states in their own tables, and when a continual release's end
shows (issue 22, item 0).

A basis (up to megabytes) stored in the ``releases`` or ``release_epochs`` row made every read
of that row slower once the worker stored it, even a read that does not select the basis:
SQLite reaches a column stored after a large value by walking the value's overflow pages. An
analyst could so time a release's finish before its ``visible_at``. Now the rows an analyst's
reads touch stay small, and a basis is read only when it is shown.

``release_bases`` holds one row per released basis: ``epoch`` 0 is a release's result, ``t >= 1``
epoch ``t`` of a continual release. ``release_states`` holds a continual release's state (the
tree's closed nodes with their noise, which grows as epochs are stored). Existing values move
there (same bytes, same hashes); the old columns ``releases.result_basis``,
``release_epochs.basis`` and ``releases.continual_state`` are kept, emptied, and no longer
written.

``releases.outcome_visible_at``: when analysts may see a continual release's end (null: as
before, from ``visible_at`` and its epochs' own ``visible_at``).

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-26 14:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "release_bases",
        sa.Column("release_id", sa.Uuid(), nullable=False),
        sa.Column("epoch", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("basis", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["release_id"], ["releases.id"]),
        sa.PrimaryKeyConstraint("release_id", "epoch"),
    )
    op.execute(
        "INSERT INTO release_bases (release_id, epoch, basis) "
        "SELECT id, 0, result_basis FROM releases WHERE result_basis IS NOT NULL"
    )
    op.execute(
        "INSERT INTO release_bases (release_id, epoch, basis) "
        "SELECT release_id, epoch, basis FROM release_epochs WHERE basis IS NOT NULL"
    )
    op.create_table(
        "release_states",
        sa.Column("release_id", sa.Uuid(), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["release_id"], ["releases.id"]),
        sa.PrimaryKeyConstraint("release_id"),
    )
    op.execute(
        "INSERT INTO release_states (release_id, state) "
        "SELECT id, continual_state FROM releases WHERE continual_state IS NOT NULL"
    )
    op.add_column(
        "releases",
        sa.Column("outcome_visible_at", service.db.types.UTCDateTime(), nullable=True),
    )
    op.execute("UPDATE releases SET continual_state = NULL WHERE continual_state IS NOT NULL")
    op.execute("UPDATE releases SET result_basis = NULL WHERE result_basis IS NOT NULL")
    op.execute("UPDATE release_epochs SET basis = NULL WHERE basis IS NOT NULL")


def downgrade() -> None:
    op.execute(
        "UPDATE releases SET continual_state = (SELECT state FROM release_states "
        "WHERE release_states.release_id = releases.id)"
    )
    op.drop_table("release_states")
    op.drop_column("releases", "outcome_visible_at")
    op.execute(
        "UPDATE releases SET result_basis = (SELECT basis FROM release_bases "
        "WHERE release_bases.release_id = releases.id AND release_bases.epoch = 0)"
    )
    op.execute(
        "UPDATE release_epochs SET basis = (SELECT basis FROM release_bases "
        "WHERE release_bases.release_id = release_epochs.release_id "
        "AND release_bases.epoch = release_epochs.epoch)"
    )
    op.drop_table("release_bases")
