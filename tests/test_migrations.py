"""Alembic makes the schema: the migrated database matches the ORM models exactly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from service.db.models import Base


def test_migrations_match_the_models(engines, backend):
    with engines[backend].connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
