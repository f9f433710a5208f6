"""Dataset files: ingestion of uploads into float64 ``.npy`` files, read-only memory maps, purge.

Uploads arrive as a file in the store's ``incoming`` directory (written there by the streaming
multipart reader, never in the system temp dir). Ingestion converts them block by block into a
raw float64 file and then prefixes the ``.npy`` header, so memory stays bounded by one block
whatever the upload's size. Error messages name the problem (and a column or row number) but
never quote a value from the file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from service.errors import InvalidInput

SUPPORTED_SUFFIXES = (".csv", ".npy", ".parquet")
#: Rows converted per block: bounded memory for any upload.
BLOCK_ROWS = 65536
#: Larger CSV blocks make pyarrow faster; this bounds one block's raw text.
CSV_BLOCK_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class StoredMatrix:
    """A dataset file in the store and its public shape."""

    file_name: str
    n_rows: int
    n_cols: int


class _MatrixWriter:
    """Appends validated float64 row blocks to a raw file, then writes the ``.npy``."""

    def __init__(self, raw_path: Path) -> None:
        self.raw_path = raw_path
        self.raw: BinaryIO = open(raw_path, "wb")  # noqa: SIM115 - closed in finish/abort
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
        values = np.ascontiguousarray(block, dtype="<f8")
        finite = np.isfinite(values)
        if not finite.all():
            bad_row = int(np.argwhere(~finite)[0][0]) + self.n_rows + 1
            raise InvalidInput("file", f"non-finite value (NaN or infinity) in row {bad_row}")
        self.raw.write(values.tobytes())
        self.n_rows += values.shape[0]

    def finish(self, final_path: Path) -> tuple[int, int]:
        self.raw.close()
        if self.n_cols is None or self.n_rows < 2:
            raise InvalidInput("file", "the data needs at least 2 rows and 1 column")
        header = {"descr": "<f8", "fortran_order": False, "shape": (self.n_rows, self.n_cols)}
        partial = final_path.with_suffix(".partial")
        with open(partial, "wb") as out, open(self.raw_path, "rb") as raw:
            np.lib.format.write_array_header_2_0(out, header)
            while chunk := raw.read(8 * 1024 * 1024):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, final_path)
        return self.n_rows, self.n_cols

    def abort(self) -> None:
        self.raw.close()


def _npy_blocks(path: Path) -> Iterator[np.ndarray[Any, Any]]:
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
    for start in range(0, array.shape[0], BLOCK_ROWS):
        yield np.asarray(array[start : start + BLOCK_ROWS], dtype=np.float64)


def _csv_first_row(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8", errors="replace") as handle:
        return next(csv.reader(io.StringIO(handle.readline())), [])


def _is_header(cells: list[str]) -> bool:
    """A first row with any non-numeric cell is a header."""
    for cell in cells:
        try:
            float(cell)
        except ValueError:
            return True
    return False


def _csv_blocks(path: Path) -> Iterator[np.ndarray[Any, Any]]:
    first_row = _csv_first_row(path)
    width = len(first_row)
    if width < 1:
        raise InvalidInput("file", "the CSV file is empty")
    names = [f"c{i}" for i in range(width)]
    read_options = pa_csv.ReadOptions(
        column_names=names, skip_rows=1 if _is_header(first_row) else 0, block_size=CSV_BLOCK_BYTES
    )
    convert_options = pa_csv.ConvertOptions(
        column_types={name: pa.float64() for name in names}, strings_can_be_null=False
    )
    try:
        reader = pa_csv.open_csv(path, read_options=read_options, convert_options=convert_options)
        for batch in reader:
            yield _batch_to_matrix(batch)
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
    return "not a readable numeric CSV file"


def _batch_to_matrix(batch: pa.RecordBatch) -> np.ndarray[Any, Any]:
    columns = []
    for index, column in enumerate(batch.columns):
        if column.null_count:
            raise InvalidInput("file", f"missing or NaN value in column {index + 1}")
        columns.append(column.to_numpy(zero_copy_only=False).astype(np.float64, copy=False))
    return np.column_stack(columns) if columns else np.empty((0, 0))


def _parquet_blocks(path: Path) -> Iterator[np.ndarray[Any, Any]]:
    try:
        parquet = pq.ParquetFile(path)
    except Exception:
        raise InvalidInput("file", "not a readable Parquet file") from None
    schema = parquet.schema_arrow
    if len(schema) < 1:
        raise InvalidInput("file", "the data has no columns")
    for field in schema:
        if not (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)):
            raise InvalidInput(
                "file", f"Parquet column {field.name!r} is not numeric (type {field.type})"
            )
    try:
        for batch in parquet.iter_batches(batch_size=BLOCK_ROWS):
            yield _batch_to_matrix(batch)
    except InvalidInput:
        raise
    except Exception:
        raise InvalidInput("file", "not a readable Parquet file") from None


_READERS = {".csv": _csv_blocks, ".npy": _npy_blocks, ".parquet": _parquet_blocks}


class DatasetStore:
    """The directory of dataset files (``<data_dir>/datasets``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.incoming = root / "incoming"

    def ensure(self) -> None:
        self.incoming.mkdir(parents=True, exist_ok=True)

    def new_incoming_path(self, suffix: str) -> Path:
        """A fresh path in the store for an upload being received."""
        self.ensure()
        return self.incoming / f"{uuid.uuid4().hex}{suffix}.upload"

    def ingest(self, upload_path: Path, suffix: str) -> StoredMatrix:
        """Validate and convert an uploaded file into a float64 ``.npy`` in the store.

        The upload file is removed in every case; on failure nothing is left behind.
        """
        suffix = suffix.lower()
        if suffix not in _READERS:
            with contextlib.suppress(FileNotFoundError):
                upload_path.unlink()
            raise InvalidInput(
                "file", f"unsupported file type {suffix or '(none)'}; use .csv, .npy or .parquet"
            )
        file_name = f"{uuid.uuid4().hex}.npy"
        final_path = self.root / file_name
        writer = _MatrixWriter(upload_path.with_suffix(".raw"))
        try:
            for block in _READERS[suffix](upload_path):
                writer.append(block)
            n_rows, n_cols = writer.finish(final_path)
        except BaseException:
            writer.abort()
            for leftover in (final_path, final_path.with_suffix(".partial")):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
            raise
        finally:
            for temporary in (upload_path, writer.raw_path):
                with contextlib.suppress(FileNotFoundError):
                    temporary.unlink()
        return StoredMatrix(file_name=file_name, n_rows=n_rows, n_cols=n_cols)

    def path_of(self, file_name: str) -> Path:
        return self.root / file_name

    def open(self, file_name: str) -> np.ndarray[Any, Any]:
        """The dataset as a read-only memory map (``n x d`` float64)."""
        matrix: np.ndarray[Any, Any] = np.load(
            self.path_of(file_name), mmap_mode="r", allow_pickle=False
        )
        return matrix

    def exists(self, file_name: str) -> bool:
        return self.path_of(file_name).is_file()

    def purge(self, file_name: str) -> None:
        """Delete a dataset file."""
        with contextlib.suppress(FileNotFoundError):
            self.path_of(file_name).unlink()
