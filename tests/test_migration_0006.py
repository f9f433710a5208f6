"""Migration 0006 (accounting) keeps every existing dataset's numbers: datasets become basic with
no derived budget, ledger entries and grants get rho = 0, and the budget reads as before; and
it goes back down."""

from __future__ import annotations

import uuid
from decimal import Decimal

from alembic import command
from sqlalchemy import MetaData, create_engine, insert, select

from service import ledger
from service.db.engine import make_session_factory
from service.db.models import Dataset, Grant, LedgerEntry, Release
from service.migrate import alembic_config
from tests.factories import old_schema_with_release


def test_0006_keeps_every_number_and_downgrades(tmp_path):
    old = old_schema_with_release(tmp_path, "0005")
    grant_id = uuid.uuid4()
    with old.engine.begin() as connection:
        connection.execute(
            insert(old.tables.tables["grants"]).values(
                id=grant_id.hex, dataset_id=old.dataset_id.hex, epsilon="0.5",
                delta="0.000005", created_at=old.created_at,
            )
        )  # fmt: skip
        connection.execute(
            insert(old.tables.tables["ledger_entries"]).values(
                dataset_id=old.dataset_id.hex, release_id=old.release_id.hex, kind="charge",
                epsilon="0.1", delta="0.0000001", created_at=old.created_at, grant_id=grant_id.hex,
            )
        )  # fmt: skip
    url = old.url
    old.engine.dispose()
    command.upgrade(alembic_config(url), "head")
    engine = create_engine(url)
    factory = make_session_factory(engine)
    with factory() as session:
        dataset = session.execute(select(Dataset)).scalar_one()
        assert dataset.accounting == "basic"
        assert (dataset.rho_total, dataset.mu_total, dataset.delta_conversion) == (None,) * 3
        assert (dataset.epsilon_total, dataset.delta_total) == (Decimal(1), Decimal("0.00001"))
        entry = session.execute(select(LedgerEntry)).scalar_one()
        assert (entry.epsilon, entry.delta, entry.rho) == (
            Decimal("0.1"),
            Decimal("0.0000001"),
            Decimal(0),
        )
        assert session.execute(select(Grant.rho)).scalar_one() == 0
        release = session.execute(select(Release.cost_rho, Release.cost_delta)).one()
        assert tuple(release) == (None, None)
        state = ledger.budget_of(session, dataset)
        assert (state.epsilon_remaining, state.delta_remaining) == (
            Decimal("0.9"),
            Decimal("0.0000099"),
        )
        assert state.affords(ledger.Charge(Decimal("0.9"), Decimal(0)))
        assert not state.affords(ledger.Charge(Decimal("0.9000001"), Decimal(0)))
    engine.dispose()
    command.downgrade(alembic_config(url), "0005")
    engine = create_engine(url)
    reflected = MetaData()
    reflected.reflect(engine)
    assert "accounting" not in reflected.tables["datasets"].c
    assert "rho" not in reflected.tables["ledger_entries"].c
    assert "rho" not in reflected.tables["grants"].c
    assert "cost_rho" not in reflected.tables["releases"].c
    with engine.connect() as connection:
        assert connection.execute(select(reflected.tables["ledger_entries"])).all()
    engine.dispose()
