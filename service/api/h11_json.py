"""uvicorn's h11 protocol (``dpss api`` without httptools) with the service's JSON 400 for a
request it cannot parse, instead of uvicorn's plain text (see
:data:`service.api.connections.MALFORMED_REQUEST`), and a request head bounded in time as in
:mod:`service.api.bounded_head` (408 after :data:`service.api.connections.head_timeout_seconds`).
Its head is bounded in size by uvicorn's own ``h11_max_incomplete_event_size``."""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.api import connections
from service.api.connections import json_400


class JsonErrorsH11(H11Protocol):
    _head_timer: asyncio.TimerHandle | None = None

    def send_400_response(self, msg: str) -> None:
        self.transport.write(json_400(self.server_state.default_headers))
        self.transport.close()

    def _in_head(self) -> bool:
        # Between requests h11 waits in IDLE: a request's head not yet whole (a kept-alive
        # connection's pause is uvicorn's keep-alive timeout's, which the first byte ends).
        return self.conn.their_state is h11.IDLE

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing() or not self._in_head():
            self._disarm_head_timer()
        else:
            self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(
                connections.head_timeout_seconds, self._head_timed_out
            )

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head() and not self.transport.is_closing():
            self.transport.write(connections.head_timeout_response())
            self.transport.close()
