"""Migration 0014 adds ``dataset_reference_objects`` (one live dataset per referenced object)
and the registration job's columns of ``datasets`` (existing datasets ``ready``): its unique
constraints hold after the upgrade, and it goes back down."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import MetaData, create_engine, select
from sqlalchemy.exc import IntegrityError

from service.db.engine import make_session_factory
from service.db.models import Dataset, DatasetReferenceObject
from service.migrate import alembic_config
from tests.factories import old_schema_with_release


def test_0014_adds_reference_objects_and_downgrades(tmp_path: Path) -> None:
    old = old_schema_with_release(tmp_path, "0005")
    url = old.url
    old.engine.dispose()
    command.upgrade(alembic_config(url), "0014")
    engine = create_engine(url)
    factory = make_session_factory(engine)
    with factory() as session:
        dataset_id: uuid.UUID = session.execute(select(Dataset.id)).scalar_one()
        # An existing dataset is ready: it keeps taking releases.
        status = session.execute(select(Dataset.registration_status)).scalar_one()
        assert status == "ready"
        session.add(
            DatasetReferenceObject(
                dataset_id=dataset_id,
                object_key="s3://b/k",
                key_sha256="a" * 64,
                content_sha256="b" * 64,
            )
        )
        session.commit()
        session.add(
            DatasetReferenceObject(
                dataset_id=dataset_id,
                object_key="s3://b/k2",
                key_sha256="c" * 64,
                content_sha256="b" * 64,
            )
        )
        with pytest.raises(IntegrityError):
            session.commit()
    engine.dispose()
    command.downgrade(alembic_config(url), "0013")
    reflected = MetaData()
    engine = create_engine(url)
    reflected.reflect(engine)
    assert "dataset_reference_objects" not in reflected.tables
    assert not {c.name for c in reflected.tables["datasets"].columns if "registration" in c.name}
    engine.dispose()
