"""Run Alembic migrations programmatically (``dpss migrate``, ``dpss serve``, tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(url: str | None = None, connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_to_head(url: str) -> None:
    """Bring the database at ``url`` to the newest schema."""
    command.upgrade(alembic_config(url), "head")
