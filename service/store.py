"""Dataset files: ingestion of uploads into float64 ``.npy`` files, read-only memory maps, purge.

Uploads arrive as a file in the store's ``incoming`` directory (written there by the streaming
multipart reader, never in the system temp dir). Ingestion converts them block by block into a
raw float64 file and then prefixes the ``.npy`` header, so memory stays bounded by one block
whatever the upload's size. Error messages name the problem (and a column or row number) but
never quote a value from the file.

Memory is bounded by the public column limit (``DPSS_MAX_COLS``), not by the file: the width is
read from the CSV's first row, the ``.npy`` header or the Parquet schema and refused above the
limit before any row is converted, and a block holds at most :data:`BLOCK_VALUES` values.

The decoded size (``n x d x 8`` bytes of float64) is bounded by ``DPSS_MAX_DATASET_BYTES``, not
by the upload's size: a small, highly compressible file (a 522 KB Parquet file of one repeated
value decoded into 960 MB) is refused with 413 from the ``.npy`` header's or the Parquet
footer's row and column counts before any row is decoded, and a CSV file (whose rows are known
only as they are read) as soon as the rows converted so far exceed it.

Raw rows never outlive a request outside the store's own files. Each process writes its uploads
in its own ``incoming/<session>/`` directory and holds an exclusive ``flock`` on its lock file
while it lives; at start-up (:meth:`DatasetStore.ensure`) every session directory whose lock can
be taken belongs to a dead process and is removed, so a killed API leaves nothing behind for
long, while the uploads of sibling processes (``dpss api --workers N``) are left alone. Files are
created ``0600`` and directories ``0700``. A full disk is :class:`InsufficientStorage` (507).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from service.errors import InsufficientStorage, InvalidInput, PayloadTooLarge
from service.privacy_unit import FIELD as UNIT_FIELD
from service.privacy_unit import UnitIndexer, rows_per_unit_buckets

SUPPORTED_SUFFIXES = (".csv", ".npy", ".parquet")
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
#: Errors of a full disk or quota: the client is told 507, never 422 or 500.
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_UTF8_BOM = b"\xef\xbb\xbf"
#: How long a session directory may lack its lock file before it counts as abandoned.
UNLOCKED_SESSION_GRACE_SECONDS = 60.0
FILE_MODE = 0o600
DIR_MODE = 0o700
#: Subdirectory of the store holding each person-level dataset's per-row unit index (int64
#: ``.npy`` named as the dataset's file): never listed as a dataset file, purged with it.
UNITS_DIR = "units"

#: A block of rows and, with a privacy unit column, its identifier values (never stored).
Block = tuple[np.ndarray[Any, Any], list[Any] | np.ndarray[Any, Any] | None]
UnitColumn = str | int | None


def create_private(path: Path) -> BinaryIO:
    """A new file only its owner can read (``0600`` whatever the umask); never an existing one."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    return os.fdopen(descriptor, "wb")


def make_private_dir(path: Path) -> None:
    """``path`` and any missing parents, ``0700``."""
    if not path.is_dir():
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)


def secure_data_dir(path: Path) -> None:
    """Create the data directory ``0700``, or make an existing one ``0700`` (one made by hand
    or by a container image before ``dpss migrate`` kept ``0755``): it holds the SQLite
    database, the dataset store and the wake files. Every process that uses it calls this at
    start (``dpss migrate``, ``dpss serve``, the API, ``dpss worker``).

    Raises
    ------
    PermissionError
        The directory belongs to another user and cannot be tightened: the process refuses to
        start rather than keep data in a directory others can list.
    """
    try:
        make_private_dir(path)
    except PermissionError as exc:
        raise PermissionError(
            exc.errno,
            f"the data directory {path} cannot be made private (mode 0700): {exc.strerror}; "
            "run the service as its owner or fix its mode",
        ) from None


@contextlib.contextmanager
def disk_space_errors() -> Iterator[None]:
    """Turn a full disk (or quota) into :class:`InsufficientStorage`."""
    try:
        yield
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise InsufficientStorage(
                "the server has no space left for this upload; nothing was kept"
            ) from None
        raise


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


@dataclass(frozen=True)
class StoredMatrix:
    """A dataset file in the store and its public shape; with a privacy unit column, the number
    of units and the coarse rows-per-unit counts (for the owner's upload answer only)."""

    file_name: str
    n_rows: int
    n_cols: int
    n_units: int | None = None
    rows_per_unit: dict[str, int] | None = None


class _MatrixWriter:
    """Appends validated float64 row blocks to a raw file, then writes the ``.npy``."""

    def __init__(self, raw_path: Path, limits: Limits) -> None:
        self.raw_path = raw_path
        self.limits = limits
        self.raw: BinaryIO = create_private(raw_path)
        self.n_rows = 0
        self.n_cols: int | None = None

    def append(self, block: np.ndarray[Any, Any]) -> None:
        if block.ndim != 2:
            raise InvalidInput("file", "the data must be a 2-D matrix")
        if self.n_cols is None:
            if block.shape[1] < 1:
                raise InvalidInput("file", "the data has no columns")
            self.n_cols = block.shape[1]
        elif block.shape[1] != self.n_cols:
            raise InvalidInput(
                "file",
                f"rows have inconsistent widths (expected {self.n_cols} columns, "
                f"got {block.shape[1]} near row {self.n_rows + 1})",
            )
        # Before the block is converted or written: the bound holds while decoding.
        self.limits.check_size(self.n_rows + block.shape[0], self.n_cols, "the data so far")
        values = np.ascontiguousarray(block, dtype="<f8")
        finite = np.isfinite(values)
        if not finite.all():
            bad_row = int(np.argwhere(~finite)[0][0]) + self.n_rows + 1
            raise InvalidInput("file", f"non-finite value (NaN or infinity) in row {bad_row}")
        self.raw.write(values.tobytes())
        self.n_rows += values.shape[0]

    def finish(self, partial: Path, final_path: Path) -> tuple[int, int]:
        """Write the ``.npy`` at ``partial`` (in the session directory) and move it into place."""
        self.raw.close()
        if self.n_cols is None or self.n_rows < 2:
            raise InvalidInput("file", "the data needs at least 2 rows and 1 column")
        header = {"descr": "<f8", "fortran_order": False, "shape": (self.n_rows, self.n_cols)}
        with create_private(partial) as out, open(self.raw_path, "rb") as raw:
            np.lib.format.write_array_header_2_0(out, header)
            while chunk := raw.read(8 * 1024 * 1024):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, final_path)
        return self.n_rows, self.n_cols

    def abort(self) -> None:
        self.raw.close()


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


def _npy_blocks(path: Path, limits: Limits, unit_column: UnitColumn = None) -> Iterator[Block]:
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
        raise InvalidInput("file", f"the .npy array must be 2-D (it has {array.ndim} dimensions)")
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
        raise InvalidInput(
            "file", f"the first row is longer than {CSV_BLOCK_BYTES // (1024 * 1024)} MiB"
        )
    if line.startswith(_UTF8_BOM):
        line = line[len(_UTF8_BOM) :]
    if not line.strip(b"\r\n"):
        return 0, False, []
    _check_width(_QUOTED_FIELD.sub(b"", line).count(b",") + 1, max_cols)
    try:
        table = pa_csv.read_csv(
            io.BytesIO(line), read_options=pa_csv.ReadOptions(autogenerate_column_names=True)
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise InvalidInput("file", "not a readable numeric CSV file") from None
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
        # Identifiers are read as text: "007" and "7" are two people, as the owner wrote them.
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
        return f"a row is longer than {CSV_BLOCK_BYTES // (1024 * 1024)} MiB"
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
    if ids.null_count:
        raise InvalidInput(UNIT_FIELD, "the identifier column has a missing value")
    if pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type):
        values: list[Any] | np.ndarray[Any, Any] = ids.to_pylist()
        if any(not value.strip() for value in values):
            raise InvalidInput(UNIT_FIELD, "the identifier column has an empty value")
    elif pa.types.is_integer(ids.type) or pa.types.is_floating(ids.type):
        numbers = ids.to_numpy(zero_copy_only=False)
        if numbers.dtype.kind == "f" and not np.isfinite(numbers).all():
            raise InvalidInput(UNIT_FIELD, "the identifier column has a NaN or infinity")
        values = numbers
    else:
        raise InvalidInput(UNIT_FIELD, "the identifier column must hold text or integers")
    features = batch.drop_columns([batch.schema.names[position]])
    matrix = _batch_to_matrix(features)
    return matrix, values


def _batch_to_matrix(batch: pa.RecordBatch) -> np.ndarray[Any, Any]:
    columns = []
    for index, column in enumerate(batch.columns):
        if column.null_count:
            raise InvalidInput("file", f"missing or NaN value in column {index + 1}")
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


def _parquet_blocks(path: Path, limits: Limits, unit_column: UnitColumn = None) -> Iterator[Block]:
    if _parquet_footer_bytes(path) > MAX_PARQUET_FOOTER_BYTES:
        raise InvalidInput(
            "file",
            f"the Parquet metadata is larger than {MAX_PARQUET_FOOTER_BYTES // (1024 * 1024)} MiB",
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
            raise InvalidInput(
                "file", f"Parquet column {field.name!r} is not numeric (type {field.type})"
            )
    metadata = parquet.metadata
    # The footer's row count, before a value is decoded (the writer checks again as it goes).
    limits.check_size(metadata.num_rows, len(schema))
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for column in range(row_group.num_columns):
            if row_group.column(column).total_uncompressed_size > MAX_PARQUET_CHUNK_BYTES:
                raise InvalidInput(
                    "file",
                    f"Parquet row group {group + 1} holds a column larger than "
                    f"{MAX_PARQUET_CHUNK_BYTES // (1024 * 1024)} MiB decoded; write smaller "
                    "row groups",
                )
    try:
        for batch in parquet.iter_batches(batch_size=_rows_per_block(len(schema))):
            yield _batch_with_unit(batch, position)
    except InvalidInput:
        raise
    except Exception:
        raise InvalidInput("file", "not a readable Parquet file") from None


def _npy_layout(path: Path) -> tuple[int, int, int]:
    """``(data offset, header rows, columns)`` of a store ``.npy`` (C-order ``<f8``)."""
    with open(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read(handle)
        if fortran or dtype != np.dtype("<f8") or len(shape) != 2:
            raise ValueError("not a dataset file of the store")
        return handle.tell(), int(shape[0]), int(shape[1])


_READERS: dict[str, Callable[[Path, Limits, UnitColumn], Iterator[Block]]] = {
    ".csv": _csv_blocks,
    ".npy": _npy_blocks,
    ".parquet": _parquet_blocks,
}


class DatasetStore:
    """The directory of dataset files (``<data_dir>/datasets``)."""

    def __init__(
        self,
        root: Path,
        max_cols: int = DEFAULT_MAX_COLS,
        max_bytes: int = DEFAULT_MAX_DATASET_BYTES,
    ) -> None:
        self.root = root
        self.incoming = root / "incoming"
        self.limits = Limits(max_cols=max_cols, max_bytes=max_bytes)
        self._session: Path | None = None
        self._session_lock: int | None = None

    def ensure(self) -> None:
        """Create the store's directories (``0700``) and remove what dead processes left in
        ``incoming/``: raw rows of uploads that never completed."""
        make_private_dir(self.root)
        make_private_dir(self.incoming)
        for entry in self.incoming.iterdir():
            if entry == self._session:
                continue
            if entry.is_dir() and not entry.is_symlink():
                self._remove_if_abandoned(entry)
            else:
                # Files directly in incoming/ are from before session directories existed.
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()

    @staticmethod
    def _remove_if_abandoned(session: Path) -> None:
        try:
            descriptor = os.open(session / ".lock", os.O_RDWR)
        except FileNotFoundError:
            # No lock file: killed between creating the directory and its lock, or a live
            # process is between the two right now; only the first stays that way for long.
            with contextlib.suppress(FileNotFoundError):
                if time.time() - session.stat().st_mtime > UNLOCKED_SESSION_GRACE_SECONDS:
                    shutil.rmtree(session, ignore_errors=True)
            return
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a live process owns it
        else:
            shutil.rmtree(session, ignore_errors=True)
        finally:
            os.close(descriptor)

    def _session_dir(self) -> Path:
        """This process's directory in ``incoming/``, locked for as long as the process lives."""
        if self._session is None or self._session_lock is None:
            make_private_dir(self.incoming)
            session = self.incoming / uuid.uuid4().hex
            session.mkdir(mode=DIR_MODE)
            descriptor = os.open(session / ".lock", os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE)
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._session, self._session_lock = session, descriptor
        return self._session

    def new_incoming_path(self) -> Path:
        """A fresh path for an upload being received; the name holds nothing from the client."""
        with disk_space_errors():
            return self._session_dir() / f"{uuid.uuid4().hex}.upload"

    def open_incoming(self) -> tuple[Path, BinaryIO]:
        """A new private file for an upload being received, and its path."""
        path = self.new_incoming_path()
        with disk_space_errors():
            return path, create_private(path)

    def ingest(
        self,
        upload_path: Path,
        suffix: str,
        *,
        batch: bool = False,
        unit_column: UnitColumn = None,
    ) -> StoredMatrix:
        """Validate and convert an uploaded file into a float64 ``.npy`` in the store.

        The upload file is removed in every case; on failure nothing is left behind. A full disk
        raises :class:`InsufficientStorage`; data that decodes to more than the store's
        ``max_bytes`` raises :class:`PayloadTooLarge` (while decoding, not after). With
        ``batch=True`` (an append) the ``.npy`` stays in this process's ``incoming/``
        directory, to be copied to the end of the dataset's file
        by :meth:`append` and then removed (a killed process leaves it to :meth:`ensure`);
        ``file_name`` is then that path relative to the store.

        With ``unit_column`` (a name or 0-based index; :mod:`service.privacy_unit`) that column
        is removed from the matrix and each row's dense unit index is written to
        ``units/<file_name>`` (int64 ``.npy``); the identifier values themselves are dropped.
        """
        if batch and unit_column is not None:
            raise ValueError("appends with a privacy unit are refused before ingestion")
        suffix = suffix.lower()
        if suffix not in _READERS:
            with contextlib.suppress(FileNotFoundError):
                upload_path.unlink()
            raise InvalidInput(
                "file", f"unsupported file type {suffix or '(none)'}; use .csv, .npy or .parquet"
            )
        file_name = f"{uuid.uuid4().hex}.npy"
        if batch:
            file_name = str((upload_path.parent / file_name).relative_to(self.root))
        final_path = self.root / file_name
        partial = upload_path.with_suffix(".partial")
        writer: _MatrixWriter | None = None
        indexer = UnitIndexer() if unit_column is not None else None
        unit_blocks: list[np.ndarray[Any, Any]] = []
        units_path = self.units_path(file_name)
        try:
            with disk_space_errors():
                writer = _MatrixWriter(upload_path.with_suffix(".raw"), self.limits)
                for block, ids in _READERS[suffix](upload_path, self.limits, unit_column):
                    writer.append(block)
                    if indexer is not None and ids is not None:
                        unit_blocks.append(indexer.add(ids))
                if indexer is not None:
                    # Before the matrix is moved into place: no dataset file without its units.
                    make_private_dir(units_path.parent)
                    units = np.concatenate(unit_blocks) if unit_blocks else np.zeros(0, np.int64)
                    with create_private(units_path) as out:
                        np.save(out, units, allow_pickle=False)
                n_rows, n_cols = writer.finish(partial, final_path)
        except BaseException as exc:
            if writer is not None:
                writer.abort()
            for leftover in (final_path, partial, units_path):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
            # "Inconsistent widths" or "non-numeric" says nothing useful about a CSV written
            # with semicolons and decimal commas (a spreadsheet's export in many locales).
            hint = csv_dialect_hint(upload_path) if suffix == ".csv" else None
            if isinstance(exc, InvalidInput) and hint is not None:
                raise InvalidInput("file", hint) from None
            raise
        finally:
            for temporary in (upload_path, upload_path.with_suffix(".raw")):
                with contextlib.suppress(FileNotFoundError):
                    temporary.unlink()
        if indexer is None:
            return StoredMatrix(file_name=file_name, n_rows=n_rows, n_cols=n_cols)
        return StoredMatrix(
            file_name=file_name,
            n_rows=n_rows,
            n_cols=n_cols,
            n_units=indexer.n_units,
            rows_per_unit=rows_per_unit_buckets(units),
        )

    def path_of(self, file_name: str) -> Path:
        return self.root / file_name

    def units_path(self, file_name: str) -> Path:
        """Where the per-row unit index of the dataset file ``file_name`` is kept."""
        return self.root / UNITS_DIR / Path(file_name).name

    def open_units(self, file_name: str, n_rows: int | None = None) -> np.ndarray[Any, Any]:
        """The dense unit index of the first ``n_rows`` rows (``(n,)`` int64); raises
        ``FileNotFoundError`` when it is missing, ``ValueError`` when shorter than asked."""
        units: np.ndarray[Any, Any] = np.load(
            self.units_path(file_name), mmap_mode="r", allow_pickle=False
        )
        if units.ndim != 1 or units.dtype.kind != "i":
            raise ValueError("not a unit index file of the store")
        rows = units.shape[0] if n_rows is None else n_rows
        if units.shape[0] < rows:
            raise ValueError("the unit index holds fewer rows than the dataset")
        return np.asarray(units[:rows], dtype=np.int64)

    def open(self, file_name: str, n_rows: int | None = None) -> np.ndarray[Any, Any]:
        """The dataset's first ``n_rows`` rows (all of batch 0's header when ``None``) as a
        read-only memory map (``n x d`` float64): a prefix of batches, never copied.

        The ``.npy`` header records the shape of the upload (batch 0); appended batches follow
        its data, so the row count comes from the database, which commits a batch only after
        its rows are on disk.
        """
        path = self.path_of(file_name)
        offset, header_rows, n_cols = _npy_layout(path)
        rows = header_rows if n_rows is None else n_rows
        if rows == 0:
            return np.empty((0, n_cols))
        matrix: np.ndarray[Any, Any] = np.memmap(
            path, dtype="<f8", mode="r", offset=offset, shape=(rows, n_cols)
        )
        return matrix

    def append(self, file_name: str, batch_file: str, committed_rows: int) -> None:
        """Write the rows of ``batch_file`` (an ingested ``.npy`` from ``ingest(batch=True)``)
        after the first ``committed_rows`` rows of the dataset file ``file_name``, and remove
        ``batch_file``.

        The caller holds the dataset's lock and commits the batch only after this returns, so
        the rows are on disk (fsync) before any reader can be told they exist. Whatever lies
        beyond ``committed_rows`` (the rows of an append whose transaction failed) is cut off
        first; on failure the file is cut back to ``committed_rows``.
        """
        path = self.path_of(file_name)
        batch_path = self.path_of(batch_file)
        try:
            offset, _, n_cols = _npy_layout(path)
            batch_offset, _, batch_cols = _npy_layout(batch_path)
            if batch_cols != n_cols:
                raise ValueError("the batch and the dataset differ in width")
            end = offset + 8 * n_cols * committed_rows
            with disk_space_errors(), open(path, "r+b") as out, open(batch_path, "rb") as src:
                try:
                    out.truncate(end)
                    out.seek(end)
                    src.seek(batch_offset)
                    shutil.copyfileobj(src, out, 8 * 1024 * 1024)
                    out.flush()
                    os.fsync(out.fileno())
                except BaseException:
                    out.truncate(end)
                    raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                batch_path.unlink()

    def trim(self, file_name: str, committed_rows: int) -> None:
        """Cut the dataset file back to its first ``committed_rows`` rows (under the dataset's
        lock): the rows of an append whose transaction did not commit are not kept."""
        path = self.path_of(file_name)
        with contextlib.suppress(FileNotFoundError):
            offset, _, n_cols = _npy_layout(path)
            with open(path, "r+b") as out:
                out.truncate(offset + 8 * n_cols * committed_rows)

    def discard(self, file_name: str) -> None:
        """Remove an ingested batch that will not be appended."""
        with contextlib.suppress(FileNotFoundError):
            self.path_of(file_name).unlink()

    def exists(self, file_name: str) -> bool:
        return self.path_of(file_name).is_file()

    def fault(self, file_name: str, n_rows: int | None, n_cols: int | None = None) -> str | None:
        """What is wrong with the dataset file ``file_name`` for reading its first ``n_rows``
        rows (all of batch 0's when ``None``) of ``n_cols`` columns, or ``None`` when it can
        be read. Only the file's presence, header and size are looked at (public facts, like
        the row count), never a row, so the answer does not depend on the data."""
        path = self.path_of(file_name)
        if not path.is_file():
            return "is missing"
        try:
            offset, header_rows, cols = _npy_layout(path)
            size = path.stat().st_size
        except FileNotFoundError:
            return "is missing"
        except (OSError, ValueError, EOFError):
            return "is not a dataset file of the store"
        if n_cols is not None and cols != n_cols:
            return f"has {cols} columns, the database says {n_cols}"
        rows = header_rows if n_rows is None else n_rows
        if size < offset + 8 * cols * rows:
            return f"holds fewer rows than the database says ({rows})"
        return None

    def units_fault(self, file_name: str, n_rows: int) -> str | None:
        """What is wrong with the unit index of a person-level dataset file, or ``None``."""
        try:
            self.open_units(file_name, n_rows)
        except FileNotFoundError:
            return "has no unit index (units/)"
        except (OSError, ValueError, EOFError):
            return "has a unit index shorter than its rows or unreadable"
        return None

    def stored_files(self) -> list[str]:
        """The names of the dataset files in the store (``incoming/`` excluded), sorted."""
        if not self.root.is_dir():
            return []
        return sorted(
            entry.name
            for entry in self.root.iterdir()
            if entry.name != self.incoming.name and not entry.is_dir()
        )

    def purge(self, file_name: str) -> None:
        """Delete a dataset file (and its unit index, if any)."""
        for path in (self.path_of(file_name), self.units_path(file_name)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
