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
    test) can see which parts of the worker waited it out.

    A success ends the outage if its operation failed during it, or if no operation is still
    failing. A lock held elsewhere (``DPSS_WORKER_DB_LOCK_TIMEOUT_SECONDS``) fails one operation
    (the finish waiting on a locked row) while the others succeed; the re-check thread's
    successes every second would otherwise end and restart the outage at each of the finish's
    retries, logging it again each time. An operation that stops retrying while failing (a stop
    request, a heartbeat whose job ended) says so (:meth:`gave_up`) so as not to hold the
    outage open."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    since: float | None = None
    failures: Counter[str] = field(default_factory=Counter)
    #: Operations whose last attempt failed (and which still retry).
    failing: set[str] = field(default_factory=set)

    def failed(self, operation: str, exc: BaseException) -> None:
        with self.lock:
            self.failures[operation] += 1
            self.failing.add(operation)
            if self.since is not None:
                return
            self.since = time.monotonic()
        log.warning(
            "database unavailable (%s: %s); retrying with backoff",
            operation,
            safe_traceback(exc),
        )

    def gave_up(self, operation: str) -> None:
        """``operation`` no longer retries: it does not keep the outage open."""
        with self.lock:
            self.failing.discard(operation)

    def succeeded(self, operation: str) -> None:
        with self.lock:
            if self.since is None:
                return
            self.failing.discard(operation)
            if operation not in self.failures and self.failing:
                # The database answers this operation, but another still fails (a row it
                # needs is locked elsewhere): the outage goes on for it.
                return
            down, failures = time.monotonic() - self.since, self.failures
            self.since, self.failures, self.failing = None, Counter(), set()
        by_operation = ", ".join(f"{operation} {count}" for operation, count in failures.items())
        log.warning(
            "database available again after %.1f s (%d failed attempts: %s)",
            down,
            failures.total(),
            by_operation,
        )
