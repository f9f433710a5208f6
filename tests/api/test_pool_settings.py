"""The pool, the database slots and the thread limits come from the settings, sized together."""

from __future__ import annotations

import anyio
import anyio.to_thread

from service.app import create_app
from service.config import Settings
from service.db.engine import make_pooled_engine


def test_pool_slots_and_threads_follow_the_settings(tmp_path):
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'x.sqlite3'}",
        db_pool_size=3,
        db_max_overflow=2,
        db_pool_timeout_seconds=1.5,
        api_threads=7,
    )
    engine = make_pooled_engine(settings)
    assert (engine.pool.size(), engine.pool._max_overflow, engine.pool._timeout) == (3, 2, 1.5)  # type: ignore[attr-defined]
    engine.dispose()
    database = create_app(settings).state.database

    async def limits() -> tuple[float, float, float]:
        gate = database.gate()
        default = anyio.to_thread.current_default_thread_limiter().total_tokens
        return gate.threads.total_tokens, gate.slots.value, default

    # One thread per slot, one connection per slot (pool + overflow), other work on api_threads.
    assert anyio.run(limits) == (5, 5, 7)
