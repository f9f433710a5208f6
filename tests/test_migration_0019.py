"""Migration 0019 adds a dataset's pending batch by reference and fills in batch 0's row
count for datasets by reference registered before the batch row carried it."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import create_engine, text

from service.migrate import alembic_config
from tests.factories import old_schema_with_release


def test_0019_fills_in_batch_zero_and_downgrades(tmp_path: Path) -> None:
    old = old_schema_with_release(tmp_path, "0005")
    url = old.url
    old.engine.dispose()
    command.upgrade(alembic_config(url), "0018")
    engine = create_engine(url)
    with engine.begin() as connection:
        n_rows = connection.execute(text("SELECT n_rows FROM datasets")).scalar_one()
        assert n_rows > 0
        # As registration left a dataset by reference before 0019: its one batch counted 0.
        connection.execute(
            text(
                "INSERT INTO dataset_batches (dataset_id, seq, n_rows, row_offset, file_name,"
                " created_at) SELECT id, 0, 0, 0, file_name, created_at FROM datasets"
            )
        )
    engine.dispose()
    command.upgrade(alembic_config(url), "0019")
    engine = create_engine(url)
    with engine.connect() as connection:
        batch = connection.execute(text("SELECT n_rows FROM dataset_batches WHERE seq = 0"))
        assert batch.scalar_one() == n_rows
        status = connection.execute(text("SELECT batch_status FROM datasets")).scalar_one()
        assert status is None
    engine.dispose()
    command.downgrade(alembic_config(url), "0018")
    engine = create_engine(url)
    with engine.connect() as connection:
        columns = {row[1] for row in connection.execute(text("PRAGMA table_info(datasets)"))}
        assert not {"batch_status", "batch_reason", "batch_request"} & columns
        batch = connection.execute(text("SELECT n_rows FROM dataset_batches WHERE seq = 0"))
        assert batch.scalar_one() == n_rows
    engine.dispose()
