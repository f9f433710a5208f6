"""Datasets by reference: Parquet on S3-compatible object storage or a shared filesystem.

An owner registers ``s3://bucket/prefix/`` (the endpoint is the deployment's
``DPSS_S3_ENDPOINT_URL``) or a directory path, plus the numeric columns to use, instead of
uploading. The URI must lie under one of ``DPSS_REFERENCE_ROOTS``: the service reads with the
deployment's credentials, so an owner may name only what the operator opened to references.

**Registration** (:func:`inspect`, run by a worker as a job the owner polls, see
:mod:`service.registration`; the request checks only what needs no read, :func:`check_request`):
the regular ``*.parquet`` objects under the URI (local: by ``lstat``, symlinks not followed, a
non-regular one refused unopened), sorted by key, are the dataset; row ``i`` is the ``i``-th row
of their row groups in that order (the stable row index). Per object the footer and the chosen
columns' chunks are read as byte ranges and their SHA-256 recorded; every value is decoded from
exactly those bytes (:class:`_Ranges`) and checked (numeric, not null, finite) one bounded batch
at a time; the rows the data pages hold (:func:`page_rows`) and the rows decoded must equal the
footer's count; the whole reference is bounded by ``DPSS_MAX_DATASET_BYTES``; an object another
live dataset covers is refused by :func:`service.datasets.cover_objects`. Each object's identity
(S3: ETag, and VersionId when the bucket is versioned; a path: size and modification time in
nanoseconds, by ``lstat``) is recorded with the digests.

**Immutability.** The worker compares every object's identity with the record before a release
reads it and again before the outcome is stored (:meth:`ParquetRows.check_unchanged`), and each
task reads its row group through :func:`_read_piece`: a regular file opened at its registered,
resolved path under the current roots without following a symlink (S3: the recorded version),
its footer and chunks compared with their digests, the decoded rows counted and checked as at
registration. A changed, swapped, missing or added object ends the release ``failed`` and
refunded, with a reason naming the object; nothing was released (noise is drawn in the worker,
never on the cluster) and the failure is decided by digests, not by the registered values.

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
repeatedly, every worker gone for ``DPSS_DASK_WAIT_SECONDS``), the release ends ``failed`` with
a fixed reason naming the exception type. Such faults do not depend on the values: every task's
memory and time are functions of the row group's public shape, and the numerical code is total
on the finite values registration admitted. Nothing was released either way; the refund
follows DESIGN's rule that a job is refunded only when it provably never read the data: a
fault before the release's first task was submitted (no worker within the wait, an unreachable
scheduler) is refunded; once a task was submitted it may have read rows (the client cannot
tell whether a pending task had started), so the cost stays charged. An object found changed
is refunded as before: that failure is decided by the digests, not by what was read.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import io
import os
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from service.config import Settings
from service.errors import InvalidInput, PayloadTooLarge
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

CHANGED_REASON = "the referenced object {path} changed since registration; nothing was released"
UNREADABLE_REASON = "the referenced object {path} could not be read ({kind}); nothing was released"
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
UNSAFE_REASON = (
    "the referenced object {path} is no longer a regular file at its registered path under "
    "DPSS_REFERENCE_ROOTS; nothing was released"
)
LEGACY_REASON = (
    "this dataset was registered before content digests were recorded; register it again"
)
VALUES_REASON = "the values read from {path} differ from the registered ones; nothing was released"
#: The largest Parquet footer read (its length is the file's claim, so it is bounded first).
MAX_FOOTER_BYTES = 64 * 1024 * 1024
_MAGIC = b"PAR1"


class ReferenceFault(Exception):
    """A release on a dataset by reference that cannot complete: the worker ends it ``failed``
    with :attr:`reason`, refunded when :attr:`refund` (nothing released and the fault decided
    by something other than the registered values: a changed object, a lost cluster)."""

    def __init__(self, reason: str, refund: bool = True) -> None:
        super().__init__(reason, refund)
        self.reason = reason
        self.refund = refund


@dataclass(frozen=True)
class Location:
    """Where the objects are: the protocol, the endpoint and the roots they must lie under,
    never credentials (picklable, sent to Dask workers, which read their own environment's
    credentials). The roots are the worker's current ``DPSS_REFERENCE_ROOTS``: containment is
    checked at every open, not only at registration."""

    protocol: str  # "s3" or "file"
    endpoint_url: str | None = None
    roots: tuple[str, ...] = ()

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
class Chunk:
    """The bytes of one column chunk: ``[start, start + length)`` of the object, and their
    SHA-256 fixed at registration."""

    start: int
    length: int
    sha256: str


@dataclass(frozen=True)
class Piece:
    """One row group: rows ``[offset, offset + rows)`` of the dataset, read from ``chunks``
    (one per chosen column, in the columns' order)."""

    path: str
    row_group: int
    offset: int
    rows: int
    chunks: tuple[Chunk, ...] = ()


def _roots(settings: Settings, protocol: str) -> tuple[str, ...]:
    roots = settings.reference_root_list
    if protocol == "s3":
        return tuple(r[len("s3://") :].strip("/") for r in roots if r.startswith("s3://"))
    return tuple(os.path.realpath(r) for r in roots if not r.startswith("s3://"))


def _under(path: str, roots: Sequence[str]) -> bool:
    return bool(path) and any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


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
            "pieces": [
                [
                    p.path,
                    p.row_group,
                    p.offset,
                    p.rows,
                    [[c.start, c.length, c.sha256] for c in p.chunks],
                ]
                for p in self.pieces
            ],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any], settings: Settings) -> Reference:
        protocol = str(raw["protocol"])
        endpoint = settings.s3_endpoint_url if protocol == "s3" else None
        pieces = []
        for entry in raw["pieces"]:
            chunks = tuple(
                Chunk(int(a), int(b), str(c)) for a, b, c in (entry[4] if len(entry) > 4 else [])
            )
            pieces.append(Piece(str(entry[0]), int(entry[1]), int(entry[2]), int(entry[3]), chunks))
        return cls(
            uri=str(raw["uri"]),
            location=Location(protocol, endpoint, _roots(settings, protocol)),
            columns=[str(c) for c in raw["columns"]],
            objects=list(raw["objects"]),
            pieces=pieces,
        )

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.rows for p in self.pieces), len(self.columns)

    def covered(self) -> list[tuple[str, str, str]]:
        """``(object_key, key_sha256, content_sha256)`` of each object (see
        :class:`~service.db.models.DatasetReferenceObject`): the key names the object (a
        resolved path, or bucket and key), the content digest what its releases read (the
        footer's digest and its row groups' chunk digests, in order)."""
        chunks: dict[str, list[str]] = {}
        for piece in self.pieces:
            chunks.setdefault(piece.path, []).extend(c.sha256 for c in piece.chunks)
        out = []
        for record in self.objects:
            path = str(record["path"])
            key = object_key(self.location, path)
            content = "\n".join([str(record["footer_sha256"]), *chunks.get(path, [])])
            out.append((key, _sha256(key.encode()), _sha256(content.encode())))
        return out

    @property
    def digested(self) -> bool:
        """Whether every object's footer and every piece's chunks carry a digest (datasets
        registered before digests were recorded do not, and are refused at release)."""
        return all("footer_sha256" in o for o in self.objects) and all(
            len(p.chunks) == len(self.columns) for p in self.pieces
        )


# -- opening and reading one object -----------------------------------------------------------


class NotRegular(OSError):
    """The path is not (or no longer) a regular file at its resolved place under a root."""


def _open_regular(path: str, roots: Sequence[str]) -> int:
    """A descriptor of the regular file at ``path`` (a resolved path under ``roots``), opened
    without following a symlink and without blocking (a FIFO or device answers at once, and is
    refused): :class:`NotRegular` otherwise."""
    if "\x00" in path or not os.path.isabs(path) or not _under(path, roots):
        raise NotRegular(path)
    # A directory on the way replaced by a symlink resolves elsewhere: refused before the open.
    if os.path.realpath(path) != path:
        raise NotRegular(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symlink, or a FIFO/socket
            raise NotRegular(path) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(path)
        # What was opened is where it was meant to be (a rename between the checks and the
        # open would show here), on Linux, where the descriptor's path can be read.
        link = f"/proc/self/fd/{fd}"
        if os.path.islink(link) and os.readlink(link) != path:
            raise NotRegular(path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Object:
    """One object opened for reading byte ranges: a local regular file (:func:`_open_regular`)
    or an S3 object (at its recorded version when the bucket is versioned)."""

    def __init__(
        self, location: Location, path: str, version: str | None = None, size: int = -1
    ) -> None:
        self.location = location
        self.path = path
        self.version = version
        self._fd: int | None = None
        self._fs: Any = None
        if location.protocol == "file":
            self._fd = _open_regular(path, location.roots)
            self.size = os.fstat(self._fd).st_size
        else:
            if not _under(path, location.roots):
                raise NotRegular(path)
            self._fs = location.filesystem()
            self.size = size  # the recorded size (the ETag and version are checked apart)

    def read(self, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        if self._fd is not None:
            parts = []
            done = 0
            while done < length:
                part = os.pread(self._fd, length - done, start + done)
                if not part:
                    break
                parts.append(part)
                done += len(part)
            data = b"".join(parts)
        else:
            data = bytes(
                self._fs.cat_file(
                    self.path, start=start, end=start + length, version_id=self.version
                )
            )
        if len(data) != length:
            raise EOFError(self.path)
        return data

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> _Object:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Ranges(io.RawIOBase):
    """A file of ``size`` bytes of which only ``ranges`` (offset -> verified bytes) exist:
    pyarrow decodes from these and nothing else, so what is decoded is what was digested. A
    read outside them is an error (the row group is then unreadable, at registration already,
    since registration decodes through this too)."""

    def __init__(self, size: int, ranges: dict[int, bytes]) -> None:
        super().__init__()
        self._size = size
        self._ranges = sorted(ranges.items())
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = self._size - self._pos
        if size == 0:
            return b""
        for start, data in self._ranges:
            if start <= self._pos and self._pos + size <= start + len(data):
                out = data[self._pos - start : self._pos - start + size]
                self._pos += size
                return out
        raise OSError("a read outside the column chunks recorded at registration")

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


#: Chunks of one row group closer than this are fetched in one read (one GET on S3): a wide
#: table's chosen columns lie side by side, and a request per column would cost d round trips.
COALESCE_GAP = 64 * 1024


def _read_ranges(handle: _Object, wanted: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes of each ``(start, length)``, read in as few requests as the gaps allow."""
    order = sorted(range(len(wanted)), key=lambda i: wanted[i][0])
    out: list[bytes] = [b""] * len(wanted)
    group: list[int] = []

    def flush() -> None:
        if not group:
            return
        low = wanted[group[0]][0]
        high = max(wanted[i][0] + wanted[i][1] for i in group)
        data = handle.read(low, high - low)
        for i in group:
            start, length = wanted[i]
            out[i] = data[start - low : start - low + length]
        group.clear()

    end = -1
    for i in order:
        start, length = wanted[i]
        if group and start - end > COALESCE_GAP:
            flush()
        group.append(i)
        end = max(end, start + length) if len(group) > 1 else start + length
    flush()
    return out


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _footer(handle: _Object, size: int) -> tuple[bytes, pq.FileMetaData]:
    """The footer's bytes (metadata, length, magic) and its parsed metadata."""
    if size < 12:
        raise ValueError("too short for Parquet")
    tail = handle.read(size - 8, 8)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != _MAGIC or not 0 < length <= min(MAX_FOOTER_BYTES, size - 12):
        raise ValueError("not a Parquet footer")
    footer = handle.read(size - 8 - length, length + 8)
    return footer, _parse_footer(footer)


def _parse_footer(footer: bytes) -> pq.FileMetaData:
    return pq.ParquetFile(pa.BufferReader(_MAGIC + footer)).metadata


def _column_indices(metadata: pq.FileMetaData, columns: Sequence[str]) -> list[int]:
    """The column-chunk index of each chosen column (top-level, so its path is its name)."""
    paths = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    return [paths.index(name) for name in columns]


def _chunk_range(column: Any) -> tuple[int, int]:
    """Where a column chunk's pages lie (as pyarrow computes it: from the dictionary page if
    there is one before the data pages)."""
    start = int(column.data_page_offset)
    dictionary = column.dictionary_page_offset
    if column.has_dictionary_page and dictionary is not None and 0 < dictionary < start:
        start = int(dictionary)
    return start, int(column.total_compressed_size)


def _decode(
    metadata: pq.FileMetaData,
    size: int,
    ranges: dict[int, bytes],
    row_group: int,
    columns: Sequence[str],
    batch_rows: int | None = None,
) -> Iterator[pa.RecordBatch | pa.Table]:
    """The row group's chosen columns decoded from the verified ``ranges`` only."""
    parquet = pq.ParquetFile(_Ranges(size, ranges), metadata=metadata, pre_buffer=False)
    if batch_rows is None:
        yield parquet.read_row_group(row_group, columns=list(columns))
        return
    yield from parquet.iter_batches(
        batch_size=batch_rows, row_groups=[row_group], columns=list(columns)
    )


# -- counting what the pages hold -------------------------------------------------------------
#
# A footer's row counts are claims: pyarrow decodes as many rows as the footer says and ignores
# what the pages hold beyond them. Registration therefore walks every chosen column chunk's page
# headers (Thrift compact protocol) and counts the values they hold; a count other than the
# footer's refuses the object.

_DATA_PAGE, _DATA_PAGE_V2 = 0, 3
_MAX_DEPTH = 16


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("a truncated page header")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _zigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _skip(data: bytes, pos: int, kind: int, depth: int) -> int:
    """Past one compact-protocol value of type ``kind`` (booleans in containers: one byte)."""
    if depth > _MAX_DEPTH:
        raise ValueError("a page header nested too deep")
    if kind in (1, 2, 3):
        return pos + 1
    if kind in (4, 5, 6):
        return _varint(data, pos)[1]
    if kind == 7:
        return pos + 8
    if kind == 8:
        length, pos = _varint(data, pos)
        return pos + length
    if kind in (9, 10):
        if pos >= len(data):
            raise ValueError("a truncated page header")
        header = data[pos]
        size, element = header >> 4, header & 0x0F
        pos += 1
        if size == 15:
            size, pos = _varint(data, pos)
        for _ in range(size):
            pos = _skip(data, pos, element, depth + 1)
        return pos
    if kind == 11:
        size, pos = _varint(data, pos)
        if size:
            if pos >= len(data):
                raise ValueError("a truncated page header")
            key, value = data[pos] >> 4, data[pos] & 0x0F
            pos += 1
            for _ in range(size):
                pos = _skip(data, _skip(data, pos, key, depth + 1), value, depth + 1)
        return pos
    if kind == 12:
        return _struct(data, pos, depth + 1)[1]
    raise ValueError("an unknown type in a page header")


def _struct(data: bytes, pos: int, depth: int = 0) -> tuple[dict[int, Any], int]:
    """A compact-protocol struct's integer and struct fields by id, and the position after it."""
    if depth > _MAX_DEPTH:
        raise ValueError("a page header nested too deep")
    fields: dict[int, Any] = {}
    last = 0
    while True:
        if pos >= len(data):
            raise ValueError("a truncated page header")
        byte = data[pos]
        pos += 1
        if byte == 0:
            return fields, pos
        kind, delta = byte & 0x0F, byte >> 4
        if delta:
            last += delta
        else:
            raw, pos = _varint(data, pos)
            last = _zigzag(raw)
        if kind in (4, 5, 6):
            raw, pos = _varint(data, pos)
            fields[last] = _zigzag(raw)
        elif kind == 12:
            fields[last], pos = _struct(data, pos, depth + 1)
        elif kind in (1, 2):
            fields[last] = kind == 1
        else:
            pos = _skip(data, pos, kind, depth)


def page_rows(chunk: bytes) -> int:
    """The rows the data pages of one (flat) column chunk hold, by their headers; the pages must
    fill the chunk exactly (``ValueError`` otherwise)."""
    pos = total = 0
    while pos < len(chunk):
        header, pos = _struct(chunk, pos)
        kind, compressed = header.get(1), header.get(3)
        if not isinstance(compressed, int) or compressed < 0:
            raise ValueError("a page header without its size")
        if kind == _DATA_PAGE:
            count = header.get(5, {}).get(1)
        elif kind == _DATA_PAGE_V2:
            count = header.get(8, {}).get(3)  # num_rows
        else:
            count = 0
        if not isinstance(count, int) or count < 0:
            raise ValueError("a data page without its count")
        total += count
        pos += compressed
    if pos != len(chunk):
        raise ValueError("pages running past their column chunk")
    return total


# -- registration ---------------------------------------------------------------------------


def _allowed_root(uri: str, settings: Settings) -> tuple[Location, str]:
    """The location and the normalised path (``bucket/prefix`` or an absolute path) of
    ``uri``, refused unless it lies under one of ``DPSS_REFERENCE_ROOTS``."""
    if not settings.reference_root_list:
        raise InvalidInput("uri", "registration by reference is off (DPSS_REFERENCE_ROOTS)")
    if "\x00" in uri:
        raise InvalidInput("uri", "must not contain NUL characters")
    if uri.startswith("s3://"):
        path = uri[len("s3://") :].strip("/")
        if any(part in ("", ".", "..") for part in path.split("/")):
            raise InvalidInput("uri", "must not contain empty, '.' or '..' segments")
        location = Location("s3", settings.s3_endpoint_url, _roots(settings, "s3"))
    else:
        raw = uri[len("file://") :] if uri.startswith("file://") else uri
        if not os.path.isabs(raw):
            raise InvalidInput("uri", "must be s3://bucket/prefix or an absolute path")
        path = os.path.realpath(raw)  # symlinks and '..' resolved before the check
        location = Location("file", None, _roots(settings, "file"))
    if not _under(path, location.roots):
        raise InvalidInput("uri", "is not under any of the roots this service may read")
    return location, path


def _identity(fs: Any, location: Location, path: str) -> dict[str, Any]:
    """What must not change, checked cheaply before and after every release (the digests are
    checked as the bytes are read): S3's ETag (and VersionId), or a file's size and mtime,
    from ``lstat`` (a file replaced by a symlink, or by anything but a regular file, has
    changed)."""
    if location.protocol == "s3":
        info = fs.info(path, refresh=True)
        return {
            "path": path,
            "size": int(info["size"]),
            "etag": str(info.get("ETag", "")),
            "version": info.get("VersionId"),
        }
    status = os.lstat(path)
    if not stat.S_ISREG(status.st_mode):
        raise NotRegular(path)
    return {"path": path, "size": status.st_size, "mtime_ns": status.st_mtime_ns}


def _fault_name(exc: BaseException) -> str:
    return type(exc).__name__


class _Deadline:
    """``DPSS_REFERENCE_READ_SECONDS`` for one registration, checked between reads."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise InvalidInput(
                "uri",
                f"could not be read within {self.seconds:g} s (DPSS_REFERENCE_READ_SECONDS)",
            )


def _list_local(path: str, deadline: _Deadline | None = None) -> list[str]:
    """The regular ``*.parquet`` files at or under ``path`` (resolved), by ``lstat``: nothing
    is opened, a symlink under ``path`` is not followed (its target may lie elsewhere, or be
    listed twice), and a non-regular ``*.parquet`` (a FIFO, a device) is refused by name."""
    status = os.lstat(path)
    if stat.S_ISREG(status.st_mode):
        return [path]
    if not stat.S_ISDIR(status.st_mode):
        raise InvalidInput("uri", f"{path} is not a regular file or a directory")
    found: list[str] = []
    for directory, _subdirs, names in os.walk(path, followlinks=False):
        if deadline is not None:
            deadline.check()
        if len(found) > MAX_OBJECTS:
            break
        for name in names:
            if not name.endswith(".parquet"):
                continue
            full = os.path.join(directory, name)
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                continue
            if not stat.S_ISREG(mode):
                raise InvalidInput("uri", f"{full} is not a regular file")
            found.append(full)
    return sorted(found)


def _list_objects(
    fs: Any, location: Location, path: str, deadline: _Deadline | None = None
) -> list[str]:
    try:
        if location.protocol == "file":
            found = _list_local(path, deadline)
        elif fs.isfile(path):
            found = [path]
        else:
            found = sorted(p for p in fs.find(path) if p.endswith(".parquet"))
    except InvalidInput:
        raise
    except Exception as exc:
        raise InvalidInput("uri", f"could not be listed ({_fault_name(exc)})") from None
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


def _bad_values(batch: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> tuple[str, str] | None:
    """What registration refuses in a batch, as ``(field, message)`` with the batch's row
    (from 1) of a non-finite value, or None; the same check runs on every row group a release
    reads."""
    for name in columns:
        if batch.column(name).null_count:
            return "columns", f"{name!r} has a missing value"
    finite = np.isfinite(_matrix(batch, columns))
    if not finite.all():
        row = int(np.argwhere(~finite)[0][0]) + 1
        return "uri", f"non-finite value (NaN or infinity) in row {row}"
    return None


class _Total:
    """``DPSS_MAX_DATASET_BYTES`` over a whole reference, row group by row group as the footers
    are read (before their bytes): the float64 matrix (``n x d x 8``), and the chosen column
    chunks' bytes as stored (what is read and digested) and as Parquet decodes them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.rows = self.stored = self.decoded = 0

    def add(self, path: str, rows: int, cols: int, decoded: int, stored: int) -> None:
        self.rows += rows
        self.stored += stored
        self.decoded += decoded
        if max(8 * self.rows * cols, self.stored, self.decoded) > self.limit:
            raise PayloadTooLarge(
                f"uri: the reference, up to {path}, is larger than {self.limit} bytes "
                f"({self.rows} rows x {cols} columns x 8 bytes decoded, {self.stored} bytes "
                "stored in the chosen columns; DPSS_MAX_DATASET_BYTES)"
            )


def _register_object(
    fs: Any,
    location: Location,
    path: str,
    columns: Sequence[str],
    offset: int,
    deadline: _Deadline,
    total: _Total,
) -> tuple[dict[str, Any], list[Piece]]:
    """One object's record (identity, footer digest) and row groups (chunk digests), every
    value decoded from exactly the digested bytes and checked batch by batch."""
    record = _identity(fs, location, path)
    pieces: list[Piece] = []
    with _Object(location, path, record.get("version"), record["size"]) as handle:
        size = int(record["size"])
        if handle.size != size:
            raise InvalidInput("uri", f"{path} changed while it was read")
        footer, metadata = _footer(handle, size)
        record["footer_sha256"] = _sha256(footer)
        record["footer_length"] = len(footer)
        _check_schema(metadata.schema.to_arrow_schema(), columns, path)
        indices = _column_indices(metadata, columns)
        data_end = size - len(footer)
        batch_rows = max(1, BLOCK_VALUES // max(1, len(columns)))
        file_rows = 0
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            chosen = [row_group.column(i) for i in indices]
            decoded = sum(c.total_uncompressed_size for c in chosen)
            stored = sum(c.total_compressed_size for c in chosen)
            if max(decoded, stored, 8 * row_group.num_rows * len(columns)) > MAX_ROW_GROUP_BYTES:
                raise InvalidInput(
                    "uri",
                    f"{path}: row group {group + 1} is larger than "
                    f"{MAX_ROW_GROUP_BYTES >> 20} MiB decoded; write smaller row groups",
                )
            total.add(path, row_group.num_rows, len(columns), decoded, stored)
            chunks: list[Chunk] = []
            ranges: dict[int, bytes] = {}
            wanted = [_chunk_range(column) for column in chosen]
            for start, length in wanted:
                if not (len(_MAGIC) <= start and length > 0 and start + length <= data_end):
                    raise ValueError("a column chunk outside the data")
            deadline.check()
            for (start, length), data in zip(wanted, _read_ranges(handle, wanted), strict=True):
                held = page_rows(data)
                if held != row_group.num_rows:
                    raise InvalidInput("uri", _count_mismatch(path, group, row_group, held))
                ranges[start] = data
                chunks.append(Chunk(start, length, _sha256(data)))
            rows = 0
            for batch in _decode(metadata, size, ranges, group, columns, batch_rows):
                bad = _bad_values(batch, columns)
                if bad is not None and bad[0] == "columns":
                    raise InvalidInput("columns", f"{bad[1]} in {path}")
                if bad is not None:  # the row counted from the object's first row
                    row = file_rows + rows + int(bad[1].rsplit(" ", 1)[1])
                    raise InvalidInput("uri", f"{path}: {bad[1].rsplit(' ', 1)[0]} {row}")
                rows += batch.num_rows
                deadline.check()
            if rows != row_group.num_rows:
                raise InvalidInput("uri", _count_mismatch(path, group, row_group, rows))
            if rows:
                pieces.append(Piece(path, group, offset + file_rows, rows, tuple(chunks)))
            file_rows += rows
    if file_rows != metadata.num_rows:
        raise InvalidInput(
            "uri",
            f"{path}: the footer says {metadata.num_rows} rows, its row groups hold {file_rows}",
        )
    return record, pieces


def _count_mismatch(path: str, group: int, row_group: Any, held: int) -> str:
    return (
        f"{path}: row group {group + 1}: the footer says {row_group.num_rows} rows, "
        f"the data holds {held}; nothing is registered"
    )


def check_request(uri: str, columns: list[str], settings: Settings) -> tuple[Location, str]:
    """What a registration can refuse without reading an object (in the request, 422): the
    columns, the URI's form, NUL bytes and containment under ``DPSS_REFERENCE_ROOTS``. The
    location and normalised path (resolved for a local path: ``realpath`` opens nothing)."""
    if not columns:
        raise InvalidInput("columns", "name at least one column")
    if any("\x00" in name for name in columns):
        raise InvalidInput("columns", "must not contain NUL characters")
    if len(set(columns)) != len(columns):
        raise InvalidInput("columns", "a column is named twice")
    if len(columns) > settings.max_cols:
        raise InvalidInput("columns", f"at most {settings.max_cols} are accepted (DPSS_MAX_COLS)")
    return _allowed_root(uri, settings)


def object_key(location: Location, path: str) -> str:
    """The name :meth:`Reference.covered` gives an object at ``path``."""
    return f"{location.protocol}://{path}"


def key_digest(key: str) -> str:
    return _sha256(key.encode())


def inspect(uri: str, columns: list[str], settings: Settings) -> Reference:
    """Read the footers and every value of ``columns`` under ``uri``; the :class:`Reference`
    to store. :class:`InvalidInput` names ``uri`` or ``columns``; nothing is kept either way."""
    location, path = check_request(uri, columns, settings)
    deadline = _Deadline(settings.reference_read_seconds)
    total = _Total(settings.max_dataset_bytes)
    fs = location.filesystem()
    fs.invalidate_cache()  # a listing cached by an earlier registration may be stale
    objects = _list_objects(fs, location, path, deadline)
    reference = Reference(uri=uri, location=location, columns=list(columns), objects=[])
    offset = 0
    for name in objects:
        deadline.check()
        try:
            record, pieces = _register_object(fs, location, name, columns, offset, deadline, total)
        except (InvalidInput, PayloadTooLarge):
            raise
        except NotRegular:
            raise InvalidInput("uri", f"{name} is not a regular file") from None
        except Exception as exc:
            raise InvalidInput(
                "uri", f"{name} is not a readable Parquet object ({_fault_name(exc)})"
            ) from None
        reference.objects.append(record)
        reference.pieces.extend(pieces)
        offset += sum(p.rows for p in pieces)
    if offset < 2:
        raise InvalidInput("uri", "the data needs at least 2 rows")
    first: dict[str, str] = {}
    for (_, _, content), record in zip(reference.covered(), reference.objects, strict=True):
        if content in first:  # a copy: its rows would count twice in one dataset
            raise InvalidInput("uri", f"{record['path']} holds the same data as {first[content]}")
        first[content] = str(record["path"])
    return reference


# -- the heavy passes -------------------------------------------------------------------------


def _read_piece(
    location: Location, piece: Piece, columns: Sequence[str], record: dict[str, Any]
) -> FloatArray:
    """The row group's rows, decoded only from bytes whose SHA-256 is the registered one, from
    a regular file opened at its registered place under the current roots (S3: the recorded
    version), and checked as registration checked them: else :class:`ReferenceFault`."""
    path = piece.path
    size = int(record["size"])
    length = int(record["footer_length"])
    try:
        with _Object(location, path, record.get("version"), size) as handle:
            if handle.size != size:
                raise ReferenceFault(CHANGED_REASON.format(path=path))
            footer = handle.read(size - length, length)
            if _sha256(footer) != record["footer_sha256"]:
                raise ReferenceFault(CHANGED_REASON.format(path=path))
            ranges: dict[int, bytes] = {}
            wanted = [(chunk.start, chunk.length) for chunk in piece.chunks]
            for chunk, data in zip(piece.chunks, _read_ranges(handle, wanted), strict=True):
                if _sha256(data) != chunk.sha256:
                    raise ReferenceFault(CHANGED_REASON.format(path=path))
                ranges[chunk.start] = data
    except ReferenceFault:
        raise
    except NotRegular:
        raise ReferenceFault(UNSAFE_REASON.format(path=path)) from None
    except (FileNotFoundError, EOFError):
        raise ReferenceFault(CHANGED_REASON.format(path=path)) from None
    except Exception as exc:
        raise ReferenceFault(UNREADABLE_REASON.format(path=path, kind=_fault_name(exc))) from None
    # From here on the bytes are the registered ones: a failure would depend on them, so it is
    # not refunded (it cannot happen unless this pyarrow decodes them unlike registration's).
    try:
        (table,) = _decode(_parse_footer(footer), size, ranges, piece.row_group, columns)
    except Exception:
        raise ReferenceFault(VALUES_REASON.format(path=path), refund=False) from None
    if table.num_rows != piece.rows or _bad_values(table, columns) is not None:
        raise ReferenceFault(VALUES_REASON.format(path=path), refund=False)
    return _matrix(table, columns)


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
        """``sum`` of ``task(location, piece, columns, *args)`` over the row groups, added in
        row-group order (a chain, so the order and the bits do not depend on the scheduler)."""
        from dask.delayed import delayed

        ref = self.reference
        total: Any = None
        for piece in ref.pieces:
            record = self.records[piece.path]
            part = delayed(task, pure=False)(ref.location, piece, ref.columns, record, *args)
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
                            ref.location,
                            piece,
                            ref.columns,
                            self.records[piece.path],
                            piece_slots,
                            bounds,
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
        naming the first difference. A cheap check of identities before and after the run; the
        bytes themselves are checked against their digests as each task reads them."""
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
                raise ReferenceFault(UNSAFE_REASON.format(path=path)) from None
            except FileNotFoundError:
                raise ReferenceFault(CHANGED_REASON.format(path=path)) from None
            except Exception as exc:
                raise ReferenceFault(
                    UNREADABLE_REASON.format(path=path, kind=_fault_name(exc))
                ) from None
            if any(recorded.get(key) != value for key, value in current.items()):
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
