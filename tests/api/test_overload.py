"""Overload is shed at once: 503 with Retry-After as soon as the expected wait for a database
slot, or one pass of the event loop, exceeds its bound, never after queueing for the timeout.

Nothing here is timed: the waits are set huge (a request that queued would never come back
within the guard) and the estimates are set by hand.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
from fastapi.testclient import TestClient
from starlette.types import Receive, Scope, Send

from service.api.middleware import OverloadMiddleware
from service.app import create_app
from service.config import Settings
from tests.conftest import bearer


def _with(settings: Settings, **changes: Any) -> Settings:
    return Settings(**{**settings.model_dump(), **changes})


def test_overload_is_shed_at_once_when_the_expected_wait_exceeds_the_bound(
    settings, session_factory, make_key
):
    # The pool timeout and the slot wait are huge: a request that queued would not come back
    # within the guard below. The answer must come from the shedding path, not from a timeout.
    app = create_app(
        _with(
            settings,
            db_pool_size=2,
            db_max_overflow=0,
            db_wait_seconds=10**6,
            db_pool_timeout_seconds=10**6,
            db_max_queue_seconds=1.0,
            retry_after_seconds=2,
        ),
        session_factory=session_factory,
    )
    owner = bearer(make_key("owner"))
    database = app.state.database

    async def scenario() -> tuple[httpx.Response, httpx.Response, float, float]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            assert (await http.get("/v1/datasets", headers=owner)).status_code == 200
            gate = database.gate()
            free = gate.expected_wait(database.size)
            for _ in range(2):  # every slot taken, as by units of work holding them
                await gate.slots.acquire()
            gate.service_seconds = 3.0  # each holds its slot about 3 s
            full = gate.expected_wait(database.size)  # 1 request (itself) / 2 slots * 3 s
            try:
                with anyio.fail_after(60):  # a guard against hanging, not a timing assertion
                    shed = await http.get("/v1/datasets", headers=owner)
            finally:
                for _ in range(2):
                    gate.slots.release()
            assert gate.waiting == 0  # it never queued
            return shed, await http.get("/v1/datasets", headers=owner), free, full

    shed, after, free, full = anyio.run(scenario)
    assert (free, full) == (0.0, 1.5)
    assert shed.status_code == 503
    assert shed.headers["retry-after"] == "2"
    assert shed.json() == {
        "error": "service_unavailable",
        "detail": "the database is busy; retry shortly",
        "retry_after": 2,
    }
    assert after.status_code == 200


def test_a_short_expected_wait_queues_instead_of_shedding(settings, session_factory, make_key):
    app = create_app(
        _with(settings, db_pool_size=1, db_max_overflow=0, db_max_queue_seconds=1.0),
        session_factory=session_factory,
    )
    owner = bearer(make_key("owner"))

    async def scenario() -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            gate = app.state.database.gate()
            await gate.slots.acquire()
            gate.service_seconds = 0.5  # expected wait 0.5 s: within the bound, so it queues
            async with anyio.create_task_group() as tasks:
                statuses: list[int] = []

                async def request() -> None:
                    statuses.append((await http.get("/v1/datasets", headers=owner)).status_code)

                tasks.start_soon(request)
                while gate.waiting == 0:
                    await anyio.sleep(0.01)
                gate.slots.release()
            return statuses[0]

    assert anyio.run(scenario) == 200


def test_a_saturated_event_loop_sheds_v1_requests_before_the_app_runs():
    reached: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    layer = OverloadMiddleware(app, max_lag=0.25, retry_after=3, min_in_flight=0)
    client = TestClient(layer)
    assert client.get("/v1/datasets").status_code == 200  # an idle loop: measured, served
    assert 0 <= layer.lag < 0.25 and not layer.overloaded()
    layer.lag, layer.lag_measured_at = 2.0, time.perf_counter() + 3600  # a saturated loop
    layer._probing = True  # (no new measurement arrives meanwhile)
    shed = client.get("/v1/datasets")
    assert shed.status_code == 503
    assert shed.headers["retry-after"] == "3"
    assert shed.json() == {
        "error": "service_unavailable",
        "detail": "the service is overloaded; retry shortly",
        "retry_after": 3,
    }
    assert client.get("/healthz").status_code == 200  # health and docs are never shed
    layer.lag_measured_at = time.perf_counter() - 2 * layer.FRESH_SECONDS  # an old measurement
    assert client.get("/v1/datasets").status_code == 200
    assert reached == ["/v1/datasets", "/healthz", "/v1/datasets"]


def test_a_slow_loop_with_few_requests_in_flight_is_not_shed():
    """A lone client on a busy host (a slow pass, few requests) is served: only this process's
    own backlog is overload."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    layer = OverloadMiddleware(app, max_lag=0.25, retry_after=3)
    lone = TestClient(layer)
    layer.lag, layer.lag_measured_at = 2.0, time.perf_counter() + 3600  # a saturated loop
    layer._probing = True  # (no new measurement arrives meanwhile)
    assert [lone.get("/v1/datasets").status_code for _ in range(20)] == [200] * 20


def test_the_app_has_the_overload_layer_unless_turned_off(settings, session_factory, keys):
    on = _with(settings, api_max_loop_lag_seconds=0.5)
    with TestClient(create_app(on, session_factory=session_factory)) as client:
        assert client.get("/v1/datasets", headers=bearer(keys.owner)).status_code == 200
    stack = create_app(on, session_factory=session_factory).build_middleware_stack()
    off = _with(settings, api_max_loop_lag_seconds=0)
    bare = create_app(off, session_factory=session_factory).build_middleware_stack()

    def layers(app: Any) -> list[str]:
        found = []
        while app is not None:
            found.append(type(app).__name__)
            app = getattr(app, "app", None)
        return found

    assert "OverloadMiddleware" in layers(stack)
    assert "OverloadMiddleware" not in layers(bare)


def test_the_mean_slot_time_counts_the_unit_of_work_not_the_loops_lag_after_it(
    settings, session_factory, monkeypatch
):
    """The expected-wait estimate is the database's: a unit of work's own time in its thread.
    The event loop's lag in resuming the request afterwards (OverloadMiddleware's to shed) used
    to be counted too, so a lagging loop made an idle database look full and shed requests it
    could serve. Not timed: the clock is stepped by hand, 10 s per reading on the loop's
    thread (a huge lag) and 1 ms per reading in the unit of work's thread."""
    import threading

    from service.api import deps

    database = deps.Database(session_factory, settings)
    loop_thread = threading.get_ident()
    now = [0.0]

    def clock() -> float:
        now[0] += 10.0 if threading.get_ident() == loop_thread else 0.001
        return now[0]

    async def scenario() -> float:
        monkeypatch.setattr(deps, "clock", clock)
        try:
            assert await database.run(lambda session: 1) == 1
        finally:
            monkeypatch.undo()
        return database.gate().service_seconds

    assert anyio.run(scenario) == 0.001
