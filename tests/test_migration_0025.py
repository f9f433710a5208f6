"""Migration 0025 adds the partial indexes the padding's registration term reads through
(:data:`service.padding_queue._REGISTRATIONS`); the downgrade removes them."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import create_engine, text

from service import padding_queue
from service.db.models import utcnow
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
    # Each branch of the term reads an index, not the table (the reason for them).
    engine = create_engine(url)
    query = str(padding_queue._REGISTRATIONS.compile(engine))
    moment = utcnow().isoformat(" ")
    with engine.connect() as connection:
        plan = connection.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {query}", (moment,) * query.count("?")
        ).all()
    engine.dispose()
    reads = [row[3] for row in plan if row[3].startswith(("SCAN", "SEARCH"))]
    assert len(reads) == 4 and all(
        read.startswith("SEARCH datasets USING INDEX ix_datasets_") for read in reads
    ), reads
    command.downgrade(alembic_config(url), "0024")
    assert _indexes(url) == {}
