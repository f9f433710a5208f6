"""What an upload sends: rows from the inputs the client accepts (arrays, sparse matrices,
tables, files), streamed as a ``.npy`` file with an optional progress report.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    # numpy is imported where a basis or an array is handled: the commands that only list,
    # show or grant (and `dpss --help`) start without it (bench/bench_cli_startup.py).
    from numpy.typing import NDArray


def feature_names(data: Any) -> list[str] | None:
    """The string column names of a table-like input (anything with a ``columns`` attribute,
    e.g. a pandas or polars DataFrame; duck-typed, so neither is needed), as scikit-learn reads
    them: ``None`` when it has none or none is a string; ``TypeError`` when only some are."""
    columns = getattr(data, "columns", None)
    if columns is None or isinstance(columns, str):
        return None
    try:
        names = list(columns)
    except TypeError:
        return None
    strings = [isinstance(name, str) for name in names]
    if not names or not any(strings):
        return None
    if not all(strings):
        kinds = sorted({type(name).__name__ for name in names})
        raise TypeError(
            "column names are supported only when all are strings; these are of types "
            f"{kinds}: convert them, e.g. columns = [str(c) for c in columns]"
        )
    return names


def is_sparse(data: Any) -> bool:
    """Whether ``data`` is a SciPy sparse matrix or array (duck-typed: SciPy is not needed)."""
    return all(hasattr(data, name) for name in ("tocsr", "nnz", "shape"))


def as_rows(data: Any) -> NDArray[Any]:
    """``data`` (any array-like: a NumPy array, nested lists, a DataFrame) as a 2-D array."""
    import numpy as np

    if is_sparse(data):
        # numpy.asarray makes a 0-d object array of it: "must be 2-D, got shape ()" misled.
        raise TypeError(
            f"a sparse matrix {data.shape} is not uploaded as it is: the service stores dense "
            "rows; convert it with .toarray() (mind the memory) or write it to .npy or CSV"
        )
    array = np.asarray(data)
    if array.ndim != 2:
        raise ValueError(f"the array must be 2-D (rows x columns), got shape {array.shape}")
    return array


def _is_path(data: Any) -> bool:
    return isinstance(data, str | os.PathLike)


# --------------------------------------------------------------------------------------------
# Streaming a NumPy array as a .npy file


class NpyStream(io.RawIOBase):
    """A read-only, seekable file object whose bytes are ``np.save(array)``'s, made on the fly.

    Only the small ``.npy`` header is built in memory; the array's buffer is read in place
    through a memoryview, so an upload needs neither a temporary file nor a copy of the data
    (unless the array is neither C- nor Fortran-contiguous, when one contiguous copy is made).
    Being seekable with a known length lets httpx send a ``Content-Length``.
    """

    def __init__(self, array: NDArray[Any]) -> None:
        import numpy as np

        super().__init__()
        if array.dtype.hasobject:
            raise ValueError("object arrays cannot be uploaded; use a numeric dtype")
        if array.flags.c_contiguous:
            contiguous, fortran = array, False
        elif array.flags.f_contiguous:
            # The transpose of a Fortran-ordered array is C-ordered over the same memory,
            # and .npy stores exactly that buffer when the header says fortran_order.
            contiguous, fortran = array.T, True
        else:
            contiguous, fortran = np.ascontiguousarray(array), False
        header = np.lib.format.header_data_from_array_1_0(array)
        header["fortran_order"] = fortran
        buf = io.BytesIO()
        try:
            np.lib.format.write_array_header_1_0(buf, header)
        except ValueError:
            buf = io.BytesIO()
            np.lib.format.write_array_header_2_0(buf, header)
        self._header = memoryview(buf.getvalue())
        self._data: memoryview = contiguous.reshape(-1).view(np.uint8).data
        self._size = len(self._header) + len(self._data)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        written = 0
        while written < len(out) and self._pos < self._size:
            h = len(self._header)
            src = self._header[self._pos :] if self._pos < h else self._data[self._pos - h :]
            n = min(len(src), len(out) - written)
            out[written : written + n] = src[:n]
            written += n
            self._pos += n
        return written


#: ``progress(sent, total)`` after each chunk of an upload's file is read for sending.
UploadProgress = Callable[[int, int], None]


class _Reporting(io.RawIOBase):
    """A file object that tells ``report(sent, total)`` how many of its ``total`` bytes were
    read for sending. Seeking back to the start (httpx measures, then rewinds) restarts the count.
    """

    def __init__(self, inner: Any, total: int, report: UploadProgress) -> None:
        super().__init__()
        self._inner = inner
        self._total = total
        self._report = report
        self._sent = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return int(self._inner.tell())

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        position = int(self._inner.seek(offset, whence))
        self._sent = position
        return position

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        data = self._inner.read(len(out))
        out[: len(data)] = data
        if data:
            self._sent += len(data)
            self._report(min(self._sent, self._total), self._total)
        return len(data)


_CONTENT_TYPES: Final = {
    ".csv": "text/csv",
    ".npy": "application/octet-stream",
    ".parquet": "application/vnd.apache.parquet",
}
