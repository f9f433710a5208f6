"""The route class of every ``/v1`` router: the key before the body, bounded bodies.

FastAPI reads and parses a JSON body before it resolves any dependency, so a key checked in a
dependency is checked after an anonymous client's body was read and parsed. :class:`GuardedRoute`
wraps FastAPI's handler instead:

- a route with a JSON body checks the key first, in a short transaction of its own (401 before a
  byte of the body is read); then it reads the body with no session open, refusing it with 413
  as soon as its ``Content-Length`` or the bytes received exceed ``DPSS_MAX_JSON_BYTES``, and
  only then parses it (:func:`parse_json_body`: a key given twice in any object, nested ones
  included, is refused with 422 naming it, where ``json.loads`` would keep the last) and hands
  the parsed value to FastAPI to validate. The route's unit of work checks the key again, in the
  same transaction as the work. (Starlette's own body limit answers in plain text,
  outside the service's error format, and has no deadline.)
- every body (JSON, or the multipart upload that its route streams itself) must arrive within
  ``DPSS_BODY_TIMEOUT_SECONDS`` of the first read. A read past the deadline fails, and whatever
  the route's reader made of that failure is answered as 408: the cause is the slow client.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope

from service.api.deps import PRINCIPAL_BEFORE_BODY, unit_of_work_for
from service.config import Settings
from service.errors import InvalidInput, PayloadTooLarge, RequestTimeout, printable


class BodyDeadline:
    """A ``receive`` that fails if the body is not complete ``seconds`` after its first call.

    Once the last chunk has arrived, calls pass straight through: waiting for a disconnect
    after the body is not sending a body.
    """

    def __init__(self, receive: Receive, seconds: float) -> None:
        self._receive = receive
        self.seconds = seconds
        self._ends: float | None = None
        self._complete = False
        self.expired = False

    async def receive(self) -> Message:
        if self._complete:
            return await self._receive()
        if self._ends is None:
            self._ends = anyio.current_time() + self.seconds
        with anyio.CancelScope(deadline=self._ends):
            message = await self._receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                self._complete = True
            return message
        self.expired = True
        raise self.error()

    def error(self) -> RequestTimeout:
        return RequestTimeout(
            f"body: not received within {self.seconds:g} s (DPSS_BODY_TIMEOUT_SECONDS)"
        )


async def read_json_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with :class:`PayloadTooLarge` before it exceeds ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(_too_large(limit))
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(_too_large(limit))
            chunks.append(chunk)
    except ClientDisconnect:
        raise InvalidInput("body", "the connection closed before the whole body arrived") from None
    return b"".join(chunks)


def _require_json(content_type: str) -> None:
    """Refuse a body sent as another media type, as FastAPI reads it: no ``Content-Type``,
    ``application/json`` or ``application/*+json``. FastAPI hands any other body to validation
    as bytes, and the 422 said "Input should be a valid dictionary" of a valid JSON object."""
    media = content_type.partition(";")[0].strip().lower()
    kind, _, subtype = media.partition("/")
    if not media or (kind == "application" and (subtype == "json" or subtype.endswith("+json"))):
        return
    raise InvalidInput(
        "body",
        f"sent as Content-Type {printable(content_type, 60)!r}; "
        "send the JSON with 'Content-Type: application/json'",
    )


def _too_large(limit: int) -> str:
    return f"body: larger than the limit of {limit} bytes (DPSS_MAX_JSON_BYTES)"


class DuplicateKey(ValueError):
    """A JSON object names one key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # ``object_pairs_hook``: called for every object, innermost first, with its pairs in order.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateKey(key)
        result[key] = value
    return result


def parse_json_body(body: bytes) -> Any:
    """``body`` parsed as JSON with every object's keys unique; 422 naming the body otherwise
    (for text that is not JSON, json's reason and the character, as FastAPI answered it).

    Raises
    ------
    InvalidInput
        A key appears twice in one object (the last would silently win: ``epsilon`` given
        twice charged the second, a duplicated ``role`` changed the created key's role); or the
        parser gave up on valid JSON it will not read: an integer of more than Python's 4,300
        digits, or arrays and objects nested past the recursion limit; or the body is not UTF-8
        (UTF-16 and UTF-32 bodies were read and charged, a Latin-1 one was a 400). FastAPI's
        own parse catches only a ``JSONDecodeError`` and answered these with a 400 that named
        nothing.
    """
    try:
        # UTF-8 only (RFC 8259, 8.1; a leading byte order mark is ignored): ``json.loads`` on
        # bytes would guess UTF-16 or UTF-32 from the first bytes and read such a body.
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            "body", f"not valid JSON (not UTF-8 at byte {exc.start}; send JSON as UTF-8)"
        ) from None
    if "\x00" in text:
        # Never in JSON text (not even inside a string); UTF-16 or UTF-32 without a byte
        # order mark decodes as UTF-8 with NULs between the characters.
        raise InvalidInput(
            "body",
            f"not valid JSON (a NUL at byte {body.index(0)}: UTF-16 or UTF-32? send JSON as UTF-8)",
        )
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except DuplicateKey as exc:
        raise InvalidInput(
            "body", f"the key '{printable(exc.key)}' appears twice in one object; send it once"
        ) from None
    except RecursionError:
        raise InvalidInput(
            "body", "not valid JSON (nested deeper than this service reads)"
        ) from None
    except json.JSONDecodeError as exc:
        # As FastAPI answered it (service.api.errors): json's reason and where, never the text.
        # Not left to FastAPI: its own parse reads bytes, guessing UTF-16 and UTF-32 again.
        raise InvalidInput(
            "body", f"not valid JSON ({printable(exc.msg)} at character {exc.pos})"
        ) from None
    except ValueError:
        limit = sys.get_int_max_str_digits()
        raise InvalidInput(
            "body", f"not valid JSON (a number of more than {limit} digits)"
        ) from None


class ParsedJsonRequest(Request):
    """A request whose body was read and parsed already: FastAPI's ``await request.json()``
    gets the value :func:`parse_json_body` made."""

    def __init__(self, scope: Scope, receive: Receive, parsed: Any) -> None:
        super().__init__(scope, receive)
        self._parsed = parsed

    async def json(self) -> Any:
        return self._parsed


def _replay(body: bytes, then: Receive) -> Receive:
    """The body already read, as one message; then the connection's own messages."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return await then()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


class GuardedRoute(APIRoute):
    """See the module docstring."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        has_json_body = self.body_field is not None

        async def guarded(request: Request) -> Response:
            settings: Settings = request.app.state.settings
            deadline = BodyDeadline(request.receive, settings.body_timeout_seconds)
            bounded = Request(request.scope, deadline.receive)
            try:
                if has_json_body:
                    principal = await unit_of_work_for(request).principal_before_body()
                    # For the route's role check before its body is validated
                    # (service.api.deps.roles_before_body).
                    request.scope[PRINCIPAL_BEFORE_BODY] = principal
                    body = await read_json_body(bounded, settings.max_json_bytes)
                    if body:
                        _require_json(request.headers.get("content-type", ""))
                    bounded = Request(request.scope, _replay(body, deadline.receive))
                    if body:
                        parsed = parse_json_body(body)
                        bounded = ParsedJsonRequest(
                            request.scope, _replay(body, deadline.receive), parsed
                        )
                return await handler(bounded)
            except Exception:
                if deadline.expired:
                    raise deadline.error() from None
                raise

        return guarded
