"""The pool, the database slots and the thread limits come from the settings, sized together."""

from __future__ import annotations

import anyio
import anyio.to_thread
from sqlalchemy import exc as sa_exc

from service.app import create_app
from service.config import Settings
from service.db.engine import database_unavailable, make_pooled_engine


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


def test_outages_are_told_from_faults():
    class DriverError(Exception):
        pass

    def wrapped(kind: type[sa_exc.DBAPIError], invalidated: bool = False) -> sa_exc.DBAPIError:
        return kind("SELECT 1", {}, DriverError(), connection_invalidated=invalidated)

    assert database_unavailable(sa_exc.TimeoutError("pool exhausted"))
    assert database_unavailable(wrapped(sa_exc.OperationalError))
    assert database_unavailable(wrapped(sa_exc.InterfaceError))
    assert database_unavailable(wrapped(sa_exc.DBAPIError, invalidated=True))
    assert not database_unavailable(wrapped(sa_exc.IntegrityError))
    assert not database_unavailable(wrapped(sa_exc.ProgrammingError))
    assert not database_unavailable(ValueError("not a database error"))
