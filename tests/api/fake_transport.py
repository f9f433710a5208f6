"""An asyncio transport that records what a uvicorn protocol writes, for the protocol tests
(the 431 head bound and the JSON 400) that feed raw bytes without a socket."""

from __future__ import annotations

from typing import Any


class RecordingTransport:
    """Collects ``write`` calls in :attr:`written`; ``close`` sets :attr:`closed`."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 8000) if name in ("sockname", "peername") else None

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def set_write_buffer_limits(self, *args: Any, **kwargs: Any) -> None: ...
