"""Migration 0004 (grants) keeps every existing ledger entry, with no grant, and goes back down.

On SQLite, adding a column with a foreign key rebuilds ``ledger_entries`` (Alembic's batch
mode): the rows must survive the copy.
"""

from __future__ import annotations

from decimal import Decimal

from alembic import command
from sqlalchemy import MetaData, create_engine, insert, select

from service.db.engine import make_session_factory
from service.db.models import LedgerEntry
from service.migrate import alembic_config
from tests.factories import old_schema_with_release


def test_0004_keeps_the_ledger_and_downgrades(tmp_path):
    old = old_schema_with_release(tmp_path, "0003")
    url, engine, tables = old.url, old.engine, old.tables
    dataset_id, release_id, now = old.dataset_id, old.release_id, old.created_at
    with engine.begin() as connection:
        connection.execute(
            insert(tables.tables["ledger_entries"]).values(
                dataset_id=dataset_id.hex, release_id=release_id.hex, kind="charge",
                epsilon="0.1", delta="0.0000001", created_at=now,
            )
        )  # fmt: skip
    engine.dispose()
    command.upgrade(alembic_config(url), "head")
    factory = make_session_factory(create_engine(url))
    with factory() as session:
        rows = session.execute(
            select(LedgerEntry.release_id, LedgerEntry.epsilon, LedgerEntry.grant_id)
        ).all()
        assert rows == [(release_id, Decimal("0.1"), None)]
    command.downgrade(alembic_config(url), "0003")
    engine = create_engine(url)
    reflected = MetaData()
    reflected.reflect(engine)
    assert "grants" not in reflected.tables
    assert "grant_id" not in reflected.tables["ledger_entries"].c
    with engine.connect() as connection:
        assert connection.execute(select(reflected.tables["ledger_entries"])).all()
    engine.dispose()
