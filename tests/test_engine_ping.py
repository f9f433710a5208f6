"""PostgreSQL connections are pinged at checkout only after sitting idle, and a failed ping
hands out a fresh connection instead of a dead one (not on every checkout: one round trip less
per request). Driven by the idle threshold, not by waiting."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from service.db import engine as engine_module
from tests.conftest import SKIP_POSTGRES


@pytest.mark.skipif(SKIP_POSTGRES, reason="PostgreSQL only")
def test_connections_are_pinged_only_when_idle_and_replaced_when_dead(
    database_urls: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_module.make_engine(database_urls["postgresql"], pool_size=1, max_overflow=0)
    pings: list[object] = []
    real_ping = engine.dialect.do_ping
    dead = [False]

    def ping(dbapi_connection: Any) -> bool:
        pings.append(dbapi_connection)
        if dead[0]:
            dead[0] = False
            raise ConnectionError("server closed the connection")
        return real_ping(dbapi_connection)

    monkeypatch.setattr(engine.dialect, "do_ping", ping)
    try:
        monkeypatch.setattr(engine_module, "IDLE_PING_SECONDS", 3600.0)
        for _ in range(3):  # in steady use: never pinged
            with engine.connect() as connection:
                assert connection.execute(text("SELECT 1")).scalar() == 1
        assert pings == []
        monkeypatch.setattr(engine_module, "IDLE_PING_SECONDS", 0.0)  # everything is "idle"
        with engine.connect() as connection:
            first = connection.connection.dbapi_connection
            assert connection.execute(text("SELECT 1")).scalar() == 1
        assert pings == [first]
        dead[0] = True  # the idle connection died meanwhile: the pool replaces it
        with engine.connect() as connection:
            assert connection.execute(text("SELECT 1")).scalar() == 1
            assert connection.connection.dbapi_connection is not first
    finally:
        engine.dispose()
