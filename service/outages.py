"""How a worker meets a database outage: which errors are transient (the same transaction may
succeed later), and a log of the outage once when it starts and once when it ends."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from service.db.engine import database_unavailable
from service.errors import safe_traceback

log = logging.getLogger("dpss.worker")


def is_transient_db_error(exc: BaseException) -> bool:
    """Errors that say the database is unreachable or busy, not that the statement is wrong:
    retrying the same transaction later can succeed.

    The API's rule for answering 503 (:func:`service.db.engine.database_unavailable`), so a
    worker and a request agree on what an outage is. In particular SQLite raises
    ``OperationalError`` for a missing table or column too (a schema the code does not match):
    only its busy, locked, cannot-open, I/O and full-disk codes are waited out; any other is a
    fault, which a worker that waited for it would wait for forever."""
    return database_unavailable(exc)


@dataclass
class OutageLog:
    """Logs a database outage once when it starts and once when it ends, whichever of the
    worker's threads (main loop, heartbeat, reference re-check) meets it.

    The first line names the operation that met the outage first, which is a race between the
    threads; the last line counts the failed attempts of every operation, so an operator (and a
    test) can see which parts of the worker waited it out."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    since: float | None = None
    failures: Counter[str] = field(default_factory=Counter)

    def failed(self, operation: str, exc: BaseException) -> None:
        with self.lock:
            self.failures[operation] += 1
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
            self.since, self.failures = None, Counter()
        by_operation = ", ".join(f"{operation} {count}" for operation, count in failures.items())
        log.warning(
            "database available again after %.1f s (%d failed attempts: %s)",
            down,
            failures.total(),
            by_operation,
        )
