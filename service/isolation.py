"""The worker's isolated runs: a mechanism computes in a process of its own.

Why a process (module docstring of :mod:`service.worker`, "Isolation"): SciPy's LAPACK wrappers
hold the interpreter lock for a whole call, which would starve the worker's heartbeat, and a run
that kills its process (out of memory) must not kill the worker. Both need the run in another
process; neither needs a *new* process per run.

So a worker keeps one :class:`RunProcess`: forked from the worker when its first run comes (it
has the worker's imports, numpy and SciPy among them, and the worker's settings and store),
BLAS limited once to ``DPSS_WORKER_BLAS_THREADS``, then serving runs one at a time over a pipe:
the work (a picklable callable: a module-level function and its picklable arguments) goes
down, its result comes back. Measured (``bench/bench_release_cpu.py``, docs/benchmarks.md), a
fork per run cost about as much CPU again as the run of a small release: the fork, the
copy-on-write faults of the child's first allocations and its exit, and threadpoolctl's
inspection of the loaded libraries in every new process.

What stays as before (totality): a run that kills the process (out of memory, a crash in a
native library) or lets an exception escape ends the process; the caller gets ``None`` (no
outcome: the job is left to its lease and counted as an attempt, as before) and the next run
starts a new process. The process dies with the worker (``PR_SET_PDEATHSIG``), never uses the
worker's database connections, and logs what escapes a run as the worker logs (type and location,
never the message: :func:`service.logs.forked_child_failures`). A run never sees another run's
objects: each one is a call of a pure function on its own arguments; what an earlier run left
in the process's free memory is not reachable from Python.

:func:`run_forked` keeps the former path (one fork per call) for work that cannot be pickled.

What goes down the pipe: the work, pickled, except the objects the process already holds from
the fork (the worker's settings and store, which every run's context names): those are sent as
a reference (:class:`_Pickler`) while they are still what the process inherited (the same
object, its attributes equal to those at the fork); one that changed since is pickled whole, as
before. Measured (``bench/bench_release_cpu.py``, docs/benchmarks.md, "tenth pass"): pickling
the settings with every run and unpickling them in the process was about 0.3 ms of the
worker's CPU per release, a tenth of its work outside the run.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler
from typing import Any, TypeVar

from sqlalchemy import Engine
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from service.config import Settings
from service.heap_thresholds import MMAP_THRESHOLD_MAX, glibc, set_thresholds
from service.jobs import blas_threads, die_with_parent
from service.logs import forked_child_failures

log = logging.getLogger("dpss.worker")

T = TypeVar("T")

#: Blocks below this come from the run process's heap, not from a fresh mapping per block:
#: glibc's own ceiling for its dynamic threshold.
RUN_MMAP_THRESHOLD = MMAP_THRESHOLD_MAX
#: Free memory at the top of the run process's heap kept for the next run, not returned to
#: the system: two blocks at the threshold.
RUN_TRIM_THRESHOLD = 2 * RUN_MMAP_THRESHOLD


def keep_freed_memory() -> None:
    """Fixed malloc thresholds for the run process (glibc; elsewhere nothing).

    Why: a run's ``d x d`` arrays (the Gram matrix, its noise, their sum: 4.9 MB each at d =
    784) are above glibc's initial threshold (128 KiB), so each is a fresh mapping whose pages
    the kernel faults in and zeroes, and glibc's dynamic threshold does not keep them (the
    three freed together exceed its trim threshold, twice the largest block freed, and go back
    to the system). Measured (``bench/bench_release_cpu.py``): 3,500 page faults and about
    5 ms of CPU per release at 3,500 x 784 (7% of the run), which the same run in a process
    whose history had raised the threshold did not pay. With the thresholds fixed the blocks
    come from the heap and stay there between runs: at most :data:`RUN_TRIM_THRESHOLD` bytes
    of free memory are kept, beyond the run's own (public) memory bound; what they held is not
    reachable from Python (module docstring)."""
    libc = glibc()
    if libc is not None:  # elsewhere (musl has no mallopt) the library's own policy stands
        set_thresholds(libc, RUN_MMAP_THRESHOLD, RUN_TRIM_THRESHOLD)


def _detach(bind: Engine | None) -> None:
    """In a forked process: the parent's pooled connections must never be used (or closed)."""
    if isinstance(bind, Engine):
        bind.dispose(close=False)


def _state(held: object) -> dict[str, Any]:
    """``held``'s attributes as they are now, its lists, dicts and sets copied (a change made
    inside one of them is a change too)."""
    return {
        name: copy.copy(value) if isinstance(value, list | dict | set) else value
        for name, value in vars(held).items()
    }


class _Pickler(ForkingPickler):
    """Pickles a run's work for the run process, sending each object the process inherited
    at the fork (and unchanged since) as its index among ``inherited``: the process holds it
    already (module docstring)."""

    def __init__(self, file: io.BytesIO, inherited: Sequence[tuple[object, dict[str, Any]]]):
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self._inherited = {
            id(held): (index, held, state) for index, (held, state) in enumerate(inherited)
        }

    def persistent_id(self, obj: Any) -> int | None:
        found = self._inherited.get(id(obj))
        if found is None:
            return None
        index, held, state = found
        # The same object, its attributes as at the fork: what the process holds.
        if held is obj and vars(obj) == state:
            return index
        return None


class _Unpickler(pickle.Unpickler):
    """The run process's side of :class:`_Pickler`."""

    def __init__(self, data: bytes, inherited: Sequence[object]):
        super().__init__(io.BytesIO(data))
        self._inherited = inherited

    def persistent_load(self, pid: Any) -> object:
        return self._inherited[pid]


def _serve(
    connection: Connection,
    parent: int,
    settings: Settings,
    bind: Engine | None,
    inherited: Sequence[object] = (),
) -> None:
    """The run process's body: runs until the pipe closes (the worker ended it or died)."""
    with forked_child_failures("the run process"):
        die_with_parent(parent)
        _detach(bind)
        keep_freed_memory()
        if settings.worker_blas_threads > 0:
            # Once for the process's life (what blas_threads does around each forked run).
            threadpool_limits(limits=settings.worker_blas_threads, user_api="blas")
    while True:
        try:
            data = connection.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)
        message = _Unpickler(data, inherited).load()
        if message is None:  # close()
            os._exit(0)
        what, work = message
        with forked_child_failures(what):
            result = work()
            connection.send(result)


class RunProcess:
    """One long-lived process serving a worker's isolated runs (module docstring)."""

    def __init__(
        self, settings: Settings, bind: Engine | None, shared: Sequence[object] = ()
    ) -> None:
        self.settings = settings
        self.bind = bind
        #: Objects the process holds from the fork, sent by reference while unchanged
        #: (:class:`_Pickler`): the settings and ``shared`` (the worker's store).
        self.shared = (settings, *shared)
        #: Each of :attr:`shared` with its attributes at the fork of the current process.
        self._inherited: list[tuple[object, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._process: BaseProcess | None = None
        self._connection: Connection | None = None
        #: The thread that forked the process: ``PR_SET_PDEATHSIG`` fires when *that thread*
        #: ends, so a run from another thread gets a process of its own thread.
        self._forked_by: int | None = None

    def _start(self) -> Connection:
        context = multiprocessing.get_context("fork")
        ours, theirs = context.Pipe(duplex=True)
        self._inherited = [(held, _state(held)) for held in self.shared]
        process = context.Process(
            target=_serve,
            args=(theirs, os.getpid(), self.settings, self.bind, self.shared),
            daemon=True,
        )
        process.start()
        theirs.close()
        self._process, self._connection = process, ours
        self._forked_by = threading.get_ident()
        return ours

    def run(self, what: str, work: Callable[[], T]) -> T | None:
        """``work()`` in the run process, its result back; ``None`` if the process ended
        without one (it is then replaced at the next run). ``work`` must pickle."""
        with self._lock:
            if self._connection is not None and self._forked_by != threading.get_ident():
                self._end()
            connection = self._connection or self._start()
            try:
                connection.send_bytes(self._pickled((what, work)))
            except OSError:
                # The idle process was gone (killed while waiting): nothing ran; a new one.
                self._end()
                connection = self._start()
                connection.send_bytes(self._pickled((what, work)))
            try:
                # Waiting here holds no lock of the interpreter: the heartbeat runs meanwhile.
                result: T = connection.recv()
            except (EOFError, OSError):
                exitcode = self._end()
                log.error(
                    "%s: the run's process ended without an outcome (exit code %s); "
                    "the job is left to its lease",
                    what,
                    exitcode,
                )
                return None
            return result

    def _pickled(self, message: object) -> bytes:
        buffer = io.BytesIO()
        _Pickler(buffer, self._inherited).dump(message)
        return buffer.getvalue()

    def _end(self) -> int | None:
        process, connection = self._process, self._connection
        self._process, self._connection = None, None
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.send(None)  # its end (a copy of the pipe may live in other forks)
            connection.close()
        if process is None:
            return None
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()
        return process.exitcode

    def close(self) -> None:
        """End the process (it exits when its pipe closes)."""
        with self._lock:
            self._end()


def run_forked(
    what: str, work: Callable[[], T], settings: Settings, bind: Engine | None = None
) -> T | None:
    """``work()`` in a new forked child, its result back through a pipe; ``None`` if the child
    died without one. For work that does not pickle (the run process takes only work that
    does)."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    parent = os.getpid()

    def child() -> None:
        with forked_child_failures(what):
            die_with_parent(parent)
            # Only the parent reads: with this end closed here, a send to a dead parent fails
            # instead of blocking on a full pipe.
            receiver.close()
            _detach(bind)
            with blas_threads(settings):
                result = work()
            sender.send(result)
            sender.close()

    process = context.Process(target=child, daemon=True)
    process.start()
    sender.close()
    try:
        result: T = receiver.recv()
    except EOFError:
        process.join()
        log.error(
            "%s: the run's process ended without an outcome (exit code %s); "
            "the job is left to its lease",
            what,
            process.exitcode,
        )
        return None
    finally:
        receiver.close()
    process.join()
    return result
