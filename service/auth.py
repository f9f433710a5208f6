"""API keys and roles.

A key is 256 random bits; only its SHA-256 is stored. A high-entropy secret needs no slow hash,
and looking up by hash means a lookup's timing says nothing about the secret; the final
comparison is constant-time all the same.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import and_, bindparam, func, or_, select
from sqlalchemy.orm import Session

from service import audit, logs
from service.db.models import ApiKey, RestoreHold, utcnow
from service.db.prepared import Prepared
from service.errors import Forbidden, NotFound, Unauthenticated
from service.keyformat import generate_secret
from service.pagination import Page, list_scope, parse_time_id_cursor, time_id_cursor

Role = Literal["admin", "owner", "analyst", "auditor"]
ROLES: tuple[Role, ...] = ("admin", "owner", "analyst", "auditor")


@dataclass(frozen=True)
class Principal:
    """The authenticated caller."""

    key_id: uuid.UUID
    role: Role
    name: str
    #: Whether a detected restore was unaccepted when the key was looked up (``restore_hold``,
    #: read in the same statement as the key, so the check costs no statement of its own).
    restore_held: bool = False


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


#: A key by its digest, with whether a restore hold is set (built once: every request with a
#: key not verified recently runs it). The columns a :class:`Principal` needs, not the
#: ``ApiKey`` entity: an ORM load (the object, its identity-map entry, its loaded state) cost
#: 0.29-0.44 ms a key check against 0.22-0.34 ms for the row (SQLite, medians of 400, load
#: 8.6), on every write and every read whose key was not verified recently. Nothing after
#: the check reads the caller's key object from the session (``operations.key_info`` selects
#: it where it is shown).
_KEY_WITH_HOLD = select(
    ApiKey.id,
    ApiKey.role,
    ApiKey.name,
    ApiKey.key_hash,
    ApiKey.revoked_at,
    select(RestoreHold.id).where(RestoreHold.id == 1).exists().label("restore_held"),
).where(ApiKey.key_hash == bindparam("digest"))


_KEY_WITH_HOLD_PREPARED = Prepared(_KEY_WITH_HOLD)


def authenticate(session: Session, secret: str | None) -> Principal:
    """The principal holding ``secret``; :class:`Unauthenticated` otherwise."""
    if not secret:
        raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
    digest = hash_secret(secret)
    if session.autoflush:
        session.flush()  # as the session's execute would
    # Compiled once, run on the driver's cursor (service.db.prepared): every write's first
    # statement.
    key = _KEY_WITH_HOLD_PREPARED.first(session.connection(), {"digest": digest})
    if key is None or not hmac.compare_digest(key.key_hash, digest) or key.revoked_at is not None:
        raise Unauthenticated("invalid or revoked API key")
    logs.bind_key_id(key.id)
    return Principal(
        key_id=key.id,
        role=key.role,
        name=key.name,
        restore_held=bool(key.restore_held),
    )


class VerifiedKeys:
    """Keys this API process verified in the last ``ttl_seconds``, for reads only.

    A read (GET) with a key verified here less than ``ttl_seconds`` ago skips the key lookup,
    one of the few statements of a budget or release read. Writes always check the key in
    their own transaction, so a revoked key never charges, creates or changes anything.

    Revocation: the process that revokes a key forgets every entry at once (:meth:`clear`);
    every other API process (``dpss api --workers N``, other hosts, ``dpss keys revoke``) stops
    accepting the key for reads at most ``ttl_seconds`` later, when the entry expires. Bounded:
    at most ``max_entries`` keys, least recently used dropped first; unknown or revoked keys are
    never stored, so a flood of random tokens cannot evict the real ones. Entries are keyed by
    the secret's SHA-256 (what the key table stores), never the secret.
    """

    def __init__(self, ttl_seconds: float, max_entries: int = 1024) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[float, Principal]] = OrderedDict()
        self._lock = threading.Lock()  # filled from database threads, read from the loop

    def get(self, digest: str) -> Principal | None:
        if self.ttl_seconds <= 0:
            return None
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            if time.monotonic() - entry[0] >= self.ttl_seconds:
                del self._entries[digest]
                return None
            self._entries.move_to_end(digest)
            return entry[1]

    def put(self, digest: str, principal: Principal) -> None:
        if self.ttl_seconds <= 0:
            return
        with self._lock:
            self._entries[digest] = (time.monotonic(), principal)
            self._entries.move_to_end(digest)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def authenticate_cached(
    session: Session, secret: str | None, verified: VerifiedKeys, read_only: bool
) -> Principal:
    """:func:`authenticate`, answered from ``verified`` for a read whose key it holds."""
    if secret and read_only:
        digest = hash_secret(secret)
        principal = verified.get(digest)
        if principal is None:
            principal = authenticate(session, secret)
            verified.put(digest, principal)
        else:
            logs.bind_key_id(principal.key_id)
        return principal
    return authenticate(session, secret)


def valid_key_digests(session: Session) -> set[str]:
    """The SHA-256 of every key not revoked (what :class:`service.api.deps.KeyDirectory`
    holds)."""
    query = select(ApiKey.key_hash).where(ApiKey.revoked_at.is_(None))
    return set(session.execute(query).scalars())


def require_role(principal: Principal, *roles: Role) -> None:
    if principal.role not in roles:
        raise Forbidden(f"role '{principal.role}' may not do this (needs {' or '.join(roles)})")


def create_key(
    session: Session, role: Role, name: str, actor_key_id: uuid.UUID | None
) -> tuple[ApiKey, str]:
    """Create a key; returns it with its secret (shown once, never stored)."""
    secret = generate_secret()
    key = ApiKey(id=uuid.uuid4(), role=role, name=name, key_hash=hash_secret(secret))
    session.add(key)
    session.flush()
    audit.record(
        session,
        "key_created",
        actor_key_id=actor_key_id,
        details={"key_id": str(key.id), "role": role, "name": name},
    )
    return key, secret


def revoke_key(session: Session, key_id: uuid.UUID, actor_key_id: uuid.UUID | None) -> ApiKey:
    key = session.get(ApiKey, key_id)
    if key is None:
        raise NotFound(f"no API key {key_id}")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        audit.record(
            session, "key_revoked", actor_key_id=actor_key_id, details={"key_id": str(key.id)}
        )
    return key


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.execute(select(ApiKey).order_by(ApiKey.created_at)).scalars())


KEY_CURSOR = "key"
KEY_SCOPE = list_scope("keys")


def page_keys(session: Session, limit: int, cursor: str | None) -> Page[ApiKey]:
    """Keys oldest first by ``(created_at, id)``, after ``cursor``."""
    total = session.execute(select(func.count()).select_from(ApiKey)).scalar_one()
    query = select(ApiKey)
    if cursor is not None:
        created_at, key_id = parse_time_id_cursor(cursor, KEY_CURSOR, KEY_SCOPE)
        query = query.where(
            or_(
                ApiKey.created_at > created_at,
                and_(ApiKey.created_at == created_at, ApiKey.id > key_id),
            )
        )
    rows = list(
        session.execute(query.order_by(ApiKey.created_at, ApiKey.id).limit(limit + 1)).scalars()
    )
    more = len(rows) > limit
    rows = rows[:limit]
    following = (
        time_id_cursor(KEY_CURSOR, KEY_SCOPE, rows[-1].created_at, rows[-1].id) if more else None
    )
    return Page(items=rows, total=total, next=following)


def ensure_admin_key(session: Session, secret: str) -> None:
    """Make ``secret`` a valid admin key (the ``DPSS_ADMIN_API_KEY`` bootstrap)."""
    digest = hash_secret(secret)
    if session.execute(select(ApiKey.id).where(ApiKey.key_hash == digest)).first() is not None:
        return
    key = ApiKey(id=uuid.uuid4(), role="admin", name="bootstrap admin", key_hash=digest)
    session.add(key)
    session.flush()
    audit.record(
        session,
        "key_created",
        actor_key_id=None,
        details={"key_id": str(key.id), "role": "admin", "name": key.name, "bootstrap": True},
    )


NO_ADMIN_KEY = (
    "no admin key: DPSS_ADMIN_API_KEY is not set and the database holds no active admin key, "
    "so every request to create a key (POST /v1/keys) is refused as unauthenticated; restart "
    "with DPSS_ADMIN_API_KEY=<a secret> (e.g. DPSS_ADMIN_API_KEY=change-me dpss serve), or run "
    "`dpss keys create --role admin` against the same database"
)


def has_admin_key(session: Session) -> bool:
    """Whether any admin key is active: without one, and without ``DPSS_ADMIN_API_KEY``, no key
    can be created over the API (the service says so at start, :data:`NO_ADMIN_KEY`)."""
    query = select(ApiKey.id).where(ApiKey.role == "admin", ApiKey.revoked_at.is_(None))
    return session.execute(query.limit(1)).first() is not None


def sees_real_state(principal: Principal) -> bool:
    """Whether ``principal`` is trusted with releases' real states and run times (start and
    finish times, attempts): admins and auditors, who see them in the queue, ``/metrics`` and
    the audit log anyway (docs/security.md). Analysts and owners are not: a release's real
    state tells when the job ahead of it in the queue ended (:mod:`service.visibility`)."""
    return principal.role in ("admin", "auditor")
