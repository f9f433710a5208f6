"""The HTTP protocol ``dpss api`` runs: uvicorn's httptools one, answering a request head
(line and headers) over :data:`service.api.connections.MAX_HEAD_BYTES` with 431 and closing the
connection, and a request it cannot parse with a JSON 400
(:data:`service.api.connections.MALFORMED_REQUEST`; uvicorn's is plain text). A module of its
own, so that uvicorn can import it by name in each API process (``--workers``) and so that
importing :mod:`service.api.connections` needs no httptools."""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.api.connections import HEAD_TOO_LARGE, MAX_HEAD_BYTES, json_400
from service.api.head_deadline import HeadDeadline


class BoundedHead(HeadDeadline, HttpToolsProtocol):
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

    def _head_in_progress(self) -> bool:
        return self._in_head

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
        self._disarm_head_timer()
        self._in_head = False
        self._raw_bytes = 0
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._too_large:
            self.transport.write(json_400(self.server_state.default_headers))
            self.transport.close()
            return
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\n"
            b"content-length: " + str(len(HEAD_TOO_LARGE)).encode() + b"\r\n"
            b"connection: close\r\n\r\n" + HEAD_TOO_LARGE
        )
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        # A head has begun (or, on a kept-alive connection, the next one): it must end in time.
        self._arm_head_timer()
        self._raw_bytes += len(data)
        if self._raw_bytes > MAX_HEAD_BYTES:
            self._too_large = True
            self.send_400_response("")
