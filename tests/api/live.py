"""A real uvicorn server in a thread, for tests that need real HTTP and real sockets.

Outage tests never stop the shared PostgreSQL server: they start a cluster of their own with
``scripts.harness.PrivatePostgres`` (``initdb``/``pg_ctl`` on a free port).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio.to_thread
import uvicorn

from scripts.harness import free_port


@contextmanager
def serving(app: Any, threads: int | None = None) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 from a thread; yields its base URL.

    ``threads`` sizes the event loop's default thread limiter before the app starts, so that a
    test runs any version of the app under the same thread budget (the app may resize it).
    """
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        if threads is not None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        await server.serve()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
