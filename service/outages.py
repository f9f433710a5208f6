"""How a worker meets a database outage: which errors are transient (the same transaction may
succeed later), and a log of the outage once when it starts and once when it ends."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from service.errors import safe_traceback

log = logging.getLogger("dpss.worker")


def is_transient_db_error(exc: BaseException) -> bool:
    """Errors that say the database is unreachable or busy, not that the statement is wrong:
    retrying the same transaction later can succeed."""
    if isinstance(exc, OperationalError | InterfaceError | PoolTimeoutError):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


@dataclass
class OutageLog:
    """Logs a database outage once when it starts and once when it ends, whichever of the
    worker's threads (main loop, heartbeat) meets it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    since: float | None = None
    failures: int = 0

    def failed(self, operation: str, exc: BaseException) -> None:
        with self.lock:
            self.failures += 1
            if self.since is not None:
                return
            self.since = time.monotonic()
        log.warning(
            "database unavailable (%s: %s); retrying with backoff",
            operation,
            safe_traceback(exc),
        )

    def succeeded(self) -> None:
        with self.lock:
            if self.since is None:
                return
            down, failures = time.monotonic() - self.since, self.failures
            self.since, self.failures = None, 0
        log.warning("database available again after %.1f s (%d failed attempts)", down, failures)
