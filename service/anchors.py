"""Audit anchors: the chain's head, kept outside the database, so that a restore is noticed.

A database restored from an older backup is a consistent, valid chain that simply ends earlier:
every revoked key is live again and every budget spent since the backup is back. Nothing inside
the database can show that, so the workers append the head to a place outside it (an
*anchor*): a file, best on another volume than the database (``DPSS_AUDIT_ANCHOR_PATH``), one
JSON line per anchor::

    {"time": "2026-11-26T14:00:00+00:00", "seq": 812, "hash": "<64 hex>", "mac": "<64 hex>"}

and, with ``DPSS_AUDIT_ANCHOR_URL``, the same line POSTed to a collector. A line is written every
``DPSS_AUDIT_ANCHOR_INTERVAL_SECONDS`` when the head changed (idle services write nothing). With
``DPSS_AUDIT_HMAC_KEY`` the line carries ``HMAC-SHA256(key, "dpss audit anchor" | time | seq |
hash)``, so that whoever can write the file but not read the key cannot add anchors that verify.

:func:`check` (run by ``dpss audit verify``) compares the chain with *every* anchor, not only the
last one: a worker restarted on a restored database anchors its shorter chain too, and that
newer line must not hide the older, longer one. A chain that ends before an anchored event, or
holds another hash there, is a restore (or a rewrite) and fails the verification.

A restore detected by a worker or an API process at start (:func:`detect_restore`) is recorded
in the audit log (``restore_detected``) and *holds* the service (``restore_hold``): the API
refuses charges and key use until an admin runs ``dpss audit accept-restore``
(:func:`accept_restore`), which records ``restore_accepted`` and then appends an acceptance
line to the anchor file (:meth:`AnchorWriter.write_acceptance`) naming the head that holds it.
From then on anchors written before that line are not checked (they name the lost history),
while any later restore, to a backup older than the acceptance itself, no longer holds the
head the line names and is caught against every anchor again. Only the line counts, never the
event alone: someone who can write the database could append the event too
(:func:`accepted_by`).

The default anchor file is outside the data directory
(:attr:`service.config.Settings.resolved_audit_anchor_path`), so that a backup of the data
directory does not carry it.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from service import audit
from service.audit import Head
from service.config import Settings
from service.db.models import AuditEvent, AuditHead, RestoreHold, utcnow

log = logging.getLogger("dpss.audit")

MAC_LABEL = "dpss audit anchor"
#: Anchor lines at most this long are read; a longer line is damage, not an anchor.
MAX_LINE_CHARS = 512
#: Seconds a POST to ``DPSS_AUDIT_ANCHOR_URL`` may take.
POST_TIMEOUT_SECONDS = 5.0


#: The MAC label of an acceptance line: the flag is covered, so a plain anchor's MAC cannot
#: vouch for an acceptance.
ACCEPTS_MAC_LABEL = "dpss audit anchor accepts"


def anchor_mac(key: bytes, time: str, seq: int, digest: str, accepts: bool = False) -> str:
    label = ACCEPTS_MAC_LABEL if accepts else MAC_LABEL
    message = f"{label}|{time}|{seq}|{digest}".encode("ascii")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Anchor:
    """One anchor line: the head ``seq``/``hash`` at ``time``; ``line`` numbers it in its file.

    ``accepts``: the line ``dpss audit accept-restore`` appends after recording an acceptance,
    naming the head that holds it. Only such a line makes anchors written before it unchecked
    (:func:`check`): the anchor file is what someone who can write the database cannot reach,
    so a ``restore_accepted`` event alone (which they can append) silences nothing."""

    time: str
    seq: int
    hash: str
    mac: str | None = None
    line: int = 0
    accepts: bool = False
    #: The file the line was read from (``line`` orders lines within it: the order written).
    file: str = ""

    @property
    def head(self) -> Head:
        return Head(self.seq, self.hash)

    def to_json(self) -> str:
        body: dict[str, object] = {
            "time": self.time,
            "seq": self.seq,
            "hash": self.hash,
            "mac": self.mac,
        }
        if self.accepts:
            body["accepts"] = True
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def of(
        cls, head: Head, key: bytes | None, now: datetime | None = None, accepts: bool = False
    ) -> Anchor:
        time = (now or datetime.now(UTC)).isoformat(timespec="seconds")
        mac = anchor_mac(key, time, head.seq, head.hash, accepts) if key is not None else None
        return cls(time=time, seq=head.seq, hash=head.hash, mac=mac, accepts=accepts)


@dataclass
class AnchorFile:
    """The anchors read from a file, and what was wrong with its other lines."""

    path: Path
    anchors: list[Anchor] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def append(path: Path, anchor: Anchor) -> None:
    """Append ``anchor`` as one line (``0600``, ``O_APPEND`` under an exclusive ``flock``, so
    lines of several workers never interleave) and ``fsync`` it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        os.write(descriptor, (anchor.to_json() + "\n").encode("ascii"))
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _parse(text: str, number: int) -> Anchor:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not an object")
    seq, digest, time, mac = (
        value.get("seq"),
        value.get("hash"),
        value.get("time"),
        value.get("mac"),
    )
    Head.parse(f"{seq}:{digest}")  # the same bounds as a head given by hand
    if not isinstance(seq, int) or not isinstance(digest, str) or not isinstance(time, str):
        raise ValueError("seq, hash and time are required")
    if not (time.isascii() and time.isprintable()):
        # verify prints the time: a JSON escape such as \u001b would reach the terminal
        raise ValueError("time is not printable")
    if mac is not None and not isinstance(mac, str):
        raise ValueError("mac is not a string")
    accepts = value.get("accepts", False)
    if not isinstance(accepts, bool):
        raise ValueError("accepts is not a boolean")
    return Anchor(time=time, seq=seq, hash=digest, mac=mac, line=number, accepts=accepts)


def read(path: Path, key: bytes | None) -> AnchorFile:
    """Every anchor in ``path`` whose line is well formed (and, given ``key``, whose MAC is
    right). A malformed last line is a write cut short (noted); any other bad line, or a wrong
    MAC, is a problem: the file was edited."""
    result = AnchorFile(path)
    with open(path, encoding="ascii", errors="replace") as handle:
        lines = handle.read().split("\n")
    ending = lines.pop() if lines else ""  # text after the last newline: a cut-short write
    numbered = [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    if ending.strip():
        result.notes.append(f"{path}: the last line is incomplete (a write cut short); ignored")
    unmacced = 0
    for number, line in numbered:
        try:
            if len(line) > MAX_LINE_CHARS:
                raise ValueError("too long")
            anchor = replace(_parse(line, number), file=str(path))
        except ValueError:
            result.problems.append(f"{path}: line {number} is not an anchor")
            continue
        if key is not None:
            if anchor.mac is None and anchor.accepts:
                # An anchor without a MAC can only add checks; an acceptance removes them, so
                # with the key only one that carries it counts (`dpss audit accept-restore`
                # run with DPSS_AUDIT_HMAC_KEY writes one).
                result.problems.append(
                    f"{path}: line {number}: an acceptance without a MAC (forged, or written "
                    "without DPSS_AUDIT_HMAC_KEY); not counted"
                )
                continue
            if anchor.mac is None:
                unmacced += 1
            elif not hmac.compare_digest(
                anchor.mac, anchor_mac(key, anchor.time, anchor.seq, anchor.hash, anchor.accepts)
            ):
                result.problems.append(
                    f"{path}: line {number}: the MAC does not match (forged, or another key)"
                )
                continue
        result.anchors.append(anchor)
    if unmacced:
        result.notes.append(f"{path}: {unmacced} anchors carry no MAC (written without the key)")
    return result


def check(session: Session, anchors: Iterable[Anchor], last: Head) -> tuple[list[str], list[str]]:
    """Problems and notes of the chain ending at ``last`` against ``anchors``.

    Every anchor must name an event the chain holds, with the hash the chain holds: a chain that
    is shorter than an anchor or diverges from one was restored from an older backup (or cut
    and rewritten). The problem names the newest (highest) anchor that fails, when it was
    written, and how many others fail with it.
    """
    anchors = list(anchors)
    acceptance = accepted_by(session, anchors, last)
    if acceptance is not None:
        kept = [a for a in anchors if not _written_before(a, acceptance)]
        skipped = len(anchors) - len(kept)
        anchors = kept
        if skipped:
            accepted_note = (
                f"{skipped} anchors written before the restore accepted at "
                f"{acceptance.time} (line {acceptance.line}) were not checked (they describe "
                "the history given up)"
            )
            problems, notes = check(session, anchors, last) if anchors else ([], [])
            return problems, [*notes, accepted_note]
    if not anchors:
        return [], []
    wanted = sorted({a.seq for a in anchors if 0 < a.seq <= last.seq})
    stored: dict[int, str] = {}
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        rows = session.execute(
            select(AuditEvent.seq, AuditEvent.hash).where(AuditEvent.seq.in_(chunk))
        )
        stored.update({int(seq): str(digest) for seq, digest in rows})
    failing: list[tuple[Anchor, str]] = []
    for anchor in anchors:
        if anchor.seq > last.seq:
            failing.append(
                (
                    anchor,
                    f"the chain ends at event {last.seq} but the anchor of {anchor.time} "
                    f"(line {anchor.line}) names event {anchor.seq}: the database was restored "
                    "from a backup older than that anchor (revoked keys live again, spent "
                    "budget handed back) or its newest events were removed",
                )
            )
        elif anchor.seq == 0:
            continue
        elif anchor.seq not in stored:
            failing.append((anchor, f"event {anchor.seq}, named by an anchor, is missing"))
        elif not hmac.compare_digest(stored[anchor.seq], anchor.hash):
            failing.append(
                (
                    anchor,
                    f"event {anchor.seq} differs from the anchor of {anchor.time} (line "
                    f"{anchor.line}): the database was restored from an older backup and has "
                    "recorded other events since, or the chain was rewritten",
                )
            )
    newest = max(anchors, key=lambda a: a.seq)
    if not failing:
        # What no anchor covers yet: a cut of these events, with their rows and the head,
        # is seen only once a later anchor names one of them.
        tail = (
            f"; events {newest.seq + 1}-{last.seq} are newer than any anchor"
            if newest.seq < last.seq
            else ""
        )
        return [], [
            f"the chain holds all {len(anchors)} anchors (newest: event {newest.seq}, "
            f"{newest.time}){tail}"
        ]
    _, message = max(failing, key=lambda item: item[0].seq)
    if len(failing) > 1:
        message += f" ({len(failing) - 1} older anchors fail too)"
    return ["restore detected: " + message], []


ACCEPTED = "restore_accepted"
DETECTED = "restore_detected"


def accepted_by(session: Session, anchors: list[Anchor], last: Head) -> Anchor | None:
    """The last acceptance line (``accepts``) among ``anchors`` (in the order read: a file's
    lines in the order written) whose head the chain ending at ``last`` holds, if any: anchors
    written before it describe the history an admin gave up.

    Read from the anchor file, never from the chain: someone who can write the database (and,
    without the MAC key, extend the chain) could append a ``restore_accepted`` event after
    cutting the newest events, and an acceptance read from the chain would then leave every
    anchor unchecked. A restore to a backup older than the acceptance loses the head the line
    names, so the line no longer counts (and fails as an anchor)."""
    accepting = [a for a in anchors if a.accepts and 0 < a.seq <= last.seq]
    if not accepting:
        return None
    rows = session.execute(
        select(AuditEvent.seq, AuditEvent.hash).where(
            AuditEvent.seq.in_(sorted({a.seq for a in accepting}))
        )
    )
    stored = {int(seq): str(digest) for seq, digest in rows}
    held = [
        anchor
        for anchor in accepting
        if anchor.seq in stored and hmac.compare_digest(stored[anchor.seq], anchor.hash)
    ]
    return held[-1] if held else None


def _as_utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _written_before(anchor: Anchor, acceptance: Anchor) -> bool:
    """Whether ``anchor`` was written no later than ``acceptance``. Within one file by line
    order, the order the lines were appended: the times are the writers' clocks, and a clock
    set back after an acceptance (or one that ran ahead when it was written) would otherwise
    leave every later anchor unchecked, so that a cut of the newest events went unseen. Only
    an anchor of another file (one an earlier version wrote in the data directory) is placed
    by its time."""
    if anchor.file == acceptance.file:
        return anchor.line <= acceptance.line
    try:
        moment = _as_utc(datetime.fromisoformat(anchor.time))
        return moment <= _as_utc(datetime.fromisoformat(acceptance.time))
    except ValueError:
        return False  # an unreadable time is checked, never skipped


def anchor_paths(settings: Settings) -> list[Path]:
    """The anchor files to check: the configured (or default) one, and the one in the data
    directory that earlier versions wrote by default, if it is there."""
    paths = [settings.resolved_audit_anchor_path]
    legacy = settings.legacy_audit_anchor_path
    if settings.audit_anchor_path is None and legacy.resolve() != paths[0].resolve():
        paths.append(legacy)
    return [path for path in paths if path.is_file()]


def restore_problem(
    session_factory: sessionmaker[Session], settings: Settings, key: bytes | None
) -> str | None:
    """The restore the anchor files show against the database, if any (not recorded)."""
    anchors = [anchor for path in anchor_paths(settings) for anchor in read(path, key).anchors]
    if not anchors:
        return None
    with session_factory() as session:
        row = session.execute(select(AuditHead).where(AuditHead.id == 1)).scalar_one_or_none()
        if row is None:
            return None
        problems, _ = check(session, anchors, Head(row.last_seq, row.last_hash))
    return problems[0] if problems else None


def hold(session: Session, problem: str) -> bool:
    """Record a detected restore and hold the service; False if it was already held."""
    if session.get(RestoreHold, 1) is not None:
        return False
    shown = problem[:2000]
    session.add(RestoreHold(id=1, problem=shown))
    session.flush()
    audit.record(session, DETECTED, actor_key_id=None, details={"problem": shown})
    return True


def detect_restore(
    session_factory: sessionmaker[Session], settings: Settings, key: bytes | None
) -> str | None:
    """Check the database against the anchor files; on a restore, hold the service (logged
    as an error, recorded once in the audit log). Returns the problem, if any."""
    problem = restore_problem(session_factory, settings, key)
    if problem is None:
        return None
    try:
        with session_factory.begin() as session:
            held = hold(session, problem)
    except IntegrityError:
        held = False  # another process recorded it at the same moment
    log.error(
        "audit anchor: %s; the API refuses charges and key use until an admin runs "
        "`dpss audit accept-restore`%s",
        problem,
        "" if held else " (already held)",
    )
    return problem


def accept_restore(session: Session, now: datetime | None = None) -> str | None:
    """An admin's acceptance of the restore held (or found): lift the hold, and record which
    anchors describe the history given up (those written until now). Returns the problem
    accepted, ``None`` when nothing was held."""
    now = now or utcnow()
    row = session.get(RestoreHold, 1)
    problem = row.problem if row is not None else None
    if row is not None:
        session.delete(row)
    audit.record(
        session,
        ACCEPTED,
        actor_key_id=None,
        details={"problem": problem, "anchors_before": now.isoformat(timespec="seconds")},
    )
    return problem


class AnchorWriter:
    """Appends the audit head to the anchor file (and URL) when it changed since the last time.

    One runs in each worker process (``dpss worker``; ``dpss serve`` starts one); with several
    workers the file gets a few more lines, never a torn one. At start it compares the database
    with the newest anchor in the file and logs an error when the chain is behind it.
    """

    def __init__(self, session_factory: sessionmaker[Session], settings: Settings) -> None:
        self.session_factory = session_factory
        self.settings = settings
        self.path = settings.resolved_audit_anchor_path
        self.url = settings.audit_anchor_url
        self.interval = settings.audit_anchor_interval_seconds
        key = settings.audit_hmac_key
        self._key = key.get_secret_value().encode("utf-8") if key is not None else None
        self._last: Head | None = None

    def head(self) -> Head | None:
        with self.session_factory() as session:
            row = session.execute(select(AuditHead).where(AuditHead.id == 1)).scalar_one_or_none()
            return Head(row.last_seq, row.last_hash) if row is not None else None

    def write_once(self, now: datetime | None = None) -> Anchor | None:
        """Anchor the current head if it changed since this writer's last anchor."""
        head = self.head()
        if head is None or head == self._last or head.seq == 0:
            return None
        if self._last is not None and not self._still_holds(self._last):
            # The chain no longer holds what this writer anchored: the database was restored
            # (or cut) under a running worker. Hold the service now, not at the next start.
            detect_restore(self.session_factory, self.settings, self._key)
        anchor = Anchor.of(head, self._key, now)
        append(self.path, anchor)
        self._post(anchor)
        self._last = head
        return anchor

    def write_acceptance(self, now: datetime | None = None) -> Anchor:
        """Append the acceptance line (``accepts``) naming the current head, which holds the
        ``restore_accepted`` event just committed: the anchor file's witness of the acceptance
        (:func:`accepted_by`). Raises ``OSError`` when the file cannot be written."""
        head = self.head()
        if head is None:
            raise RuntimeError("no audit head: the acceptance was not recorded")
        anchor = Anchor.of(head, self._key, now, accepts=True)
        append(self.path, anchor)
        self._post(anchor)
        self._last = head
        return anchor

    def _post(self, anchor: Anchor) -> None:
        if not self.url:
            return
        try:
            httpx.post(
                self.url,
                content=anchor.to_json(),
                timeout=POST_TIMEOUT_SECONDS,
                headers={"content-type": "application/json"},
            )
        except httpx.HTTPError as exc:
            log.warning(
                "audit anchor: POST to DPSS_AUDIT_ANCHOR_URL failed (%s)", type(exc).__name__
            )

    def _still_holds(self, anchored: Head) -> bool:
        with self.session_factory() as session:
            stored = session.execute(
                select(AuditEvent.hash).where(AuditEvent.seq == anchored.seq)
            ).scalar_one_or_none()
        return stored is not None and hmac.compare_digest(stored, anchored.hash)

    def check_at_start(self) -> list[str]:
        """Problems of the database against the anchor files: a restore holds the service
        (:func:`detect_restore`)."""
        log.info(
            "audit anchors: %s (outside the data directory unless configured there)", self.path
        )
        problem = detect_restore(self.session_factory, self.settings, self._key)
        return [problem] if problem is not None else []

    def run(self, stop: threading.Event) -> None:
        """Anchor now and then every ``interval`` seconds until ``stop`` is set; errors (the
        database or the file away) are logged and the next round tries again."""
        if self.interval <= 0:
            return
        try:
            self.check_at_start()
        except Exception as exc:
            log.warning("audit anchors not checked at start (%s)", type(exc).__name__)
        while True:
            try:
                self.write_once()
            except Exception as exc:
                log.warning("audit anchor not written (%s)", type(exc).__name__)
            if stop.wait(self.interval):
                return
