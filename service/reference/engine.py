"""The heavy passes over a dataset by reference, in process or on Dask, and their faults.

Guarantees:

- **Only aggregates leave a task.** :class:`ParquetRows` (a
  :class:`~service.mechanisms.linalg.RowSource`) runs one task per run of row groups (a clipped
  Gram matrix, a clipped column sum, captured energy, norm counts, or the rows of a group of
  random subsets); only ``d x d``-sized results and the ``t x d x k`` subset bases reach the
  worker, and noise is drawn in the worker, never on the cluster.
- **Same bits either way.** Partial results are added in row-group order (a chain), so a run
  on Dask (``DPSS_DASK_SCHEDULER``) and one in process (Dask's synchronous scheduler) agree
  bit for bit when the BLAS uses one thread in both, and up to its summation order otherwise.
- **Immutability.** :meth:`ParquetRows.check_unchanged` compares every object's identity with
  the record before a release reads and again before its outcome is stored; each task reads
  through :func:`~service.reference.reading._read_piece`, which checks the digests.
- **Faults end the release, never hang it.** Tasks are retried (``DPSS_DASK_RETRIES``); a
  cluster with no worker for ``DPSS_DASK_WAIT_SECONDS`` (before the first task or while tasks
  are pending) ends the release ``failed`` with a fixed reason naming the exception type.
  Refunded only while no task of the release was submitted (DESIGN: a refund only when the
  job provably never read the data); from then on the cost stays charged. Such faults do not
  depend on the values (every task's memory and time are functions of public shapes).
- :func:`mechanism_allowed` admits only mechanisms that reach the rows through these passes;
  :func:`worker_bytes` is what the worker holds besides, for the memory gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from service.config import Settings
from service.errors import InvalidInput
from service.mechanisms.linalg import (
    FloatArray,
    IntArray,
    captured_energy,
    clipped_gram,
    clipped_sum,
    gram_norm_counts,
)
from service.mechanisms.sample_aggregate import GROUP_ROWS, PASS_BYTES, pass_subsets
from service.mechanisms.subset_top_k import top_k_right_singular
from service.reference.heap import reused_buffers
from service.reference.integrity import (
    CHANGED_REASON,
    LEGACY_REASON,
    UNREADABLE_REASON,
    UNSAFE_REASON,
    Piece,
    Reference,
    ReferenceFault,
    object_fault,
)
from service.reference.objects import (
    Location,
    NotRegular,
    _fault_name,
    _identity,
    identity_differs,
)
from service.reference.reading import _read_piece, verify_piece

#: Mechanisms that reach the rows only through the RowSource passes (Gram, column sum, subset
#: bases); the others index rows directly and are refused for a dataset by reference (422).
MECHANISMS = frozenset(
    {
        "analyze_gauss",
        "continual_gauss",
        "gap_perturbation",
        "smooth_sensitivity",
        "spectrum",
        "friendly_aggregate",
        "histogram_aggregate",
    }
)
CLUSTER_REASON = "the Dask cluster failed ({kind}) before anything was released; refunded"
#: A cluster fault once a task was submitted: a task may have read the data (DESIGN: a refund
#: only when the job provably never read it), so the release stays charged.
CLUSTER_CHARGED_REASON = (
    "the Dask cluster failed ({kind}) after its tasks were submitted; nothing was released, "
    "but a task may have read the data, so the cost stays charged"
)
NO_WORKERS_REASON = (
    "the Dask cluster had no worker for {seconds:g} s (DPSS_DASK_WAIT_SECONDS); nothing was "
    "read; refunded"
)
LOST_WORKERS_REASON = (
    "the Dask cluster lost every worker for {seconds:g} s (DPSS_DASK_WAIT_SECONDS) after its "
    "tasks were submitted; nothing was released, but a task may have read the data, so the "
    "cost stays charged"
)
#: How often a release waiting on the cluster asks whether it still has a worker, seconds.
WATCH_SECONDS = 2.0


def _piece_gram(
    location: Location,
    piece: Piece,
    columns: Sequence[str],
    record: dict[str, Any],
    clip_norm: float,
    center: FloatArray | None,
    row_clip: float | None = None,
) -> FloatArray:
    return clipped_gram(
        _read_piece(location, piece, columns, record), clip_norm, center=center, row_clip=row_clip
    )


def _piece_energy(
    location: Location,
    piece: Piece,
    columns: Sequence[str],
    record: dict[str, Any],
    basis: FloatArray,
    clip_norm: float,
    center: FloatArray | None,
) -> FloatArray:
    rows = _read_piece(location, piece, columns, record)
    return np.asarray(captured_energy(rows, basis, clip_norm, center), dtype=np.float64)


def _piece_norm_counts(
    location: Location,
    piece: Piece,
    columns: Sequence[str],
    record: dict[str, Any],
    clip_norm: float,
    center: FloatArray | None,
    edges: FloatArray,
) -> FloatArray:
    return gram_norm_counts(_read_piece(location, piece, columns, record), clip_norm, center, edges)


def _piece_sum(
    location: Location,
    piece: Piece,
    columns: Sequence[str],
    record: dict[str, Any],
    clip_norm: float,
) -> FloatArray:
    return clipped_sum(_read_piece(location, piece, columns, record), clip_norm)


def _piece_subsets(
    location: Location,
    piece: Piece,
    columns: Sequence[str],
    record: dict[str, Any],
    slots: IntArray,
    bounds: Sequence[tuple[int, int]],
) -> list[tuple[IntArray, FloatArray]]:
    """Per group of subsets (slot range ``[lo, hi)``), this row group's rows in it and their
    slots (``slot = j m + position`` of the row in subset ``j``)."""
    with reused_buffers():
        rows = _read_piece(location, piece, columns, record)
    out = []
    for lo, hi in bounds:
        chosen = np.flatnonzero((slots >= lo) & (slots < hi))
        out.append((slots[chosen], rows[chosen]))
    return out


def _group_bases(
    parts: Sequence[tuple[IntArray, FloatArray]], lo: int, g: int, m: int, d: int, k: int
) -> FloatArray:
    """``U_j`` of the ``g`` subsets whose slots start at ``lo``: their rows put in subset
    order (as :func:`~service.mechanisms.sample_aggregate.subset_bases` lays them out)."""
    buffer = np.empty((g * m, d), dtype=np.float64)
    for slots, rows in parts:
        buffer[slots - lo] = rows
    return top_k_right_singular(buffer.reshape(g, m, d), k, overwrite=True)


class _Args:
    """A task's arguments as one value Dask does not look into. Building a graph, Dask walks
    every list, tuple, dict and dataclass among a call's arguments for collections; a run's
    row groups and records (a digest per column chunk) took longer to walk than the task took
    to schedule (most of the client's CPU in a pass, bench_dask_overhead)."""

    __slots__ = ("values",)

    def __init__(self, *values: Any) -> None:
        self.values = values


def _call(function: Any, packed: _Args) -> Any:
    return function(*packed.values)


def _task(function: Any, *values: Any, nout: int | None = None) -> Any:
    """``function(*values)`` as a Delayed whose arguments Dask does not walk (:class:`_Args`),
    keyed by the function's name (as Dask would name it) and a fresh token."""
    from dask.delayed import delayed

    key = f"{function.__name__}-{uuid.uuid4().hex}"
    return delayed(_call, pure=False, nout=nout)(function, _Args(*values), dask_key_name=key)


def _add(left: FloatArray, right: FloatArray) -> FloatArray:
    return left + right


def _run_sum(
    task: Any,
    location: Location,
    pieces: Sequence[Piece],
    columns: Sequence[str],
    records: Sequence[dict[str, Any]],
    args: tuple[Any, ...],
) -> FloatArray:
    """``task`` over consecutive row groups, added in order: one row group in memory at a
    time, so a task's memory is its largest group's whatever the run's length."""
    total: FloatArray | None = None
    with reused_buffers():
        for piece, record in zip(pieces, records, strict=True):
            part = np.asarray(task(location, piece, columns, record, *args), dtype=np.float64)
            total = part if total is None else total + part
    assert total is not None  # a run holds at least one row group
    return total


def task_runs(pieces: Sequence[Piece], row_bytes: int, budget: int) -> list[list[Piece]]:
    """The row groups cut into runs of consecutive groups of at most ``budget`` bytes of
    float64 rows each (a larger group alone): the tasks of a pass. Public: a function of the
    registered row-group sizes only."""
    runs: list[list[Piece]] = []
    held = 0
    for piece in pieces:
        size = piece.rows * row_bytes
        if runs and held + size <= budget:
            runs[-1].append(piece)
            held += size
        else:
            runs.append([piece])
            held = size
    return runs


class ParquetRows:
    """A dataset by reference as a :class:`~service.mechanisms.linalg.RowSource`: the passes
    run as Dask graphs, on the cluster named by ``DPSS_DASK_SCHEDULER`` or, without one, on
    Dask's synchronous scheduler in this process (the same tasks, added in the same order)."""

    def __init__(
        self, reference: Reference, settings: Settings, since_ns: int | None = None
    ) -> None:
        self.reference = reference
        self.settings = settings
        #: The release's request (ns since the epoch): identity stamps at or after it count
        #: (:func:`~service.reference.objects.identity_differs`).
        self.since_ns = since_ns
        #: Each object's record (identity and footer digest) by path, for the tasks.
        self.records = {str(o["path"]): o for o in reference.objects}
        self._client: Any = None
        #: Whether a task of this release reached the cluster (from then on data may be read).
        self._submitted = False

    @property
    def shape(self) -> tuple[int, int]:
        return self.reference.shape

    # -- running graphs ---------------------------------------------------------------------

    def _compute(self, *graphs: Any) -> tuple[Any, ...]:
        from dask.base import compute

        address = self.settings.dask_scheduler
        if address is None:
            try:
                return tuple(compute(*graphs, scheduler="sync"))
            except (TimeoutError, OSError) as exc:
                raise ReferenceFault(
                    UNREADABLE_REASON.format(kind=_fault_name(exc)), path=self.reference.uri
                ) from None
        from distributed import Client

        try:
            if self._client is None:
                self._client = Client(
                    address,
                    timeout=self.settings.dask_connect_timeout_seconds,
                    set_as_default=False,
                )
            self._await_workers()
            futures = self._client.compute(list(graphs), retries=self.settings.dask_retries)
            self._submitted = True
            try:
                self._watch(futures)
            except ReferenceFault:
                self._client.cancel(futures)
                raise
            return tuple(self._client.gather(futures))
        except ReferenceFault:
            raise
        except (TimeoutError, OSError, asyncio.CancelledError) as exc:
            raise self._cluster_fault(exc) from None
        except Exception as exc:
            if type(exc).__module__.startswith("distributed"):  # KilledWorker and the like
                raise self._cluster_fault(exc) from None
            raise

    def _cluster_fault(self, exc: BaseException) -> ReferenceFault:
        """A cluster fault, refunded only while no task of this release was submitted: from
        then on a task may have started reading rows (the scheduler does not tell the client
        whether one did), and DESIGN allows a refund only when the job provably never read the
        data. Such a failure is still independent of the values (module docstring, Faults), so
        charging it is conservative: the status reveals nothing, and the budget covers a read
        that may have happened."""
        if self._submitted:
            return ReferenceFault(CLUSTER_CHARGED_REASON.format(kind=_fault_name(exc)), False)
        return ReferenceFault(CLUSTER_REASON.format(kind=_fault_name(exc)))

    def _workers(self) -> int:
        """Workers the scheduler has now (asked, not from a cached view)."""
        return len(self._client.nthreads())

    def _await_workers(self) -> None:
        """At least one Dask worker within ``DPSS_DASK_WAIT_SECONDS``, before this release's
        first task is submitted: else :class:`ReferenceFault` (refunded: nothing was read)."""
        if self._submitted:
            return
        wait = self.settings.dask_wait_seconds
        try:
            self._client.wait_for_workers(1, timeout=wait)
        except TimeoutError:
            raise ReferenceFault(NO_WORKERS_REASON.format(seconds=wait)) from None

    def _watch(self, futures: Any) -> None:
        """Wait for ``futures`` however long they compute, but not while the cluster has no
        worker for more than ``DPSS_DASK_WAIT_SECONDS`` (the scheduler would keep the tasks
        pending until one returns, and the release ``running`` with it): then
        :class:`ReferenceFault`, charged (not refunded): the tasks were submitted, and one
        may have read rows before its worker left, so the job did not provably never read the
        data. Nothing was released, and the loss of every worker does not depend on the
        values, so the failure itself reveals nothing."""
        limit = self.settings.dask_wait_seconds
        poll = min(limit, WATCH_SECONDS)
        pending = len(futures)
        lock, finished = threading.Lock(), threading.Event()

        def one_done(_: Any) -> None:
            nonlocal pending
            with lock:
                pending -= 1
                if pending <= 0:
                    finished.set()

        if not futures:
            return
        for future in futures:
            future.add_done_callback(one_done)  # also on an error or a cancel
        alone_since: float | None = None
        while not finished.wait(poll):
            if self._workers():
                alone_since = None
                continue
            now = time.monotonic()
            if alone_since is None:
                alone_since = now
            elif now - alone_since >= limit:
                raise ReferenceFault(LOST_WORKERS_REASON.format(seconds=limit), refund=False)

    def _reduce(self, task: Any, *args: Any) -> FloatArray:
        """``sum`` of ``task(location, piece, columns, record, *args)`` over the row groups:
        one Dask task per run of consecutive row groups of about ``DPSS_DASK_TASK_MB``
        (:func:`task_runs`), each adding its groups in order, and the runs' sums added in
        order (a chain), so the order and the bits do not depend on the scheduler."""
        from dask.delayed import delayed

        ref = self.reference
        total: Any = None
        budget = int(self.settings.dask_task_mb * 2**20)
        for run in task_runs(ref.pieces, 8 * len(ref.columns), budget):
            records = [self.records[piece.path] for piece in run]
            part = _task(_run_sum, task, ref.location, run, ref.columns, records, args)
            total = part if total is None else delayed(_add, pure=False)(total, part)
        (result,) = self._compute(total)
        return np.asarray(result, dtype=np.float64)

    def clipped_gram(
        self, clip_norm: float, center: FloatArray | None, row_clip: float | None = None
    ) -> FloatArray:
        return self._reduce(_piece_gram, clip_norm, center, row_clip)

    def captured_energy(
        self, basis: FloatArray, clip_norm: float, center: FloatArray | None
    ) -> tuple[float, float]:
        captured, residual = self._reduce(_piece_energy, basis, clip_norm, center)
        return float(captured), float(residual)

    def gram_norm_counts(
        self, clip_norm: float, center: FloatArray | None, edges: FloatArray
    ) -> FloatArray:
        return self._reduce(_piece_norm_counts, clip_norm, center, edges)

    def clipped_sum(self, clip_norm: float) -> FloatArray:
        return self._reduce(_piece_sum, clip_norm)

    def subset_bases(self, partition: IntArray, k: int) -> FloatArray:
        """Passes of :func:`~service.mechanisms.sample_aggregate.pass_subsets` subsets (rows of
        at most ``DPSS_DASK_PASS_MB`` on the cluster, :data:`PASS_BYTES` in process, at once;
        the groups, hence every ``U_j``, do not depend on it); per pass one task per row group
        splits its rows by group of subsets, and one task per group decomposes them."""
        from dask.delayed import delayed

        t, m = partition.shape
        n, d = self.shape
        per_group = max(1, GROUP_ROWS // m)
        on_cluster = self.settings.dask_scheduler is not None
        pass_bytes = int(self.settings.dask_pass_mb * 2**20) if on_cluster else PASS_BYTES
        per_pass = pass_subsets(t, m, d, per_group, pass_bytes)
        # slot[i] = j m + p for row i at position p of subset j; -1: in no subset. O(n) ints,
        # drawn from the release's generator in the worker (the partition is public randomness).
        slot = np.full(n, -1, dtype=np.int64)
        slot[partition.ravel()] = np.arange(t * m, dtype=np.int64)
        bases = np.empty((t, d, k), dtype=np.float64)
        ref = self.reference
        for first in range(0, t, per_pass):
            last = min(t, first + per_pass)
            groups = [(s, min(last, s + per_group)) for s in range(first, last, per_group)]
            bounds = [(s * m, e * m) for s, e in groups]
            split = []
            for piece in ref.pieces:
                piece_slots = slot[piece.offset : piece.offset + piece.rows]
                if np.any((piece_slots >= first * m) & (piece_slots < last * m)):
                    split.append(
                        _task(
                            _piece_subsets,
                            ref.location,
                            piece,
                            ref.columns,
                            self.records[piece.path],
                            piece_slots,
                            bounds,
                            nout=len(bounds),
                        )
                    )
            graphs = [
                delayed(_group_bases, pure=False)(
                    [parts[index] for parts in split], s * m, e - s, m, d, k
                )
                for index, (s, e) in enumerate(groups)
            ]
            for (s, e), result in zip(groups, self._compute(*graphs), strict=True):
                bases[s:e] = result
        return bases

    # -- immutability -----------------------------------------------------------------------

    def check_unchanged(self) -> None:
        """Every recorded object as recorded: else :class:`ReferenceFault` naming the first
        difference (an object added under the URI is not looked for: it is never read). A cheap
        check of identities before and after the run; the bytes themselves are checked against
        their digests as each task reads them."""
        ref = self.reference
        if not ref.digested:
            raise ReferenceFault(LEGACY_REASON)
        fs = ref.location.filesystem()
        fs.invalidate_cache()
        for recorded in ref.objects:
            path = recorded["path"]
            try:
                current = _identity(fs, ref.location, path)
            except NotRegular:
                raise object_fault(UNSAFE_REASON, path=path) from None
            except FileNotFoundError:
                raise object_fault(CHANGED_REASON, path=path) from None
            except Exception as exc:
                raise object_fault(
                    UNREADABLE_REASON.format(kind=_fault_name(exc)), path=path
                ) from None
            if identity_differs(recorded, current, self.since_ns):
                raise object_fault(CHANGED_REASON, path=path)

    def verify_unchanged(self) -> None:
        """:meth:`check_unchanged`, then every row group's footer and chunks read and compared
        with their digests, in this process, decoding nothing (the re-check of
        :mod:`service.reference_recheck`): a rewrite that kept an object's size and mtime is
        found by its digests. Reads what a release reads, once; its time depends on the
        reference's public sizes, not on the values."""
        self.check_unchanged()
        for piece in self.reference.pieces:
            verify_piece(self.reference.location, piece, self.records[piece.path])

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None


def stamp_ns(moment: datetime | None) -> int | None:
    """A stored moment (UTC, naive or not) in ns since the epoch, as identity stamps are."""
    if moment is None:
        return None
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return int(aware.timestamp() * 1_000_000) * 1000


def batch_of(reference: Reference, row_offset: int, n_rows: int) -> Reference:
    """The rows ``[row_offset, row_offset + n_rows)`` (one batch of a continual release): the
    row groups that hold them, which must be whole, and every object of the reference (so
    :meth:`ParquetRows.check_unchanged` still checks them all, the batch's passes read only
    its groups)."""
    stop = row_offset + n_rows
    pieces = [p for p in reference.pieces if row_offset <= p.offset < stop]
    if sum(p.rows for p in pieces) != n_rows or any(p.offset + p.rows > stop for p in pieces):
        raise ValueError("a batch of a dataset by reference is whole row groups")
    return dataclasses.replace(reference, pieces=pieces)


@contextlib.contextmanager
def open_rows(
    raw: dict[str, Any],
    settings: Settings,
    batch: tuple[int, int] | None = None,
    since: datetime | None = None,
) -> Iterator[ParquetRows]:
    """The rows of a dataset by reference for one release (with ``batch``, ``(row_offset,
    n_rows)``: those of one batch, :func:`batch_of`), every object checked unchanged first
    (with ``since``, the release's request: an identity stamp at or after it too)."""
    reference = Reference.from_json(raw, settings)
    if batch is not None:
        reference = batch_of(reference, *batch)
    rows = ParquetRows(reference, settings, stamp_ns(since))
    try:
        rows.check_unchanged()
        yield rows
    finally:
        rows.close()


def mechanism_allowed(mechanism: str) -> None:
    """Refuse (422 naming ``mechanism``) one that indexes rows directly."""
    if mechanism not in MECHANISMS:
        raise InvalidInput(
            "mechanism",
            f"{mechanism} cannot run on a dataset registered by reference; one of "
            f"{', '.join(sorted(MECHANISMS))}",
        )


def worker_bytes(raw: dict[str, Any]) -> int:
    """Memory a release on this dataset needs in the worker beyond the mechanism's own estimate
    (public facts only): the subsets' slot per row (``8 n``), and, when the passes run in
    process, one row group as Arrow columns, as a float64 matrix and its clipped copy, plus its
    chunks' bytes as read (verified and decoded from memory), held twice while they are sliced
    out of one coalesced read."""
    pieces = raw["pieces"]
    n = sum(int(piece[3]) for piece in pieces)
    largest = max((int(piece[3]) for piece in pieces), default=0)
    stored = max(
        (sum(int(chunk[1]) for chunk in piece[4]) for piece in pieces if len(piece) > 4),
        default=0,
    )
    return 8 * n + 3 * 8 * largest * len(raw["columns"]) + 2 * stored
