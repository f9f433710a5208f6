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


def answer_with_retry_after(settings: Settings) -> None:
    """Replace uvicorn's plain-text answer beyond ``limit_concurrency`` with the service's 503
    (its error body and ``Retry-After``), in this process. uvicorn's HTTP protocols look the
    answer up by name in their own modules at each refused connection."""
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

_HEAD_TOO_LARGE = json.dumps(
    {
        "error": "request_header_fields_too_large",
        "detail": f"request line and headers: larger than {MAX_HEAD_BYTES} bytes",
    }
).encode()


def bounded_head_protocol() -> type[Any] | None:
    """uvicorn's httptools protocol, answering a request head over :data:`MAX_HEAD_BYTES` with
    431 and closing the connection; ``None`` without httptools (uvicorn then uses h11, bounded by
    ``h11_max_incomplete_event_size``)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class BoundedHead(HttpToolsProtocol):
        # Two counts. The parsed head (URL and headers, as the parser reports them): past the
        # bound, a callback fails, the parser stops, and uvicorn's 400 for a parse error is
        # answered as 431 instead. The raw bytes of chunks received while a head is incomplete:
        # the parser reports a header only once its value is whole, and holds it until then.
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = True
            self._raw_bytes = 0
            self._parsed_bytes = 0
            self._too_large = False

        def _count(self, size: int) -> None:
            self._parsed_bytes += size
            if self._parsed_bytes > MAX_HEAD_BYTES:
                self._too_large = True
                raise ValueError("request head too large")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = True
            self._parsed_bytes = 0

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._raw_bytes = 0
            super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            if not self._too_large:
                super().send_400_response(msg)
                return
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                b"content-type: application/json\r\n"
                b"content-length: " + str(len(_HEAD_TOO_LARGE)).encode() + b"\r\n"
                b"connection: close\r\n\r\n" + _HEAD_TOO_LARGE
            )
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._in_head or self.transport.is_closing():
                return
            self._raw_bytes += len(data)
            if self._raw_bytes > MAX_HEAD_BYTES:
                self._too_large = True
                self.send_400_response("")

    return BoundedHead
