"""Pure ASGI middleware: request ids and access logs, security headers, CORS, rate limits.

Pure ASGI (not ``BaseHTTPMiddleware``, which buffers and breaks streaming): each layer wraps
``send`` and never reads the request body. :class:`ServiceApp` puts these layers *outside*
Starlette's ``ServerErrorMiddleware``, so that even a 500 carries the request id and the
headers, and its access line is written.

Order, outermost first: request id and access log, HEAD as GET (``http_methods``), security
headers, no encoded slash (``http_methods``), CORS (only when configured), rate limit,
overload shedding, then the application.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.deps import KEY_AUTHENTICATED, KeyDirectory, bearer_in
from service.api.docs import DOCS_PAGES
from service.api.http_methods import HeadAsGet, NoEncodedSlash
from service.config import Settings
from service.logs import REQUEST_ID_HEADER, request_context, request_id_from

access_log = logging.getLogger("dpss.access")

#: Shown instead of uvicorn's name and version.
SERVER_NAME = "dpss"
#: JSON responses load nothing and may not be framed.
API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.S)


def _route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


class PathTemplates:
    """The path template of a request, never the raw path (which may carry anything a client
    typed): the matched route's, or for a request refused before routing (rate limit) the
    documented path it would have matched."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._compiled: list[tuple[re.Pattern[str], str]] | None = None

    def _documented(self) -> list[tuple[re.Pattern[str], str]]:
        if self._compiled is None:
            paths = self.app.openapi().get("paths", {})
            self._compiled = [(compile_path(path)[0], path) for path in paths]
        return self._compiled

    def __call__(self, scope: Scope) -> str:
        path = getattr(scope.get("route"), "path", None)
        if isinstance(path, str):
            return path
        route_path = _route_path(scope)
        return next(
            (template for regex, template in self._documented() if regex.match(route_path)),
            "<unmatched>",
        )


class RequestLogMiddleware:
    """Give each request an id (the client's ``X-Request-ID`` if well formed), return it on
    every response, and write one access line: method, path template, status, duration and
    key id (added by authentication through :func:`service.logs.bind_key_id`)."""

    def __init__(self, app: ASGIApp, templates: PathTemplates) -> None:
        self.app = app
        self.templates = templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(Headers(scope=scope).get(REQUEST_ID_HEADER))
        status = 500  # what the client gets if the app raises before answering
        start = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        with request_context(request_id):
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                access_log.info(
                    "request",
                    extra={
                        "method": scope["method"],
                        "path": self.templates(scope),
                        "status": status,
                        "duration_ms": round((time.perf_counter() - start) * 1000, 2),
                    },
                )


def _hash_source(script: bytes) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script).digest()).decode() + "'"


def _docs_policy(kind: str, body: bytes) -> str:
    """The Content-Security-Policy of a docs page: exactly its sources. Inline scripts are
    allowed by hash; the pages are built from configuration only (title, URLs), never from
    request input, so the hashes cover FastAPI's own bootstrap script and nothing else."""
    scripts = " ".join(_hash_source(m.group(1)) for m in _INLINE_SCRIPT.finditer(body))
    common = "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    if kind == "swagger":
        # The assets are the service's own (service.api.docs): nothing off this host. Scripts
        # are the strict part; swagger-ui styles elements inline as it renders.
        return (
            f"default-src 'none'; script-src 'self' {scripts}; style-src 'self' 'unsafe-inline'; "
            f"img-src 'self' data:; connect-src 'self'; {common}"
        )
    if kind == "redoc":
        # ReDoc renders with styled-components (inline <style>) and searches in a blob worker.
        return (
            "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
            f"img-src 'self' data:; connect-src 'self'; worker-src blob:; {common}"
        )
    return f"default-src 'none'; script-src {scripts}; {common}"  # the OAuth2 redirect page


class SecurityHeadersMiddleware:
    """``X-Content-Type-Options: nosniff`` and a version-free ``server`` everywhere,
    ``Cache-Control: no-store`` on ``/v1`` (keys, budgets and results must not sit in caches),
    and a Content-Security-Policy: locked down for the API, exact for the docs pages."""

    def __init__(self, app: ASGIApp, docs_pages: dict[str, str]) -> None:
        self.app = app
        self.docs_pages = docs_pages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = _route_path(scope)
        docs_kind = self.docs_pages.get(path)
        held: Message | None = None
        chunks: list[bytes] = []

        def secure(message: Message, csp: str) -> None:
            headers = MutableHeaders(scope=message)
            headers["X-Content-Type-Options"] = "nosniff"
            headers["Referrer-Policy"] = "no-referrer"
            headers["Content-Security-Policy"] = csp
            headers["server"] = SERVER_NAME
            if path == "/v1" or path.startswith("/v1/"):
                headers["Cache-Control"] = "no-store"

        async def send_secured(message: Message) -> None:
            nonlocal held
            if docs_kind is None:
                if message["type"] == "http.response.start":
                    secure(message, API_CSP)
                await send(message)
                return
            # A docs page is a few kB of HTML: hold it to hash its inline script.
            if message["type"] == "http.response.start":
                held = message
                return
            if message["type"] == "http.response.body" and held is not None:
                chunks.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                body = b"".join(chunks)
                secure(held, _docs_policy(docs_kind, body))
                await send(held)
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            await send(message)

        await self.app(scope, receive, send_secured)


@dataclass
class _Bucket:
    tokens: float
    updated: float


class TokenBuckets:
    """Token buckets by identity: ``burst`` at once, refilled at ``rate`` per second; bounded
    (the least recently seen beyond ``max_buckets`` are dropped, i.e. refilled)."""

    def __init__(self, rate: float, burst: int, max_buckets: int = 100_000) -> None:
        self.rate = rate
        self.burst = burst
        self.max_buckets = max_buckets
        self.buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def retry_after(self, identity: str, now: float) -> float:
        """Take a token for ``identity``; 0 if allowed, else seconds until one is available."""
        bucket = self.buckets.get(identity)
        if bucket is None:
            bucket = self.buckets[identity] = _Bucket(tokens=float(self.burst), updated=now)
            while len(self.buckets) > self.max_buckets:
                self.buckets.popitem(last=False)
        else:
            self.buckets.move_to_end(identity)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / self.rate


class RateLimitMiddleware:
    """Rate limits on ``/v1``, decided before the body is read and before any database work;
    beyond them 429 with ``Retry-After``.

    - A valid key has its own bucket, told apart by the SHA-256 of the presented secret (the
      value the key table stores): one this process has seen authenticate (its request's unit
      of work set :data:`~service.api.deps.KEY_AUTHENTICATED`), or one the
      :class:`~service.api.deps.KeyDirectory` holds, so that a valid key new to this process
      (created elsewhere, or after a restart) starts even during a flood.
    - Any other request (no key, an unknown, random or revoked one) is counted against its
      client address and against one bucket shared by all of them: a flood with a fresh random
      token per request no longer gets a fresh bucket each time, and cannot crowd out valid
      keys.

    The client address is the TCP peer's, or the forwarded one only from a proxy in
    ``DPSS_TRUSTED_PROXIES`` (uvicorn's ``forwarded_allow_ips``, :func:`service.cli
    ._uvicorn_options`): otherwise a client would choose its own address with a header.

    State is per API process (``dpss api --workers N`` allows N times the rates in total) and
    bounded; a key's known status is dropped when it is refused with 401 (revoked).
    """

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings,
        max_buckets: int = 100_000,
        directory: Callable[[], KeyDirectory | None] | None = None,
    ) -> None:
        self.app = app
        self.directory = directory or (lambda: None)
        self.keys = TokenBuckets(
            settings.rate_limit_per_second, settings.rate_limit_burst, max_buckets
        )
        unverified = settings.rate_limit_unverified_per_second
        self.addresses = (
            TokenBuckets(unverified, settings.rate_limit_unverified_burst, max_buckets)
            if unverified > 0
            else None
        )
        everyone = settings.rate_limit_unverified_global_per_second
        self.everyone = (
            TokenBuckets(everyone, max(1, math.ceil(everyone))) if everyone > 0 else None
        )
        self.max_buckets = max_buckets
        self.known: OrderedDict[str, None] = OrderedDict()

    @staticmethod
    def _key_digest(scope: Scope) -> str | None:
        secret = bearer_in(Headers(scope=scope))
        return hashlib.sha256(secret.encode("utf-8")).hexdigest() if secret else None

    def _unverified_wait(self, scope: Scope, now: float) -> tuple[float, str]:
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        if self.addresses is not None:
            wait = self.addresses.retry_after(address, now)
            if wait > 0:
                return wait, "without a valid key from this address"
        if self.everyone is not None:
            wait = self.everyone.retry_after("*", now)
            if wait > 0:
                return wait, "without a valid key"
        return 0.0, ""

    def _remember(self, digest: str) -> None:
        self.known[digest] = None
        self.known.move_to_end(digest)
        while len(self.known) > self.max_buckets:
            self.known.popitem(last=False)

    def _learn(self, digest: str, authenticated: bool, status: int) -> None:
        if authenticated:
            if digest not in self.known:
                # The request that made the key known counts in its bucket too.
                self.keys.retry_after(digest, time.monotonic())
            self._remember(digest)
        elif status == 401:
            self.known.pop(digest, None)
            directory = self.directory()
            if directory is not None:
                directory.discard(digest)

    async def _valid(self, digest: str | None) -> bool:
        if digest is None:
            return False
        if digest in self.known:
            return True
        directory = self.directory()
        return directory is not None and await directory.is_valid(digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = _route_path(scope) if scope["type"] == "http" else ""
        if not (path == "/v1" or path.startswith("/v1/")):
            await self.app(scope, receive, send)
            return
        now = time.monotonic()
        digest = self._key_digest(scope)
        if digest is not None and await self._valid(digest):
            self._remember(digest)
            wait, whose = self.keys.retry_after(digest, now), "for this key"
        else:
            wait, whose = self._unverified_wait(scope, now)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            response = JSONResponse(
                {
                    "error": "rate_limited",
                    "detail": f"too many requests {whose}; retry after {seconds} s",
                },
                status_code=429,
                headers={"Retry-After": str(seconds)},
            )
            await response(scope, receive, send)
            return
        if digest is None:
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            self._learn(digest, bool(scope.get(KEY_AUTHENTICATED)), status)


class OverloadMiddleware:
    """Answer ``/v1`` with 503 and ``Retry-After`` at once while the event loop is saturated.

    Every await of a request (its database slot, its thread's result, each response message)
    waits one pass of the loop; when one pass takes longer than ``max_lag`` seconds (CPU-bound:
    more requests than the process can parse and answer), a request would wait several of
    them. Refusing it here costs microseconds and no database work, so the process drains
    instead of queueing ever longer (the database slots' own queue is shed in
    :meth:`service.api.deps.Database.run`).

    The lag is measured without making anyone wait: a request schedules a callback (one in
    flight at a time) and the callback records how late it ran, in a moving mean (one slow
    pass, a large response serialised on the loop, does not shed by itself); the decision uses
    it until it is older than :attr:`FRESH_SECONDS` (an idle loop).

    Only while at least ``min_in_flight`` ``/v1`` requests are in this process: a slow pass with
    few requests is the machine (another process, a pause), not this process's overload, and
    shedding then would refuse a lone client on a busy host.
    """

    FRESH_SECONDS = 1.0
    #: Weight of the newest measurement in the moving mean.
    WEIGHT = 0.3

    def __init__(
        self, app: ASGIApp, max_lag: float, retry_after: int, min_in_flight: int = 8
    ) -> None:
        self.app = app
        self.max_lag = max_lag
        self.retry_after = retry_after
        self.min_in_flight = min_in_flight
        #: ``/v1`` requests of this process now (touched only from its event loop).
        self.in_flight = 0
        #: The latest loop pass measured, seconds, and when it was measured (perf_counter).
        self.lag = 0.0
        self.lag_measured_at = -math.inf
        self._probing = False

    def _probe(self) -> None:
        if self._probing:
            return
        self._probing = True
        scheduled = time.perf_counter()

        def ran() -> None:
            now = time.perf_counter()
            fresh = now - self.lag_measured_at < self.FRESH_SECONDS
            lag = now - scheduled
            self.lag = self.lag + self.WEIGHT * (lag - self.lag) if fresh else lag
            self.lag_measured_at, self._probing = now, False

        asyncio.get_running_loop().call_soon(ran)

    def overloaded(self) -> bool:
        fresh = time.perf_counter() - self.lag_measured_at < self.FRESH_SECONDS
        return fresh and self.lag > self.max_lag

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = _route_path(scope) if scope["type"] == "http" else ""
        if not (path == "/v1" or path.startswith("/v1/")):
            await self.app(scope, receive, send)
            return
        self._probe()
        if self.in_flight < self.min_in_flight or not self.overloaded():
            self.in_flight += 1
            try:
                await self.app(scope, receive, send)
            finally:
                self.in_flight -= 1
            return
        response = JSONResponse(
            {
                "error": "service_unavailable",
                "detail": "the service is overloaded; retry shortly",
                "retry_after": self.retry_after,
            },
            status_code=503,
            headers={"Retry-After": str(self.retry_after)},
        )
        await response(scope, receive, send)


def harden(app: ASGIApp, settings: Settings, fastapi_app: FastAPI) -> ASGIApp:
    """Wrap the application in the layers above, as ``settings`` configure them."""
    if settings.api_max_loop_lag_seconds > 0:
        app = OverloadMiddleware(
            app, settings.api_max_loop_lag_seconds, settings.retry_after_seconds
        )
    if settings.rate_limit_per_second > 0:

        def directory() -> KeyDirectory | None:
            database = getattr(fastapi_app.state, "database", None)
            return getattr(database, "key_directory", None)

        app = RateLimitMiddleware(app, settings, directory=directory)
    if settings.cors_allow_origins:
        app = CORSMiddleware(
            app,
            allow_origins=settings.cors_allow_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", REQUEST_ID_HEADER],
            expose_headers=[REQUEST_ID_HEADER, "Retry-After"],
            allow_credentials=False,
            max_age=600,
        )
    app = SecurityHeadersMiddleware(NoEncodedSlash(app), DOCS_PAGES)
    return RequestLogMiddleware(HeadAsGet(app), PathTemplates(fastapi_app))


class ServiceApp(FastAPI):
    """FastAPI with :func:`harden`'s layers outside Starlette's error middleware, so that they
    also see (and label, and log) the 500 it produces."""

    def build_middleware_stack(self) -> ASGIApp:
        settings: Settings = self.state.settings
        return harden(super().build_middleware_stack(), settings, self)
