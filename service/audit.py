"""The append-only, hash-chained audit log.

Each event's hash is ``SHA-256(prev_hash || canonical JSON of the event)``; the one-row
``audit_head`` table holds the last ``seq`` and hash. Appending locks the head row, so appends are
serialised on PostgreSQL (SQLite transactions are serialised already) and the chain has no forks;
``verify`` recomputes every hash, checks the links and that the head matches the last event, so
an edited, removed or reordered event (the last one included) is detected.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import AuditEvent, AuditHead, utcnow

GENESIS_HASH = "0" * 64


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json_value(details: dict[str, Any]) -> dict[str, Any]:
    """Details as plain JSON values (decimals and ids become strings)."""
    result: dict[str, Any] = json.loads(json.dumps(details, default=_json_default))
    return result


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


def record(
    session: Session,
    event_type: str,
    *,
    actor_key_id: uuid.UUID | None,
    details: dict[str, Any],
    dataset_id: uuid.UUID | None = None,
    release_id: uuid.UUID | None = None,
) -> AuditEvent:
    """Append an event in the caller's transaction (it commits with the change it records)."""
    head = session.execute(
        select(AuditHead).where(AuditHead.id == 1).with_for_update()
    ).scalar_one()
    seq = head.last_seq + 1
    created_at = utcnow()
    clean = to_json_value(details)
    digest = event_digest(
        prev_hash=head.last_hash,
        seq=seq,
        event_type=event_type,
        actor_key_id=actor_key_id,
        dataset_id=dataset_id,
        release_id=release_id,
        created_at=created_at,
        details=clean,
    )
    event = AuditEvent(
        seq=seq,
        event_type=event_type,
        actor_key_id=actor_key_id,
        dataset_id=dataset_id,
        release_id=release_id,
        created_at=created_at,
        details=clean,
        prev_hash=head.last_hash,
        hash=digest,
    )
    session.add(event)
    head.last_seq = seq
    head.last_hash = digest
    return event


def list_events(session: Session, after: int, limit: int) -> list[AuditEvent]:
    """Events with ``seq > after`` in chain order."""
    query = select(AuditEvent).where(AuditEvent.seq > after).order_by(AuditEvent.seq).limit(limit)
    return list(session.execute(query).scalars())


@dataclass
class VerifyReport:
    """Outcome of :func:`verify`: ``ok`` is true only when no problem was found."""

    checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _iter_chain(session: Session, batch: int = 1000) -> Iterator[AuditEvent]:
    after = 0
    while True:
        events = list_events(session, after, batch)
        if not events:
            return
        yield from events
        after = events[-1].seq


def verify(session: Session) -> VerifyReport:
    """Recompute the whole chain and compare it with what is stored."""
    report = VerifyReport()
    expected_prev = GENESIS_HASH
    expected_seq = 1
    for event in _iter_chain(session):
        if event.seq != expected_seq:
            report.problems.append(f"event {expected_seq} is missing (next stored is {event.seq})")
        if event.prev_hash != expected_prev:
            report.problems.append(f"event {event.seq}: prev_hash does not match event before it")
        recomputed = event_digest(
            prev_hash=event.prev_hash,
            seq=event.seq,
            event_type=event.event_type,
            actor_key_id=event.actor_key_id,
            dataset_id=event.dataset_id,
            release_id=event.release_id,
            created_at=event.created_at,
            details=event.details,
        )
        if recomputed != event.hash:
            report.problems.append(f"event {event.seq}: content does not match its hash")
        expected_prev = event.hash
        expected_seq = event.seq + 1
        report.checked += 1
    head = session.execute(select(AuditHead).where(AuditHead.id == 1)).scalar_one_or_none()
    if head is None:
        report.problems.append("the chain head is missing")
    elif head.last_seq != expected_seq - 1 or head.last_hash != expected_prev:
        report.problems.append(
            f"the chain head says {head.last_seq} events, the last stored event is "
            f"{expected_seq - 1}: events were removed or the head was altered"
        )
    return report
