"""Opaque keyset cursors shared by every list endpoint.

A cursor names the last item of a page by its sort key (for releases ``(created_at, id)``), not
by its position: a row inserted while a client pages through a list never shifts the next page,
and a page is one index range scan however deep it is. The text is URL-safe base64 of compact
JSON; clients must treat it as opaque (its content may change between versions).
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

from service.errors import InvalidInput

T = TypeVar("T")

#: Longer cursors than any this service issues are refused before decoding (the API bounds the
#: parameter with the same number).
MAX_CURSOR_LENGTH = 200

BAD_CURSOR = "not a cursor this service issued; pass a list's `next` value unchanged"


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page: its rows, how many rows match the filters in all, and the next cursor."""

    items: list[T]
    total: int
    next: str | None


def _encode(kind: str, *parts: str | int) -> str:
    raw = json.dumps([kind, *parts], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str, kind: str, field: str) -> list[object]:
    if len(cursor) > MAX_CURSOR_LENGTH:
        raise InvalidInput(field, f"at most {MAX_CURSOR_LENGTH} characters")
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise InvalidInput(field, BAD_CURSOR) from None
    if not isinstance(value, list) or not value or value[0] != kind:
        raise InvalidInput(field, BAD_CURSOR)
    return value[1:]


def time_id_cursor(kind: str, created_at: datetime, row_id: uuid.UUID) -> str:
    """The cursor after a row sorted by ``(created_at, id)``."""
    return _encode(kind, created_at.astimezone(UTC).isoformat(), str(row_id))


def parse_time_id_cursor(
    cursor: str, kind: str, field: str = "cursor"
) -> tuple[datetime, uuid.UUID]:
    """The ``(created_at, id)`` a cursor from :func:`time_id_cursor` names; 422 otherwise."""
    parts = _decode(cursor, kind, field)
    try:
        if len(parts) != 2 or not all(isinstance(part, str) for part in parts):
            raise ValueError
        created_at = datetime.fromisoformat(str(parts[0]))
        if created_at.tzinfo is None:
            raise ValueError
        return created_at.astimezone(UTC), uuid.UUID(str(parts[1]))
    except ValueError:
        raise InvalidInput(field, BAD_CURSOR) from None


def ledger_cursor(kind: str, created_at: datetime, release_id: uuid.UUID, entry: str) -> str:
    """The cursor after a ledger entry sorted by ``(created_at, release_id, kind)``: public
    values only (not the entry's global id, numbered when it was written)."""
    return _encode(kind, created_at.astimezone(UTC).isoformat(), str(release_id), entry)


def parse_ledger_cursor(
    cursor: str, kind: str, field: str = "cursor"
) -> tuple[datetime, uuid.UUID, str]:
    """The ``(created_at, release_id, kind)`` a cursor from :func:`ledger_cursor` names."""
    parts = _decode(cursor, kind, field)
    try:
        if len(parts) != 3 or not all(isinstance(part, str) for part in parts):
            raise ValueError
        created_at = datetime.fromisoformat(str(parts[0]))
        if created_at.tzinfo is None or parts[2] not in ("charge", "refund"):
            raise ValueError
        return created_at.astimezone(UTC), uuid.UUID(str(parts[1])), str(parts[2])
    except ValueError:
        raise InvalidInput(field, BAD_CURSOR) from None


def seq_cursor(kind: str, seq: int) -> str:
    """The cursor after a row sorted by an integer sequence number."""
    return _encode(kind, seq)


def parse_seq_cursor(cursor: str, kind: str, field: str = "cursor") -> int:
    parts = _decode(cursor, kind, field)
    if len(parts) != 1 or type(parts[0]) is not int or not 0 <= parts[0] <= 2**63 - 1:
        raise InvalidInput(field, BAD_CURSOR)
    return parts[0]
