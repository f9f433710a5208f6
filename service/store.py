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
import mmap
import os
import shutil
import stat
import time
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from service import unit_keys
from service.errors import InsufficientStorage, InvalidInput
from service.privacy_unit import rows_per_unit_buckets
from service.upload_formats import (
    DEFAULT_MAX_COLS,
    DEFAULT_MAX_DATASET_BYTES,
    FIX_MISSING_VALUES,
    READERS,
    Limits,
    UnitColumn,
    csv_dialect_hint,
    npy_layout,
    npy_layout_of,
)

SUPPORTED_SUFFIXES = (".csv", ".npy", ".parquet")
#: Errors of a full disk or quota: the client is told 507, never 422 or 500.
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
#: How long a session directory may lack its lock file before it counts as abandoned.
UNLOCKED_SESSION_GRACE_SECONDS = 60.0
FILE_MODE = 0o600
DIR_MODE = 0o700
#: A read of at most this many bytes of a dataset file maps its rows populated at once
#: (``MAP_POPULATE``; :meth:`DatasetStore.open`), not page by page as the pass touches them with
#: a read-ahead hint per chunk: measured (``bench/bench_release_cpu.py``), the pass of
#: ``analyze_gauss`` on a 50,000 x 100 file (38 MiB, in the page cache) took 1.0 ms more on a
#: lazily faulted memory map than on the rows in memory (5% of it), populated 0.2 ms less. A
#: larger file keeps the lazy map and its read-ahead (it may not fit in memory); the choice is
#: a function of the public ``n`` and ``d`` only.
POPULATE_BYTES = 256 * 1024 * 1024
#: Subdirectory of the store holding each person-level dataset's per-row unit index (int64
#: ``.npy`` named as the dataset's file): never listed as a dataset file, purged with it.
UNITS_DIR = "units"


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


def _stacked(blocks: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """The digest blocks as one ``(n, 32)`` array (``(0, 32)`` for none)."""
    if not blocks:
        return np.zeros((0, unit_keys.DIGEST_BYTES), dtype=np.uint8)
    return np.concatenate(blocks)


def _replace(path: Path, array: np.ndarray[Any, Any]) -> None:
    """Write ``array`` as ``.npy`` to ``path`` atomically (a private temporary, fsync, rename):
    a reader sees the old file or the new one, never a part."""
    temporary = path.with_name(path.name + ".new")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    try:
        with create_private(temporary) as out:
            np.save(out, array, allow_pickle=False)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise


def _populated(handle: BinaryIO, offset: int, rows: int, n_cols: int) -> np.ndarray[Any, Any]:
    """The rows ``[0, rows)`` of an open store file as a read-only array over a mapping
    populated when made (``MAP_POPULATE``: its pages read and mapped in one call, where the
    kernel has it; elsewhere a plain read-only mapping). See :data:`POPULATE_BYTES`. The
    mapping outlives the handle."""
    end = offset + rows * n_cols * 8
    mapping = mmap.mmap(
        handle.fileno(),
        end,
        flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
        prot=mmap.PROT_READ,
    )
    # The array holds the mapping (its buffer) for as long as it lives; read-only (PROT_READ).
    return np.frombuffer(mapping, dtype="<f8", count=rows * n_cols, offset=offset).reshape(
        rows, n_cols
    )


class DatasetFileFault(ValueError):
    """A dataset file that cannot be read as the database describes it; the message is what
    :meth:`DatasetStore.fault` says of it (public facts: presence, header, size, never a row)."""


def _open_store_file(path: Path) -> BinaryIO:
    """``path`` open for reading, if it is a regular file; else :class:`DatasetFileFault`
    ("is missing", as for no file). Opened without blocking (a FIFO in its place would block
    a plain open), then checked on the open descriptor: one open and one ``fstat``."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise DatasetFileFault("is missing") from None
    except OSError:
        raise DatasetFileFault("is not a dataset file of the store") from None
    try:
        regular = stat.S_ISREG(os.fstat(descriptor).st_mode)
    except OSError:
        os.close(descriptor)
        raise DatasetFileFault("is not a dataset file of the store") from None
    if not regular:  # a directory opens too (read-only)
        os.close(descriptor)
        raise DatasetFileFault("is missing")
    return os.fdopen(descriptor, "rb")


def _checked_layout(
    handle: BinaryIO, n_rows: int | None, n_cols: int | None = None
) -> tuple[int, int, int]:
    """``(data offset, rows, columns)`` of an open store file for reading its first ``n_rows``
    rows (batch 0's header's when ``None``) of ``n_cols`` columns (any when ``None``), or
    :class:`DatasetFileFault`: :meth:`DatasetStore.fault`'s checks, shared by
    :meth:`DatasetStore.open` (which makes them on the file it maps)."""
    try:
        offset, header_rows, cols = npy_layout_of(handle)
        size = os.fstat(handle.fileno()).st_size
    except (OSError, ValueError, EOFError):
        raise DatasetFileFault("is not a dataset file of the store") from None
    if n_cols is not None and cols != n_cols:
        raise DatasetFileFault(f"has {cols} columns, the database says {n_cols}")
    rows = header_rows if n_rows is None else n_rows
    if size < offset + 8 * cols * rows:
        raise DatasetFileFault(f"holds fewer rows than the database says ({rows})")
    return offset, rows, cols


@dataclass(frozen=True)
class StoredMatrix:
    """A dataset file in the store and its public shape; with a privacy unit column, the number
    of units and the coarse rows-per-unit counts (for the owner's upload answer only)."""

    file_name: str
    n_rows: int
    n_cols: int
    n_units: int | None = None
    rows_per_unit: dict[str, int] | None = None
    #: An appended batch of a person-level dataset: its rows' keyed identifier digests
    #: (:mod:`service.unit_keys`), a file beside the batch, mapped to indices under the lock.
    unit_digests: str | None = None


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
            raise InvalidInput(
                "file",
                f"non-finite value (NaN or infinity) in row {bad_row}{FIX_MISSING_VALUES}",
            )
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
            # A store that is dropped gives its descriptor back (not at the lifespan's end: an
            # app's lifespan can run more than once, a test client's per thread, while another
            # upload is under way): processes that build many apps (tests) ran past the 1,024
            # descriptors select() can watch.
            weakref.finalize(self, os.close, descriptor)
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
        unit_secret: bytes | None = None,
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
        ``units/<file_name>`` (int64 ``.npy``), with a new per-dataset secret and each person's
        keyed digest (:mod:`service.unit_keys`); the identifier values themselves are dropped.
        An append (``batch=True``) with ``unit_column`` needs the dataset's ``unit_secret``: its
        rows' digests are kept beside the batch (``unit_digests``) for :meth:`append_units`.
        """
        if batch and unit_column is not None and unit_secret is None:
            raise ValueError("an append with a privacy unit needs the dataset's secret")
        suffix = suffix.lower()
        if suffix not in READERS:
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
        secret = unit_secret if batch else unit_keys.new_secret()
        indexer = unit_keys.KeyedIndexer() if unit_column is not None else None
        unit_blocks: list[np.ndarray[Any, Any]] = []
        digest_blocks: list[np.ndarray[Any, Any]] = []
        units_path = self.units_path(file_name)
        secret_path, digests_path = self.secret_path(file_name), self.digests_path(file_name)
        batch_digests = final_path.with_name(final_path.name + ".ids")
        try:
            with disk_space_errors():
                if upload_path.stat().st_size == 0:
                    # Said as such in every format (a reader would call it unreadable): most
                    # often nothing was sent, e.g. a path given without curl's @.
                    raise InvalidInput(
                        "file",
                        "the file is empty (0 bytes): send the data's contents (curl: "
                        "-F file=@PATH, with the @)",
                    )
                writer = _MatrixWriter(upload_path.with_suffix(".raw"), self.limits)
                for block, ids in READERS[suffix](upload_path, self.limits, unit_column):
                    writer.append(block)
                    if indexer is not None and ids is not None:
                        assert secret is not None
                        digests = unit_keys.row_digests(secret, ids)
                        if batch:
                            digest_blocks.append(digests)
                        else:
                            unit_blocks.append(indexer.add_digests(digests))
                if indexer is not None and batch:
                    with create_private(batch_digests) as out:
                        np.save(out, _stacked(digest_blocks), allow_pickle=False)
                elif indexer is not None:
                    assert secret is not None
                    make_private_dir(units_path.parent)
                    with create_private(secret_path) as out:
                        out.write(secret)
                    with create_private(digests_path) as out:
                        np.save(out, indexer.digests, allow_pickle=False)
                    # Before the matrix is moved into place: no dataset file without its units.
                    make_private_dir(units_path.parent)
                    units = np.concatenate(unit_blocks) if unit_blocks else np.zeros(0, np.int64)
                    with create_private(units_path) as out:
                        np.save(out, units, allow_pickle=False)
                n_rows, n_cols = writer.finish(partial, final_path)
        except BaseException as exc:
            if writer is not None:
                writer.abort()
            leftovers = [final_path, partial, batch_digests]
            leftovers += [] if batch else [units_path, secret_path, digests_path]
            for leftover in leftovers:
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
        if batch:
            return StoredMatrix(
                file_name=file_name,
                n_rows=n_rows,
                n_cols=n_cols,
                unit_digests=str(batch_digests.relative_to(self.root)),
            )
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

    def secret_path(self, file_name: str) -> Path:
        """The per-dataset secret of the keyed identifier digests (:mod:`service.unit_keys`)."""
        return self.root / UNITS_DIR / f"{file_name}.key"

    def digests_path(self, file_name: str) -> Path:
        """Each person's keyed digest, in unit-index order."""
        return self.root / UNITS_DIR / f"{file_name}.ids"

    def unit_secret(self, file_name: str) -> bytes:
        """The dataset's secret; raises ``FileNotFoundError`` for a person-level dataset
        uploaded before appends per person existed (it has none)."""
        secret = self.secret_path(file_name).read_bytes()
        unit_keys.rule_of(secret)  # ValueError: not a unit secret of the store
        return secret

    def append_units(
        self, file_name: str, batch_digests: str, committed_rows: int, committed_units: int
    ) -> tuple[int, dict[str, int]]:
        """Give the batch's rows their unit indices (known people keep theirs, new ones follow
        the ``committed_units`` people) and write the unit index (the first ``committed_rows``
        entries, then the batch's) and the digests, each replaced atomically. Under the
        dataset's lock, before the rows are appended; whatever an uncommitted append left
        beyond the committed rows and people is dropped first. Returns the new number of
        units and the batch's coarse rows-per-unit counts (its people's rows over the whole
        dataset, for the owner)."""
        known = np.load(self.digests_path(file_name), allow_pickle=False)[:committed_units]
        digests = np.load(self.path_of(batch_digests), allow_pickle=False)
        batch_units, every = unit_keys.extend(known, digests)
        units = np.concatenate([self.open_units(file_name, committed_rows), batch_units])
        with disk_space_errors():
            _replace(self.units_path(file_name), units)
            _replace(self.digests_path(file_name), every)
        seen = np.unique(batch_units)
        counts = np.bincount(units, minlength=every.shape[0])[seen]
        return int(every.shape[0]), rows_per_unit_buckets(np.repeat(np.arange(seen.size), counts))

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
        read-only memory map (``n x d`` float64): a prefix of batches, never copied; populated
        at once up to :data:`POPULATE_BYTES` (an ``ndarray`` over the mapping), lazily beyond
        (an ``np.memmap``, read ahead chunk by chunk).

        The ``.npy`` header records the shape of the upload (batch 0); appended batches follow
        its data, so the row count comes from the database, which commits a batch only after
        its rows are on disk.

        Raises :class:`DatasetFileFault` (a ``ValueError``) for what :meth:`fault` would name,
        checked on the file it maps before anything is mapped: a one-shot run needs no
        :meth:`fault` first (before, the worker checked the file, a stat, an open, a header
        parse and a stat, and the run process opened and parsed it again).
        """
        with _open_store_file(self.path_of(file_name)) as handle:
            offset, rows, n_cols = _checked_layout(handle, n_rows)
            if rows == 0:
                return np.empty((0, n_cols))
            if rows * n_cols * 8 <= POPULATE_BYTES:
                return _populated(handle, offset, rows, n_cols)
            matrix: np.ndarray[Any, Any] = np.memmap(
                handle, dtype="<f8", mode="r", offset=offset, shape=(rows, n_cols)
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
            offset, _, n_cols = npy_layout(path)
            batch_offset, _, batch_cols = npy_layout(batch_path)
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
            offset, _, n_cols = npy_layout(path)
            with open(path, "r+b") as out:
                out.truncate(offset + 8 * n_cols * committed_rows)

    def discard(self, file_name: str) -> None:
        """Remove an ingested batch that will not be appended (and its digests, if any)."""
        for path in (self.path_of(file_name), self.path_of(file_name + ".ids")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def exists(self, file_name: str) -> bool:
        return self.path_of(file_name).is_file()

    def fault(self, file_name: str, n_rows: int | None, n_cols: int | None = None) -> str | None:
        """What is wrong with the dataset file ``file_name`` for reading its first ``n_rows``
        rows (all of batch 0's when ``None``) of ``n_cols`` columns, or ``None`` when it can
        be read. Only the file's presence, header and size are looked at (public facts, like
        the row count), never a row, so the answer does not depend on the data."""
        try:
            with _open_store_file(self.path_of(file_name)) as handle:
                _checked_layout(handle, n_rows, n_cols)
        except DatasetFileFault as fault:
            return str(fault)
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
        for path in (
            self.path_of(file_name),
            self.units_path(file_name),
            self.secret_path(file_name),
            self.digests_path(file_name),
        ):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
