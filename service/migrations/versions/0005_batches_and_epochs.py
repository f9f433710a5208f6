"""Growing datasets and continual releases: ``dataset_batches`` (a dataset is a sequence of
batches, the upload is batch 0), ``release_epochs`` (one row per epoch of a continual release),
``datasets.n_batches``, and on ``releases`` the prefix a release reads (``n_rows_read``,
``batches_read``) and the continual state (``epochs_done``, ``continual_state``: the serialized
tree, ``continual_key``: the release's CSPRNG key; private, never exposed).

Existing datasets become one batch (their upload); existing releases read that batch.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 11:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db.types

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dataset_batches",
        sa.Column("dataset_id", sa.Uuid(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("n_rows", sa.BigInteger(), nullable=False),
        sa.Column("row_offset", sa.BigInteger(), nullable=False),
        sa.Column("file_name", sa.String(length=200), nullable=True),
        sa.Column("created_at", service.db.types.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"]),
        sa.PrimaryKeyConstraint("dataset_id", "seq"),
    )
    op.create_table(
        "release_epochs",
        sa.Column("release_id", sa.Uuid(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("batch_seq", sa.Integer(), nullable=False),
        sa.Column("n_rows_read", sa.BigInteger(), nullable=False),
        sa.Column("basis", sa.LargeBinary(), nullable=True),
        sa.Column("basis_shape", sa.JSON(), nullable=True),
        sa.Column("basis_sha256", sa.String(length=64), nullable=True),
        sa.Column("extras", sa.JSON(), nullable=True),
        sa.Column("created_at", service.db.types.UTCDateTime(), nullable=False),
        sa.Column("visible_at", service.db.types.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["release_id"], ["releases.id"]),
        sa.PrimaryKeyConstraint("release_id", "epoch"),
    )
    # Plain ADD COLUMN (no batch rebuild): SQLite supports it for these columns, and a rebuild
    # of ``datasets`` or ``releases`` would have to drop a table other rows reference.
    op.add_column(
        "datasets", sa.Column("n_batches", sa.Integer(), nullable=False, server_default="1")
    )
    op.add_column("releases", sa.Column("n_rows_read", sa.BigInteger(), nullable=True))
    op.add_column("releases", sa.Column("batches_read", sa.Integer(), nullable=True))
    op.add_column(
        "releases", sa.Column("epochs_done", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column("releases", sa.Column("continual_state", sa.LargeBinary(), nullable=True))
    op.add_column("releases", sa.Column("continual_key", sa.LargeBinary(), nullable=True))
    # Every existing dataset is its upload, batch 0, starting at row 0 of its file; every
    # existing release read exactly that batch.
    op.execute(
        "INSERT INTO dataset_batches (dataset_id, seq, n_rows, row_offset, file_name, created_at) "
        "SELECT id, 0, n_rows, 0, file_name, created_at FROM datasets"
    )
    op.execute(
        "UPDATE releases SET batches_read = 1, n_rows_read = "
        "(SELECT datasets.n_rows FROM datasets WHERE datasets.id = releases.dataset_id)"
    )


def downgrade() -> None:
    op.drop_table("release_epochs")
    op.drop_table("dataset_batches")
    for column in (
        "continual_key",
        "continual_state",
        "epochs_done",
        "batches_read",
        "n_rows_read",
    ):
        op.drop_column("releases", column)
    op.drop_column("datasets", "n_batches")
