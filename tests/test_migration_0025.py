"""Migration 0025 adds the partial indexes the padding's registration term reads through
(:data:`service.padding_queue._REGISTRATIONS`); the downgrade removes them. (The term's plan,
with 0027's branches on ``batch_moments`` too: ``tests/test_migration_0027.py``.)"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import create_engine, text

from service.migrate import alembic_config
from tests.factories import old_schema_with_release

INDEXES = {
    "ix_datasets_registration_pending": "registration_visible_at IS NOT NULL",
    "ix_datasets_batch_pending": "batch_visible_at IS NOT NULL",
}


def _indexes(url: str) -> dict[str, str]:
    engine = create_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT name, sql FROM sqlite_master WHERE type = 'index'")
        ).all()
    engine.dispose()
    return {name: sql for name, sql in rows if name in INDEXES}


def test_0025_adds_partial_indexes_the_term_uses_and_downgrades(tmp_path: Path) -> None:
    old = old_schema_with_release(tmp_path, "0005")
    url = old.url
    old.engine.dispose()
    command.upgrade(alembic_config(url), "0025")
    made = _indexes(url)
    assert set(made) == set(INDEXES)
    for name, where in INDEXES.items():
        assert made[name].endswith(f"WHERE {where}"), made[name]
    command.downgrade(alembic_config(url), "0024")
    assert _indexes(url) == {}
