"""Migration 0005 (batches and epochs) turns every dataset into one batch (its upload) and every
release into a reader of that batch, and goes back down."""

from __future__ import annotations

from alembic import command
from sqlalchemy import MetaData, create_engine, select

from service.db.engine import make_session_factory
from service.db.models import Dataset, DatasetBatch, Release
from service.migrate import alembic_config
from tests.factories import old_schema_with_release


def test_0005_backfills_batch_zero_and_downgrades(tmp_path):
    old = old_schema_with_release(tmp_path, "0004")
    url, dataset_id = old.url, old.dataset_id
    old.engine.dispose()
    command.upgrade(alembic_config(url), "head")
    factory = make_session_factory(create_engine(url))
    with factory() as session:
        batches = session.execute(
            select(DatasetBatch.dataset_id, DatasetBatch.seq, DatasetBatch.n_rows,
                   DatasetBatch.row_offset, DatasetBatch.file_name)
        ).all()  # fmt: skip
        assert batches == [(dataset_id, 0, 3, 0, "x.npy")]
        assert session.execute(select(Dataset.n_batches)).scalar_one() == 1
        release = session.execute(
            select(Release.n_rows_read, Release.batches_read, Release.epochs_done)
        ).one()
        assert tuple(release) == (3, 1, 0)
    command.downgrade(alembic_config(url), "0004")
    engine = create_engine(url)
    reflected = MetaData()
    reflected.reflect(engine)
    assert "dataset_batches" not in reflected.tables
    assert "release_epochs" not in reflected.tables
    assert "n_batches" not in reflected.tables["datasets"].c
    assert "continual_state" not in reflected.tables["releases"].c
    with engine.connect() as connection:
        assert connection.execute(select(reflected.tables["releases"])).all()
    engine.dispose()
