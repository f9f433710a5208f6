"""A deadline on each request head, shared by both HTTP protocols ``dpss api`` may run
(:mod:`service.api.bounded_head`, :mod:`service.api.h11_json`). uvicorn times nothing between a
connection (or a kept-alive request's first byte) and the end of its head, so a client sending
nothing, or a byte at a time, held a connection slot for good; a head not whole within
:data:`service.api.connections.head_timeout_seconds` gets a JSON 408 and the connection closes."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from service.api import connections


class HeadDeadline:
    """Mixin placed before a uvicorn protocol class: it arms the timer when the connection is
    made and disarms it when it is lost; the protocol re-arms it when a head begins and
    disarms it when the head is whole, and says (:meth:`_head_in_progress`) whether one is."""

    _head_timer: asyncio.TimerHandle | None = None

    if TYPE_CHECKING:
        loop: asyncio.AbstractEventLoop
        transport: asyncio.Transport

    def _head_in_progress(self) -> bool:
        raise NotImplementedError

    # Any: uvicorn's protocols narrow asyncio's BaseTransport to Transport.
    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)  # type: ignore[misc]

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
        if self._head_in_progress() and not self.transport.is_closing():
            self.transport.write(connections.head_timeout_response())
            self.transport.close()
