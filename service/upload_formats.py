"""Upload formats: CSV, ``.npy`` and Parquet files decoded block by block into float64 rows.

Each reader yields blocks of at most :data:`BLOCK_VALUES` values (and, with a privacy unit
column, the block's identifier values, which are never stored as features). Widths are read
from the CSV's first row, the ``.npy`` header or the Parquet schema and refused above the public
column limit before any row is decoded; decoded sizes are checked against
``DPSS_MAX_DATASET_BYTES`` from the header or footer (:class:`Limits`). Error messages name the
problem and a row or column number, never a value from the file. :mod:`service.store` writes
what these readers yield into the store.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from service.errors import InvalidInput, PayloadTooLarge, size_text
from service.privacy_unit import FIELD as UNIT_FIELD
from service.privacy_unit import visible_text

#: What an owner does about a missing or non-finite value: the service neither drops nor fills
#: rows (either would change what the budget protects without the owner's say).
FIX_MISSING_VALUES = (
    "; remove those rows, or fill the values with public constants (not statistics of the "
    "rows), before uploading: the service neither drops nor fills values"
)
#: Values converted per block (32 MiB of float64): bounded memory for any upload and width.
BLOCK_VALUES = 4 * 1024 * 1024
#: Larger CSV blocks make pyarrow faster; this bounds one block's raw text, and so one row.
CSV_BLOCK_BYTES = 16 * 1024 * 1024
#: The largest Parquet footer (schema and row-group metadata) read into memory.
MAX_PARQUET_FOOTER_BYTES = 64 * 1024 * 1024
#: The largest decoded Parquet column chunk (one column of one row group), as the file declares
#: it: a small, highly compressed chunk could otherwise decode into gigabytes.
MAX_PARQUET_CHUNK_BYTES = 256 * 1024 * 1024
#: The default of ``DPSS_MAX_COLS``.
DEFAULT_MAX_COLS = 10_000
#: The default of ``DPSS_MAX_DATASET_BYTES`` (512 MiB of float64).
DEFAULT_MAX_DATASET_BYTES = 512 * 1024**2
#: A block of rows and, with a privacy unit column, its identifier values (never stored).
Block = tuple[np.ndarray[Any, Any], list[Any] | np.ndarray[Any, Any] | None]
UnitColumn = str | int | None
_UTF8_BOM = b"\xef\xbb\xbf"


def _rows_per_block(n_cols: int) -> int:
    return max(1, BLOCK_VALUES // max(1, n_cols))


def _check_width(n_cols: int, max_cols: int) -> None:
    if n_cols > max_cols:
        raise InvalidInput(
            "file",
            f"the data has {n_cols} columns; at most {max_cols} are accepted (DPSS_MAX_COLS)",
        )


@dataclass(frozen=True)
class Limits:
    """The public bounds an upload is decoded under."""

    max_cols: int = DEFAULT_MAX_COLS
    #: Most bytes of the decoded float64 matrix, ``n x d x 8``.
    max_bytes: int = DEFAULT_MAX_DATASET_BYTES

    def check_size(self, n_rows: int, n_cols: int, what: str = "the data") -> None:
        """:class:`PayloadTooLarge` if ``n_rows x n_cols`` float64 values exceed ``max_bytes``."""
        if n_rows * n_cols * 8 > self.max_bytes:
            raise PayloadTooLarge(
                f"file: {what} would decode to more than {self.max_bytes} bytes "
                f"({n_rows} rows x {n_cols} columns x 8 bytes; DPSS_MAX_DATASET_BYTES)"
            )


def _unit_index(column: UnitColumn, n_cols: int, names: list[str] | None, kind: str) -> int:
    """The 0-based position of the identifier column among ``n_cols`` columns."""
    if isinstance(column, int):
        if column >= n_cols:
            raise InvalidInput(
                UNIT_FIELD, f"column index {column} is beyond the file's {n_cols} columns"
            )
        position = column
    else:
        if names is None:
            raise InvalidInput(
                UNIT_FIELD, f"{kind} has no column names: give the column's 0-based index"
            )
        if names.count(str(column)) != 1:
            raise InvalidInput(
                UNIT_FIELD, "no column of that name (or several) in the file's header"
            )
        position = names.index(str(column))
    if n_cols < 2:
        raise InvalidInput(UNIT_FIELD, "the file needs a feature column besides the identifier")
    return position


def _split_unit(block: np.ndarray[Any, Any], position: int | None) -> Block:
    if position is None:
        return block, None
    return np.delete(block, position, axis=1), block[:, position]


def _check_narrow_float_ids(ids: np.ndarray[Any, Any]) -> None:
    """Refuse a float32 or float16 identifier column unless it holds integers its format holds
    exactly (below ``2^24``, ``2^11``). Such a float has no one spelling: ``0.1`` stored in it
    is ``0.10000000149`` as a number, and beyond that range it is the rounding of several
    integers, so the person written ``0.1`` (or ``16777217``) in a CSV batch would become a
    second unit, bounded apart. The message names no value."""
    if ids.dtype.kind != "f" or ids.dtype.itemsize >= 8 or ids.size == 0:
        return
    exact = 2 ** (np.finfo(ids.dtype).nmant + 1)
    wide = np.asarray(ids, dtype=np.float64)
    if not (np.all(wide == np.trunc(wide)) and np.all(np.abs(wide) < exact)):
        bits = 8 * ids.dtype.itemsize
        raise InvalidInput(
            UNIT_FIELD,
            f"the identifier column is a {bits}-bit float holding a value that is not an "
            f"integer below 2^{exact.bit_length() - 1}: such a float has no one spelling (one "
            "person could become two units), so write identifiers as text or integers",
        )


@dataclass(frozen=True)
class NpyHeader:
    """What an uploaded ``.npy`` file's header declares, checked against its body."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    data_offset: int


def _read_npy_header(
    handle: BinaryIO,
) -> tuple[tuple[int, int], tuple[int, ...], bool, np.dtype[Any]]:
    """``(version, shape, fortran_order, dtype)`` of the ``.npy`` open at its start, leaving
    ``handle`` at the first value (numpy's own header readers: 1.0, else 2.0's layout)."""
    version = np.lib.format.read_magic(handle)
    read = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read(handle)
    return version, shape, fortran, dtype


def npy_header(path: Path) -> NpyHeader:
    """The header of an uploaded ``.npy``, read before any value (422 on ``file``).

    A header numpy cannot parse (its parser raises more than ``ValueError``: a tokenizer or
    syntax error), a dtype that holds Python objects, a negative size, or a body longer or
    shorter than the declared shape is refused here, so that nothing is ever allocated from a
    declared shape the body does not hold and no byte the owner sent is silently dropped.
    """
    try:
        with open(path, "rb") as handle:
            version, shape, _fortran, dtype = _read_npy_header(handle)
            if version not in ((1, 0), (2, 0), (3, 0)):
                raise ValueError("unknown .npy version")
            offset = handle.tell()
    except Exception:
        raise InvalidInput("file", "not a readable .npy file (its header is not valid)") from None
    if dtype.hasobject:
        raise InvalidInput(
            "file", "not a .npy array file, or it holds Python objects (refused: no pickles)"
        )
    if any(size < 0 for size in shape):
        raise InvalidInput("file", "the .npy header declares a negative size")
    declared = dtype.itemsize
    for size in shape:
        declared *= int(size)  # Python integers: no overflow however large the claim
    body = path.stat().st_size - offset
    if body != declared:
        raise InvalidInput(
            "file",
            f"the .npy header declares {declared} bytes of values but {body} follow it "
            "(a truncated or padded file)",
        )
    return NpyHeader(tuple(int(size) for size in shape), dtype, offset)


def _npy_blocks(path: Path, limits: Limits, unit_column: UnitColumn = None) -> Iterator[Block]:
    npy_header(path)
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc) or "object" in str(exc):
            raise InvalidInput(
                "file", "not a .npy array file, or it holds Python objects (refused: no pickles)"
            ) from None
        raise InvalidInput("file", "not a readable .npy file") from None
    except Exception:
        raise InvalidInput("file", "not a readable .npy file") from None
    if array.ndim != 2:
        raise InvalidInput(
            "file",
            f"the .npy array must be 2-D (it has {array.ndim} "
            f"dimension{'' if array.ndim == 1 else 's'})",
        )
    if array.dtype.kind not in "biuf":
        raise InvalidInput("file", f"the .npy array must be numeric (its dtype is {array.dtype})")
    if array.shape[1] < 1:
        raise InvalidInput("file", "the data has no columns")
    _check_width(array.shape[1], limits.max_cols)
    limits.check_size(array.shape[0], array.shape[1])
    position = None
    if unit_column is not None:
        position = _unit_index(unit_column, array.shape[1], None, "a .npy file")
    rows = _rows_per_block(array.shape[1])
    for start in range(0, array.shape[0], rows):
        block = array[start : start + rows]
        if position is None:
            yield np.asarray(block, dtype=np.float64), None
        else:
            ids = np.array(block[:, position])
            if ids.dtype.kind == "f" and not np.isfinite(ids).all():
                raise InvalidInput(UNIT_FIELD, "the identifier column has a NaN or infinity")
            _check_narrow_float_ids(ids)
            yield np.asarray(np.delete(block, position, axis=1), dtype=np.float64), ids


#: A field between double quotes (quotes inside doubled): commas in it separate nothing.
_QUOTED_FIELD = re.compile(rb'"(?:[^"]|"")*"')


def _csv_first_row(
    path: Path, max_cols: int, unit_column: UnitColumn = None
) -> tuple[int, bool, list[str]]:
    """The width of the first row and whether it is a header (any cell not a number).

    Memory is bounded by one CSV block and the column limit: the width is counted on the raw
    line (commas outside quotes) before any cell is built, so a row of hundreds of thousands of
    columns is refused without making them; the cells are then parsed by pyarrow, the parser of
    the data (no field-size limit like the csv module's). A UTF-8 byte-order mark is not part
    of the first cell.
    """
    with open(path, "rb") as handle:
        line = handle.readline(CSV_BLOCK_BYTES + 1)
    if len(line) > CSV_BLOCK_BYTES:
        raise InvalidInput("file", f"the first row is longer than {size_text(CSV_BLOCK_BYTES)}")
    if line.startswith(_UTF8_BOM):
        line = line[len(_UTF8_BOM) :]
    if not line.strip(b"\r\n"):
        return 0, False, []
    _check_width(_QUOTED_FIELD.sub(b"", line).count(b",") + 1, max_cols)
    if not line.endswith(b"\n"):
        # The file's only line, without a line end: pyarrow infers no columns from a block
        # with no complete line ("Empty CSV file or block"), where the data reader reads it.
        line += b"\n"
    try:
        table = pa_csv.read_csv(
            io.BytesIO(line), read_options=pa_csv.ReadOptions(autogenerate_column_names=True)
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise InvalidInput("file", _describe_first_row(line)) from None
    # An empty or NaN-like cell (pyarrow's null) says nothing; the data parser refuses it later.
    # A named identifier column means a header; an identifier given by index may be text in
    # every row, so it is left out of the test.
    cells = [str(table.column(i)[0]) for i in range(table.num_columns)]
    numeric = [
        pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t)
        for t in table.schema.types
    ]
    if isinstance(unit_column, int) and unit_column < len(numeric):
        numeric[unit_column] = True
    header = not all(numeric) or (isinstance(unit_column, str) and unit_column in cells)
    return table.num_columns, header, cells


def _describe_first_row(line: bytes) -> str:
    """Why the first row did not parse, by row and column and without any of its cells: a
    quoted field not closed is named by its column (a file cut short in it, or a stray
    quote)."""
    unquoted = _QUOTED_FIELD.sub(b"", line)
    if unquoted.count(b'"') % 2:
        column = unquoted[: unquoted.rindex(b'"')].count(b",") + 1
        return (
            f"row 1, column {column}: a quoted field is not closed (is the file cut short, "
            "or a quote stray?)"
        )
    return "row 1: not a readable numeric CSV row"


def _csv_blocks(path: Path, limits: Limits, unit_column: UnitColumn = None) -> Iterator[Block]:
    width, header, first_cells = _csv_first_row(path, limits.max_cols, unit_column)
    if width < 1:
        raise InvalidInput("file", "the CSV file is empty")
    _check_width(width, limits.max_cols)
    position = None
    if unit_column is not None:
        position = _unit_index(
            unit_column, width, first_cells if header else None, "this CSV file (no header)"
        )
    names = [f"c{i}" for i in range(width)]
    types = {name: pa.float64() for name in names}
    if position is not None:
        # Identifiers are read as text, as the owner wrote them; the store's rule
        # (privacy_unit.person_key) then makes "7", "7.0" and a Parquet 7 one person.
        types[names[position]] = pa.string()
    read_options = pa_csv.ReadOptions(
        column_names=names, skip_rows=1 if header else 0, block_size=CSV_BLOCK_BYTES
    )
    convert_options = pa_csv.ConvertOptions(column_types=types, strings_can_be_null=False)
    try:
        reader = pa_csv.open_csv(path, read_options=read_options, convert_options=convert_options)
        for batch in reader:
            yield _batch_with_unit(batch, position)
    except InvalidInput:
        raise
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        if header and "Could not skip initial" in str(exc):
            # A header without a line end and nothing after it (the first row, within a
            # block, was checked above): no data rows, as with a line end.
            return
        raise InvalidInput("file", _describe_csv_error(str(exc))) from None
    except StopIteration:
        return


def _describe_csv_error(message: str) -> str:
    """Turn pyarrow's CSV error into a message without any of the file's contents."""
    widths = re.search(r"Expected (\d+) columns, got (\d+)", message)
    if widths:
        return f"rows have inconsistent widths (expected {widths[1]} columns, got {widths[2]})"
    column = re.search(r"column #(\d+)", message)
    if column and ("conversion error" in message or "invalid value" in message):
        return f"non-numeric value in column {int(column[1]) + 1}"
    if "Empty CSV" in message:
        return "the CSV file is empty"
    if "straddling" in message or "block" in message:
        return f"a row is longer than {size_text(CSV_BLOCK_BYTES)}"
    return "not a readable numeric CSV file"


#: A number with a decimal point, and one with a decimal comma (European spreadsheets).
_DOT_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_COMMA_NUMBER = re.compile(r"[+-]?(?:\d+(?:,\d*)?|,\d+)(?:[eE][+-]?\d+)?")
#: Separators a spreadsheet may have written instead of commas, and their names.
_FOREIGN_SEPARATORS = ((";", "semicolon"), ("\t", "tab"), ("|", "pipe"))
#: How much of a refused CSV is looked at to name its separator.
_SNIFF_BYTES = 64 * 1024


def csv_dialect_hint(path: Path) -> str | None:
    """Why a CSV that failed to parse probably did, when it is written with another separator
    (``;``, tab or ``|``) and possibly decimal commas: the message says which, and what the
    service reads. Looks at the first 64 KiB only; the message carries no value of the file.

    A separator is named when every line sampled (after a possible header) has the same number
    (at least 1) of it and every cell between them is a number, with decimal points or commas.
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(_SNIFF_BYTES + 1)
    except OSError:
        return None
    if head.startswith(_UTF8_BOM):
        head = head[len(_UTF8_BOM) :]
    lines = head[:_SNIFF_BYTES].decode("utf-8", errors="replace").splitlines()
    if len(head) > _SNIFF_BYTES:
        lines = lines[:-1]  # the last line may be cut
    lines = [_QUOTED_FIELD.sub(b"", line.encode()).decode().strip() for line in lines[:200]]
    lines = [line for line in lines if line]
    if not lines:
        return None
    for separator, name in _FOREIGN_SEPARATORS:
        counts = {line.count(separator) for line in lines[1:]} or {lines[0].count(separator)}
        if len(counts) != 1 or 0 in counts:
            continue
        cells = [cell.strip() for line in lines for cell in line.split(separator)]
        data = cells[len(lines[0].split(separator)) :] if len(lines) > 1 else cells
        if not data or not all(
            _COMMA_NUMBER.fullmatch(c) or _DOT_NUMBER.fullmatch(c) for c in data
        ):
            continue
        decimal_commas = any("," in cell for cell in data)
        written = f"{name}-separated" + (" with decimal commas" if decimal_commas else "")
        return (
            f"the CSV file looks {written}; the service reads ',' as the separator and '.' as "
            "the decimal point: export it again with those (or upload .npy or .parquet)"
        )
    return None


def _batch_with_unit(batch: pa.RecordBatch, position: int | None) -> Block:
    """The batch's feature columns as a matrix and, at ``position``, its identifiers."""
    if position is None:
        return _batch_to_matrix(batch), None
    ids = batch.column(position)
    if pa.types.is_dictionary(ids.type):
        # A categorical column (pandas' "category", Parquet's dictionary): its values, text or
        # integers, are the identifiers (the codes are the file's own, not the people's).
        ids = ids.dictionary_decode()
    if ids.null_count:
        raise InvalidInput(UNIT_FIELD, "the identifier column has a missing value")
    if (
        pa.types.is_string(ids.type)
        or pa.types.is_large_string(ids.type)
        or pa.types.is_string_view(ids.type)  # Arrow's view layout of the same text
    ):
        values: list[Any] | np.ndarray[Any, Any] = ids.to_pylist()
        # Empty once its invisible characters are dropped (a zero-width space alone) is empty.
        if any(not visible_text(value).strip() for value in values):
            raise InvalidInput(UNIT_FIELD, "the identifier column has an empty value")
    elif pa.types.is_integer(ids.type) or pa.types.is_floating(ids.type):
        numbers = ids.to_numpy(zero_copy_only=False)
        if numbers.dtype.kind == "f" and not np.isfinite(numbers).all():
            raise InvalidInput(UNIT_FIELD, "the identifier column has a NaN or infinity")
        _check_narrow_float_ids(numbers)
        values = numbers
    else:
        raise InvalidInput(UNIT_FIELD, "the identifier column must hold text or integers")
    features = batch.drop_columns([batch.schema.names[position]])
    matrix = _batch_to_matrix(features, skipped=position)
    return matrix, values


def _batch_to_matrix(batch: pa.RecordBatch, skipped: int | None = None) -> np.ndarray[Any, Any]:
    """The batch as a float64 matrix; ``skipped``: the file's column (from 0) already taken
    out as the privacy unit, so that a refusal names the column as the owner's file has it."""
    columns = []
    for index, column in enumerate(batch.columns):
        if column.null_count:
            in_file = index + 1 if skipped is None or index < skipped else index + 2
            raise InvalidInput(
                "file", f"missing or NaN value in column {in_file}{FIX_MISSING_VALUES}"
            )
        columns.append(column.to_numpy(zero_copy_only=False).astype(np.float64, copy=False))
    return np.column_stack(columns) if columns else np.empty((0, 0))


def _parquet_footer_bytes(path: Path) -> int:
    """The footer's declared length: the last 8 bytes are its length and ``PAR1``."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() < 12:
            raise InvalidInput("file", "not a readable Parquet file")
        handle.seek(-8, os.SEEK_END)
        tail = handle.read(8)
    if tail[4:] != b"PAR1":
        raise InvalidInput("file", "not a readable Parquet file")
    return int.from_bytes(tail[:4], "little")


def _type_kind(kind: pa.DataType) -> str:
    """A column's type without any name from the file: ``list``, ``struct``, ``map`` or
    ``dictionary`` for the kinds that carry field names or nested types, else the type."""
    if pa.types.is_dictionary(kind):
        return "dictionary"
    if pa.types.is_nested(kind):
        return str(kind).split("<", 1)[0]
    return str(kind)


_PARQUET_ROWS_DISAGREE = (
    "the Parquet footer's row counts disagree (file, row groups and column chunks): a corrupt "
    "or rewritten file"
)


def _parquet_blocks(path: Path, limits: Limits, unit_column: UnitColumn = None) -> Iterator[Block]:
    if _parquet_footer_bytes(path) > MAX_PARQUET_FOOTER_BYTES:
        raise InvalidInput(
            "file",
            f"the Parquet metadata is larger than {size_text(MAX_PARQUET_FOOTER_BYTES)}",
        )
    try:
        parquet = pq.ParquetFile(path)
    except Exception:
        raise InvalidInput("file", "not a readable Parquet file") from None
    schema = parquet.schema_arrow
    if len(schema) < 1:
        raise InvalidInput("file", "the data has no columns")
    _check_width(len(schema), limits.max_cols)
    position = None
    if unit_column is not None:
        position = _unit_index(unit_column, len(schema), list(schema.names), "this file")
    for index, field in enumerate(schema):
        if index == position:
            continue
        if not (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)):
            # By position, never by name: a name is the file's text, and a table whose first
            # row became its header names its columns with raw values (as CSV, whose header
            # cells are never echoed either). Nested types by kind: their fields are names too.
            raise InvalidInput(
                "file",
                f"Parquet column {index + 1} is not numeric (type {_type_kind(field.type)})",
            )
    metadata = parquet.metadata
    # The footer's row count, before a value is decoded (the writer checks again as it goes).
    limits.check_size(metadata.num_rows, len(schema))
    declared = metadata.num_rows
    if sum(metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)) != declared:
        raise InvalidInput("file", _PARQUET_ROWS_DISAGREE)
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for column in range(row_group.num_columns):
            # Flat columns (the only ones accepted): one value, or null, per row.
            if row_group.column(column).num_values != row_group.num_rows:
                raise InvalidInput("file", _PARQUET_ROWS_DISAGREE)
            if row_group.column(column).total_uncompressed_size > MAX_PARQUET_CHUNK_BYTES:
                raise InvalidInput(
                    "file",
                    f"Parquet row group {group + 1} holds a column larger than "
                    f"{size_text(MAX_PARQUET_CHUNK_BYTES)} decoded; write smaller "
                    "row groups",
                )
    decoded = 0
    try:
        for batch in parquet.iter_batches(batch_size=_rows_per_block(len(schema))):
            decoded += batch.num_rows
            yield _batch_with_unit(batch, position)
    except InvalidInput:
        raise
    except Exception:
        raise InvalidInput("file", "not a readable Parquet file") from None
    # The reader stops at the pages' end: a footer declaring more rows than they hold would
    # otherwise be stored short, with the size check made on the larger, false count.
    if decoded != declared:
        raise InvalidInput(
            "file", f"the Parquet footer declares {declared} rows but its pages hold {decoded}"
        )


def npy_layout(path: Path) -> tuple[int, int, int]:
    """``(data offset, header rows, columns)`` of a store ``.npy`` (C-order ``<f8``)."""
    with open(path, "rb") as handle:
        return npy_layout_of(handle)


def npy_layout_of(handle: BinaryIO) -> tuple[int, int, int]:
    """:func:`npy_layout` of a store ``.npy`` open at its start (left at its first value)."""
    _, shape, fortran, dtype = _read_npy_header(handle)
    if fortran or dtype != np.dtype("<f8") or len(shape) != 2:
        raise ValueError("not a dataset file of the store")
    return handle.tell(), int(shape[0]), int(shape[1])


READERS: dict[str, Callable[[Path, Limits, UnitColumn], Iterator[Block]]] = {
    ".csv": _csv_blocks,
    ".npy": _npy_blocks,
    ".parquet": _parquet_blocks,
}
