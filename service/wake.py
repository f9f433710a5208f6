"""Wake idle workers when a release is queued, instead of letting them find it at their next poll.

A wake-up is a **hint**: a worker that misses one still finds the job at its next poll
(``DPSS_WORKER_POLL_SECONDS``), so nothing here can lose or duplicate a job, and every failure
in here is logged and waited out, never raised into the API or the worker loop.

* **PostgreSQL**: the transaction that queues a release also runs ``NOTIFY dpss_release_queued``
  (:func:`announce`). PostgreSQL delivers a notification only when that transaction commits, so
  a woken worker always finds the committed job, and a refused (rolled back) request wakes
  nobody. Each worker process keeps one dedicated connection (outside the pool) in
  ``LISTEN``, read by a background thread (:class:`PostgresListener`); scaled-out workers on other
  machines are woken the same way. That connection holds no transaction and no lock; it is
  checked every :data:`LISTEN_CHECK_SECONDS` and, when the database goes away, closed and
  reopened with capped exponential backoff (the worker's own retry settings). After every
  (re)connection the worker claims once, since notifications sent while nobody listened are
  lost.
* **SQLite (embedded mode)**: API and workers share the data directory on one machine. After
  the queueing transaction commits, the API writes a value never written before into the
  file ``<data dir>/wake/queued`` (:func:`touch`: a process's random token and a counter, so a
  change is seen even where modification times are coarse). An idle worker reads that file
  every :data:`FILE_CHECK_SECONDS` (no socket, no port, works for any number of API and worker
  processes, and nothing to clean up after a crash) and claims as soon as it changes (a read
  that meets a write half done sees a change too: at worst one claim that finds nothing).
  A failed write or read (read-only or full disk) only means the worker polls as before.

The worker calls :meth:`Waker.wait` only while idle and holding no database connection.

**The other direction: a release finished.** The transaction that stores a release's outcome
calls :func:`announce_finished`: ``NOTIFY dpss_release_finished, '<release id>'`` on PostgreSQL,
the file ``<data dir>/wake/finished`` written after the commit on SQLite, and in either case the
release's id handed after the commit to this process's listeners (:func:`add_local_listener`).
The API's long poll (``GET /v1/releases/{id}?wait=``, :mod:`service.waiters`) waits on these;
they are hints there too: a long poll also re-reads on its own every 2 s.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session

from service.config import Settings

log = logging.getLogger("dpss.wake")

#: The PostgreSQL notification channel (a fixed identifier: no quoting, no data in it).
CHANNEL = "dpss_release_queued"
#: How often an idle worker looks at the wake file (SQLite mode), seconds.
FILE_CHECK_SECONDS = 0.02
#: How often the listener's connection is checked with a trivial query while idle, seconds: a
#: connection that died without a reset (a server gone from the network) is noticed this fast.
LISTEN_CHECK_SECONDS = 5.0
#: The PostgreSQL channel on which a stored outcome is announced (payload: the release id).
FINISHED_CHANNEL = "dpss_release_finished"
#: The two PostgreSQL notifications, built once (each queued and each finished release sends
#: one; a ``text()`` built per call cost its construction and its compiled-cache key's).
_NOTIFY_QUEUED = text(f"NOTIFY {CHANNEL}")
_NOTIFY_FINISHED = text("SELECT pg_notify(:channel, :payload)")
#: Key in ``Session.info``: the wake files to write once the transaction commits (SQLite).
_PENDING = "dpss_wake_files"
#: Key in ``Session.info``: the releases whose outcome the transaction stores (local listeners).
_FINISHED = "dpss_finished_releases"
#: Called after a commit with the ids of the releases it finished (this process only).
_local_listeners: list[Callable[[list[uuid.UUID]], None]] = []
_local_lock = threading.Lock()
#: Numbers :func:`touch`'s values within a process.
_touches = itertools.count()
#: How many bytes of the wake file a watcher reads (:func:`touch` writes 16).
_VALUE_BYTES = 64


def wake_file(settings: Settings) -> Path:
    """The file an API writes after queueing a release (SQLite mode)."""
    return settings.data_dir / "wake" / "queued"


def finished_file(settings: Settings) -> Path:
    """The file a worker writes after storing a release's outcome (SQLite mode)."""
    return settings.data_dir / "wake" / "finished"


def _token() -> bytes:
    """This process's random prefix for :func:`touch`'s values (made again in a forked child,
    whose counter would otherwise repeat its parent's values)."""
    global _token_pid, _token_bytes
    pid = os.getpid()
    if pid != _token_pid:
        _token_pid, _token_bytes = pid, os.urandom(8)
    return _token_bytes


_token_pid = -1
_token_bytes = b""


def touch(path: Path) -> None:
    """Write a value never written before over the first bytes of ``path`` (made when missing);
    errors are logged.

    Once per commit that queues or finishes a release. The value is this process's random
    token and a counter (16 bytes at offset 0, one ``pwrite``): a watcher compares the
    file's contents (:class:`FileWatch`), so a change is seen however coarse the file
    system's modification times, and writers in any number of processes never write a value
    a watcher already saw. A new file renamed over the old one per call (the signal before)
    cost 243 us of CPU per release on ext4, this about a tenth of it (docs/benchmarks.md,
    "Release fixed cost, seventh pass")."""
    value = _token() + next(_touches).to_bytes(8, "little")
    try:
        try:
            handle = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        except FileNotFoundError:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            handle = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(handle, value, 0)
        finally:
            os.close(handle)
    except OSError as exc:
        log.warning("could not signal the workers through %s (%s); they will poll", path, exc)


def announce(session: Session, settings: Settings) -> None:
    """Wake the workers once the current transaction (which queues a release) commits.

    PostgreSQL: ``NOTIFY`` inside the transaction (delivered at commit, dropped on rollback).
    SQLite: the wake file is written after the commit (:func:`_after_commit`). Other dialects:
    nothing; the workers poll.
    """
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        session.execute(_NOTIFY_QUEUED)
    elif dialect == "sqlite":
        session.info.setdefault(_PENDING, set()).add(wake_file(settings))


def announce_finished(session: Session, settings: Settings, release_id: uuid.UUID) -> None:
    """Tell long polls that ``release_id`` has news (an outcome, or a continual release's new
    epoch), once the current transaction commits; its waiters re-read it.

    PostgreSQL: ``NOTIFY`` with the id as payload (delivered at commit, dropped on rollback).
    SQLite: the finished file is written after the commit (:func:`touch`). Always: this
    process's local listeners get the id after the commit (an API and a worker in one process,
    and tests).
    """
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        session.execute(_NOTIFY_FINISHED, {"channel": FINISHED_CHANNEL, "payload": str(release_id)})
    elif dialect == "sqlite":
        session.info.setdefault(_PENDING, set()).add(finished_file(settings))
    session.info.setdefault(_FINISHED, []).append(release_id)


def add_local_listener(listener: Callable[[list[uuid.UUID]], None]) -> None:
    """Call ``listener(ids)`` after every commit in this process that finished releases."""
    with _local_lock:
        _local_listeners.append(listener)


def remove_local_listener(listener: Callable[[list[uuid.UUID]], None]) -> None:
    with _local_lock:
        if listener in _local_listeners:
            _local_listeners.remove(listener)


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    for path in sorted(session.info.pop(_PENDING, ())):
        touch(path)
    finished = session.info.pop(_FINISHED, None)
    if finished:
        with _local_lock:
            listeners = list(_local_listeners)
        for listener in listeners:
            try:
                listener(finished)
            except Exception as exc:  # a hint: never fail the commit's caller
                log.warning("a finished-release listener failed (%s)", type(exc).__name__)


@event.listens_for(Session, "after_rollback")
def _after_rollback(session: Session) -> None:
    session.info.pop(_PENDING, None)
    session.info.pop(_FINISHED, None)


# -- the worker's side ----------------------------------------------------------------------------


class Waker(Protocol):
    def wait(self, timeout: float) -> None:
        """Return after ``timeout`` seconds, on a wake-up, or when the worker is told to stop."""

    def close(self) -> None:
        """Release what the waker holds (a connection, a thread)."""


class NoWake:
    """Polling only (other databases, or no way to be woken)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def wait(self, timeout: float) -> None:
        self.stop.wait(timeout)

    def close(self) -> None:
        pass


class FileWatch:
    """Wakes when the wake file's contents (or inode) change (SQLite mode; :func:`touch`)."""

    def __init__(self, path: Path, stop: threading.Event) -> None:
        self.path = path
        self.stop = stop
        self.seen = self._signature()

    def _signature(self) -> tuple[int, bytes] | None:
        # The inode too: a writer of an older version replaces the file by a new empty one.
        try:
            handle = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            return os.fstat(handle).st_ino, os.read(handle, _VALUE_BYTES)
        except OSError:
            return None
        finally:
            os.close(handle)

    def wait(self, timeout: float) -> None:
        self.changed(timeout)

    def changed(self, timeout: float) -> bool:
        """:meth:`wait`, and whether it returned on a change of the file."""
        deadline = time.monotonic() + timeout
        while True:
            current = self._signature()
            if current != self.seen:
                # Remember before the worker claims: a later change wakes the next wait.
                self.seen = current
                return True
            left = deadline - time.monotonic()
            if left <= 0 or self.stop.wait(min(FILE_CHECK_SECONDS, left)):
                return False

    def rebase(self) -> None:
        """Take the file as it is now as seen: a change made before this call wakes nobody
        (the long polls registered after it read the release after it)."""
        self.seen = self._signature()

    def close(self) -> None:
        pass


class PostgresListener:
    """A thread holding one dedicated ``LISTEN`` connection; sets an event per notification.

    Parameters
    ----------
    conninfo : str
        A libpq connection string or URI (the worker's database).
    stop : threading.Event
        The worker's stop event: ends the thread and any wait.
    retry_initial, retry_max : float
        Backoff between reconnection attempts (doubling, capped, jittered).
    channel : str
        The channel to listen on (default: queued releases).
    on_notify : callable, optional
        Called from the thread with each notification's payload, and with ``None`` after every
        (re)connection (notifications sent while nobody listened are lost).
    """

    def __init__(
        self,
        conninfo: str,
        stop: threading.Event,
        retry_initial: float,
        retry_max: float,
        *,
        channel: str = CHANNEL,
        on_notify: Callable[[str | None], None] | None = None,
    ) -> None:
        self.conninfo = conninfo
        self.channel = channel
        self.on_notify = on_notify
        #: What the log says is being listened for.
        self._what = "queued releases" if channel == CHANNEL else "finished releases"
        self.stop = stop
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.woken = threading.Event()
        #: Set while a connection is listening (tests and diagnostics).
        self.listening = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpss-listen", daemon=True)
        self._thread.start()

    def wait(self, timeout: float) -> None:
        # A stop ends the thread, which sets ``woken`` on its way out (within 0.5 s).
        self.woken.wait(timeout)
        if not self._ended():
            self.woken.clear()

    def close(self) -> None:
        self._closed.set()
        self.woken.set()
        self._thread.join(timeout=LISTEN_CHECK_SECONDS + 5)

    def _ended(self) -> bool:
        return self._closed.is_set() or self.stop.is_set()

    def _run(self) -> None:
        import psycopg

        failures = 0
        while not self._ended():
            try:
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {self.channel}")
                    if failures:
                        log.warning("listening for %s again", self._what)
                    failures = 0
                    self.listening.set()
                    # Notifications sent while nobody listened are lost: claim once now.
                    self.woken.set()
                    if self.on_notify is not None:
                        self.on_notify(None)
                    self._listen(conn)
            except Exception as exc:  # any failure of the hint channel: reconnect later
                self.listening.clear()
                failures += 1
                if failures == 1:
                    log.warning(
                        "not listening for %s (%s); polling until reconnected",
                        self._what,
                        type(exc).__name__,
                    )
                ceiling = min(self.retry_max, self.retry_initial * 2 ** min(failures - 1, 30))
                self._pause(random.uniform(ceiling / 2, ceiling))
        self.listening.clear()
        self.woken.set()  # a worker waiting now returns to see its stop request

    def _listen(self, conn: Any) -> None:
        last_check = time.monotonic()
        while not self._ended():
            for note in conn.notifies(timeout=0.5):
                self.woken.set()
                if self.on_notify is not None:
                    self.on_notify(note.payload)
                if self._ended():
                    return
            if time.monotonic() - last_check >= LISTEN_CHECK_SECONDS:
                conn.execute("SELECT 1")  # raises on a dead connection: reconnect
                last_check = time.monotonic()

    def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._ended() and (left := deadline - time.monotonic()) > 0:
            self._closed.wait(min(left, 0.5))


def libpq_conninfo(engine: Engine) -> str:
    """The engine's PostgreSQL URL as a libpq URI (the SQLAlchemy driver suffix removed)."""
    url = engine.url.set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


def waker_for(engine: Engine | None, settings: Settings, stop: threading.Event) -> Waker:
    """The waker that fits the worker's database (see the module docstring)."""
    if engine is None or not settings.worker_wake:
        return NoWake(stop)
    dialect = engine.dialect.name
    if dialect == "postgresql":
        return PostgresListener(
            libpq_conninfo(engine),
            stop,
            settings.worker_db_retry_initial_seconds,
            settings.worker_db_retry_max_seconds,
        )
    if dialect == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        return FileWatch(wake_file(settings), stop)
    return NoWake(stop)
