"""Request-scoped access to the database: one unit of work, one thread call, one commit.

Why this shape: FastAPI runs each sync dependency and a sync endpoint as separate threadpool
calls. When the session was a dependency, a request held a pooled connection (opened while its
key was checked) between those calls, waiting for a thread; with more clients than connections
every thread could be waiting for a connection held by a request that was waiting for a thread,
a deadlock that only the pool timeout broke (500s, connections left "idle in transaction").

Here routes are ``async`` and touch the database only through :meth:`Database.run`:

1. the request waits, holding nothing, for one of ``db_pool_size + db_max_overflow`` slots
   (an anyio semaphore, first come first served); after ``db_wait_seconds`` it gets 503 with
   ``Retry-After``. When every slot is taken and its expected wait (the requests queued ahead
   of it, divided among the slots, times the recent mean time a unit of work holds a slot)
   exceeds ``db_max_queue_seconds``, it gets that 503 at once instead: under overload a client
   learns in microseconds, not after ``db_wait_seconds``, that it should back off;
2. one thread call, on a limiter with as many threads as slots (so it never waits for a
   thread), opens the session, checks the key, does the work, builds the response body and
   commits; the connection is held only inside that call, and the pool always has one for it.

The commit happens before the route returns, hence before the response starts: a client told
201/202 can rely on the result being durable, and a failed commit is answered as an error.
A database that cannot serve (down, unreachable, restarting, pool exhausted) becomes
:class:`ServiceUnavailable` (503), never a 500.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar
from fastapi import Depends, Path, Query, Request
from pydantic import BeforeValidator
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from starlette.datastructures import Headers

from service import logs, row_locks
from service.auth import (
    Principal,
    Role,
    VerifiedKeys,
    authenticate_cached,
    hash_secret,
    require_role,
    valid_key_digests,
)
from service.config import Settings
from service.db.engine import database_unavailable
from service.errors import RestoreUnaccepted, ServiceUnavailable, Unauthenticated
from service.pagination import MAX_CURSOR_LENGTH
from service.row_locks import RowBusy
from service.store import DatasetStore

T = TypeVar("T")

log = logging.getLogger("dpss.api")

#: The largest integer both databases store (signed 64 bits). Every integer query parameter is
#: bounded by it at most, so an oversized value is a 422 and never an overflow in a driver.
MAX_QUERY_INT = 2**63 - 1

Limit = Annotated[int, Query(ge=1, le=1000, description="Page size.")]
Offset = Annotated[int, Query(ge=0, le=MAX_QUERY_INT, description="Items to skip.")]
Cursor = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=MAX_CURSOR_LENGTH,
        description="The `next` value of the previous page, unchanged; omit for the first page.",
    ),
]

#: The one spelling of an id this service writes and accepts: ``str(uuid)``, 36 characters,
#: lowercase hex, hyphenated 8-4-4-4-12. Python's ``uuid.UUID`` (and so pydantic) also reads
#: uppercase, ``{...}``, ``urn:uuid:...`` and 32 bare digits, which put one resource under five
#: URLs: a cache, a log search or a proxy rule keyed on the path would see five resources.
#: Any other spelling is a 422 naming the parameter (as any other malformed id is).
CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
NOT_CANONICAL_UUID = (
    "not an id in canonical form: 36 characters, lowercase hex digits hyphenated 8-4-4-4-12 "
    "(as this service writes ids)"
)


def _canonical_uuid(value: object) -> object:
    if isinstance(value, str) and not CANONICAL_UUID.fullmatch(value):
        raise ValueError(NOT_CANONICAL_UUID)
    return value


#: A UUID parameter in canonical form only (see :data:`CANONICAL_UUID`).
CanonicalUUID = Annotated[uuid.UUID, BeforeValidator(_canonical_uuid)]

# Path ids, described on the API page (what each names and where a client gets it).
DatasetId = Annotated[
    CanonicalUUID,
    Path(description="The dataset's id: `id` of the upload's answer or of `GET /v1/datasets`."),
]
ReleaseId = Annotated[
    CanonicalUUID,
    Path(description="The release's id: `id` of the release request's answer or of a listing."),
]
GrantId = Annotated[
    CanonicalUUID, Path(description="The grant's id: `id` of `POST .../grants` or of its listing.")
]
KeyId = Annotated[
    CanonicalUUID, Path(description="The key's id (not its secret): `id` of `POST /v1/keys`.")
]
PriorId = Annotated[
    CanonicalUUID, Path(description="The prior's id: `id` of `POST /v1/priors` or of its listing.")
]

#: The clock of units of work (a name of this module's, so a test can step it by hand).
clock = time.monotonic

#: Pauses between a unit of work's attempts at a row lock held elsewhere (seconds; doubled from
#: the first up to the largest, each drawn between half and all of it so waiters spread out).
ROW_BUSY_FIRST_PAUSE = 0.05
ROW_BUSY_MAX_PAUSE = 0.4
#: The longest of each attempt after the first (``db_lock_attempt_seconds``). The first waits in
#: PostgreSQL's queue for the row, in order, long enough for ordinary contention (other
#: requests of the dataset committing); polling in short attempts from the start let a request
#: lose the row to later ones again and again under load (a release answered 503 after the lock
#: timeout in the load script). A row still held after it is held long: from then on short
#: attempts, a slot held only for them.
RETRY_ATTEMPT_SECONDS = 0.1
#: The shortest attempt at a row lock (the last one before db_lock_timeout_seconds runs out).
MIN_ATTEMPT_SECONDS = 0.001

#: Weight of the newest unit of work in the mean time a unit holds a slot (about the last 20).
SERVICE_TIME_WEIGHT = 0.05


@dataclass
class _Gate:
    """One event loop's admission control: ``slots`` units of work, as many threads, and what
    the shedding decision needs (touched only from the loop's own thread: no lock)."""

    slots: anyio.Semaphore
    threads: anyio.CapacityLimiter
    #: Requests waiting for a slot now.
    waiting: int = 0
    #: Moving mean of the seconds a unit of work runs in its thread (0 until one has run).
    service_seconds: float = 0.0

    def observe(self, seconds: float) -> None:
        """Fold one unit of work's time holding a slot into the moving mean."""
        if self.service_seconds == 0.0:
            self.service_seconds = seconds
        else:
            self.service_seconds += SERVICE_TIME_WEIGHT * (seconds - self.service_seconds)

    def expected_wait(self, size: int) -> float:
        """Seconds a request arriving now would wait for a slot: 0 while one is free, else the
        requests ahead of it and itself, shared among ``size`` slots, times the mean hold."""
        if self.slots.value > 0:
            return 0.0
        return (self.waiting + 1) * self.service_seconds / size


class Database:
    """The API's access to the database (one per app); see the module docstring."""

    def __init__(self, session_factory: sessionmaker[Session], settings: Settings) -> None:
        self.session_factory = session_factory
        bind = session_factory.kw.get("bind")
        #: Sessions whose connection is in autocommit, for a read of one statement (see
        #: :meth:`run`). PostgreSQL only: there it saves two round trips, while SQLite is in
        #: process and starts every transaction itself (``BEGIN IMMEDIATE``, service.db.engine).
        #: Only when the app owns its engine: a test's factory bound to one connection inside a
        #: transaction cannot change its isolation level.
        self.autocommit_factory: sessionmaker[Session] | None = None
        if isinstance(bind, Engine) and bind.dialect.name == "postgresql":
            autocommit = bind.execution_options(isolation_level="AUTOCOMMIT")
            self.autocommit_factory = sessionmaker(**{**session_factory.kw, "bind": autocommit})
        self.size = settings.db_slots
        self.wait_seconds = settings.db_wait_seconds
        self.lock_timeout = settings.db_lock_timeout_seconds
        #: One attempt's wait for a row lock (service.row_locks); 0: one wait, holding the slot.
        self.lock_attempt_seconds = min(settings.db_lock_attempt_seconds, self.lock_timeout)
        self.max_queue_seconds = settings.db_max_queue_seconds
        self.retry_after = settings.retry_after_seconds
        self.api_threads = settings.api_threads
        self.verified_keys = VerifiedKeys(settings.auth_cache_seconds)
        self.key_directory = KeyDirectory(self)
        # Semaphores belong to one event loop; tests run one app under several (one per
        # TestClient), so each loop gets its own gate.
        self._gates: RunVar[_Gate] = RunVar("dpss_database_gate")
        self._outage = False
        self._outage_lock = threading.Lock()

    def gate(self) -> _Gate:
        """This event loop's gate, made on first use (also sizes the loop's default threads)."""
        try:
            return self._gates.get()
        except LookupError:
            gate = _Gate(
                anyio.Semaphore(self.size, max_value=self.size), anyio.CapacityLimiter(self.size)
            )
            self._gates.set(gate)
            anyio.to_thread.current_default_thread_limiter().total_tokens = self.api_threads
            return gate

    async def run(self, work: Callable[[Session], T], autocommit: bool = False) -> T:
        """``work(session)`` in one transaction in one thread call, committed before returning.

        ``autocommit``: ``work`` reads, in one statement that needs no other (a budget read):
        on PostgreSQL run it on a connection in autocommit, without the ``BEGIN`` and
        ``COMMIT`` round trips of a transaction (a lone statement reads one snapshot all the
        same). Any statement before it (a key check) is then its own transaction too.

        Raises :class:`ServiceUnavailable` at once if the expected wait for a slot exceeds
        ``db_max_queue_seconds`` (see :meth:`_Gate.expected_wait`), if no slot frees up within
        ``db_wait_seconds``, or if the database cannot serve; whatever ``work`` raises otherwise,
        after a rollback.

        A row lock held elsewhere (:class:`~service.row_locks.RowBusy`: ``work`` waited
        ``db_lock_attempt_seconds`` for it in vain, or :data:`RETRY_ATTEMPT_SECONDS` on a
        retry) is waited for holding nothing: the
        transaction rolls back, the slot goes back, and ``work`` runs again from the start after
        a pause (doubling, jittered), until ``db_lock_timeout_seconds`` have passed since the
        first attempt began waiting; then :class:`ServiceUnavailable`. ``work`` must therefore
        be safe to run again after :class:`RowBusy`: it locks (:func:`row_locks.lock_one`)
        before it writes, locks anything else or acts outside the transaction.
        """
        # Set once an attempt found a row locked elsewhere (row_locks.RowBusy): when the wait
        # for it has lasted db_lock_timeout_seconds, counted from that first attempt's start.
        busy_until: float | None = None
        pause = ROW_BUSY_FIRST_PAUSE
        while True:
            try:
                return await self._run_once(work, autocommit, busy_until)
            except RowBusy:
                # Rolled back, connection and slot given back: wait holding nothing, then
                # redo the whole unit of work (row_locks: each locks before it writes).
                now = clock()
                if busy_until is None:
                    busy_until = now - self.lock_attempt_seconds + self.lock_timeout
                left = busy_until - now
                if left <= 0:
                    raise ServiceUnavailable(
                        "the database is busy; retry shortly", self.retry_after
                    ) from None
                await anyio.sleep(min(pause * random.uniform(0.5, 1.0), left))
                pause = min(2 * pause, ROW_BUSY_MAX_PAUSE)

    async def _run_once(
        self,
        work: Callable[[Session], T],
        autocommit: bool,
        busy_until: float | None,
    ) -> T:
        """One try of :meth:`run`: a slot, then the unit of work in its thread. A retry
        (``busy_until`` set) waits for its slot, and for the row, no later than that."""
        gate = self.gate()
        expected = gate.expected_wait(self.size)
        if expected > self.max_queue_seconds:
            # Shed before queueing: the client would wait longer than we allow and likely time
            # out anyway, and a queue that only grows makes every later request slower too.
            raise ServiceUnavailable("the database is busy; retry shortly", self.retry_after)
        wait = self.wait_seconds
        if busy_until is not None:
            wait = min(wait, max(busy_until - clock(), 0.0))
        gate.waiting += 1
        try:
            with anyio.move_on_after(wait) as waited:
                await gate.slots.acquire()
        finally:
            gate.waiting -= 1
        if waited.cancelled_caught:
            raise ServiceUnavailable("the database is busy; retry shortly", self.retry_after)
        attempt = self.lock_attempt_seconds
        if busy_until is not None:
            attempt = min(attempt, RETRY_ATTEMPT_SECONDS)
            attempt = min(attempt, max(busy_until - clock(), MIN_ATTEMPT_SECONDS))
        worked: list[float] = []

        def timed() -> T:
            started = clock()
            try:
                return self._transaction(work, autocommit, attempt)
            finally:
                worked.append(clock() - started)

        try:
            # Not abandoned on cancellation: the slot is released only when the thread (and
            # its connection) is done, so slots never outnumber connections.
            return await anyio.to_thread.run_sync(timed, limiter=gate.threads)
        finally:
            # The unit of work's own time, measured in its thread: not the loop's lag in
            # resuming this request afterwards. A lagging loop is OverloadMiddleware's to shed;
            # counted here too, it made every slot look busy for a whole loop pass, and
            # requests were shed for a database that was idle (35% 503 at 200 clients with
            # loop shedding off).
            if worked:
                gate.observe(worked[0])
            gate.slots.release()

    def _transaction(
        self, work: Callable[[Session], T], autocommit: bool = False, attempt: float = 0.0
    ) -> T:
        factory = self.session_factory
        if autocommit and self.autocommit_factory is not None:
            factory = self.autocommit_factory
        try:
            with factory.begin() as session:
                if attempt > 0:
                    session.info[row_locks.ATTEMPT_SECONDS] = attempt
                result = work(session)
        except Exception as exc:
            if not database_unavailable(exc):
                raise
            self._note_outage(exc)
            raise ServiceUnavailable(
                "the database is unavailable; retry shortly", self.retry_after
            ) from None
        self._note_recovery()
        return result

    def _note_outage(self, exc: BaseException) -> None:
        # Logged once per outage, by exception type only: a driver's message may quote SQL
        # parameters, and hundreds of requests a second would repeat it.
        with self._outage_lock:
            if self._outage:
                return
            self._outage = True
        log.warning("database unavailable (%s); answering 503", type(exc).__name__)

    def _note_recovery(self) -> None:
        if not self._outage:
            return
        with self._outage_lock:
            if not self._outage:
                return
            self._outage = False
        log.warning("database available again")


def refuse_while_restore_held(principal: Principal, read_only: bool) -> None:
    """Refuse charges and key use while a detected restore is not accepted (``restore_hold``,
    :mod:`service.anchors`): after a restore from an older backup, revoked keys are live again
    and spent budget is back, so the service must not act on that state until an admin has
    looked (``dpss audit accept-restore``).

    Only admins' and auditors' reads pass (the dashboard and the audit log show the restore).
    The hold is read with the key (:func:`service.auth.authenticate`, no statement of its own):
    a hold set by another process (a worker's anchor round) applies to every write at once and
    to reads within ``DPSS_AUTH_CACHE_SECONDS`` (a read's key check may be that old); so does
    its acceptance.
    """
    if principal.restore_held and not (read_only and principal.role in ("admin", "auditor")):
        raise RestoreUnaccepted()


class KeyDirectory:
    """The digests of the valid (not revoked) keys, in memory, so that the rate limiter tells a
    valid key from a random token without a database statement per request
    (:class:`service.api.middleware.RateLimitMiddleware`).

    Why: a key is otherwise "unverified" until this process has seen it authenticate, and a
    flood of random tokens exhausts the unverified buckets, so a valid key new to this process
    (created elsewhere, or any key after a restart) could never start. Here:

    - a key created through this process is added at once (:meth:`add`);
    - a digest not held makes the directory reload the whole set (one statement, through
      :meth:`Database.run`, so bounded by the slots like any unit of work), at most once per
      :attr:`MIN_RELOAD_SECONDS`, one reload at a time; every miss arriving while a reload is
      in flight awaits that same reload (32 parallel first requests of a new key are all
      recognised), a miss after it counts as unverified. A random-token flood therefore costs
      at most one reload a second, and a key created anywhere is recognised at most that long
      after its creation: a client obeying ``Retry-After`` gets in on its next try;
    - a key answered 401 (revoked) is dropped (:meth:`discard`) until the next reload.

    This is only the rate limiter's classification: every request still authenticates its key
    against the key table (:func:`service.auth.authenticate`).
    """

    MIN_RELOAD_SECONDS = 1.0

    def __init__(self, database: Database) -> None:
        self.database = database
        self.digests: set[str] = set()
        #: When the last reload started (monotonic); digests added since it started.
        self.reloaded_at = -float("inf")
        self._added_during_reload: set[str] = set()
        self._reload: anyio.Event | None = None

    def add(self, digest: str) -> None:
        self.digests.add(digest)
        self._added_during_reload.add(digest)

    def discard(self, digest: str) -> None:
        self.digests.discard(digest)
        self._added_during_reload.discard(digest)

    async def is_valid(self, digest: str, now: float | None = None) -> bool:
        """Whether ``digest`` is a valid key's, reloading (or awaiting a reload) on a miss."""
        if digest in self.digests:
            return True
        if self._reload is not None:
            await self._reload.wait()
            return digest in self.digests
        now = time.monotonic() if now is None else now
        if now - self.reloaded_at < self.MIN_RELOAD_SECONDS:
            return False
        self.reloaded_at = now
        self._reload = done = anyio.Event()
        self._added_during_reload = set()
        try:
            digests = await self.database.run(valid_key_digests, autocommit=True)
            # A key created while the statement ran may be missing from its snapshot.
            self.digests = digests | self._added_during_reload
        except ServiceUnavailable:
            pass  # keep what we had; the next miss after MIN_RELOAD_SECONDS tries again
        finally:
            self._reload = None
            done.set()
        return digest in self.digests


def bearer_in(headers: Headers) -> str | None:
    """The secret of the request's one ``Authorization: Bearer <key>`` header; None without
    one, for another scheme, and for a header sent more than once (which key would it be?)."""
    values = headers.getlist("authorization")
    if len(values) != 1:
        return None
    scheme, _, secret = values[0].partition(" ")
    return secret.strip() or None if scheme.lower() == "bearer" else None


def bearer_secret(request: Request) -> str | None:
    """As :func:`bearer_in`; a header that is there but holds no usable key is refused (401)
    with what is wrong with it. Two ``Authorization`` headers answered as the first one did,
    so a proxy that adds its own header in front of the client's chose the caller's role."""
    values = request.headers.getlist("authorization")
    if len(values) > 1:
        raise Unauthenticated(
            f"Authorization: sent {len(values)} times; send one 'Authorization: Bearer <key>'"
        )
    secret = bearer_in(request.headers)
    if values and secret is None:
        raise Unauthenticated(
            "Authorization: not a bearer key; send 'Authorization: Bearer <key>' (one space)"
        )
    return secret


#: Set in a request's ASGI scope once its key authenticated: the rate limiter
#: (:class:`service.api.middleware.RateLimitMiddleware`) then gives the key its own bucket.
KEY_AUTHENTICATED = "dpss.key_authenticated"

#: Set in a request's ASGI scope by the key check before its body
#: (:class:`service.api.routing.GuardedRoute`): the principal, for :func:`roles_before_body`.
PRINCIPAL_BEFORE_BODY = "dpss.principal_before_body"

#: Methods that change nothing: their key check may come from :class:`VerifiedKeys`.
READ_METHODS = frozenset({"GET", "HEAD"})


class UnitOfWork:
    """One request's access to the database, as the principal of its key.

    ``await uow(work)`` runs ``work(session, principal)`` through :meth:`Database.run`. For a
    write the key is checked in the same transaction as the work, so a key revoked a moment ago
    does nothing; a read may use the process's recent verification of the key (at most
    ``DPSS_AUTH_CACHE_SECONDS`` old, see :class:`service.auth.VerifiedKeys`).
    """

    def __init__(
        self,
        database: Database,
        secret: str | None,
        scope: MutableMapping[str, Any] | None = None,
        read_only: bool = False,
    ) -> None:
        self.database = database
        self.secret = secret
        self.scope = scope
        self.read_only = read_only

    async def __call__(
        self, work: Callable[[Session, Principal], T], single_statement: bool = False
    ) -> T:
        """``single_statement``: ``work`` only reads, in one statement (:meth:`Database.run`'s
        ``autocommit``); honoured for reads (GET) only."""
        secret, verified, read_only = self.secret, self.database.verified_keys, self.read_only

        def transaction(session: Session) -> T:
            principal = authenticate_cached(session, secret, verified, read_only)
            return work(session, self._admitted(principal))

        return await self.database.run(transaction, autocommit=single_statement and read_only)

    def reads(self) -> UnitOfWork:
        """This request's access for reads only, as a ``GET`` has it: its key may be answered
        from the process's recent verification (a write's request reading what it made, such as
        ``POST .../releases?wait=`` polling its release after the creating transaction, which
        checked the key itself)."""
        return UnitOfWork(self.database, self.secret, self.scope, read_only=True)

    def _admitted(self, principal: Principal) -> Principal:
        """``principal``, refused while a restore hold is set (writes) and marked authenticated
        in the request's scope (the rate limiter's bucket)."""
        refuse_while_restore_held(principal, self.read_only)
        if self.scope is not None:
            self.scope[KEY_AUTHENTICATED] = True
        return principal

    async def principal(self) -> Principal:
        """Check the key alone, in a short transaction (a request whose only work is the key
        check, such as listing the mechanisms, answers 503 while the database is down)."""
        return await self(lambda _session, principal: principal)

    async def principal_before_body(self) -> Principal:
        """Check the key alone, before a request body is read: from this process's recent
        verification of the key (:class:`~service.auth.VerifiedKeys`) when it has one, else as
        :meth:`principal` (which, as ever, fills that cache for reads only: a write's gate reads
        it, never widens it). Only a gate for reading the body: the work's own transaction
        checks a write's key again (a key revoked meanwhile changes nothing), so a cached answer
        costs at most a body read for a key revoked less than ``DPSS_AUTH_CACHE_SECONDS`` ago,
        and saves a transaction on every write with a body."""
        known = self.database.verified_keys.get(hash_secret(self.secret)) if self.secret else None
        if known is None:
            return await self.principal()
        logs.bind_key_id(known.key_id)
        return self._admitted(known)


def database_of(request: Request) -> Database:
    database: Database = request.app.state.database
    return database


def unit_of_work_for(request: Request) -> UnitOfWork:
    return UnitOfWork(
        database_of(request),
        bearer_secret(request),
        request.scope,
        read_only=request.method in READ_METHODS,
    )


def roles_before_body(*roles: Role) -> Any:
    """A route dependency that refuses (403) a key whose role may not call the route, before
    the route's JSON body is validated.

    Why: FastAPI validates the body's fields before the route runs, so a role check in the
    route answered a key of another role 422 (naming the fields) for a wrong body and 403 only
    for a right one; docs/security.md promises 403. Dependencies resolve before the body's
    fields, so here the role comes first. It reuses the key check
    :class:`~service.api.routing.GuardedRoute` made before reading the body (no statement of
    its own); the route's unit of work checks the key again with its work, as ever."""

    async def check(request: Request) -> None:
        principal: Principal | None = request.scope.get(PRINCIPAL_BEFORE_BODY)
        if principal is None:
            principal = await unit_of_work_for(request).principal_before_body()
        require_role(principal, *roles)

    return Depends(check)


# Dependencies are async so that resolving them costs no thread call.
async def get_unit_of_work(request: Request) -> UnitOfWork:
    return unit_of_work_for(request)


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_store(request: Request) -> DatasetStore:
    store: DatasetStore = request.app.state.store
    return store


UnitOfWorkDep = Annotated[UnitOfWork, Depends(get_unit_of_work)]
StoreDep = Annotated[DatasetStore, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
