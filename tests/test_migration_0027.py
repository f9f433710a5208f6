"""Migration 0027 adds ``batch_moments`` (the moments of the batches by reference a dataset's
next batch replaced on its row) with the partial index the padding's registration term reads
it through (:data:`service.padding_queue._REGISTRATIONS`: every branch a range of an index,
0025's on ``datasets`` and this one's); the downgrade removes them."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import create_engine, inspect

from service import padding_queue
from service.db.models import utcnow
from service.migrate import alembic_config
from tests.factories import old_schema_with_release


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    names = set(inspect(engine).get_table_names())
    engine.dispose()
    return names


def test_0027_adds_batch_moments_the_term_reads_through_an_index_and_downgrades(
    tmp_path: Path,
) -> None:
    old = old_schema_with_release(tmp_path, "0005")
    url = old.url
    old.engine.dispose()
    command.upgrade(alembic_config(url), "0026")
    assert "batch_moments" not in _tables(url)
    command.upgrade(alembic_config(url), "0027")
    assert "batch_moments" in _tables(url)
    engine = create_engine(url)
    indexes = {index["name"]: index for index in inspect(engine).get_indexes("batch_moments")}
    assert set(indexes) == {"ix_batch_moments_dataset_id", "ix_batch_moments_pending"}
    # Each of the term's six branches reads a partial index, never a table scan; the kept
    # batches' branches find their dataset's deletion by its key.
    query = str(padding_queue._REGISTRATIONS.compile(engine))
    moment = utcnow().isoformat(" ")
    with engine.connect() as connection:
        plan = connection.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {query}", (moment,) * query.count("?")
        ).all()
    engine.dispose()
    reads = [row[3] for row in plan if row[3].startswith(("SCAN", "SEARCH"))]
    pending = [read for read in reads if "_pending" in read]
    assert len(pending) == 6, reads
    assert sum(read.startswith("SEARCH datasets USING INDEX ix_datasets_") for read in reads) == 4
    assert sum(read.startswith("SEARCH batch_moments USING INDEX ix_batch_") for read in reads) == 2
    assert all(
        read in pending or read.startswith("SEARCH datasets USING INDEX sqlite_autoindex")
        for read in reads
    ), reads
    command.downgrade(alembic_config(url), "0026")
    assert "batch_moments" not in _tables(url)
