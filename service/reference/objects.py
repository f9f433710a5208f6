"""Where the objects of a dataset by reference are, and how one is opened, listed and named.

Guarantees:

- **Containment.** A URI is accepted only under ``DPSS_REFERENCE_ROOTS`` (:func:`check_request`:
  a local path resolved by ``realpath`` first, an S3 key without empty, ``.`` or ``..``
  segments), and every later open is checked again against the worker's *current* roots
  (:class:`Location` carries them, never credentials: it is pickled into Dask tasks).
- **Regular files only, symlinks never followed.** :func:`_open_regular` opens a local object
  with ``O_NOFOLLOW | O_NONBLOCK`` at its resolved path and refuses (:class:`NotRegular`)
  anything that is not a regular file there, before and after the open; listing
  (:func:`_list_local`) works by ``lstat``, opens nothing, skips symlinks and refuses a
  non-regular ``*.parquet`` by name.
- **The name recorded is the object read** (S3): a name is accepted, listed or opened only
  when the client's own parse of it gives it back unchanged (:func:`read_as_named`: s3fs
  reads ``key?versionId=...`` as ``key``, a second name for one object).
- **Identity.** :func:`_identity` is what must not change between registration and a release:
  S3's ETag, VersionId and LastModified (an S3 object is read at its recorded version), or a
  file's size, modification time and inode change time in nanoseconds by ``lstat``. The last
  of each is set by the kernel or the store at every write and cannot be put back by the
  writer, so a change made after a release's request and undone before its re-check (the
  bytes and the mtime restored, an object put again with its old bytes) is still found
  (:func:`identity_differs`).
- **Bounded work.** At most :data:`MAX_OBJECTS` objects, a registration's reads bounded in time
  (:class:`_Deadline`), byte ranges fetched in as few requests as their gaps allow
  (:func:`_read_ranges`).
- Errors name the object and an exception's *type* only (:func:`_fault_name`), never its
  message, which may quote a signed URL or a header.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.config import Settings
from service.errors import InvalidInput

#: Objects a reference may name (each is checked before every release).
MAX_OBJECTS = 10_000


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


def _roots(settings: Settings, protocol: str) -> tuple[str, ...]:
    roots = settings.reference_root_list
    if protocol == "s3":
        return tuple(r[len("s3://") :].strip("/") for r in roots if r.startswith("s3://"))
    return tuple(os.path.realpath(r) for r in roots if not r.startswith("s3://"))


def _under(path: str, roots: Sequence[str]) -> bool:
    return bool(path) and any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class NotRegular(OSError):
    """The path is not (or no longer) a regular file at its resolved place under a root."""


def read_as_named(fs: Any, path: str) -> bool:
    """Whether the S3 client reads the object ``path`` names (``bucket/key``), not another.

    The client parses a name before it asks for it: s3fs drops a ``?versionId=...`` suffix
    (read as the current version when the filesystem is not version-aware), so
    ``bucket/a.parquet?versionId=1`` named, and was recorded as, another object than the one
    read: the same rows under a second key, a second dataset and a second budget, with any
    columns (a copy's content digest covers the columns chosen only). A name is accepted only
    when the client's own parse of it gives back exactly that bucket and key, no version:
    whatever else the client may come to normalise is refused the same way."""
    try:
        bucket, key, version = fs.split_path(path)
    except Exception:
        return False
    return version is None and bool(key) and f"{bucket}/{key}" == path


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
        #: A local file's ``st_dev:st_ino`` (the file itself, whatever path reached it).
        self.file_id: str | None = None
        if location.protocol == "file":
            self._fd = _open_regular(path, location.roots)
            opened = os.fstat(self._fd)
            self.size = opened.st_size
            self.file_id = f"{opened.st_dev}:{opened.st_ino}"
        else:
            if not _under(path, location.roots):
                raise NotRegular(path)
            self._fs = location.filesystem()
            if not read_as_named(self._fs, path):
                raise NotRegular(path)
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


def _fault_name(exc: BaseException) -> str:
    return type(exc).__name__


def _identity(fs: Any, location: Location, path: str) -> dict[str, Any]:
    """What must not change, checked cheaply before and after every release (the digests are
    checked as the bytes are read): S3's ETag (and VersionId), or a file's size and mtime,
    from ``lstat`` (a file replaced by a symlink, or by anything but a regular file, has
    changed)."""
    if location.protocol == "s3":
        info = fs.info(path, refresh=True)
        modified = info.get("LastModified")
        return {
            "path": path,
            "size": int(info["size"]),
            "etag": str(info.get("ETag", "")),
            "version": info.get("VersionId"),
            LAST_MODIFIED: None if modified is None else int(modified.timestamp()) * 10**9,
        }
    status = os.lstat(path)
    if not stat.S_ISREG(status.st_mode):
        raise NotRegular(path)
    return {
        "path": path,
        "size": status.st_size,
        "mtime_ns": status.st_mtime_ns,
        CTIME_NS: status.st_ctime_ns,
    }


#: Identity fields set by the kernel (a file's inode change time) or the store (an S3 object's
#: LastModified, whole seconds, as nanoseconds) at every change, which a writer cannot set back:
#: a change undone before a re-check (the bytes and the mtime put back) still differs here.
CTIME_NS = "ctime_ns"
LAST_MODIFIED = "last_modified_ns"
LATER_FIELDS = frozenset({CTIME_NS, LAST_MODIFIED})


def identity_differs(
    recorded: dict[str, Any], current: dict[str, Any], since_ns: int | None = None
) -> bool:
    """Whether an object's identity now (:func:`_identity`) differs from its record.

    Every field but those of :data:`LATER_FIELDS`; those only with ``since_ns`` (a release's
    request, in ns since the epoch), where recorded, and when the new stamp is at or after it: a
    change made and undone (the same bytes put back) *before* the release was requested races
    with none of its jobs, and its registered bytes are still released; one stamped after it is
    a change whatever the bytes are now (a job may have read the other bytes meanwhile). A
    record made before these fields compares the fields it has."""
    for key, value in current.items():
        if key not in LATER_FIELDS:
            if recorded.get(key) != value:
                return True
        elif (
            since_ns is not None
            and key in recorded
            and recorded[key] != value
            and (value is None or value >= since_ns - STAMP_SLACK_NS.get(key, 0))
        ):
            return True
    return False


#: S3's LastModified has whole seconds: a stamp within a second before the request may be a
#: change after it, so it counts. Linux stamps an inode's change time from its coarse clock
#: (the last timer tick: up to a jiffy, 10 ms at HZ=100, behind the real moment, and it was
#: seen 1.6 ms before a request taken before the change here), so a change made and undone
#: just after the request could carry stamps before it and pass as one made before: 50 ms
#: counts as after. The cost: a change made and undone within 50 ms *before* a request fails
#: that release too (decided by the stamps, not by when its job ran).
STAMP_SLACK_NS = {LAST_MODIFIED: 10**9, CTIME_NS: 50 * 10**6}


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
        else:
            if not read_as_named(fs, path) and not read_as_named(fs, f"{path}/x"):
                # Checked before any request: the client would list or read another name.
                raise InvalidInput("uri", "names another object than the one it would read")
            if fs.isfile(path):
                found = [path]
            else:
                found = sorted(p for p in fs.find(path) if p.endswith(".parquet"))
            for name in found:
                if not read_as_named(fs, name):
                    raise InvalidInput("uri", f"{name} names another object than the one read")
    except InvalidInput:
        raise
    except Exception as exc:
        raise InvalidInput("uri", f"could not be listed ({_fault_name(exc)})") from None
    if not found:
        raise InvalidInput("uri", "holds no .parquet objects")
    if len(found) > MAX_OBJECTS:
        raise InvalidInput("uri", f"holds more than {MAX_OBJECTS} objects")
    return found


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
