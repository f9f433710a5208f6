"""Migration 0020 adds upload and append idempotency keys: existing datasets keep null keys
(any number of them), a key is unique per owner key, and the downgrade removes the columns."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from service.migrate import alembic_config
from tests.factories import old_schema_with_release

#: An owner key id (the reflected schema's foreign keys are not enforced by this engine).
OWNER = "f" * 32


def test_0020_adds_unique_keys_and_downgrades(tmp_path: Path) -> None:
    old = old_schema_with_release(tmp_path, "0005")
    url = old.url
    old.engine.dispose()
    command.upgrade(alembic_config(url), "0020")
    engine = create_engine(url)
    copy = (
        "INSERT INTO datasets (id, name, owner_key_id, n_rows, n_cols, epsilon_total,"
        " delta_total, file_name, created_at, n_batches, accounting, registration_status,"
        " registration_attempts, idempotency_key, request_hash)"
        " SELECT :id, name, :owner, n_rows, n_cols, epsilon_total, delta_total, NULL,"
        " created_at, 1, accounting, 'ready', 0, :key, 'h' FROM datasets LIMIT 1"
    )
    with engine.begin() as connection:
        assert connection.execute(text("SELECT idempotency_key FROM datasets")).scalar_one() is None
        connection.execute(
            text(copy), {"id": "a" * 32, "key": None, "owner": OWNER}
        )  # nulls never collide
        connection.execute(text(copy), {"id": "b" * 32, "key": "k", "owner": OWNER})
        # The same key under another owner key is that owner's.
        connection.execute(text(copy), {"id": "d" * 32, "key": "k", "owner": "e" * 32})
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.execute(text(copy), {"id": "c" * 32, "key": "k", "owner": OWNER})
    engine.dispose()
    command.downgrade(alembic_config(url), "0019")
    engine = create_engine(url)
    with engine.connect() as connection:
        for table in ("datasets", "dataset_batches"):
            columns = {row[1] for row in connection.execute(text(f"PRAGMA table_info({table})"))}
            assert not {"idempotency_key", "request_hash"} & columns
    engine.dispose()
