"""uvicorn's h11 protocol (``dpss api`` without httptools) with the service's JSON 400 for a
request it cannot parse, instead of uvicorn's plain text (see
:data:`service.api.connections.MALFORMED_REQUEST`). Its head is bounded by uvicorn's own
``h11_max_incomplete_event_size``."""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol

from service.api.connections import json_400


class JsonErrorsH11(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        self.transport.write(json_400(self.server_state.default_headers))
        self.transport.close()
