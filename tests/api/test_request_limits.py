"""Requests are bounded before they cost anything: the key before the body, JSON bodies by size
before parsing, integer query parameters by range, waits for the database by time (503)."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient

from service.api.routing import BodyDeadline
from service.app import create_app
from service.config import Settings
from service.errors import RequestTimeout
from tests.conftest import bearer

RELEASE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}


def _with(settings: Settings, **changes: Any) -> Settings:
    return Settings(**{**settings.model_dump(), **changes})


@pytest.fixture
def limited(settings, session_factory) -> Any:
    app = create_app(_with(settings, max_json_bytes=1000), session_factory=session_factory)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _releases_path() -> str:
    return f"/v1/datasets/{uuid.uuid4()}/releases"


JSON = {"Content-Type": "application/json"}


def test_json_over_the_limit_is_refused_with_413_before_it_is_parsed(limited, make_key):
    analyst = bearer(make_key("analyst"))
    headers = {**analyst, **JSON}
    # Not JSON at all: parsed, it would be a 422; over the limit it is never parsed.
    small, large = b"{not json", b"{not json" + b" " * 1000
    assert limited.post(_releases_path(), headers=headers, content=small).status_code == 422
    response = limited.post(_releases_path(), headers=headers, content=large)
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    assert "DPSS_MAX_JSON_BYTES" in response.json()["detail"]


def test_json_over_the_limit_without_content_length_is_refused_while_it_arrives(limited, make_key):
    headers = {**bearer(make_key("admin")), **JSON}
    chunks = iter([b'{"role": "owner", "name": "', b"x" * 600, b"x" * 600, b'"}'])
    response = limited.post("/v1/keys", headers=headers, content=chunks)
    assert "content-length" not in {k.lower() for k in response.request.headers}
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"


def test_default_json_limit_applies(client, make_key):
    headers = {**bearer(make_key("analyst")), **JSON}
    body = b'{"mechanism": "' + b"a" * (64 * 1024) + b'"}'
    assert client.post(_releases_path(), headers=headers, content=body).status_code == 413


def test_a_request_without_a_valid_key_gets_401_before_its_json_is_parsed(client, make_key):
    for headers in ({}, bearer("dpss_not-a-key")):
        response = client.post(_releases_path(), headers={**headers, **JSON}, content=b"{oops")
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
    # With a valid key the same body is parsed, and refused as JSON.
    analyst = bearer(make_key("analyst"))
    refused = client.post(_releases_path(), headers={**analyst, **JSON}, content=b"{oops")
    assert refused.status_code == 422
    # The field is the body (pydantic locates the error at a character offset, which read "1").
    assert refused.json()["detail"].startswith("body: not valid JSON (")


async def _call(app: Any, method: str, path: str, headers: dict[str, str]) -> tuple[int, int]:
    """Call the ASGI app directly; returns the status and how often the body was asked for."""
    reads = 0
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    return status, reads


@pytest.mark.parametrize(
    ("method", "path", "content_type"),
    [
        ("POST", "/v1/datasets/00000000-0000-0000-0000-000000000000/releases", "application/json"),
        ("POST", "/v1/keys", "application/json"),
        ("POST", "/v1/datasets", "multipart/form-data; boundary=b"),
    ],
)
def test_no_byte_of_the_body_is_read_without_a_valid_key(app, make_key, method, path, content_type):
    for auth in ({}, bearer("dpss_not-a-key")):
        headers = {**auth, "content-type": content_type, "content-length": "2"}
        assert anyio.run(_call, app, method, path, headers) == (401, 0)
    if path == "/v1/datasets":
        # An upload also checks the role before it reads anything.
        headers = {**bearer(make_key("analyst")), "content-type": content_type}
        assert anyio.run(_call, app, method, path, headers) == (403, 0)


@pytest.mark.parametrize(
    ("path", "role", "parameter"),
    [
        ("/v1/datasets", "analyst", "limit"),
        ("/v1/datasets", "analyst", "offset"),
        ("/v1/audit", "auditor", "limit"),
        ("/v1/audit", "auditor", "after"),
    ],
)
def test_integer_query_parameters_beyond_64_bits_are_422(client, make_key, path, role, parameter):
    headers = bearer(make_key(role))
    for value in (2**70, -(2**70), 2**63):
        response = client.get(path, headers=headers, params={parameter: str(value)})
        assert response.status_code == 422, (parameter, value, response.text)
        assert response.json()["error"] == "invalid_input"
        assert parameter in response.json()["detail"]


def test_the_largest_accepted_offset_works_on_the_database(client, make_key):
    headers = bearer(make_key("analyst"))
    for parameter in ("offset",):
        response = client.get("/v1/datasets", headers=headers, params={parameter: str(2**63 - 1)})
        assert response.status_code == 200, response.text
        assert response.json()["items"] == []
    auditor = bearer(make_key("auditor"))
    response = client.get("/v1/audit", headers=auditor, params={"after": str(2**63 - 1)})
    assert response.status_code == 200, response.text


def test_every_integer_query_parameter_has_an_upper_bound(app):
    unbounded, integers = [], 0
    for path, operations in app.openapi()["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                if parameter["in"] == "query" and schema.get("type") == "integer":
                    integers += 1
                    if "maximum" not in schema and "exclusiveMaximum" not in schema:
                        unbounded.append(f"{method} {path} {parameter['name']}")
    assert integers >= 4 and unbounded == []


def test_a_request_that_cannot_get_a_database_slot_in_time_gets_503(
    settings, session_factory, make_key
):
    app = create_app(
        _with(
            settings, db_pool_size=1, db_max_overflow=0, db_wait_seconds=0.2, retry_after_seconds=3
        ),
        session_factory=session_factory,
    )
    owner = bearer(make_key("owner"))

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            gate = app.state.database.gate()
            await gate.slots.acquire()  # the only slot, as a long unit of work would hold it
            try:
                busy = await http.get("/v1/datasets", headers=owner)
            finally:
                gate.slots.release()
            return busy, await http.get("/v1/datasets", headers=owner)

    busy, after = anyio.run(scenario)
    assert busy.status_code == 503
    assert busy.headers["retry-after"] == "3"
    assert busy.json() == {
        "error": "service_unavailable",
        "detail": "the database is busy; retry shortly",
        "retry_after": 3,
    }
    assert after.status_code == 200


def test_the_body_deadline_covers_the_body_and_ends_with_it():
    async def scenario(first_chunk_after: float) -> tuple[str, bool]:
        messages = [{"type": "http.request", "body": b"x", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                await anyio.sleep(first_chunk_after)
                return messages.pop(0)
            await anyio.sleep(0.3)  # waiting for a disconnect, after the body
            return {"type": "http.disconnect"}

        deadline = BodyDeadline(receive, 0.1)
        try:
            await deadline.receive()
            return (await deadline.receive())["type"], deadline.expired
        except RequestTimeout:
            return "timeout", deadline.expired

    assert anyio.run(scenario, 0.0) == ("http.disconnect", False)
    assert anyio.run(scenario, 0.3) == ("timeout", True)
