"""Datasets by reference: Parquet on S3-compatible object storage or a shared filesystem.

An owner registers ``s3://bucket/prefix/`` (the endpoint is the deployment's
``DPSS_S3_ENDPOINT_URL``) or a directory path, plus the numeric columns to use, instead of
uploading. The URI must lie under one of ``DPSS_REFERENCE_ROOTS``: the service reads with the
deployment's credentials, so an owner may name only what the operator opened to references.

**Registration** (:func:`inspect`, in the API process, in a thread): the ``*.parquet`` objects
under the URI, sorted by key, are the dataset; row ``i`` is the ``i``-th row of their row groups
in that order (the stable row index). The footers give ``n`` (public) and the schema; every
value of the chosen columns is then read and checked (numeric, not null, finite) one bounded
batch at a time (:data:`~service.store.BLOCK_VALUES` values), so the API never holds more than
one batch. Each object's identity (S3: ETag, and VersionId when the bucket is versioned; a path:
size and modification time in nanoseconds) and size are recorded with the dataset.

**Immutability.** The worker compares every object with the record before a release reads it
and again before the outcome is stored (:meth:`ParquetRows.check_unchanged`): a changed, missing
or added object ends the release ``failed`` and refunded, with a reason naming the object;
nothing was released (noise is drawn in the worker, never on the cluster).

**Credentials** come from the deployment's environment only (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, a profile or an instance role, read by botocore in the API, the
worker and each Dask worker): never from a request body, never stored, never pickled into a
Dask task (a :class:`Location` holds the protocol and the endpoint only). Errors name the object
and the exception type, never an exception's message (a library's message may quote a signed
URL or a header).

**Heavy passes** (:class:`ParquetRows`, a :class:`~service.mechanisms.linalg.RowSource`): one
task per row group computes a ``d x d`` clipped Gram matrix, a clipped column sum or the rows
of a group of random subsets; the partial results are added in row-group order, so a run on
Dask (``DPSS_DASK_SCHEDULER``) and one in process (Dask's synchronous scheduler) give the same
bits when the BLAS uses one thread in both (Dask's nanny sets it for its workers), and agree up
to the BLAS kernels' summation order otherwise. Only ``d x d``-sized results (and the
``t x d x k`` subset bases) reach the worker; :func:`worker_bytes` adds what the worker holds
besides to the memory gate.

**Faults.** Tasks are retried (``DPSS_DASK_RETRIES``) and the scheduler recomputes the tasks of
a lost worker; if the cluster still fails (unreachable scheduler, a task that killed its workers
repeatedly, an object that cannot be read), the release ends ``failed`` and refunded with a
fixed reason naming the exception type. Such faults do not depend on the values: every task's
memory and time are functions of the row group's public shape, and the numerical code is total
on the finite values registration admitted. Nothing was released, so the refund is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

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
from service.mechanisms.sample_aggregate import (
    GROUP_ROWS,
    PASS_BYTES,
    _top_k_right_singular,
    pass_subsets,
)
from service.store import BLOCK_VALUES

#: ``datasets.file_name`` of a dataset by reference: not a file of the store (null still means
#: deleted, so every check of a live dataset holds unchanged).
REFERENCE_FILE_NAME = "(by reference)"
#: Mechanisms that reach the rows only through the RowSource passes (Gram, column sum, subset
#: bases); the others index rows directly and are refused for a dataset by reference (422).
MECHANISMS = frozenset(
    {
        "analyze_gauss",
        "gap_perturbation",
        "smooth_sensitivity",
        "spectrum",
        "friendly_aggregate",
        "histogram_aggregate",
    }
)
#: The largest decoded row group (chosen columns): one Dask task's rows.
MAX_ROW_GROUP_BYTES = 256 * 1024 * 1024
#: Objects a reference may name (each is checked before every release).
MAX_OBJECTS = 10_000

CHANGED_REASON = "the referenced object {path} changed since registration; nothing was read"
UNREADABLE_REASON = "the referenced object {path} could not be read ({kind}); nothing was released"
CLUSTER_REASON = "the Dask cluster failed ({kind}) before anything was released; refunded"


class ReferenceFault(Exception):
    """A release on a dataset by reference that cannot complete for a reason that does not
    depend on the values: the worker ends it ``failed`` and refunded with :attr:`reason`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Location:
    """Where the objects are: the protocol and the endpoint, never credentials (picklable, sent
    to Dask workers, which read their own environment's credentials)."""

    protocol: str  # "s3" or "file"
    endpoint_url: str | None = None

    def filesystem(self) -> Any:
        if self.protocol == "s3":
            import s3fs

            # fsspec's instance cache: one client per process (and endpoint), since building
            # one loads botocore's service models (about a second). Identities are read with
            # refresh=True, never from its listing cache.
            return s3fs.S3FileSystem(endpoint_url=self.endpoint_url, anon=False)
        import fsspec

        return fsspec.filesystem("file")


@dataclass(frozen=True)
class Piece:
    """One row group: rows ``[offset, offset + rows)`` of the dataset."""

    path: str
    row_group: int
    offset: int
    rows: int


@dataclass
class Reference:
    """What ``datasets.reference`` stores (JSON)."""

    uri: str
    location: Location
    columns: list[str]
    objects: list[dict[str, Any]]
    pieces: list[Piece] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "protocol": self.location.protocol,
            "columns": self.columns,
            "objects": self.objects,
            "pieces": [[p.path, p.row_group, p.offset, p.rows] for p in self.pieces],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any], settings: Settings) -> Reference:
        protocol = str(raw["protocol"])
        endpoint = settings.s3_endpoint_url if protocol == "s3" else None
        return cls(
            uri=str(raw["uri"]),
            location=Location(protocol, endpoint),
            columns=[str(c) for c in raw["columns"]],
            objects=list(raw["objects"]),
            pieces=[Piece(str(a), int(b), int(c), int(d)) for a, b, c, d in raw["pieces"]],
        )

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.rows for p in self.pieces), len(self.columns)


# -- registration ---------------------------------------------------------------------------


def _allowed_root(uri: str, settings: Settings) -> tuple[Location, str]:
    """The location and the normalised path (``bucket/prefix`` or an absolute path) of
    ``uri``, refused unless it lies under one of ``DPSS_REFERENCE_ROOTS``."""
    roots = settings.reference_root_list
    if not roots:
        raise InvalidInput("uri", "registration by reference is off (DPSS_REFERENCE_ROOTS)")
    if uri.startswith("s3://"):
        path = uri[len("s3://") :].strip("/")
        if any(part in ("", ".", "..") for part in path.split("/")):
            raise InvalidInput("uri", "must not contain empty, '.' or '..' segments")
        location = Location("s3", settings.s3_endpoint_url)
        allowed = [r[len("s3://") :].strip("/") for r in roots if r.startswith("s3://")]
    else:
        raw = uri[len("file://") :] if uri.startswith("file://") else uri
        if not os.path.isabs(raw):
            raise InvalidInput("uri", "must be s3://bucket/prefix or an absolute path")
        path = os.path.realpath(raw)  # symlinks and '..' resolved before the check
        location = Location("file")
        allowed = [os.path.realpath(r) for r in roots if not r.startswith("s3://")]
    if not path or not any(path == r or path.startswith(r.rstrip("/") + "/") for r in allowed):
        raise InvalidInput("uri", "is not under any of the roots this service may read")
    return location, path


def _identity(fs: Any, location: Location, path: str) -> dict[str, Any]:
    """What must not change: S3's ETag (and VersionId), or a file's size and mtime."""
    if location.protocol == "s3":
        info = fs.info(path, refresh=True)
        return {
            "path": path,
            "size": int(info["size"]),
            "etag": str(info.get("ETag", "")),
            "version": info.get("VersionId"),
        }
    stat = os.stat(path)
    return {"path": path, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _fault_name(exc: BaseException) -> str:
    return type(exc).__name__


def _list_objects(fs: Any, location: Location, path: str) -> list[str]:
    try:
        if location.protocol == "file" and os.path.isfile(path):
            return [path]
        if location.protocol == "s3" and fs.isfile(path):
            return [path]
        found = sorted(p for p in fs.find(path) if p.endswith(".parquet"))
    except Exception as exc:
        raise InvalidInput("uri", f"could not be listed ({_fault_name(exc)})") from None
    if location.protocol == "file":
        # A symlink inside the root must not lead out of it.
        found = [p for p in found if os.path.realpath(p).startswith(path.rstrip("/") + "/")]
    if not found:
        raise InvalidInput("uri", "holds no .parquet objects")
    if len(found) > MAX_OBJECTS:
        raise InvalidInput("uri", f"holds more than {MAX_OBJECTS} objects")
    return found


def _check_schema(schema: pa.Schema, columns: Sequence[str], path: str) -> None:
    for name in columns:
        index = schema.get_field_index(name)
        if index < 0:
            raise InvalidInput("columns", f"{name!r} is not a column of {path}")
        kind = schema.field(index).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            raise InvalidInput("columns", f"{name!r} is not numeric in {path} (type {kind})")


def _matrix(table: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> FloatArray:
    return np.column_stack(
        [
            np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)
            for name in columns
        ]
    )


def _validate_object(
    fs: Any, path: str, columns: Sequence[str], offset: int, max_cols: int
) -> list[Piece]:
    """The row groups of one object, its values checked batch by batch."""
    pieces: list[Piece] = []
    with fs.open(path, "rb") as handle:
        parquet = pq.ParquetFile(handle)
        _check_schema(parquet.schema_arrow, columns, path)
        metadata = parquet.metadata
        indices = [parquet.schema_arrow.get_field_index(c) for c in columns]
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            decoded = sum(row_group.column(i).total_uncompressed_size for i in indices)
            if decoded > MAX_ROW_GROUP_BYTES or 8 * row_group.num_rows * len(columns) > (
                MAX_ROW_GROUP_BYTES
            ):
                raise InvalidInput(
                    "uri",
                    f"{path}: row group {group + 1} is larger than "
                    f"{MAX_ROW_GROUP_BYTES >> 20} MiB decoded; write smaller row groups",
                )
            if row_group.num_rows:
                pieces.append(Piece(path, group, offset, row_group.num_rows))
            offset += row_group.num_rows
        batch_rows = max(1, BLOCK_VALUES // max(1, len(columns)))
        row = 0
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=list(columns)):
            for name in columns:
                if batch.column(name).null_count:
                    raise InvalidInput("columns", f"{name!r} has a missing value in {path}")
            values = _matrix(batch, columns)
            finite = np.isfinite(values)
            if not finite.all():
                bad = int(np.argwhere(~finite)[0][0]) + row + 1
                raise InvalidInput(
                    "uri", f"{path}: non-finite value (NaN or infinity) in row {bad}"
                )
            row += batch.num_rows
    return pieces


def inspect(uri: str, columns: list[str], settings: Settings) -> Reference:
    """Read the footers and every value of ``columns`` under ``uri``; the :class:`Reference`
    to store. :class:`InvalidInput` names ``uri`` or ``columns``; nothing is kept either way."""
    if not columns:
        raise InvalidInput("columns", "name at least one column")
    if len(set(columns)) != len(columns):
        raise InvalidInput("columns", "a column is named twice")
    if len(columns) > settings.max_cols:
        raise InvalidInput("columns", f"at most {settings.max_cols} are accepted (DPSS_MAX_COLS)")
    location, path = _allowed_root(uri, settings)
    fs = location.filesystem()
    fs.invalidate_cache()  # a listing cached by an earlier registration may be stale
    objects = _list_objects(fs, location, path)
    reference = Reference(uri=uri, location=location, columns=list(columns), objects=[])
    offset = 0
    for name in objects:
        try:
            reference.objects.append(_identity(fs, location, name))
            pieces = _validate_object(fs, name, columns, offset, settings.max_cols)
        except InvalidInput:
            raise
        except Exception as exc:
            raise InvalidInput(
                "uri", f"{name} is not a readable Parquet object ({_fault_name(exc)})"
            ) from None
        reference.pieces.extend(pieces)
        offset += sum(p.rows for p in pieces)
    if offset < 2:
        raise InvalidInput("uri", "the data needs at least 2 rows")
    return reference


# -- the heavy passes -------------------------------------------------------------------------


def _read_piece(location: Location, piece: Piece, columns: Sequence[str]) -> FloatArray:
    fs = location.filesystem()
    with fs.open(piece.path, "rb") as handle:
        table = pq.ParquetFile(handle).read_row_group(piece.row_group, columns=list(columns))
    return _matrix(table, columns)


def _piece_gram(
    location: Location,
    piece: Piece,
    columns: Sequence[str],
    clip_norm: float,
    center: FloatArray | None,
    row_clip: float | None = None,
) -> FloatArray:
    return clipped_gram(
        _read_piece(location, piece, columns), clip_norm, center=center, row_clip=row_clip
    )


def _piece_energy(
    location: Location,
    piece: Piece,
    columns: Sequence[str],
    basis: FloatArray,
    clip_norm: float,
    center: FloatArray | None,
) -> FloatArray:
    rows = _read_piece(location, piece, columns)
    return np.asarray(captured_energy(rows, basis, clip_norm, center), dtype=np.float64)


def _piece_norm_counts(
    location: Location,
    piece: Piece,
    columns: Sequence[str],
    clip_norm: float,
    center: FloatArray | None,
    edges: FloatArray,
) -> FloatArray:
    return gram_norm_counts(_read_piece(location, piece, columns), clip_norm, center, edges)


def _piece_sum(
    location: Location, piece: Piece, columns: Sequence[str], clip_norm: float
) -> FloatArray:
    return clipped_sum(_read_piece(location, piece, columns), clip_norm)


def _piece_subsets(
    location: Location,
    piece: Piece,
    columns: Sequence[str],
    slots: IntArray,
    bounds: Sequence[tuple[int, int]],
) -> list[tuple[IntArray, FloatArray]]:
    """Per group of subsets (slot range ``[lo, hi)``), this row group's rows in it and their
    slots (``slot = j m + position`` of the row in subset ``j``)."""
    rows = _read_piece(location, piece, columns)
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
    return _top_k_right_singular(buffer.reshape(g, m, d), k, overwrite=True)


def _add(left: FloatArray, right: FloatArray) -> FloatArray:
    return left + right


class ParquetRows:
    """A dataset by reference as a :class:`~service.mechanisms.linalg.RowSource`: the passes
    run as Dask graphs, on the cluster named by ``DPSS_DASK_SCHEDULER`` or, without one, on
    Dask's synchronous scheduler in this process (the same tasks, added in the same order)."""

    def __init__(self, reference: Reference, settings: Settings) -> None:
        self.reference = reference
        self.settings = settings
        self._client: Any = None

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
                    UNREADABLE_REASON.format(path=self.reference.uri, kind=_fault_name(exc))
                ) from None
        from distributed import Client

        try:
            if self._client is None:
                self._client = Client(
                    address,
                    timeout=self.settings.dask_connect_timeout_seconds,
                    set_as_default=False,
                )
            futures = self._client.compute(list(graphs), retries=self.settings.dask_retries)
            return tuple(self._client.gather(futures))
        except (TimeoutError, OSError, asyncio.CancelledError) as exc:
            raise ReferenceFault(CLUSTER_REASON.format(kind=_fault_name(exc))) from None
        except Exception as exc:
            if type(exc).__module__.startswith("distributed"):  # KilledWorker and the like
                raise ReferenceFault(CLUSTER_REASON.format(kind=_fault_name(exc))) from None
            raise

    def _reduce(self, task: Any, *args: Any) -> FloatArray:
        """``sum`` of ``task(location, piece, columns, *args)`` over the row groups, added in
        row-group order (a chain, so the order and the bits do not depend on the scheduler)."""
        from dask.delayed import delayed

        ref = self.reference
        total: Any = None
        for piece in ref.pieces:
            part = delayed(task, pure=False)(ref.location, piece, ref.columns, *args)
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
                        delayed(_piece_subsets, nout=len(bounds), pure=False)(
                            ref.location, piece, ref.columns, piece_slots, bounds
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
        """Every recorded object as recorded, and no object added: else :class:`ReferenceFault`
        naming the first difference."""
        ref = self.reference
        fs = ref.location.filesystem()
        fs.invalidate_cache()
        for recorded in ref.objects:
            path = recorded["path"]
            try:
                current = _identity(fs, ref.location, path)
            except FileNotFoundError:
                raise ReferenceFault(CHANGED_REASON.format(path=path)) from None
            except Exception as exc:
                raise ReferenceFault(
                    UNREADABLE_REASON.format(path=path, kind=_fault_name(exc))
                ) from None
            if current != recorded:
                raise ReferenceFault(CHANGED_REASON.format(path=path))

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None


@contextlib.contextmanager
def open_rows(raw: dict[str, Any], settings: Settings) -> Iterator[ParquetRows]:
    """The rows of a dataset by reference for one release, checked unchanged first."""
    rows = ParquetRows(Reference.from_json(raw, settings), settings)
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
    process, one row group as Arrow columns, as a float64 matrix and its clipped copy."""
    pieces = raw["pieces"]
    n = sum(int(piece[3]) for piece in pieces)
    largest = max((int(piece[3]) for piece in pieces), default=0)
    return 8 * n + 3 * 8 * largest * len(raw["columns"])
