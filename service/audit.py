"""The append-only, hash-chained audit log, and its reconciliation with the money.

Each event's hash is ``SHA-256(prev_hash || canonical JSON of the event)``; the one-row
``audit_head`` table holds the last ``seq`` and hash. Appending locks the head row, so appends are
serialised on PostgreSQL (SQLite transactions are serialised already) and the chain has no forks.
When the writing session holds ``DPSS_AUDIT_HMAC_KEY`` each event also stores
``HMAC-SHA256(key, hash)``; since the hash covers every earlier event, a valid MAC on the newest
event vouches for the whole chain.

:func:`verify` recomputes every hash and link, checks the head, the MACs (given the key) and an
anchor (a head exported earlier and kept outside the database), then reconciles the tables that
hold the money with the events: every ledger row, dataset budget, release (cost, status, result
hash, refund) and API key must be exactly what the events say, and every event's row must exist.
What it cannot see: a tail removed together with its rows (or a restore from an older backup)
when no anchor newer than the cut is given; a chain recomputed from scratch by someone who can
write the database when no key is used (an anchor still catches any change up to its event);
anything done by someone who holds the key or controls the service host.

This module writes and verifies the chain; an event's canonical form, hash and MAC are
:mod:`service.audit_events`, and the reconciliation of the tables with the events is
:mod:`service.audit_reconcile` (both re-exported here where the service and tests use them).
"""

from __future__ import annotations

import hmac
import re
import typing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretBytes, SecretStr
from sqlalchemy import Table, Text, bindparam, cast, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.audit_events import GENESIS_HASH as GENESIS_HASH
from service.audit_events import HMAC_INFO_KEY as HMAC_INFO_KEY
from service.audit_events import TERMINAL_EVENTS as TERMINAL_EVENTS
from service.audit_events import event_digest as event_digest
from service.audit_events import event_mac as event_mac
from service.audit_events import plain_json
from service.audit_events import stored_event_digest as stored_event_digest
from service.audit_events import to_json_value as to_json_value
from service.audit_reconcile import _reconcile as _reconcile
from service.audit_recorded import _Recorded as _Recorded
from service.db.models import AuditEvent, AuditHead, utcnow
from service.db.prepared import Prepared


def use_hmac_key(factory: sessionmaker[Session], key: SecretStr | None) -> None:
    """Make every session of ``factory`` MAC the events it records (no-op without a key)."""
    if key is None:
        return
    info = dict(factory.kw.get("info") or {})
    # SecretBytes: the factory's and sessions' reprs (tracebacks, debuggers) never show the key.
    info[HMAC_INFO_KEY] = SecretBytes(key.get_secret_value().encode("utf-8"))
    factory.configure(info=info)


#: The chain's head, locked (built once: it is read by every audited change).
_HEAD = select(AuditHead).where(AuditHead.id == 1).with_for_update()
_HEAD_TABLE = typing.cast(Table, AuditHead.__table__)
#: The same lock, as the head's two columns (:func:`record`: no ORM object to flush later).
_HEAD_ROW = (
    select(_HEAD_TABLE.c.last_seq, _HEAD_TABLE.c.last_hash)
    .where(_HEAD_TABLE.c.id == 1)
    .with_for_update()
)
#: An event's row and the head's move (:func:`record`), built once.
_INSERT_EVENT = insert(typing.cast(Table, AuditEvent.__table__))
_MOVE_HEAD = (
    update(_HEAD_TABLE)
    .where(_HEAD_TABLE.c.id == 1)
    .values(
        last_seq=bindparam("new_seq", type_=_HEAD_TABLE.c.last_seq.type),
        last_hash=bindparam("new_hash", type_=_HEAD_TABLE.c.last_hash.type),
    )
)
#: PostgreSQL: the event's row and the head's move as one statement (the move a
#: data-modifying ``WITH``, which runs whether or not the insert reads it): one round trip
#: and one statement's overhead less per audited change (``bench/bench_release_cpu.py``,
#: docs/benchmarks.md, "Release fixed cost, sixth pass"). The rows written are the same; the
#: head is already locked by this transaction (:data:`_HEAD_ROW`), so the lock order holds.
#: SQLite has no data-modifying ``WITH``: two statements there.
_INSERT_EVENT_MOVING_HEAD = _INSERT_EVENT.add_cte(_MOVE_HEAD.cte("moved_head"))
#: The three, compiled once per dialect and run on the driver's cursor (:mod:`service.db.
#: prepared`): :func:`record` runs on every audited change, twice per release.
_PREPARED_HEAD_ROW = Prepared(_HEAD_ROW)
_PREPARED_INSERT_EVENT = Prepared(_INSERT_EVENT)
_PREPARED_MOVE_HEAD = Prepared(_MOVE_HEAD)
_PREPARED_INSERT_EVENT_MOVING_HEAD = Prepared(_INSERT_EVENT_MOVING_HEAD)


def wait_for_writers(session: Session) -> None:
    """Lock the chain's head until the caller's transaction ends. Every audited change holds it
    until it commits or rolls back, so once this returns none is in flight: a read after it
    (a new snapshot per statement on PostgreSQL; SQLite serialises writers) sees their
    outcome, even that of a transaction whose connection was lost during its COMMIT."""
    session.execute(_HEAD)


def record(
    session: Session,
    event_type: str,
    *,
    actor_key_id: uuid.UUID | None,
    details: dict[str, Any],
    dataset_id: uuid.UUID | None = None,
    release_id: uuid.UUID | None = None,
) -> None:
    """Append an event in the caller's transaction (it commits with the change it records).

    The order of the writes is the chain's lock order: the caller's pending changes are
    flushed first (as the ORM's autoflush did before the head's lock), then the head is
    locked, then the event and the head's move are written at once, as prebuilt statements on
    the transaction's connection (an ORM object for each, flushed at the commit, cost a
    millisecond per audited change: ``bench/bench_release_cpu.py``); one statement on
    PostgreSQL (:data:`_INSERT_EVENT_MOVING_HEAD`). Nothing is returned: no caller read the
    event, and building it as an ORM object (never added to the session) was CPU on every
    audited change, twice per release (docs/benchmarks.md, "tenth pass")."""
    if session.autoflush:
        session.flush()
    connection = session.connection()
    head = _PREPARED_HEAD_ROW.one(connection, {})
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
    key: SecretBytes | None = session.info.get(HMAC_INFO_KEY)
    row = {
        "seq": seq,
        "event_type": event_type,
        "actor_key_id": actor_key_id,
        "dataset_id": dataset_id,
        "release_id": release_id,
        "created_at": created_at,
        "details": clean,
        "prev_hash": head.last_hash,
        "hash": digest,
        "mac": event_mac(key.get_secret_value(), digest) if key is not None else None,
    }
    if connection.dialect.name == "postgresql":
        _PREPARED_INSERT_EVENT_MOVING_HEAD.run(
            connection, {**row, "new_seq": seq, "new_hash": digest}
        )
    else:
        _PREPARED_INSERT_EVENT.run(connection, row)
        _PREPARED_MOVE_HEAD.run(connection, {"new_seq": seq, "new_hash": digest})


def list_events(session: Session, after: int, limit: int) -> list[AuditEvent]:
    """Events with ``seq > after`` in chain order."""
    query = select(AuditEvent).where(AuditEvent.seq > after).order_by(AuditEvent.seq).limit(limit)
    return list(session.execute(query).scalars())


def count_events(session: Session) -> int:
    """How many events the chain holds."""
    return int(session.execute(select(func.count()).select_from(AuditEvent)).scalar_one())


@dataclass(frozen=True)
class Head:
    """A point of the chain: event ``seq`` and its hash (``0`` and the genesis hash if empty)."""

    seq: int
    hash: str

    _TOKEN = re.compile(r"([0-9]{1,19}):([0-9a-f]{64})")

    def token(self) -> str:
        """The one-line form the operator stores outside the database."""
        return f"{self.seq}:{self.hash}"

    @classmethod
    def parse(cls, token: str) -> Head:
        match = cls._TOKEN.fullmatch(token.strip())
        if match is None:
            raise ValueError("an audit head is SEQ:HASH, as printed by `dpss audit head`")
        return cls(int(match.group(1)), match.group(2))


@dataclass
class VerifyReport:
    """Outcome of :func:`verify`: ``ok`` is true only when no problem was found.

    Problems name a table or an event and an id, never a stored value. ``head`` is the last event
    of the chain as read (the token ``dpss audit head`` prints when the report is ok).
    """

    checked: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    head: Head = field(default_factory=lambda: Head(0, GENESIS_HASH))

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


def _iter_stored(session: Session, batch: int = 1000) -> Iterator[tuple[AuditEvent, str]]:
    """Every event in chain order with its details as the database stores them (the text)."""
    after = 0
    while True:
        query = (
            select(AuditEvent, cast(AuditEvent.details, Text).label("stored"))
            .where(AuditEvent.seq > after)
            .order_by(AuditEvent.seq)
            .limit(batch)
        )
        rows = [(event, str(raw)) for event, raw in session.execute(query)]
        if not rows:
            return
        yield from rows
        after = rows[-1][0].seq


def verify(
    session: Session, *, anchor: Head | None = None, hmac_key: bytes | None = None
) -> VerifyReport:
    """Check the chain, its head, MACs and anchor, then reconcile the tables with the events.

    Run it in one transaction with a consistent snapshot (the CLI does), so a service writing
    meanwhile cannot make rows and events disagree.
    """
    report = VerifyReport()
    recorded = _Recorded()
    expected_prev = GENESIS_HASH
    expected_seq = 1
    anchored_hash: str | None = None
    first_mac: int | None = None
    macs = 0
    for event, stored in _iter_stored(session):
        if not plain_json(stored):
            # The hash covers the details as this code reads them (a repeated key: its last
            # value); SQLite's json_extract reads the first, so such text would show
            # another cost to whoever reads the database with SQL, under a valid hash.
            report.problems.append(
                f"event {event.seq}: its stored details repeat a key or hold a non-number "
                "(NaN, Infinity): readers of the database would disagree on what it says"
            )
        if event.seq != expected_seq:
            report.problems.append(f"event {expected_seq} is missing (next stored is {event.seq})")
        if event.prev_hash != expected_prev:
            report.problems.append(f"event {event.seq}: prev_hash does not match event before it")
        recomputed = stored_event_digest(event)
        if recomputed != event.hash:
            report.problems.append(f"event {event.seq}: content does not match its hash")
        if anchor is not None and event.seq == anchor.seq:
            anchored_hash = event.hash
        if event.mac is not None:
            macs += 1
        if hmac_key is not None:
            if event.mac is None:
                if first_mac is not None:
                    report.problems.append(
                        f"event {event.seq}: no MAC, but an earlier event has one"
                    )
            else:
                first_mac = event.seq if first_mac is None else first_mac
                if not hmac.compare_digest(event.mac, event_mac(hmac_key, event.hash)):
                    report.problems.append(
                        f"event {event.seq}: the MAC does not match (forged, or another key)"
                    )
        recorded.add(event, report.problems)
        expected_prev = event.hash
        expected_seq = event.seq + 1
        report.checked += 1
    last_seq = expected_seq - 1
    report.head = Head(last_seq, expected_prev)
    head = session.execute(select(AuditHead).where(AuditHead.id == 1)).scalar_one_or_none()
    if head is None:
        report.problems.append("the chain head is missing")
    elif head.last_seq != last_seq or head.last_hash != expected_prev:
        report.problems.append(
            f"the chain head says {head.last_seq} events, the last stored event is "
            f"{last_seq}: events were removed or the head was altered"
        )
    if hmac_key is not None and report.checked and first_mac is None:
        report.problems.append(
            f"no event has a MAC, the newest ({last_seq}) included: no process holding the key "
            "wrote it, or the MACs were removed"
        )
    elif hmac_key is None and macs:
        report.notes.append(f"{macs} event MACs not checked (DPSS_AUDIT_HMAC_KEY is not set)")
    if anchor is not None:
        _check_anchor(anchor, anchored_hash, last_seq, report)
    _reconcile(session, recorded, report.problems)
    return report


def _check_anchor(anchor: Head, stored: str | None, last_seq: int, report: VerifyReport) -> None:
    if anchor.seq == 0:
        if anchor.hash != GENESIS_HASH:
            report.problems.append("the anchor names event 0 with a hash other than genesis")
    elif stored is None and last_seq < anchor.seq:
        report.problems.append(
            f"the chain ends at event {last_seq} but the anchor names event {anchor.seq}: newer "
            "events were removed, or the database was restored from a backup older than the "
            "anchor (which hands back all budget spent after that backup)"
        )
    elif stored is None:
        report.problems.append(f"event {anchor.seq}, named by the anchor, is missing")
    elif not hmac.compare_digest(stored, anchor.hash):
        report.problems.append(
            f"event {anchor.seq} differs from the anchor: the chain was rewritten up to there, or "
            "the database was restored from an older backup and has recorded events since"
        )
    else:
        report.notes.append(f"the chain contains the anchored event {anchor.seq}")
