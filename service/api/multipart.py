"""Streaming multipart reader for dataset uploads.

Starlette's form parser spools large files to the system temp directory; that would put raw rows
outside the store. This reader feeds the request stream to python-multipart's parser and writes
the ``file`` part straight into the store's ``incoming`` directory, enforcing the size limit as
bytes arrive.

A body is accepted only when the parser reached the closing boundary: a truncated or
unterminated body (a client that stopped sending, a proxy that cut the stream) is refused, never
stored as a complete, shorter dataset. Whatever goes wrong, including a cancelled request, the
partial file is removed. Nothing the client sends becomes part of a path: the file name only
selects the format by its suffix, and python-multipart bounds its length with the other header
lines of its part.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from fastapi import Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import (
    DEFAULT_MAX_HEADER_COUNT,
    DEFAULT_MAX_HEADER_SIZE,
    MultipartParser,
    parse_options_header,
)

from service.errors import (
    InsufficientStorage,
    InvalidInput,
    PayloadTooLarge,
    printable,
    size_text,
)
from service.store import SUPPORTED_SUFFIXES, DatasetStore, disk_space_errors

MAX_FIELD_BYTES = 64 * 1024
MAX_FIELDS = 32
MAX_PARTS = MAX_FIELDS + 1


@dataclass
class ReceivedForm:
    """The text fields and the stored ``file`` part of an upload."""

    fields: dict[str, str] = field(default_factory=dict)
    file_path: Path | None = None
    file_suffix: str = ""
    #: The SHA-256 of the file's bytes when asked for (an idempotent upload's fingerprint).
    file_sha256: str = ""

    def discard(self) -> None:
        if self.file_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.file_path.unlink()


def file_suffix(filename: bytes) -> str:
    """The format a client's file name selects: its last suffix, lower case, if supported.

    The name may be anything (NUL bytes, thousands of characters, a Windows path): only a
    supported suffix is kept, so no client text reaches the file system.
    """
    name = filename.replace(b"\\", b"/").decode("utf-8", "replace")
    suffix = PurePosixPath(name).suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        shown = suffix if suffix.isascii() and suffix.isprintable() and len(suffix) <= 16 else ""
        raise InvalidInput(
            "file", f"unsupported file type {shown or '(none)'}; use .csv, .npy or .parquet"
        )
    return suffix


def _utf8(raw: bytes, field: str, what: str) -> str:
    """``raw`` as UTF-8, refused (422 naming ``field``) rather than repaired: a name with
    replacement characters is not the name the client meant."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(field, f"{what} is not valid UTF-8") from None


class _Receiver:
    def __init__(self, store: DatasetStore, max_bytes: int, digest: bool = False) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.digest = hashlib.sha256() if digest else None
        self.form = ReceivedForm()
        self.header_field = b""
        self.header_value = b""
        self.headers: dict[bytes, bytes] = {}
        self.parts = 0
        self.part_name: str | None = None
        self.part_is_file = False
        self.part_open = False
        self.buffer = bytearray()
        self.handle: BinaryIO | None = None
        self.file_bytes = 0
        self.complete = False

    def on_part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise InvalidInput("body", f"too many form fields (at most {MAX_FIELDS})")
        self.headers = {}
        self.part_name = None
        self.part_is_file = False
        self.part_open = True
        self.buffer = bytearray()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        self.headers[self.header_field.lower()] = self.header_value
        self.header_field = b""
        self.header_value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        name = options.get(b"name")
        self.part_name = _utf8(name, "body", "a form field's name") if name is not None else None
        if self.part_name == "file":
            if self.form.file_path is not None:
                raise InvalidInput("file", "send exactly one file part")
            filename = options.get(b"filename")
            if filename is None:
                # A text field named "file" (curl's -F file=PATH without the @): its value is
                # a path or some text, never the data; not echoed (it may be anything).
                raise InvalidInput(
                    "file",
                    "sent as a text field, not a file: send the file's contents as a file part "
                    "(curl: -F file=@PATH, with the @; its name's suffix, .csv, .npy or "
                    ".parquet, selects the format)",
                )
            self.form.file_suffix = file_suffix(filename)
            self.form.file_path, self.handle = self.store.open_incoming()
            self.part_is_file = True

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.part_is_file:
            assert self.handle is not None
            self.file_bytes += end - start
            if self.file_bytes > self.max_bytes:
                raise PayloadTooLarge(
                    f"file: larger than the limit of {size_text(self.max_bytes)} "
                    "(DPSS_MAX_UPLOAD_MB)"
                )
            with disk_space_errors():
                self.handle.write(data[start:end])
            if self.digest is not None:
                self.digest.update(data[start:end])
        else:
            self.buffer += data[start:end]
            if len(self.buffer) > MAX_FIELD_BYTES:
                raise InvalidInput(printable(self.part_name or "body"), "form field too long")

    def on_part_end(self) -> None:
        self.part_open = False
        if self.part_is_file:
            assert self.handle is not None
            with disk_space_errors():
                self.handle.close()
            self.handle = None
            if self.digest is not None:
                self.form.file_sha256 = self.digest.hexdigest()
        elif self.part_name is not None:
            field = printable(self.part_name)
            if self.part_name in self.form.fields:
                # As with a JSON key given twice: neither value silently wins.
                raise InvalidInput(field, "given twice; send each form field once")
            self.form.fields[self.part_name] = _utf8(bytes(self.buffer), field, "the value")

    def on_end(self) -> None:
        # Called only when the closing boundary ("--boundary--") has been parsed.
        self.complete = True

    def close(self) -> None:
        if self.handle is not None:
            with contextlib.suppress(OSError):
                self.handle.close()
            self.handle = None


async def receive_upload(
    request: Request, store: DatasetStore, max_bytes: int, digest: bool = False
) -> ReceivedForm:
    """Read a multipart upload, storing its ``file`` part in the store's incoming directory;
    with ``digest``, the SHA-256 of its bytes too (``form.file_sha256``)."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise InvalidInput("body", "send multipart/form-data with a 'file' part and form fields")
    declared = request.headers.get("content-length")
    if (
        declared is not None
        and declared.isascii()
        and declared.isdigit()
        and int(declared) > max_bytes + MAX_FIELD_BYTES * MAX_FIELDS
    ):
        raise PayloadTooLarge(
            f"file: larger than the limit of {size_text(max_bytes)} (DPSS_MAX_UPLOAD_MB)"
        )
    receiver = _Receiver(store, max_bytes, digest)
    callbacks = {
        "on_part_begin": receiver.on_part_begin,
        "on_header_field": receiver.on_header_field,
        "on_header_value": receiver.on_header_value,
        "on_header_end": receiver.on_header_end,
        "on_headers_finished": receiver.on_headers_finished,
        "on_part_data": receiver.on_part_data,
        "on_part_end": receiver.on_part_end,
        "on_end": receiver.on_end,
    }
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    try:
        try:
            async for chunk in request.stream():
                parser.write(chunk)
            parser.finalize()
        except (InvalidInput, PayloadTooLarge, InsufficientStorage):
            raise
        except MultipartParseError as exc:
            # python-multipart bounds each part's header lines (file names included).
            problem = (
                f"a part has a header line over {DEFAULT_MAX_HEADER_SIZE} bytes or more than "
                f"{DEFAULT_MAX_HEADER_COUNT} headers"
                if "header" in str(exc).lower()
                else "malformed multipart body"
            )
            raise InvalidInput("body", problem) from None
        except Exception:
            raise InvalidInput("body", "malformed multipart body") from None
        if not receiver.complete or receiver.part_open:
            raise InvalidInput(
                "body", "incomplete multipart body: it ends before the closing boundary"
            )
    except BaseException:
        # Also on cancellation (the client went away): no partial file may stay behind.
        receiver.close()
        receiver.form.discard()
        raise
    receiver.close()
    if receiver.form.file_path is None:
        raise InvalidInput("file", "missing: send the data as a multipart part named 'file'")
    return receiver.form


def form_body(
    file_description: str,
    fields: Mapping[str, str | None],
    required: Sequence[str] = ("file",),
) -> dict[str, Any]:
    """The ``openapi_extra`` of a route that reads a multipart form (:func:`receive_upload`):
    a binary ``file`` part described by ``file_description`` and text fields ``{name:
    description}``."""
    properties: dict[str, Any] = {
        "file": {"type": "string", "format": "binary", "description": file_description},
        **{name: {"type": "string", "description": text} for name, text in fields.items()},
    }
    schema = {"type": "object", "required": list(required), "properties": properties}
    return {
        "requestBody": {
            "required": True,
            "content": {"multipart/form-data": {"schema": schema}},
        }
    }
