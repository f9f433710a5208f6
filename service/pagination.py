"""Opaque keyset cursors shared by every list endpoint.

A cursor names the last item of a page by its sort key (for releases ``(created_at, id)``), not
by its position: a row inserted while a client pages through a list never shifts the next page,
and a page is one index range scan however deep it is. The text is URL-safe base64 of compact
JSON; clients must treat it as opaque (its content may change between versions).

A cursor also carries its list's *scope* (:func:`list_scope`): a digest of the route, the parent
resource (the dataset of ``/v1/datasets/{id}/releases``, the release of its epochs) and every
filter. A cursor is a position in one ordered list; given to another list (another dataset's
releases, other filters) it named a position there too and the page came back silently wrong
(rows skipped or repeated). Now it is a 422 naming ``cursor``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
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
OTHER_LIST = (
    "not a cursor of this list: it was issued by another list (another route, parent resource "
    "or filters); pass a page's `next` only to the same path with the same filters, or omit it "
    "for the first page"
)


def list_scope(route: str, **filters: object) -> str:
    """The scope of one list: a short digest of its route and its filters (None, the default
    of a filter, counts as absent). Not a secret: a forged one only pages its forger's own list
    wrongly, as a forged position always could."""
    shown = {
        name: value.isoformat() if isinstance(value, datetime) else str(value)
        for name, value in sorted(filters.items())
        if value is not None
    }
    text = json.dumps([route, shown], separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page: its rows, how many rows match the filters in all, and the next cursor."""

    items: list[T]
    total: int
    next: str | None


def _encode(kind: str, scope: str, *parts: str | int) -> str:
    raw = json.dumps([kind, scope, *parts], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str, kind: str, scope: str, field: str) -> list[object]:
    if len(cursor) > MAX_CURSOR_LENGTH:
        raise InvalidInput(field, f"at most {MAX_CURSOR_LENGTH} characters")
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise InvalidInput(field, BAD_CURSOR) from None
    if not isinstance(value, list) or len(value) < 2 or not isinstance(value[1], str):
        raise InvalidInput(field, BAD_CURSOR)
    if value[0] != kind or value[1] != scope:
        raise InvalidInput(field, OTHER_LIST)
    return value[2:]


def time_id_cursor(kind: str, scope: str, created_at: datetime, row_id: uuid.UUID) -> str:
    """The cursor after a row sorted by ``(created_at, id)``, in the list ``scope`` names."""
    return _encode(kind, scope, created_at.astimezone(UTC).isoformat(), str(row_id))


def parse_time_id_cursor(
    cursor: str, kind: str, scope: str, field: str = "cursor"
) -> tuple[datetime, uuid.UUID]:
    """The ``(created_at, id)`` a cursor from :func:`time_id_cursor` names in the list ``scope``
    names; 422 otherwise."""
    parts = _decode(cursor, kind, scope, field)
    try:
        if len(parts) != 2 or not all(isinstance(part, str) for part in parts):
            raise ValueError
        created_at = datetime.fromisoformat(str(parts[0]))
        if created_at.tzinfo is None:
            raise ValueError
        return created_at.astimezone(UTC), uuid.UUID(str(parts[1]))
    except ValueError:
        raise InvalidInput(field, BAD_CURSOR) from None


def ledger_cursor(
    kind: str, scope: str, created_at: datetime, release_id: uuid.UUID, entry: str
) -> str:
    """The cursor after a ledger entry sorted by ``(created_at, release_id, kind)``: public
    values only (not the entry's global id, numbered when it was written)."""
    return _encode(kind, scope, created_at.astimezone(UTC).isoformat(), str(release_id), entry)


def parse_ledger_cursor(
    cursor: str, kind: str, scope: str, field: str = "cursor"
) -> tuple[datetime, uuid.UUID, str]:
    """The ``(created_at, release_id, kind)`` a cursor from :func:`ledger_cursor` names."""
    parts = _decode(cursor, kind, scope, field)
    try:
        if len(parts) != 3 or not all(isinstance(part, str) for part in parts):
            raise ValueError
        created_at = datetime.fromisoformat(str(parts[0]))
        if created_at.tzinfo is None or parts[2] not in ("charge", "refund"):
            raise ValueError
        return created_at.astimezone(UTC), uuid.UUID(str(parts[1])), str(parts[2])
    except ValueError:
        raise InvalidInput(field, BAD_CURSOR) from None


def seq_cursor(kind: str, scope: str, seq: int) -> str:
    """The cursor after a row sorted by an integer sequence number."""
    return _encode(kind, scope, seq)


def parse_seq_cursor(cursor: str, kind: str, scope: str, field: str = "cursor") -> int:
    parts = _decode(cursor, kind, scope, field)
    if len(parts) != 1 or type(parts[0]) is not int or not 0 <= parts[0] <= 2**63 - 1:
        raise InvalidInput(field, BAD_CURSOR)
    return parts[0]
