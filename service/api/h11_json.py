"""uvicorn's h11 protocol (``dpss api`` without httptools) with the service's JSON 400 for a
request it cannot parse, instead of uvicorn's plain text (see
:data:`service.api.connections.MALFORMED_REQUEST`), and a request head bounded in time as in
:mod:`service.api.bounded_head` (408 after :data:`service.api.connections.head_timeout_seconds`).
Its head is bounded in size by uvicorn's own ``h11_max_incomplete_event_size``."""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.api.connections import json_400
from service.api.head_deadline import HeadDeadline


class JsonErrorsH11(HeadDeadline, H11Protocol):
    def send_400_response(self, msg: str) -> None:
        self.transport.write(json_400(self.server_state.default_headers))
        self.transport.close()

    def _head_in_progress(self) -> bool:
        # Between requests h11 waits in IDLE: a request's head not yet whole (a kept-alive
        # connection's pause is uvicorn's keep-alive timeout's, which the first byte ends).
        return self.conn.their_state is h11.IDLE

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing() or not self._head_in_progress():
            self._disarm_head_timer()
        else:
            self._arm_head_timer()
