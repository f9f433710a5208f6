"""Hardening through the app: security headers, docs CSP, CORS only when configured, per-key
rate limits with 429 and Retry-After, request ids on every response including a 500."""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service import releases as releases_module
from service.api.middleware import TokenBuckets
from service.app import create_app
from service.cli import _uvicorn_options
from service.db.engine import make_engine
from tests.conftest import bearer


def app_client(settings, session_factory, **overrides):
    app = create_app(settings.model_copy(update=overrides), session_factory=session_factory)
    return TestClient(app, raise_server_exceptions=False)


def test_every_response_has_nosniff_a_bare_server_name_and_a_request_id(client, keys):
    responses = [
        client.get("/healthz"),
        client.get("/v1/datasets", headers=bearer(keys.owner)),
        client.get("/v1/datasets"),  # 401
        client.get(f"/v1/releases/{uuid.uuid4()}", headers=bearer(keys.analyst)),  # 404
        client.get("/no/such/path"),
        client.get("/openapi.json"),
    ]
    for response in responses:
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["server"] == "dpss"
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["X-Request-ID"])
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]


def test_every_v1_response_is_no_store(client, keys):
    for response in (
        client.get("/v1/datasets", headers=bearer(keys.owner)),
        client.get("/v1/datasets"),
        client.post("/v1/keys", headers=bearer(keys.admin), json={"role": "nope"}),
        client.get(f"/v1/releases/{uuid.uuid4()}", headers=bearer(keys.analyst)),
    ):
        assert response.headers["Cache-Control"] == "no-store", response.status_code
    assert "no-store" not in client.get("/healthz").headers.get("Cache-Control", "")


def test_an_internal_error_still_carries_the_headers_and_the_error_body(client, keys, monkeypatch):
    def raising(*args):
        raise RuntimeError("internal")

    monkeypatch.setattr(releases_module, "get_release", raising)
    response = client.get(f"/v1/releases/{uuid.uuid4()}", headers=bearer(keys.analyst))
    assert response.status_code == 500
    assert response.json() == {"error": "internal_error", "detail": response.json()["detail"]}
    assert response.headers["X-Request-ID"] and response.headers["Cache-Control"] == "no-store"
    assert response.headers["X-Content-Type-Options"] == "nosniff"


def sources(policy: str, directive: str) -> list[str]:
    for part in policy.split(";"):
        name, *values = part.split()
        if name == directive:
            return values
    return []


def test_the_swagger_page_allows_exactly_its_own_inline_script(client):
    page = client.get("/docs")
    assert page.status_code == 200
    policy = page.headers["Content-Security-Policy"]
    inline = re.findall(r"<script>(.*?)</script>", page.text, flags=re.S)
    assert len(inline) == 1
    digest = base64.b64encode(hashlib.sha256(inline[0].encode()).digest()).decode()
    scripts = sources(policy, "script-src")
    assert f"'sha256-{digest}'" in scripts
    assert "'unsafe-inline'" not in scripts and "'unsafe-eval'" not in scripts
    assert sources(policy, "default-src") == ["'none'"]
    assert sources(policy, "connect-src") == ["'self'"]
    # The assets are the service's own: no other host is allowed or referenced.
    assert "https:" not in policy and "http:" not in policy
    assert not re.findall(r'(?:src|href)="(https?://[^"]+)', page.text)
    assert sources(policy, "style-src") == ["'self'", "'unsafe-inline'"]
    for url in re.findall(r'(?:src|href)="(/[^"]+)', page.text):
        asset = client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 1000, url
    assert page.headers["X-Content-Type-Options"] == "nosniff"


def test_the_redoc_and_oauth_pages_have_their_own_strict_policies(client):
    redoc = client.get("/redoc")
    policy = redoc.headers["Content-Security-Policy"]
    assert sources(policy, "script-src") == ["'self'"]
    assert "https:" not in policy and "http:" not in policy
    assert not re.findall(r'(?:src|href)="(https?://[^"]+)', redoc.text)
    script = re.search(r'<script src="(/[^"]+)"', redoc.text)
    assert script is not None and client.get(script.group(1)).status_code == 200
    redirect = client.get("/docs/oauth2-redirect")
    scripts = sources(redirect.headers["Content-Security-Policy"], "script-src")
    assert len(scripts) == 1 and scripts[0].startswith("'sha256-")


def test_no_cors_headers_unless_configured(client, keys, settings, session_factory):
    origin = {"Origin": "https://evil.example"}
    plain = client.get("/v1/datasets", headers={**bearer(keys.owner), **origin})
    assert "access-control-allow-origin" not in plain.headers
    preflight = client.options(
        "/v1/datasets",
        headers={**origin, "Access-Control-Request-Method": "GET"},
    )
    assert "access-control-allow-origin" not in preflight.headers
    allowed = "https://notebooks.example.org"
    with app_client(settings, session_factory, cors_allow_origins=[allowed]) as cors:
        ok = cors.get("/v1/datasets", headers={**bearer(keys.owner), "Origin": allowed})
        assert ok.headers["access-control-allow-origin"] == allowed
        assert "X-Request-ID" in ok.headers["access-control-expose-headers"]
        other = cors.get("/v1/datasets", headers={**bearer(keys.owner), **origin})
        assert "access-control-allow-origin" not in other.headers


def test_a_key_over_its_rate_gets_429_with_retry_after(keys, settings, session_factory, caplog):
    caplog.set_level(logging.INFO, logger="dpss.access")
    with app_client(
        settings, session_factory, rate_limit_per_second=0.5, rate_limit_burst=3
    ) as limited:
        statuses = [
            limited.get("/v1/datasets", headers=bearer(keys.owner)).status_code for _ in range(3)
        ]
        assert statuses == [200, 200, 200]
        refused = limited.get("/v1/datasets", headers=bearer(keys.owner))
        assert refused.status_code == 429
        assert refused.json()["error"] == "rate_limited" and refused.json()["detail"]
        assert set(refused.json()) == {"error", "detail"}
        assert 1 <= int(refused.headers["Retry-After"]) <= 2
        assert refused.headers["Cache-Control"] == "no-store"
        # Refused before routing, logged under its path template all the same.
        line = next(r for r in caplog.records if getattr(r, "status", None) == 429)
        assert line.path == "/v1/datasets"
        # Another key has its own bucket; health checks are never limited.
        assert limited.get("/v1/datasets", headers=bearer(keys.analyst)).status_code == 200
        assert all(limited.get("/healthz").status_code == 200 for _ in range(10))


def test_the_token_bucket_refills_at_the_rate():
    bucket = TokenBuckets(rate=2.0, burst=2)
    assert [bucket.retry_after("k", 0.0) for _ in range(2)] == [0.0, 0.0]
    assert bucket.retry_after("k", 0.0) == pytest.approx(0.5)
    assert bucket.retry_after("k", 0.5) == 0.0  # one token back after 1/rate seconds
    assert bucket.retry_after("k", 0.5) > 0
    assert bucket.retry_after("k", 10.0) == 0.0  # refilled, capped at the burst
    assert bucket.retry_after("k", 10.0) == 0.0
    assert bucket.retry_after("k", 10.0) > 0


def test_bucket_state_is_bounded():
    bucket = TokenBuckets(rate=1.0, burst=1, max_buckets=3)
    for i in range(10):
        bucket.retry_after(f"key-{i}", 0.0)
    assert list(bucket.buckets) == ["key-7", "key-8", "key-9"]


def test_uvicorn_runs_with_json_logs_and_without_its_access_log_or_server_header(settings):
    options = _uvicorn_options(settings)
    assert options["access_log"] is False and options["server_header"] is False
    config = options["log_config"]
    assert config["loggers"]["uvicorn.access"]["propagate"] is False
    assert config["loggers"]["sqlalchemy.engine"]["level"] == "WARNING"
    assert not make_engine("sqlite://").echo  # no statement echo, so no parameters


def test_the_middleware_passes_a_streamed_body_through_chunk_by_chunk(app):
    """Pure ASGI layers: a streaming response reaches the server as it is produced."""
    import anyio
    from starlette.responses import StreamingResponse

    async def chunks():
        for part in (b"one,", b"two,", b"three"):
            yield part

    app.add_api_route("/v1/stream-probe", lambda: StreamingResponse(chunks()), methods=["GET"])
    sent = []

    requested = []

    async def receive():
        if requested:  # the body was read: the client stays connected
            await anyio.sleep_forever()
        requested.append(True)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/stream-probe",
        "raw_path": b"/v1/stream-probe",
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    anyio.run(app, scope, receive, send)
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body" and m["body"]]
    assert bodies == [b"one,", b"two,", b"three"]
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    assert headers["cache-control"] == "no-store" and headers["x-content-type-options"] == "nosniff"


def test_a_flood_of_random_tokens_is_limited_and_a_known_key_keeps_its_own_rate(
    keys, settings, session_factory
):
    with app_client(
        settings,
        session_factory,
        rate_limit_per_second=0.01,
        rate_limit_burst=30,
        rate_limit_unverified_per_second=0.01,
        rate_limit_unverified_burst=5,
        rate_limit_unverified_global_per_second=0,
    ) as limited:
        assert limited.get("/v1/datasets", headers=bearer(keys.owner)).status_code == 200
        flood = [
            limited.get("/v1/datasets", headers=bearer(f"dpss_{uuid.uuid4().hex}"))
            for _ in range(40)
        ]
        # A fresh token per request used to get a fresh bucket each time: 40 x 401, 0 x 429.
        # The owner's key is valid, so its first request did not count against the address.
        assert [r.status_code for r in flood[:5]] == [401] * 5
        assert {r.status_code for r in flood[5:]} == {429}
        assert all(int(r.headers["Retry-After"]) >= 1 for r in flood[5:])
        assert "without a valid key" in flood[-1].json()["detail"]
        # So are requests without a key at all.
        assert limited.get("/v1/datasets").status_code == 429
        # The known key has its own bucket: 29 more of its 30 go through, then its own 429.
        owner = [limited.get("/v1/datasets", headers=bearer(keys.owner)) for _ in range(30)]
        assert [r.status_code for r in owner] == [200] * 29 + [429]
        assert "for this key" in owner[-1].json()["detail"]


async def _call(middleware, address, token):
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/datasets",
        "root_path": "",
        "headers": [(b"authorization", f"Bearer {token}".encode())],
        "client": (address, 1234),
    }
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await middleware(scope, receive, send)
    return sent[0]["status"]


def test_unknown_keys_from_many_addresses_share_one_global_bucket(settings):
    import anyio

    from service.api.deps import KEY_AUTHENTICATED
    from service.api.middleware import RateLimitMiddleware

    valid = "dpss_valid"

    async def app(scope, receive, send):
        ok = scope["headers"][0][1].endswith(valid.encode())
        scope[KEY_AUTHENTICATED] = ok
        await send({"type": "http.response.start", "status": 200 if ok else 401, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    limits = settings.model_copy(
        update={
            "rate_limit_per_second": 1,
            "rate_limit_burst": 10,
            "rate_limit_unverified_per_second": 1,
            "rate_limit_unverified_burst": 2,
            "rate_limit_unverified_global_per_second": 10,
        }
    )
    middleware = RateLimitMiddleware(app, limits)

    async def scenario():
        assert await _call(middleware, "10.0.0.1", valid) == 200  # now a known key
        statuses = [await _call(middleware, f"10.1.{i}.1", uuid.uuid4().hex) for i in range(30)]
        # Each address is new (its own burst of 2), yet all together get one second's worth.
        assert statuses.count(401) == 9 and statuses.count(429) == 21
        assert [await _call(middleware, "10.0.0.1", valid) for _ in range(9)] == [200] * 9

    anyio.run(scenario)


FLOOD_LIMITS = {
    "rate_limit_per_second": 0.01,
    "rate_limit_burst": 100,
    "rate_limit_unverified_per_second": 0.01,
    "rate_limit_unverified_burst": 5,
    "rate_limit_unverified_global_per_second": 0.01,
}


def _flood(client, count=40):
    statuses = {
        client.get("/v1/datasets", headers=bearer(f"dpss_{uuid.uuid4().hex}")).status_code
        for _ in range(count)
    }
    assert 429 in statuses  # the flood is refused: whatever comes next competes with it


def _start(client, app, key, tries=5):
    """A well-behaved client: up to ``tries`` requests, waiting as ``Retry-After`` says (the
    wait is simulated: the key directory's reload window is moved back by that much)."""
    statuses = []
    for _ in range(tries):
        response = client.get("/v1/datasets", headers=bearer(key))
        statuses.append(response.status_code)
        if response.status_code not in (429, 503):
            break
        app.state.database.key_directory.reloaded_at -= int(response.headers["Retry-After"])
    return statuses


def test_a_fresh_valid_key_starts_during_a_random_token_flood_from_its_own_address(
    keys, settings, session_factory, make_key
):
    app = create_app(settings.model_copy(update=FLOOD_LIMITS), session_factory=session_factory)
    with TestClient(app, raise_server_exceptions=False) as client:
        _flood(client)
        # Made through this process's API: known at once, its first request is served.
        made = client.post(
            "/v1/keys", headers=bearer(keys.admin), json={"role": "owner", "name": "n"}
        )
        assert made.status_code == 201
        assert _start(client, app, made.json()["key"]) == [200]
        # Made elsewhere (the CLI, another API process) during the flood: served once the
        # client has waited as told (it used to be refused on every try).
        for _ in range(3):
            fresh = make_key("analyst")
            _flood(client, 10)
            statuses = _start(client, app, fresh)
            assert statuses[-1] == 200 and len(statuses) <= 2, statuses
        # Still no way in for random tokens, nor for a revoked key.
        _flood(client, 5)


def test_many_parallel_first_requests_of_a_new_key_are_served(keys, settings, session_factory):
    """32 first requests at once of a key this process never saw (16 x 429 before: they all
    counted against the address's burst). The key directory is the real one, on the database;
    the app behind the limiter only answers (the test's session is one connection, which
    parallel units of work cannot share)."""
    import asyncio

    import anyio

    from service.api.deps import KEY_AUTHENTICATED, Database
    from service.api.middleware import RateLimitMiddleware

    limited = settings.model_copy(update={**FLOOD_LIMITS, "rate_limit_per_second": 1})
    directory = Database(session_factory, limited).key_directory

    async def app(scope, receive, send):
        await asyncio.sleep(0)
        scope[KEY_AUTHENTICATED] = True
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = RateLimitMiddleware(app, limited, directory=lambda: directory)

    async def parallel() -> list[int]:
        return list(
            await asyncio.gather(*(_call(middleware, "10.0.0.7", keys.owner) for _ in range(32)))
        )

    assert anyio.run(parallel) == [200] * 32
    # Random tokens from the same address are still refused once its burst is spent.
    flood = anyio.run(
        lambda: asyncio.gather(
            *(_call(middleware, "10.0.0.7", f"dpss_{uuid.uuid4().hex}") for _ in range(10))
        )
    )
    assert 429 in flood


def test_a_fresh_key_starts_during_a_flood_from_many_addresses_and_after_a_restart(
    keys, settings, session_factory, make_key
):
    limited = settings.model_copy(update=FLOOD_LIMITS)
    for _restart in range(2):
        # A new app is a restarted API process: it has never seen any key.
        app = create_app(limited, session_factory=session_factory)
        with TestClient(app, raise_server_exceptions=False) as client:
            for i in range(30):
                flooder = TestClient(app, raise_server_exceptions=False, client=(f"10.1.{i}.1", 9))
                flooder.get("/v1/datasets", headers=bearer(f"dpss_{uuid.uuid4().hex}"))
            assert _flood(client, 5) is None
            fresh = make_key("owner")
            for key in (keys.owner, keys.analyst, fresh):
                statuses = _start(client, app, key)
                assert statuses[-1] == 200 and len(statuses) <= 2, statuses


def test_forwarding_headers_are_believed_only_from_configured_proxies(settings):
    import anyio
    import uvicorn

    seen = []

    async def app(scope, receive, send):
        seen.append(scope["client"][0])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def call(loaded, peer):
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/v1/datasets",
            "raw_path": b"/v1/datasets",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"x-forwarded-for", b"203.0.113.9"), (b"host", b"h")],
            "client": (peer, 5000),
            "server": ("127.0.0.1", 8000),
        }

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            pass

        await loaded(scope, receive, send)

    def loaded_app(**overrides):
        config = uvicorn.Config(app, **_uvicorn_options(settings.model_copy(update=overrides)))
        config.load()
        return config.loaded_app

    default = loaded_app()
    for peer in ("127.0.0.1", "10.0.0.2"):
        anyio.run(call, default, peer)
    assert seen == ["127.0.0.1", "10.0.0.2"]  # uvicorn alone believed 127.0.0.1's header
    seen.clear()
    behind = loaded_app(trusted_proxies="10.0.0.2, 192.0.2.0/24")
    for peer in ("127.0.0.1", "10.0.0.2", "192.0.2.77"):
        anyio.run(call, behind, peer)
    assert seen == ["127.0.0.1", "203.0.113.9", "203.0.113.9"]


def test_idle_connections_outlive_every_retry_after_and_a_proxy_idle_timeout(settings):
    """A connection the server closes while its client sends the next request on it ends with
    no answer at all. uvicorn's 5 s keep-alive did that to clients coming back after a 503's
    Retry-After while the loop was seconds behind (7-8% of requests at 800-1,600 clients), and
    does it to any proxy in front whose idle timeout is longer (60 s is common)."""
    import uvicorn

    from service.errors import RestoreUnaccepted

    config = uvicorn.Config(lambda scope: None, **_uvicorn_options(settings))
    longest_retry_after = max(settings.retry_after_seconds, RestoreUnaccepted.RETRY_AFTER)
    assert config.timeout_keep_alive > longest_retry_after + settings.api_max_loop_lag_seconds
    assert config.timeout_keep_alive > 60
    shorter = settings.model_copy(update={"api_keep_alive_seconds": 7.5})
    assert uvicorn.Config(lambda scope: None, **_uvicorn_options(shorter)).timeout_keep_alive == 7.5


def test_a_request_head_past_its_bound_is_431_and_a_normal_one_is_served(settings):
    """uvicorn's httptools protocol has no bound on a request's head: a 10 MB header was read
    into memory and answered 200. The protocol `dpss api` runs answers 431 and closes."""
    import asyncio

    import uvicorn
    from uvicorn.server import ServerState

    from service.api.connections import MAX_HEAD_BYTES
    from tests.api.fake_transport import RecordingTransport as Transport

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def feed(chunks: list[bytes]) -> Transport:
        options = _uvicorn_options(settings)
        assert options["http"] != "h11"  # httptools is installed: the bounded protocol runs
        config = uvicorn.Config(app, **{**options, "log_config": None})
        config.load()
        protocol = config.http_protocol_class(config, ServerState(), {})
        transport = Transport()
        protocol.connection_made(transport)
        for chunk in chunks:
            protocol.data_received(chunk)
        for _ in range(20):
            await asyncio.sleep(0)
        return transport

    line = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
    big = b"X-Big: " + b"a" * MAX_HEAD_BYTES
    # In one chunk and in many, as a slow client sends it.
    for chunks in (
        [line + big + b"\r\n\r\n"],
        [line, *[big[i : i + 4096] for i in range(0, len(big), 4096)]],
    ):
        sent = asyncio.run(feed(chunks))
        assert sent.written.startswith(b"HTTP/1.1 431 "), sent.written[:80]
        assert b'"error": "request_header_fields_too_large"' in sent.written and sent.closed
    # A head under the bound, with a large body in the same chunk, is served.
    body = b"b" * (2 * MAX_HEAD_BYTES)
    post = line.replace(b"GET", b"POST") + b"Content-Length: %d\r\n\r\n" % len(body) + body
    assert asyncio.run(feed([post])).written.startswith(b"HTTP/1.1 204 ")
