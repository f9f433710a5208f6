"""Migration 0013 (observability) adds ``worker_heartbeats`` and ``releases.traceparent``: an
existing release keeps its meaning (no trace context, still claimable), and it goes back down."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import MetaData, create_engine, select

from service.db.engine import make_session_factory
from service.db.models import Release, WorkerHeartbeat, utcnow
from service.migrate import alembic_config
from tests.factories import old_schema_with_release


def test_0013_adds_heartbeats_and_traceparent_and_downgrades(tmp_path: Path) -> None:
    old = old_schema_with_release(tmp_path, "0005")
    url, release_id = old.url, old.release_id
    old.engine.dispose()
    command.upgrade(alembic_config(url), "0013")
    engine = create_engine(url)
    factory = make_session_factory(engine)
    with factory.begin() as session:
        # Only the columns 0013 knows: the model also maps columns later migrations add.
        release = session.execute(
            select(Release.status, Release.traceparent).where(Release.id == release_id)
        ).one()
        assert tuple(release) == ("queued", None)
        session.add(WorkerHeartbeat(worker_id="w:1:a", started_at=utcnow(), last_seen_at=utcnow()))
    with factory() as session:
        assert session.execute(select(WorkerHeartbeat.worker_id)).scalars().all() == ["w:1:a"]
    engine.dispose()
    command.downgrade(alembic_config(url), "0005")
    reflected = MetaData()
    engine = create_engine(url)
    reflected.reflect(engine)
    assert "worker_heartbeats" not in reflected.tables
    assert "traceparent" not in reflected.tables["releases"].c
    assert "continual_state" in reflected.tables["releases"].c
    engine.dispose()
