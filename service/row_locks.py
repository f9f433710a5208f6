"""Contended row locks taken in attempts, so that an API request never waits for one while it
holds a database slot.

Why: a request that locks a dataset's row (a release, a preview, an append, a batch by
reference, a grant, a deletion) waited for it up to ``db_lock_timeout_seconds`` inside its unit
of work, holding one of its process's few database slots and a pooled connection
(:class:`service.api.deps.Database`). With one row held elsewhere (an outside session, a
maintenance job), every client that sent a request to that dataset took a slot and waited there,
so requests to *other* datasets queued for a slot behind them, and a request to the locked
dataset waited first for a slot and then for the row: 503 after twice the lock timeout.

How: the API marks its sessions (:data:`ATTEMPT_SECONDS` in ``session.info``, set by
``Database``); :func:`lock_one` then takes the row with a short lock timeout (``SET LOCAL
lock_timeout``, PostgreSQL), puts the connection's own timeout back once it has the row, and
raises :class:`RowBusy` when the attempt timed out. The transaction rolls back (nothing was
written yet: every caller locks before it writes or touches a file), its connection and slot go
back, and ``Database.run`` retries the whole unit of work after a pause, until
``db_lock_timeout_seconds`` have passed; then 503 with ``Retry-After``, as before.

Each caller takes the row *first*, before any write, any other lock (the commit order's
:func:`service.commit_order.hold`, the audit head) and any external act (a file written or
removed, an idempotency key stored, a ``NOTIFY``): a retry redoes all of them.

SQLite has no row locks: every transaction takes the database's one write lock at ``BEGIN
IMMEDIATE``, reads included, so a request waiting for it holds nothing that another request
could use instead (they all need that same lock). There :func:`lock_one` is a plain statement
and the busy timeout bounds the wait, as before. Sessions not marked (the workers', the command
line's) also take the row in one statement and wait as their engine allows.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Executable, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

#: ``session.info`` key: the seconds one attempt may wait for a row lock (API sessions only).
ATTEMPT_SECONDS = "dpss.row_lock_attempt_seconds"

#: PostgreSQL's SQLSTATE for ``lock_timeout`` expired (and ``NOWAIT``): lock_not_available.
LOCK_NOT_AVAILABLE = "55P03"

_SHORT = text("SELECT set_config('lock_timeout', :milliseconds, true)")
#: The connection's own lock timeout again (set at connect: the engine's ``lock_timeout``), for
#: every later statement of the transaction (the commit order, the audit head).
_RESTORE = text("SET LOCAL lock_timeout TO DEFAULT")


class RowBusy(Exception):
    """A row lock held elsewhere was not granted within one attempt: the transaction must roll
    back and the unit of work be tried again (``service.api.deps.Database.run`` does)."""


def _lock_not_available(exc: sa_exc.DBAPIError) -> bool:
    return getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE


def lock_one(session: Session, statement: Executable, params: dict[str, Any] | None = None) -> Any:
    """``statement`` (a ``SELECT ... FOR UPDATE`` of at most one row), its one value or None;
    in an API session on PostgreSQL, waiting at most one attempt's time for the lock
    (:class:`RowBusy` past it). Call it before anything else the transaction writes or locks."""
    attempt = session.info.get(ATTEMPT_SECONDS)
    if attempt is None or session.get_bind().dialect.name != "postgresql":
        return session.execute(statement, params).scalar_one_or_none()
    session.execute(_SHORT, {"milliseconds": str(max(1, round(attempt * 1000)))})
    try:
        found = session.execute(statement, params).scalar_one_or_none()
    except sa_exc.OperationalError as exc:
        if _lock_not_available(exc):
            raise RowBusy() from None
        raise
    session.execute(_RESTORE)
    return found
