"""How many connections an API process admits: no more than its open files allow.

Each connection holds a socket, and an upload's a file in ``incoming/`` as well while its body
streams in. A process past its ``RLIMIT_NOFILE`` cannot accept at all: its loop spins on
``accept`` failing with EMFILE (logging each failure) and every new client waits with no
answer, which slow clients (slowloris: a request's head, then nothing) can bring about on
purpose. uvicorn's ``limit_concurrency`` answers a connection beyond the limit 503 and closes
it; :func:`connection_limit` sets it from the descriptors, and :func:`answer_with_retry_after`
makes that 503 the service's own (JSON, ``Retry-After``), as for every other exhaustion.
"""

from __future__ import annotations

import importlib.util
import json
import resource
from typing import Any

from service.config import Settings

#: Descriptors a process keeps besides its connections: its database pool and overflow (counted
#: separately), the LISTEN connection, log and metrics files, the store's files and SQLite's,
#: the interpreter's own.
RESERVED_FILES = 64
#: Descriptors one connection may hold: its socket and an upload's file.
FILES_PER_CONNECTION = 2


def connection_limit(settings: Settings) -> int | None:
    """Connections (and requests in progress) one API process admits; ``None``: no limit on
    open files, so none here either."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    reserved = RESERVED_FILES + settings.db_pool_size + settings.db_max_overflow
    return max(1, (soft - reserved) // FILES_PER_CONNECTION)


#: Seconds a request's head may take (``DPSS_API_HEAD_TIMEOUT_SECONDS``), set in each API
#: process by :func:`answer_with_retry_after`; read by the protocols at each connection.
head_timeout_seconds = 20.0

HEAD_TIMEOUT = json.dumps(
    {
        "error": "request_timeout",
        "detail": "request line and headers: not received in time; send them at once",
    }
).encode()


def head_timeout_response() -> bytes:
    """The whole 408 a connection gets when its request head is not complete in time; the
    connection is closed after it."""
    return (
        b"HTTP/1.1 408 Request Timeout\r\n"
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(HEAD_TIMEOUT)).encode() + b"\r\n"
        b"connection: close\r\n\r\n" + HEAD_TIMEOUT
    )


def answer_with_retry_after(settings: Settings) -> None:
    """Replace uvicorn's plain-text answer beyond ``limit_concurrency`` with the service's 503
    (its error body and ``Retry-After``), in this process. uvicorn's HTTP protocols look the
    answer up by name in their own modules at each refused connection. Also sets this
    process's :data:`head_timeout_seconds`: a connection slot is held only while a request
    head arrives in time, is served, or idles within the keep-alive timeout."""
    global head_timeout_seconds
    head_timeout_seconds = settings.api_head_timeout_seconds
    from uvicorn.protocols.http import h11_impl, httptools_impl

    retry_after = str(settings.retry_after_seconds)
    body = json.dumps(
        {
            "error": "service_unavailable",
            "detail": "too many connections; retry shortly",
            "retry_after": settings.retry_after_seconds,
        }
    ).encode()

    async def service_unavailable(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", retry_after.encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    for module in (h11_impl, httptools_impl):
        module.service_unavailable = service_unavailable  # type: ignore[attr-defined]


#: Bytes a request's line and headers may take together. uvicorn's httptools protocol sets no
#: bound (its h11 one has ``h11_max_incomplete_event_size``): a 10 MB header was read into
#: memory and served (200), so a few connections could hold any amount of it. 64 KiB is 8 times
#: nginx's default line buffer and far above any head this API needs (a key is 48 characters).
MAX_HEAD_BYTES = 64 * 1024

HEAD_TOO_LARGE = json.dumps(
    {
        "error": "request_header_fields_too_large",
        "detail": f"request line and headers: larger than {MAX_HEAD_BYTES} bytes",
    }
).encode()


#: uvicorn answers a request it cannot parse (a malformed request line, a bad header, a bad
#: chunk) itself, before the application sees it, with 400 and the plain text "Invalid HTTP
#: request received.": the one answer outside the service's error format. Its protocols here
#: (:mod:`service.api.bounded_head`, :mod:`service.api.h11_json`) send this instead. Fixed
#: text: nothing of the request is echoed.
MALFORMED_REQUEST = json.dumps(
    {
        "error": "bad_request",
        "detail": "request line or headers: not a well-formed HTTP/1.1 request",
    }
).encode()


def json_400(default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The whole 400 response (status line, headers, body) for :data:`MALFORMED_REQUEST`;
    the connection is closed after it, as uvicorn closes it."""
    head = [b"HTTP/1.1 400 Bad Request\r\n"]
    head += [name + b": " + value + b"\r\n" for name, value in default_headers]
    head += [
        b"content-type: application/json\r\n",
        b"content-length: " + str(len(MALFORMED_REQUEST)).encode() + b"\r\n",
        b"connection: close\r\n\r\n",
    ]
    return b"".join(head) + MALFORMED_REQUEST


def bounded_head_protocol() -> str | None:
    """uvicorn's httptools protocol, answering a request head over :data:`MAX_HEAD_BYTES` with
    431 and closing the connection (:class:`service.api.bounded_head.BoundedHead`); ``None``
    without httptools (uvicorn then uses h11, bounded by ``h11_max_incomplete_event_size``).

    An import string, not the class: with ``--workers`` uvicorn pickles its config into each
    spawned process, and each imports the protocol by name there."""
    if importlib.util.find_spec("httptools") is None:
        return None
    return "service.api.bounded_head:BoundedHead"


def http_protocol() -> str:
    """The protocol ``dpss api`` gives uvicorn: :func:`bounded_head_protocol`, else uvicorn's
    h11 one with JSON 400s (:class:`service.api.h11_json.JsonErrorsH11`)."""
    return bounded_head_protocol() or "service.api.h11_json:JsonErrorsH11"
