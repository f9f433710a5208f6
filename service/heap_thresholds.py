"""glibc's malloc thresholds, set from Python (``mallopt``, ``malloc.h``).

Two places keep freed buffers in their heap instead of mapping them afresh for each use: the
run process (:func:`service.isolation.keep_freed_memory`) and a Dask worker while a task of a
pass runs (:mod:`service.reference.heap`). Both reach the C library through :func:`glibc`;
elsewhere (musl, macOS) it is None and the library's own policy stands.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

#: ``mallopt`` parameters (``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: glibc's ceiling for its dynamic mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``),
#: also the largest fixed threshold it accepts.
MMAP_THRESHOLD_MAX = 32 * 2**20


@functools.cache
def glibc() -> Any | None:
    """The process's C library when it has ``mallopt`` and ``malloc_trim`` (glibc), else None.

    ``CDLL(None)`` reads the symbols already loaded into the process (no ``find_library``,
    which runs ``ldconfig`` in a subprocess)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None
    return libc


def set_thresholds(libc: Any, mmap: int, trim: int) -> None:
    """Fix the mmap threshold (blocks below it come from the heap) and the trim threshold (free
    memory at the top of the heap kept rather than returned); fixing either turns glibc's
    dynamic thresholds off for the process."""
    libc.mallopt(M_MMAP_THRESHOLD, mmap)
    libc.mallopt(M_TRIM_THRESHOLD, trim)
