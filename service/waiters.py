"""Long polls: requests waiting for a release to finish, woken without holding the database.

``GET /v1/releases/{id}?wait=<seconds>`` (and ``POST /v1/datasets/{id}/releases?wait=``, the
creating request waiting for its own release) parks the request here between two short reads of
the release (each its own unit of work through :class:`service.api.deps.Database`: a slot and a
connection for milliseconds, never while waiting). What wakes it:

- a worker storing an outcome (:func:`service.wake.announce_finished`): on PostgreSQL one
  ``LISTEN dpss_release_finished`` connection per API process (outside the pool, no transaction;
  the same reconnecting listener as the workers'), whose payload names the release, so only that
  release's waiters re-read; on SQLite the file ``<data dir>/wake/finished``, looked at every
  20 ms while anyone waits, which wakes every waiter (the embedded mode is one machine and few
  clients); in either case a worker in this same process calls :meth:`ReleaseWaiters.notify`
  directly after its commit;
- its own timer: every :data:`RECHECK_SECONDS` (a missed hint costs at most that), at the
  ``visible_at`` of a continual epoch stored but not yet visible to the analyst, and at the
  end of the wait.

An analyst waiting on a release before its ``visible_at`` is not woken by hints at all: what
they may see cannot change before then, so the wait sleeps until ``visible_at`` (or its end)
and reads again then, the same whether or not the worker has stored anything
(:func:`service.api.releases._long_poll`).

At most ``DPSS_RELEASE_WAIT_MAX_WAITERS`` requests wait at once per API process; a request
beyond that is answered at once, as without ``wait`` (the client then polls), so a flood of
long polls holds sockets and small coroutines only, never threads, slots or connections.

**Stopping.** uvicorn answers the requests in hand before it exits, and tells the app nothing
until they are done, so a waiting long poll would hold a SIGTERM up to its bound. When the
server handles SIGTERM and SIGINT in the main thread (``dpss api``, ``dpss serve``), the first
wait chains a handler in front of the server's: on either signal every waiting request is
answered at once with the release's current state (the client then polls), and no new wait
begins.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from service import wake
from service.config import Settings

log = logging.getLogger("dpss.api")

#: The longest ``wait`` a request may ask for, seconds (below common proxy read timeouts).
MAX_WAIT_SECONDS = 30.0
#: A waiting request re-reads its release at least this often, seconds.
RECHECK_SECONDS = 2.0


@dataclass(eq=False)
class Waiter:
    """One waiting request: an event set (thread-safely) on a hint about its release."""

    #: ``None`` while it waits for a release not yet created (:meth:`ReleaseWaiters.bind`).
    release_id: uuid.UUID | None
    loop: asyncio.AbstractEventLoop
    event: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait(self, seconds: float) -> None:
        """Return on a hint or after ``seconds``; the hint is consumed."""
        with suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout=max(seconds, 0.0))
        self.event.clear()

    async def sleep(self, seconds: float, until: Callable[[], bool]) -> None:
        """Sleep ``seconds`` deaf to hints: a hint is consumed and ignored, and only ``until()``
        (checked at each wake-up: the process stopping) ends the sleep early."""
        end = self.loop.time() + seconds
        while (left := end - self.loop.time()) > 0:
            await self.wait(left)
            if until():
                return

    def wake(self) -> None:
        with suppress(RuntimeError):  # its loop has closed: the request is gone
            self.loop.call_soon_threadsafe(self.event.set)


class ReleaseWaiters:
    """The API process's waiting requests and the hint source that wakes them."""

    def __init__(self, engine: Engine | None, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.limit = settings.release_wait_max_waiters
        self._lock = threading.Lock()
        #: Keyed by release; under ``None`` the waiters of releases being created (any hint wakes
        #: them, see :meth:`waiting`).
        self._waiters: dict[uuid.UUID | None, set[Waiter]] = {}
        self._count = 0
        self._stop = threading.Event()
        self._anyone = threading.Event()
        self._source: threading.Thread | wake.PostgresListener | None = None
        #: SQLite: the finished file as the watch thread last saw it (see :meth:`waiting`).
        self._file_watch: wake.FileWatch | None = None
        self._listening_locally = False
        self._exit_hooked = False

    @property
    def count(self) -> int:
        """Requests waiting now."""
        return self._count

    @property
    def closing(self) -> bool:
        """True once the process is stopping: waits end, and none begins."""
        return self._stop.is_set()

    @contextmanager
    def waiting(self, release_id: uuid.UUID | None) -> Iterator[Waiter | None]:
        """A registered waiter for ``release_id``, or ``None`` when the limit is reached.

        Register before the first read of the release: a hint between that read and the wait
        then still wakes the wait.

        ``release_id=None``: for a release about to be created (``POST .../releases?wait=``),
        whose id is known only once its transaction has committed. Until :meth:`bind` names
        the release, every hint wakes this waiter (a spurious wake costs one read), so one
        stored between that commit and :meth:`bind` is not lost and the creating request
        needs no read of its own before it waits.
        """
        waiter = Waiter(release_id, asyncio.get_running_loop())
        with self._lock:
            if self._count >= self.limit or self._stop.is_set():
                admitted = False
            else:
                admitted = True
                if self._count == 0 and self._file_watch is not None:
                    # Nobody waited: outcomes stored since are for earlier requests, each of
                    # which read its release after that store or ended. Taken as seen before
                    # this waiter is registered (and so before its first read), they do not
                    # wake it for a read that finds nothing new (on SQLite, a release finished
                    # while nobody waited cost the next long poll a read); a store after this
                    # still does.
                    self._file_watch.rebase()
                self._count += 1
                self._waiters.setdefault(release_id, set()).add(waiter)
                self._anyone.set()
        if not admitted:
            yield None
            return
        self._hook_exit_signals()
        self._start_source()
        try:
            yield waiter
        finally:
            with self._lock:
                self._count -= 1
                self._discard(waiter)
                if self._count == 0:
                    self._anyone.clear()

    def bind(self, waiter: Waiter, release_id: uuid.UUID) -> None:
        """Name the release a waiter from ``waiting(None)`` waits for (once it is created): from
        now on only that release's hints wake it. A hint it took before stays taken."""
        with self._lock:
            self._discard(waiter)
            waiter.release_id = release_id
            self._waiters.setdefault(release_id, set()).add(waiter)

    def _discard(self, waiter: Waiter) -> None:
        group = self._waiters.get(waiter.release_id)
        if group is not None:
            group.discard(waiter)
            if not group:
                del self._waiters[waiter.release_id]

    def notify(self, release_id: uuid.UUID | None) -> None:
        """Wake the waiters of ``release_id`` and those of releases being created (every waiter
        when ``None``); thread-safe."""
        with self._lock:
            if release_id is None:
                woken = [w for group in self._waiters.values() for w in group]
            else:
                woken = [*self._waiters.get(release_id, ()), *self._waiters.get(None, ())]
        for waiter in woken:
            waiter.wake()

    def close(self) -> None:
        """Stop the hint source (app shutdown) and wake everyone (they answer at once)."""
        wake.remove_local_listener(self._local)
        self._stop.set()
        self._anyone.set()
        self.notify(None)
        source = self._source
        if isinstance(source, wake.PostgresListener):
            source.close()
        elif isinstance(source, threading.Thread):
            source.join(timeout=5)

    def begin_shutdown(self) -> None:
        """Answer every waiting request now and admit no new wait (thread- and signal-safe:
        no lock is taken here; the waiters are woken from their own event loops)."""
        self._stop.set()
        for group in list(self._waiters.values()):
            for waiter in list(group):
                waiter.wake()

    def _hook_exit_signals(self) -> None:
        """See "Stopping" in the module docstring. Only in the main thread (where signal
        handlers live) and only in front of a Python handler: a default disposition is kept."""
        if self._exit_hooked or threading.current_thread() is not threading.main_thread():
            return
        self._exit_hooked = True
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(signum)
            if not callable(previous):
                continue

            def handler(sig: int, frame: object, previous: Any = previous) -> None:
                self.begin_shutdown()
                previous(sig, frame)

            signal.signal(signum, handler)

    # -- hint sources --------------------------------------------------------------------------

    def _local(self, release_ids: list[uuid.UUID]) -> None:
        for release_id in release_ids:
            self.notify(release_id)

    def _start_source(self) -> None:
        """Start, on the first wait, the listeners: this process's commits, and the one that
        fits the database (other processes'). Apps that never wait register nothing."""
        with self._lock:
            if not self._listening_locally and not self._stop.is_set():
                self._listening_locally = True
                wake.add_local_listener(self._local)
        if self._source is not None or self.engine is None or not self.settings.worker_wake:
            return
        with self._lock:
            if self._source is not None:
                return
            dialect = self.engine.dialect.name
            if dialect == "postgresql":
                self._source = wake.PostgresListener(
                    wake.libpq_conninfo(self.engine),
                    self._stop,
                    self.settings.worker_db_retry_initial_seconds,
                    self.settings.worker_db_retry_max_seconds,
                    channel=wake.FINISHED_CHANNEL,
                    on_notify=self._payload,
                )
            elif dialect == "sqlite" and self.engine.url.database not in (None, "", ":memory:"):
                self._file_watch = wake.FileWatch(wake.finished_file(self.settings), self._stop)
                thread = threading.Thread(
                    target=self._watch_file,
                    args=(self._file_watch,),
                    name="dpss-finished-watch",
                    daemon=True,
                )
                self._source = thread
                thread.start()

    def _payload(self, payload: str | None) -> None:
        try:
            release_id = uuid.UUID(payload) if payload else None
        except ValueError:
            release_id = None
        self.notify(release_id)

    def _watch_file(self, watch: wake.FileWatch) -> None:
        while not self._stop.is_set():
            # Idle (no stat at all) while nobody waits.
            self._anyone.wait()
            if watch.changed(RECHECK_SECONDS):
                self.notify(None)
