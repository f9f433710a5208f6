"""Migration 0007 moves every stored basis and continual state out of the rows each read of a
release touches (same bytes), adds ``outcome_visible_at``, and goes back down."""

from __future__ import annotations

from alembic import command
from sqlalchemy import MetaData, create_engine, insert, select, update

from service.db.engine import make_session_factory
from service.db.models import Release, ReleaseBasis, ReleaseEpoch, ReleaseState
from service.migrate import alembic_config
from tests.factories import old_schema_with_release

BASIS, EPOCH_BASIS, STATE = b"\x01" * 16, b"\x02" * 16, b"\x03" * 40


def test_0007_moves_bases_and_states_and_downgrades(tmp_path):
    old = old_schema_with_release(tmp_path, "0005")
    releases, epochs = old.tables.tables["releases"], old.tables.tables["release_epochs"]
    with old.engine.begin() as connection:
        connection.execute(
            update(releases).values(
                status="succeeded", result_basis=BASIS, result_shape="[2, 1]",
                result_sha256="a" * 64, continual_state=STATE,
            )
        )  # fmt: skip
        connection.execute(
            insert(epochs).values(
                release_id=old.release_id.hex, epoch=1, batch_seq=0, n_rows_read=3,
                basis=EPOCH_BASIS, basis_shape="[2, 1]", basis_sha256="b" * 64,
                created_at=old.created_at, visible_at=old.created_at,
            )
        )  # fmt: skip
    old.engine.dispose()
    command.upgrade(alembic_config(old.url), "head")
    factory = make_session_factory(create_engine(old.url))
    with factory() as session:
        moved = session.execute(
            select(ReleaseBasis.epoch, ReleaseBasis.basis).order_by(ReleaseBasis.epoch)
        ).all()
        assert [tuple(row) for row in moved] == [(0, BASIS), (1, EPOCH_BASIS)]
        assert session.execute(select(ReleaseState.state)).scalar_one() == STATE
        left = session.execute(
            select(Release.result_basis, Release.continual_state, Release.outcome_visible_at)
        ).one()
        assert tuple(left) == (None, None, None)
        assert session.execute(select(ReleaseEpoch.basis)).scalar_one() is None
    command.downgrade(alembic_config(old.url), "0005")
    engine = create_engine(old.url)
    reflected = MetaData()
    reflected.reflect(engine)
    assert "release_bases" not in reflected.tables
    assert "release_states" not in reflected.tables
    assert "outcome_visible_at" not in reflected.tables["releases"].c
    with engine.connect() as connection:
        back = reflected.tables["releases"]
        row = connection.execute(select(back.c.result_basis, back.c.continual_state)).one()
        assert tuple(row) == (BASIS, STATE)
        epoch = reflected.tables["release_epochs"]
        assert connection.execute(select(epoch.c.basis)).scalar_one() == EPOCH_BASIS
    engine.dispose()
