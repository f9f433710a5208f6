"""What a dataset by reference is bound to: the digests, the counts and the values checked.

Guarantees:

- **The record** (:class:`Reference`, stored as ``datasets.reference``): per object its identity
  and the SHA-256 of its footer; per row group (:class:`Piece`) the byte range and SHA-256 of
  each chosen column chunk (:class:`Chunk`). :meth:`Reference.covered` names each object's key
  and content by digest, so one object cannot back two live datasets.
- **Footers are bounded before they are read** (:func:`_footer`: at most
  :data:`MAX_FOOTER_BYTES`, inside the object, behind the Parquet magic).
- **Counts are not taken on trust.** A footer's row counts are claims; :func:`page_rows` walks a
  column chunk's page headers (Thrift compact protocol, depth-bounded, total on any bytes: a
  malformed header is a ``ValueError``) and counts the rows its data pages hold, and the pages
  must fill the chunk exactly.
- **Values**: :func:`_check_schema` admits numeric columns only, and :func:`_bad_values` refuses
  a null or a non-finite value; the same check runs at registration and on every row group a
  release reads.
- **Faults** (:class:`ReferenceFault`) carry fixed reasons that name neither the object (its
  location is for the log) nor a value, and say whether the release is refunded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from service.config import Settings
from service.errors import InvalidInput
from service.mechanisms.linalg import FloatArray
from service.reference.objects import Location, _Object, _roots, object_key

#: ``datasets.file_name`` of a dataset by reference: not a file of the store (null still means
#: deleted, so every check of a live dataset holds unchanged).
REFERENCE_FILE_NAME = "(by reference)"
# A release's reason is shown to the analyst who asked for it: it names no object (a bucket and
# key, or a path, hands its reader the location of the raw rows). The object goes to the
# worker's log (:attr:`ReferenceFault.path`), which only operators read.
CHANGED_REASON = "a referenced object changed since registration; nothing was released"
UNREADABLE_REASON = "a referenced object could not be read ({kind}); nothing was released"
UNSAFE_REASON = (
    "a referenced object is no longer a regular file at its registered path under "
    "DPSS_REFERENCE_ROOTS; nothing was released"
)
LEGACY_REASON = (
    "this dataset was registered before content digests were recorded; register it again"
)
VALUES_REASON = (
    "the values read from a referenced object differ from the registered ones; nothing was released"
)
#: The largest Parquet footer read (its length is the file's claim, so it is bounded first).
MAX_FOOTER_BYTES = 64 * 1024 * 1024
_MAGIC = b"PAR1"


class ReferenceFault(Exception):
    """A release on a dataset by reference that cannot complete: the worker ends it ``failed``
    with :attr:`reason`, refunded when :attr:`refund` (nothing released and the fault decided
    by something other than the registered values and the moment of the owner's changes: a
    cluster lost before any task was submitted; a changed object is :func:`object_fault`)."""

    def __init__(self, reason: str, refund: bool = True, path: str | None = None) -> None:
        super().__init__(reason, refund)
        self.reason = reason
        self.refund = refund
        #: The object at fault, for the worker's log only (never in :attr:`reason`).
        self.path = path


def object_fault(reason: str, path: str) -> ReferenceFault:
    """A fault found in the owner's object (changed, gone, no longer a regular file,
    unreadable): never refunded. Whether a job met it depends on whether the job read before
    or after the owner's change, that is on when a worker claimed it, that is on when the job
    ahead of it in the shared queue (on any dataset) ended; a refund would show that on the
    ledger. What analysts and owners see of the outcome is decided by the re-check at a public
    moment (:mod:`service.reference_recheck`), which charges both ways alike."""
    return ReferenceFault(reason, refund=False, path=path)


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


#: An object record's field: the local file itself, ``st_dev:st_ino`` of the descriptor read at
#: registration (a hard link or a bind mount reaches the same file by another resolved path).
FILE_ID = "file_id"
#: An object record's field, true for objects registered since their aliases are covered
#: (:meth:`Reference.covered_named`); older records are covered as they were registered, so
#: that their stored cover rows still match them (``dpss audit verify``).
ALIASES = "covers_aliases"
#: An object record's field, true for objects registered since each chosen column of a copy is
#: covered (:meth:`Reference.covered_named`'s ``column://``); older records keep the rows
#: they were registered with (``dpss audit verify`` matches them).
COLUMN_ALIASES = "covers_columns"
#: An object record's field (objects registered since the chosen columns' values are covered):
#: per chosen column, the SHA-256 of its values as float64 in row order (:class:`ColumnValues`),
#: or None for a column too plain to name its rows (:meth:`ColumnValues.digest`).
VALUE_DIGESTS = "column_values_sha256"
#: A column's values name its rows (:meth:`ColumnValues.digest`) when more than this many
#: distinct values, or at least this many rows off its most common value, are held.
VALUE_ALIAS_ROWS = 128


class ColumnValues:
    """One chosen column of one object, fed in row order at registration: the SHA-256 of its
    values as little-endian float64 (``-0.0`` as ``0.0``), and what decides whether they are
    a name for its rows (:meth:`digest`).

    Why: every other name of an object is bytes (its path, its inode, its footer and chunk
    digests), and bytes are cheap to change with the rows kept: a column renamed, the other
    columns dropped or reordered, key-value metadata added (a new footer over the very same
    chunks), or the rows written again with another compression, row-group size, encoding,
    page version or integer width. The values, decoded as a release decodes them, stay."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.rows = 0
        self._last: float | None = None
        self._step: float | None = None
        self._progression = True
        self._rising = True
        self._falling = True
        self._counts: dict[float, int] | None = {}

    def add(self, values: FloatArray) -> None:
        if not len(values):
            return
        values = np.ascontiguousarray(values, dtype="<f8") + 0.0  # -0.0 + 0.0 is 0.0
        self._hash.update(values.data)
        # The order matters only while the column may still be a progression, or sorted with
        # few distinct values (:meth:`digest`); most columns are neither after one batch.
        ordered = self._counts is not None and (self._rising or self._falling)
        joined = values if self._last is None else np.concatenate(([self._last], values))
        diffs = np.diff(joined) if self._progression or ordered else joined[:0]
        if diffs.size:
            self._rising = self._rising and not bool((diffs < 0).any())
            self._falling = self._falling and not bool((diffs > 0).any())
            if self._progression:
                step = float(diffs[0]) if self._step is None else self._step
                # A grid computed in floating point (``start + i * step``) differs from an
                # exact progression by a few ulps of its values: far inside this tolerance.
                self._progression = bool((np.abs(diffs - step) <= 1e-9 * abs(step)).all())
                self._step = step
        self._last = float(values[-1])
        self.rows += len(values)
        if self._counts is not None and len(np.unique(values[:1024])) > VALUE_ALIAS_ROWS:
            self._counts = None  # found in a slice of the batch, without sorting all of it
        if self._counts is not None:
            distinct, counts = np.unique(values, return_counts=True)
            if len(distinct) <= VALUE_ALIAS_ROWS:  # else merging would loop over a batch
                for value, count in zip(distinct.tolist(), counts.tolist(), strict=True):
                    self._counts[value] = self._counts.get(value, 0) + count
            if len(distinct) > VALUE_ALIAS_ROWS or len(self._counts) > VALUE_ALIAS_ROWS:
                self._counts = None  # enough distinct values: no need to count further

    def digest(self) -> str | None:
        """The values' SHA-256, or None when they are too plain to name these rows rather
        than any rows of that count: an arithmetic progression (a constant, a row index, a
        grid: public given ``n``), or at most :data:`VALUE_ALIAS_ROWS` distinct values either
        sorted (fixed by a few counts) or with fewer than :data:`VALUE_ALIAS_ROWS` rows off
        the most common value (a rare flag in a small object). Otherwise at least ``2^64``
        sequences have the column's value counts, so an unrelated column holds the same by
        chance with negligible odds, whereas a refusal on a plain column would refuse an
        unrelated dataset (two objects of one count with a constant column)."""
        if self._progression:
            return None
        if self._counts is not None:
            off_mode = self.rows - max(self._counts.values())
            if self._rising or self._falling or off_mode < VALUE_ALIAS_ROWS:
                return None
        return self._hash.hexdigest()


#: An object record's field (objects registered since rows are marked): the names of a public,
#: order-free sample of its rows (:class:`RowMarks`), covered as ``row://`` aliases.
ROW_MARKS = "row_marks_sha256"
#: A row is sampled when its public 64-bit hash is below ``2^(64 - ROW_MARK_BITS)``: about one
#: row in 256, so an object of a few thousand rows has several marks.
ROW_MARK_BITS = 8
#: At most this many marks per object: the sampled rows with the smallest hashes (a bottom-k
#: sample, so the same rows in any order, or any part of them, keep the same smallest ones).
ROW_MARKS_KEPT = 64
#: A sampled row names a person only when its values, as float32, need at least this many
#: decimals in all (each counted up to :data:`ROW_MARK_DECIMALS`; an integer needs none).
ROW_MARK_WEIGHT = 12
#: The most decimals one value counts for (a float32 holds about 7 significant digits).
ROW_MARK_DECIMALS = 8
_MIX = np.uint64(0x9E3779B97F4A7C15)
_MIX2 = np.uint64(0xBF58476D1CE4E5B9)
_SAMPLED = np.uint64(1 << (64 - ROW_MARK_BITS))


def _row_hash(columns: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A public 64-bit hash of each row's float32 bits, in column order, from the columns
    (``d x n``, each contiguous: one pass per column): a multiply-xorshift mix, a sample and
    not a name (the name is the SHA-256 of the same bytes)."""
    out = np.full(columns.shape[1], np.uint64(0x243F6A8885A308D3))
    for column in columns.view("<u4"):
        out ^= column
        out *= _MIX
        out ^= out >> np.uint64(31)
    out *= _MIX2
    out ^= out >> np.uint64(29)
    return out


def _decimals(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Per float32 value, the fewest decimals that write it (``round(v, d)`` back to float32
    is ``v``), at most :data:`ROW_MARK_DECIMALS`; 0 for an integer (of any magnitude)."""
    wide = values.astype(np.float64)
    out = np.full(values.shape, ROW_MARK_DECIMALS)
    for decimals in range(ROW_MARK_DECIMALS - 1, -1, -1):
        exact = np.round(wide, decimals).astype(np.float32) == values
        out[exact] = decimals
    return out


class RowMarks:
    """An order-free name of one object's rows, fed in row order at registration with the
    chosen columns' values (:meth:`add`): the SHA-256 of a public sample of its rows.

    Each row is its chosen values in the registered column order, rounded to float32 (so a
    copy written as float32 is the same row), ``-0.0`` as ``0.0``, little-endian. A row is
    sampled when a public hash of those bytes is below a fixed threshold (about one in
    ``2^ROW_MARK_BITS``), and the :data:`ROW_MARKS_KEPT` sampled rows with the smallest
    hashes are kept. Whether a row is sampled depends on the row alone, so the same rows
    permuted keep every mark, a part of them (split across objects) keeps its share, a merge
    keeps the parts' marks, and a row added, dropped or changed moves at most one mark.

    A row too plain to name a person in unrelated datasets is never a mark (public rule):
    one whose values need fewer than :data:`ROW_MARK_WEIGHT` decimals in all (every value an
    integer, of any magnitude; a single column; two columns of cents), or one held more than
    once in the object (a common answer)."""

    def __init__(self) -> None:
        # Sampled rows (bytes) -> [hash, count, weight]: about one row in 2^ROW_MARK_BITS.
        self._sampled: dict[bytes, list[int]] = {}

    def add(self, matrix: FloatArray) -> None:
        if not matrix.size:
            return
        # Column by column (the batch is row-major): one strided pass to cast, then each
        # column's hash pass contiguous. -0.0 + 0.0 is 0.0.
        columns = np.ascontiguousarray(matrix.T, dtype="<f4") + np.float32(0.0)
        hashes = _row_hash(columns)
        picked = np.flatnonzero(hashes < _SAMPLED)
        if not picked.size:
            return
        chosen = np.ascontiguousarray(columns[:, picked].T)
        weights = np.minimum(_decimals(chosen), ROW_MARK_DECIMALS).sum(axis=1)
        pairs = zip(chosen, hashes[picked].tolist(), weights.tolist(), strict=True)
        for row, hashed, weight in pairs:
            held = self._sampled.setdefault(row.tobytes(), [int(hashed), 0, int(weight)])
            held[1] += 1

    def names(self) -> list[str]:
        """The kept marks' SHA-256, smallest hash first (the same for the rows in any order)."""
        kept = sorted(
            (hashed, row)
            for row, (hashed, count, weight) in self._sampled.items()
            if count == 1 and weight >= ROW_MARK_WEIGHT
        )[:ROW_MARKS_KEPT]
        return [_sha256(b"row\n" + row) for _, row in kept]


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
    def from_json(cls, raw: dict[str, Any], settings: Settings | None) -> Reference:
        """The stored record; without ``settings`` (verification, which opens nothing) its
        location has no endpoint and no roots."""
        protocol = str(raw["protocol"])
        endpoint = settings.s3_endpoint_url if protocol == "s3" and settings else None
        roots = _roots(settings, protocol) if settings is not None else ()
        pieces = []
        for entry in raw["pieces"]:
            chunks = tuple(
                Chunk(int(a), int(b), str(c)) for a, b, c in (entry[4] if len(entry) > 4 else [])
            )
            pieces.append(Piece(str(entry[0]), int(entry[1]), int(entry[2]), int(entry[3]), chunks))
        return cls(
            uri=str(raw["uri"]),
            location=Location(protocol, endpoint, roots),
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
        footer's digest and its row groups' chunk digests, in order); and, for an object
        registered since aliases are covered (:data:`ALIASES`), the names of the same object
        that its path and columns do not give (:meth:`covered_named`)."""
        return [(key, key_sha, content) for key, key_sha, content, _ in self.covered_named()]

    def covered_named(self) -> list[tuple[str, str, str, str]]:
        """:meth:`covered` with, last, the object key each row stands for (the name a refusal
        gives). Per object, in order: its path, then its aliases:

        - ``content-set://``: the footer's digest with the chunk digests *sorted*: the same
          object's bytes read as the same columns in another order (a copy, a link) are the
          same rows;
        - ``file-id://dev:inode/footer`` (local files): the file itself, whatever path reaches
          it (a hard link, a bind mount: ``realpath`` does not merge them), whichever columns.
          With the footer's digest: a file system reuses a deleted file's inode, so the inode
          alone would refuse an unrelated new file once an owner removed a registered one.
        - ``column://`` (objects registered since :data:`COLUMN_ALIASES`), one per chosen
          column: the footer's digest with that column's chunks (place and digest, row group
          by row group). A byte copy (an S3 copy, a file copied or renamed on another device),
          which has no inode in common, registered with *some* of the columns, or others
          besides, shares it: the same values of the same rows, refused as the whole copy is.
        - ``values://`` (objects registered since :data:`VALUE_DIGESTS`), one per chosen
          column that names its rows (:meth:`ColumnValues.digest`): the column's values in
          row order, whatever bytes hold them. The same rows written again (a column renamed,
          others dropped, another compression, row-group size or encoding, an integer column
          widened or made float) share it; rows permuted, split across other objects, or
          changed in any value do not (docs/security.md says what is not covered).
        - ``row://`` (objects registered since :data:`ROW_MARKS`), one per kept mark
          (:class:`RowMarks`): a public sample of the rows, whatever their order, so the
          same rows permuted, split across objects, merged into one, with a row added,
          dropped or changed, or written as float32, share some. Once per reference: one
          row held by two of its objects is named by the first.
        """
        marked: set[str] = set()
        chunks: dict[str, list[str]] = {}
        columns: dict[str, list[list[str]]] = {}
        for piece in self.pieces:
            chunks.setdefault(piece.path, []).extend(c.sha256 for c in piece.chunks)
            per_column = columns.setdefault(piece.path, [[] for _ in piece.chunks])
            for held, chunk in zip(per_column, piece.chunks, strict=False):
                held.append(f"{chunk.start}:{chunk.length}:{chunk.sha256}")
        out = []
        for record in self.objects:
            path = str(record["path"])
            key = object_key(self.location, path)
            digests = chunks.get(path, [])
            content = "\n".join([str(record["footer_sha256"]), *digests])
            out.append((key, _sha256(key.encode()), _sha256(content.encode()), key))
            if not record.get(ALIASES):
                continue  # registered before aliases were covered: its rows as recorded then
            as_set = _sha256("\n".join([str(record["footer_sha256"]), *sorted(digests)]).encode())
            aliases = [f"content-set://{as_set}"]
            if record.get(FILE_ID):
                aliases.append(f"file-id://{record[FILE_ID]}/{record['footer_sha256']}")
            if record.get(COLUMN_ALIASES):
                aliases.extend(
                    f"column://{record['footer_sha256']}/{_sha256(' '.join(held).encode())}"
                    for held in columns.get(path, [])
                )
            # Once each: two chosen columns of one object may hold the same values (a column
            # and its copy), and a cover row's names are unique.
            aliases.extend(
                f"values://{value}"
                for value in dict.fromkeys(record.get(VALUE_DIGESTS) or [])
                if value
            )
            for mark in record.get(ROW_MARKS) or []:
                if mark not in marked:
                    marked.add(mark)
                    aliases.append(f"row://{mark}")
            for alias in aliases:
                # Distinct from every object's content digest by its prefix: the row's content
                # column must be unique too.
                tag = _sha256(f"alias\n{alias}".encode())
                out.append((alias, _sha256(alias.encode()), tag, key))
        return out

    @property
    def digested(self) -> bool:
        """Whether every object's footer and every piece's chunks carry a digest (datasets
        registered before digests were recorded do not, and are refused at release)."""
        return all("footer_sha256" in o for o in self.objects) and all(
            len(p.chunks) == len(self.columns) for p in self.pieces
        )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def key_digest(key: str) -> str:
    return _sha256(key.encode())


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


def checked_matrix(table: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> FloatArray | None:
    """The table's rows as float64, or None when registration's check (:func:`_bad_values`)
    would refuse them: a null, or a non-finite value. The same decision as registration's, in
    one conversion: every value is finite iff the matrix's minimum and maximum are (NaN
    propagates through both, an infinity is one of them), so a release builds the rows once
    and allocates nothing besides (no boolean matrix, no second copy)."""
    if any(table.column(name).null_count for name in columns):
        return None
    matrix = _matrix(table, columns)
    if matrix.size and not (np.isfinite(matrix.min()) and np.isfinite(matrix.max())):
        return None
    return matrix


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
