"""Streaming multipart reader for dataset uploads.

Starlette's form parser spools large files to the system temp directory; that would put raw rows
outside the store. This reader feeds the request stream to python-multipart's parser and writes
the ``file`` part straight into the store's ``incoming`` directory, enforcing the size limit as
bytes arrive. Whatever goes wrong, the partial file is removed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import BinaryIO

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header

from service.errors import InvalidInput, PayloadTooLarge
from service.store import DatasetStore

MAX_FIELD_BYTES = 64 * 1024
MAX_FIELDS = 32


@dataclass
class ReceivedForm:
    """The text fields and the stored ``file`` part of an upload."""

    fields: dict[str, str] = field(default_factory=dict)
    file_path: Path | None = None
    file_suffix: str = ""

    def discard(self) -> None:
        if self.file_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.file_path.unlink()


class _Receiver:
    def __init__(self, store: DatasetStore, max_bytes: int) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.form = ReceivedForm()
        self.header_field = b""
        self.header_value = b""
        self.headers: dict[bytes, bytes] = {}
        self.part_name: str | None = None
        self.part_is_file = False
        self.buffer = bytearray()
        self.handle: BinaryIO | None = None
        self.file_bytes = 0

    def on_part_begin(self) -> None:
        self.headers = {}
        self.part_name = None
        self.part_is_file = False
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
        self.part_name = name.decode("utf-8", "replace") if name is not None else None
        filename = options.get(b"filename")
        if self.part_name == "file":
            if self.form.file_path is not None:
                raise InvalidInput("file", "send exactly one file part")
            suffix = (
                PurePath(filename.decode("utf-8", "replace")).suffix.lower() if filename else ""
            )
            self.form.file_suffix = suffix
            self.form.file_path = self.store.new_incoming_path(suffix)
            self.handle = open(self.form.file_path, "wb")  # noqa: SIM115 - closed in on_part_end
            self.part_is_file = True
        elif len(self.form.fields) >= MAX_FIELDS:
            raise InvalidInput("body", f"too many form fields (at most {MAX_FIELDS})")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.part_is_file:
            assert self.handle is not None
            self.file_bytes += end - start
            if self.file_bytes > self.max_bytes:
                raise PayloadTooLarge(
                    f"file: larger than the limit of {self.max_bytes // (1024 * 1024)} MiB "
                    "(DPSS_MAX_UPLOAD_MB)"
                )
            self.handle.write(data[start:end])
        else:
            self.buffer += data[start:end]
            if len(self.buffer) > MAX_FIELD_BYTES:
                raise InvalidInput(self.part_name or "body", "form field too long")

    def on_part_end(self) -> None:
        if self.part_is_file:
            assert self.handle is not None
            self.handle.close()
            self.handle = None
        elif self.part_name is not None:
            self.form.fields[self.part_name] = self.buffer.decode("utf-8", "replace")

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


async def receive_upload(request: Request, store: DatasetStore, max_bytes: int) -> ReceivedForm:
    """Read a multipart upload, storing its ``file`` part in the store's incoming directory."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise InvalidInput("body", "send multipart/form-data with a 'file' part and form fields")
    declared = request.headers.get("content-length")
    if (
        declared is not None
        and declared.isdigit()
        and int(declared) > max_bytes + MAX_FIELD_BYTES * MAX_FIELDS
    ):
        raise PayloadTooLarge(
            f"file: larger than the limit of {max_bytes // (1024 * 1024)} MiB (DPSS_MAX_UPLOAD_MB)"
        )
    receiver = _Receiver(store, max_bytes)
    callbacks = {
        "on_part_begin": receiver.on_part_begin,
        "on_header_field": receiver.on_header_field,
        "on_header_value": receiver.on_header_value,
        "on_header_end": receiver.on_header_end,
        "on_headers_finished": receiver.on_headers_finished,
        "on_part_data": receiver.on_part_data,
        "on_part_end": receiver.on_part_end,
    }
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except (InvalidInput, PayloadTooLarge):
        receiver.close()
        receiver.form.discard()
        raise
    except Exception:
        receiver.close()
        receiver.form.discard()
        raise InvalidInput("body", "malformed multipart body") from None
    receiver.close()
    if receiver.form.file_path is None:
        raise InvalidInput("file", "missing: send the data as a multipart part named 'file'")
    return receiver.form
