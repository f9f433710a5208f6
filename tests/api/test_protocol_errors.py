"""A request uvicorn cannot parse is answered in the service's JSON error format.

uvicorn answers a malformed request line or header itself, before the application sees it,
with 400 and the plain text "Invalid HTTP request received.": the one answer of ``dpss api``
outside ``{"error", "detail"}``. Both protocols it may run (httptools, bounded; h11 without
httptools) now send a JSON 400, echoing nothing of the request, and close the connection.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from service.cli import _uvicorn_options
from tests.api.fake_transport import RecordingTransport as Transport

BOTH = "both"
#: Requests both parsers refuse, and those only httptools (the protocol ``dpss api`` runs when
#: installed, as in the image) refuses: h11 reads any HTTP/1.x version and control characters in
#: a header value.
MALFORMED = [
    (b"GARBAGE<script>\r\n\r\n", BOTH),
    (b"GET /he\x00althz HTTP/1.1\r\nHost: x\r\n\r\n", BOTH),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header<script>: 1\r\n\r\n", BOTH),
    (b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", BOTH),
    (b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n", "httptools"),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: \x01<script>\r\n\r\n", "httptools"),
]


async def _app(scope: Any, receive: Any, send: Any) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _feed(protocol_name: str, data: bytes) -> Transport:
    async def run() -> Transport:
        config = uvicorn.Config(_app, **{**options, "http": protocol_name, "log_config": None})
        config.load()
        protocol = config.http_protocol_class(config, ServerState(), {})
        transport = Transport()
        protocol.connection_made(transport)
        protocol.data_received(data)
        for _ in range(20):
            await asyncio.sleep(0)
        return transport

    options = _uvicorn_options_for_test()
    return asyncio.run(run())


def _uvicorn_options_for_test() -> dict[str, Any]:
    from service.config import Settings

    return _uvicorn_options(Settings(database_url="sqlite://"))


HTTPTOOLS = "service.api.bounded_head:BoundedHead"
PROTOCOLS = [HTTPTOOLS, "service.api.h11_json:JsonErrorsH11"]


def test_dpss_api_runs_one_of_these_protocols():
    assert _uvicorn_options_for_test()["http"] in PROTOCOLS


#: Each protocol with the requests it refuses (h11 reads the httptools-only ones).
REFUSED = [
    (protocol, request_bytes)
    for protocol in PROTOCOLS
    for request_bytes, refused_by in MALFORMED
    if refused_by == BOTH or protocol == HTTPTOOLS
]


@pytest.mark.parametrize(("protocol", "request_bytes"), REFUSED)
def test_a_malformed_request_is_a_json_400_echoing_nothing(protocol, request_bytes):
    sent = _feed(protocol, request_bytes)
    head, _, body = sent.written.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), sent.written[:200]
    assert b"content-type: application/json" in head.lower()
    problem = json.loads(body)
    assert problem == {
        "error": "bad_request",
        "detail": "request line or headers: not a well-formed HTTP/1.1 request",
    }
    assert b"<script>" not in sent.written and sent.closed


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_well_formed_request_is_still_served(protocol):
    sent = _feed(protocol, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sent.written.startswith(b"HTTP/1.1 204 "), sent.written[:200]
