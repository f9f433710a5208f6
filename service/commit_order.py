"""Stamps and commits in one order: a term computed after its point sees every row stamped by it.

The padding's terms count rows by a moment stamped *before* their transaction commits: a
release's ``created_at``, a batch's, a registration's (the dataset's ``created_at``, a batch by
reference's ``batch_requested_at``) and a deletion's ``deleted_at``. The worker recomputes an
epoch's term (and an end's after a deletion) at its claim, at a moment that follows how long
the jobs before it ran, which depends on private data. A creating transaction that stamped
``c`` and committed at ``c + L`` (a slow request) was missing from a term for a point ``P >=
c`` computed before ``c + L`` and counted by one computed after: the worker's answer, and so
the epoch's ``visible_at``, told when it reached the claim
(``tests/continual/test_term_behind_a_late_commit.py``).

**Rule.** A creating transaction stamps through :func:`stamp`, and a reader that computes a
term after its point (the worker: its claim, an epoch's padding, an end's due moment) first
calls :func:`settle`:

- PostgreSQL: :func:`stamp` takes a *shared* transaction-level advisory lock before it reads
  the clock, held until the transaction ends (creators never wait for one another);
  :func:`settle` takes the same key *exclusively* and gives it back at once (one statement):
  it returns only once no transaction holds it shared, so every creator that stamped before
  that moment has committed (or rolled back), and the reader's later statements (read
  committed: a snapshot each) see it. A creator that stamps after it stamps a later moment
  than the reader's point (the point's own row was committed, so stamped, before). New
  creators wait behind a waiting :func:`settle` (the lock queue is fair) for as long as the
  creators in flight take to commit (milliseconds; bounded by the lock timeouts either way).
- SQLite: every transaction holds the database's write lock from ``BEGIN IMMEDIATE``; the
  stamp is read after it (:func:`stamp` makes the transaction begin first), so a creator
  commits before any other transaction, reader or creator, begins: :func:`settle` has
  nothing to wait for.

A reader must not hold the shared lock itself when it settles (two such would wait for each
other): the worker's transactions never stamp; the API's requests stamp and never settle.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.orm import Session

from service.db.models import utcnow
from service.db.prepared import Prepared

#: The advisory lock's key (a bigint: ``dpss`` and 1).
KEY = 0x6470737300000001

_HOLD = text("SELECT pg_advisory_xact_lock_shared(:key)")
#: Lock, then unlock (the sub-select, kept apart by ``OFFSET 0``, is evaluated first).
_SETTLE = text(
    "SELECT pg_advisory_unlock(:key) FROM (SELECT pg_advisory_lock(:key) OFFSET 0) AS held"
)

#: The two, compiled once and run on the driver's cursor (:mod:`service.db.prepared`): one
#: of them is in every release request and every claim on PostgreSQL.
_HOLD_PREPARED = Prepared(_HOLD)
_SETTLE_PREPARED = Prepared(_SETTLE)


def postgresql(session: Session) -> bool:
    """Whether the session's database is PostgreSQL (the lock is taken there only)."""
    return session.get_bind().dialect.name == "postgresql"


def hold(session: Session) -> None:
    """Put this creating transaction in the order: the shared lock (PostgreSQL) or the write
    lock (SQLite), held until it ends. Take it *after* the creator's own dataset row (a creator
    waiting for that row, say behind an outside session's lock, must not hold the order: every
    settle, and every creator queued behind a settle, would wait with it) and *before* any
    other lock (the audit head): a creator queued behind a settle then holds only its own
    dataset row, which no creator in flight waits for (each holds its own already) and no
    reader holds while it settles."""
    if postgresql(session):
        if session.autoflush:
            session.flush()  # as the session's execute would
        _HOLD_PREPARED.run(session.connection(), {"key": KEY})
    else:
        session.connection()  # BEGIN IMMEDIATE, if not yet: the write lock before the clock


def stamp(session: Session, *, held: bool = False) -> datetime:
    """The moment a creating transaction stamps (a row a term counts by it), read once this
    transaction is in the order (:func:`hold`; ``held``: taken already), so that it commits
    before any term for a point at or after it is read."""
    if not held:
        hold(session)
    return utcnow()


def settle(session: Session) -> None:
    """Wait until every transaction that stamped before now has committed (PostgreSQL; SQLite
    serializes writers: nothing to wait for). Called by a reader that computes a term after
    its point, before it reads the rows the term counts."""
    if not postgresql(session):
        return
    if session.autoflush:
        session.flush()  # as the session's execute would
    try:
        _SETTLE_PREPARED.run(session.connection(), {"key": KEY})
    except BaseException:
        # A session-level lock outlives a rollback: should the statement fail between its
        # lock and its unlock, the connection is closed (its locks with it), never reused.
        session.connection().invalidate()
        raise
