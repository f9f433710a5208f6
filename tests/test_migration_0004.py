"""Migration 0004 (grants) keeps every existing ledger entry, with no grant, and goes back down.

On SQLite, adding a column with a foreign key rebuilds ``ledger_entries`` (Alembic's batch
mode): the rows must survive the copy.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from alembic import command
from sqlalchemy import MetaData, create_engine, insert, select

from service.db.engine import make_session_factory
from service.db.models import LedgerEntry
from service.migrate import alembic_config


def test_0004_keeps_the_ledger_and_downgrades(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    command.upgrade(alembic_config(url), "0003")
    engine = create_engine(url)
    tables = MetaData()
    tables.reflect(engine)
    dataset_id, release_id = uuid.uuid4(), uuid.uuid4()
    now = datetime(2026, 11, 1)
    with engine.begin() as connection:
        connection.execute(
            insert(tables.tables["datasets"]).values(
                id=dataset_id.hex, name="d", n_rows=3, n_cols=2, epsilon_total="1",
                delta_total="0.00001", file_name="x.npy", created_at=now,
            )
        )  # fmt: skip
        connection.execute(
            insert(tables.tables["releases"]).values(
                id=release_id.hex, dataset_id=dataset_id.hex, mechanism="analyze_gauss", k=1,
                epsilon="0.1", delta="0.0000001", params="{}", request_hash="0" * 64,
                status="queued", refunded=False, attempts=0, created_at=now,
            )
        )  # fmt: skip
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
