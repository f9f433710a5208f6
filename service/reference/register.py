"""Registering a dataset by reference: every value of the chosen columns read, digested, checked.

:func:`inspect` (run by a worker as a job, see :mod:`service.registration`) lists the regular
``*.parquet`` objects under the URI, sorted by key (row ``i`` of the dataset is the ``i``-th row
of their row groups in that order), and per object reads the footer and the chosen columns'
chunks as byte ranges. Guarantees:

- every value is decoded from exactly the digested bytes and checked (numeric, not null,
  finite) one bounded batch at a time; the rows the data pages hold and the rows decoded must
  both equal the footer's count;
- the whole reference is bounded by ``DPSS_MAX_DATASET_BYTES`` (:class:`_Total`, checked from
  the footers before the bytes are read), a row group by :data:`MAX_ROW_GROUP_BYTES`, the reads
  by ``DPSS_REFERENCE_READ_SECONDS``;
- two objects with the same content are refused (their rows would count twice);
- a refusal is an :class:`~service.errors.InvalidInput` naming ``uri`` or ``columns`` (or a
  :class:`~service.errors.PayloadTooLarge`), and nothing is kept either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.config import Settings
from service.errors import InvalidInput, PayloadTooLarge
from service.reference.integrity import (
    _MAGIC,
    ALIASES,
    COLUMN_ALIASES,
    FILE_ID,
    ROW_MARKS,
    VALUE_DIGESTS,
    Chunk,
    ColumnValues,
    Piece,
    Reference,
    RowMarks,
    _bad_values,
    _check_schema,
    _footer,
    _sha256,
    checked_matrix,
    page_rows,
)
from service.reference.objects import (
    Location,
    NotRegular,
    _Deadline,
    _fault_name,
    _identity,
    _list_objects,
    _Object,
    _read_ranges,
    check_request,
)
from service.reference.reading import _chunk_range, _column_indices, _decode
from service.upload_formats import BLOCK_VALUES

#: The largest decoded row group (chosen columns): one Dask task's rows.
MAX_ROW_GROUP_BYTES = 256 * 1024 * 1024


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
        if handle.file_id is not None:
            record[FILE_ID] = handle.file_id
        record[ALIASES] = True
        record[COLUMN_ALIASES] = True
        footer, metadata = _footer(handle, size)
        record["footer_sha256"] = _sha256(footer)
        record["footer_length"] = len(footer)
        _check_schema(metadata.schema.to_arrow_schema(), columns, path)
        indices = _column_indices(metadata, columns)
        data_end = size - len(footer)
        batch_rows = max(1, BLOCK_VALUES // max(1, len(columns)))
        file_rows = 0
        values = [ColumnValues() for _ in columns]
        marks = RowMarks()
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
                matrix = checked_matrix(batch, columns)
                bad = _bad_values(batch, columns) if matrix is None else None
                if bad is not None and bad[0] == "columns":
                    raise InvalidInput("columns", f"{bad[1]} in {path}")
                if bad is not None:  # the row counted from the object's first row
                    row = file_rows + rows + int(bad[1].rsplit(" ", 1)[1])
                    raise InvalidInput("uri", f"{path}: {bad[1].rsplit(' ', 1)[0]} {row}")
                if matrix is None:  # refused by one check, never by the other: refuse it all
                    raise InvalidInput("uri", f"{path}: a value could not be checked")
                for column, held in zip(values, matrix.T, strict=True):
                    column.add(held)
                marks.add(matrix)
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
    record[VALUE_DIGESTS] = [column.digest() for column in values]
    record[ROW_MARKS] = marks.names()
    return record, pieces


def _path_of(key: str) -> str:
    """The path (or bucket and key) an object key names."""
    return key.split("://", 1)[1]


def _count_mismatch(path: str, group: int, row_group: Any, held: int) -> str:
    return (
        f"{path}: row group {group + 1}: the footer says {row_group.num_rows} rows, "
        f"the data holds {held}; nothing is registered"
    )


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
    for _key, key_sha, content, named in reference.covered_named():
        # A copy, the same columns in another order, or a hard link to the same file: its
        # rows would count twice in one dataset.
        for seen in (key_sha, content):
            if seen in first and first[seen] != named:
                raise InvalidInput("uri", f"{_path_of(named)} holds the same data as {first[seen]}")
            first.setdefault(seen, _path_of(named))
    return reference
