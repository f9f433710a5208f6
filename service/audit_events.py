"""An audit event's canonical form, its chain hash and its MAC.

Guarantees: an event's details are stored as plain JSON values (:func:`to_json_value`: decimals
in the budget format, never exponent notation; ids and datetimes as strings), and its hash is
``SHA-256(prev_hash || canonical JSON of the event)`` (:func:`event_digest`), so the hash of the
newest event covers every earlier one; :func:`event_mac` is ``HMAC-SHA256(key, hash)``. Both are
pure functions of the stored fields (:func:`stored_event_digest` recomputes them from a row).
Writing and verifying the chain is :mod:`service.audit`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from api_schemas.common import format_budget
from service.db.models import AuditEvent

GENESIS_HASH = "0" * 64
#: Where a session finds the MAC key (``Session.info``, filled by :func:`use_hmac_key`).
HMAC_INFO_KEY = "dpss_audit_hmac_key"
TERMINAL_EVENTS = ("release_succeeded", "release_no_result", "release_failed")


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return format_budget(value)  # "0.0000001" as everywhere else, never "1E-7"
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json_value(details: dict[str, Any]) -> dict[str, Any]:
    """Details as plain JSON values (decimals and ids become strings)."""
    result: dict[str, Any] = json.loads(json.dumps(details, default=_json_default))
    return result


class _NotPlain(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _NotPlain("a repeated key")
    return result


def _no_constant(name: str) -> Any:
    raise _NotPlain(name)


def plain_json(text: str) -> bool:
    """Whether ``text`` is JSON that every reader reads alike: no object repeats a key (Python
    keeps the last value, SQLite's ``json_extract`` the first) and no ``NaN``/``Infinity``
    (not JSON). The service writes nothing else; the hash covers the value Python reads, so
    other text under a valid hash was written by someone else."""
    try:
        json.loads(text, object_pairs_hook=_unique_pairs, parse_constant=_no_constant)
    except ValueError:
        return False
    return True


def record_digest(value: Any) -> str:
    """SHA-256 of a stored JSON record's canonical form (sorted keys, no spaces): what an event
    records of a row too large to copy into it (a dataset by reference's ``reference``, every
    object, row group and chunk digest), so that verification can compare the row with it."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=_json_default)
    return hashlib.sha256(canonical.encode()).hexdigest()


def event_digest(
    *,
    prev_hash: str,
    seq: int,
    event_type: str,
    actor_key_id: uuid.UUID | None,
    dataset_id: uuid.UUID | None,
    release_id: uuid.UUID | None,
    created_at: datetime,
    details: dict[str, Any],
) -> str:
    payload = {
        "seq": seq,
        "event_type": event_type,
        "actor_key_id": str(actor_key_id) if actor_key_id else None,
        "dataset_id": str(dataset_id) if dataset_id else None,
        "release_id": str(release_id) if release_id else None,
        "created_at": created_at.isoformat(),
        "details": details,
    }
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(prev_hash.encode("ascii") + canonical.encode("ascii")).hexdigest()


def stored_event_digest(event: AuditEvent, prev_hash: str | None = None) -> str:
    """The hash ``event`` should carry, from its stored fields (after ``prev_hash``, by default
    the one it stores)."""
    return event_digest(
        prev_hash=event.prev_hash if prev_hash is None else prev_hash,
        seq=event.seq,
        event_type=event.event_type,
        actor_key_id=event.actor_key_id,
        dataset_id=event.dataset_id,
        release_id=event.release_id,
        created_at=event.created_at,
        details=event.details,
    )


def event_mac(key: bytes, digest: str) -> str:
    """``HMAC-SHA256(key, hash)``: the hash already covers the event and every one before it."""
    return hmac.new(key, digest.encode("ascii"), hashlib.sha256).hexdigest()
