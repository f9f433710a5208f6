"""Decoding the chosen column chunks of one row group into a block of rows, from verified bytes.

Guarantees:

- **What is decoded is what was digested.** pyarrow decodes from :class:`_Ranges`, a file that
  holds only the verified byte ranges of the chosen column chunks (and the footer passed as
  parsed metadata): a read outside them is an error, at registration already, since
  registration decodes through the same path (:func:`_decode`).
- **A release reads what was registered or nothing** (:func:`_read_piece`): the object opened
  at its registered place under the current roots (S3: the recorded version), the footer and
  every chunk compared with their digests before anything is decoded, then the rows counted
  and checked as registration checked them. A difference found by digests or by opening is a
  refunded :class:`~service.reference.integrity.ReferenceFault` (its object named in the log
  only); a failure once the bytes are the registered ones would depend on them, so it is not
  refunded.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from service.mechanisms.linalg import FloatArray
from service.reference.integrity import (
    CHANGED_REASON,
    UNREADABLE_REASON,
    UNSAFE_REASON,
    VALUES_REASON,
    Piece,
    ReferenceFault,
    _parse_footer,
    _sha256,
    checked_matrix,
    object_fault,
)
from service.reference.objects import Location, NotRegular, _fault_name, _Object, _read_ranges


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


def _verified(
    location: Location, piece: Piece, record: dict[str, Any]
) -> tuple[bytes, dict[int, bytes], int]:
    """The row group's footer and chosen column chunks (by start) and the object's size, read
    from a regular file opened at its registered place under the current roots (S3: the
    recorded version), each compared with its registered SHA-256: else
    :class:`ReferenceFault` (:func:`~service.reference.integrity.object_fault`)."""
    path = piece.path
    size = int(record["size"])
    length = int(record["footer_length"])
    try:
        with _Object(location, path, record.get("version"), size) as handle:
            if handle.size != size:
                raise object_fault(CHANGED_REASON, path=path)
            footer = handle.read(size - length, length)
            if _sha256(footer) != record["footer_sha256"]:
                raise object_fault(CHANGED_REASON, path=path)
            ranges: dict[int, bytes] = {}
            wanted = [(chunk.start, chunk.length) for chunk in piece.chunks]
            for chunk, data in zip(piece.chunks, _read_ranges(handle, wanted), strict=True):
                if _sha256(data) != chunk.sha256:
                    raise object_fault(CHANGED_REASON, path=path)
                ranges[chunk.start] = data
    except ReferenceFault:
        raise
    except NotRegular:
        raise object_fault(UNSAFE_REASON, path=path) from None
    except (FileNotFoundError, EOFError):
        raise object_fault(CHANGED_REASON, path=path) from None
    except Exception as exc:
        raise object_fault(UNREADABLE_REASON.format(kind=_fault_name(exc)), path=path) from None
    return footer, ranges, size


def verify_piece(location: Location, piece: Piece, record: dict[str, Any]) -> None:
    """Check the row group's bytes against their digests, decoding nothing (the re-check of
    :mod:`service.reference_recheck`): :class:`ReferenceFault` if any differs."""
    _verified(location, piece, record)


def _read_piece(
    location: Location, piece: Piece, columns: Sequence[str], record: dict[str, Any]
) -> FloatArray:
    """The row group's rows, decoded only from bytes whose SHA-256 is the registered one
    (:func:`_verified`), and checked as registration checked them: else
    :class:`ReferenceFault`."""
    path = piece.path
    footer, ranges, size = _verified(location, piece, record)
    # From here on the bytes are the registered ones: a failure would depend on them, so it is
    # not refunded (it cannot happen unless this pyarrow decodes them unlike registration's).
    try:
        (table,) = _decode(_parse_footer(footer), size, ranges, piece.row_group, columns)
    except Exception:
        raise ReferenceFault(VALUES_REASON, refund=False, path=path) from None
    matrix = checked_matrix(table, columns) if table.num_rows == piece.rows else None
    if matrix is None:
        raise ReferenceFault(VALUES_REASON, refund=False, path=path)
    return matrix
