"""The C heap of a Dask worker while a task of a pass runs: row-group buffers reused, not
mapped afresh.

Dask's nanny starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536`` so that they give freed
memory back to the system. Setting it turns glibc's dynamic thresholds off, so every
allocation above the default mmap threshold (128 KiB), which is every row group's bytes,
decoded columns and float64 rows (megabytes each), is a fresh ``mmap`` whose pages fault in
one by one and go back at ``free``. Measured on a 200,000 x 200 pass (bench_dask_overhead),
that is about 100,000 page faults and most of the workers' extra system time over the same
pass in process, where glibc's dynamic threshold lets the heap reuse those buffers.

:func:`reused_buffers` raises both thresholds while at least one task of a pass runs in the
process, so consecutive row groups reuse the same heap pages, and restores the environment's
values (and trims the heap, ``malloc_trim``) :data:`RESTORE_SECONDS` after the last one
ended, unless another began (the next task of a pass usually does, and finds its pages still
mapped, as does the release's next pass): once no task ran for that long, the worker gives
its memory back as Dask intends. It does nothing unless
the environment set ``MALLOC_TRIM_THRESHOLD_`` (thresholds already static: the nanny's workers),
since in a process on glibc's dynamic thresholds (the worker's own passes in process) a
``mallopt`` would turn them off for good, and nothing on a C library without ``mallopt``.
Memory: what a task holds is unchanged (one row group at a time); the heap keeps at most its
high-water mark until a second after the last task ends.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from service.heap_thresholds import MMAP_THRESHOLD_MAX, glibc, set_thresholds

#: The largest mmap threshold glibc accepts on 64-bit (``HEAP_MAX_SIZE / 2``): buffers up to it
#: come from the heap while a task runs (a larger row group is mapped as before).
TASK_MMAP_THRESHOLD = MMAP_THRESHOLD_MAX
#: Freed memory the heap keeps while a task runs (a few row groups' buffers).
TASK_TRIM_THRESHOLD = 512 * 2**20
_GLIBC_MMAP_DEFAULT = 128 * 1024

#: How long the raised thresholds outlive the last task of a pass: the next task of the same
#: pass (or the release's next pass) usually starts within it and finds its buffers' pages
#: still mapped; after it the worker gives the memory back.
RESTORE_SECONDS = 1.0

_lock = threading.Lock()
_active = 0
#: The environment's (trim, mmap) thresholds to put back while ours are in force, else None.
_raised: tuple[Any, tuple[int, int]] | None = None
_timer: threading.Timer | None = None


#: The C library (a module attribute so that a test can put a fake one in its place).
_libc = glibc


def _static_thresholds() -> tuple[int, int] | None:
    """The environment's ``(trim, mmap)`` thresholds when it set them (glibc then keeps them
    static), else None."""
    trim = os.environ.get("MALLOC_TRIM_THRESHOLD_")
    if trim is None:
        return None
    try:
        mmap = int(os.environ.get("MALLOC_MMAP_THRESHOLD_", _GLIBC_MMAP_DEFAULT))
        return int(trim), mmap
    except ValueError:
        return None


def _restore_if_idle() -> None:
    """Put the environment's thresholds back and trim the heap, unless a task runs again."""
    global _raised
    with _lock:
        if _active or _raised is None:
            return
        libc, (trim, mmap) = _raised
        set_thresholds(libc, mmap, trim)
        libc.malloc_trim(0)
        _raised = None


@contextlib.contextmanager
def reused_buffers() -> Iterator[None]:
    """Raise the heap's thresholds while this task runs (module docstring); put them back
    :data:`RESTORE_SECONDS` after the last task of the process ended."""
    global _active, _raised, _timer
    restore = _static_thresholds()
    libc = _libc() if restore is not None else None
    if libc is None or restore is None:
        yield
        return
    with _lock:
        _active += 1
        if _timer is not None:
            _timer.cancel()
            _timer = None
        if _raised is None:
            set_thresholds(libc, TASK_MMAP_THRESHOLD, TASK_TRIM_THRESHOLD)
            _raised = (libc, restore)
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            last = _active == 0
            if last and RESTORE_SECONDS > 0:
                _timer = threading.Timer(RESTORE_SECONDS, _restore_if_idle)
                _timer.daemon = True
                _timer.start()
        if last and RESTORE_SECONDS <= 0:
            _restore_if_idle()
