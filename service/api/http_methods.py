"""HEAD like GET without a body (RFC 9110, 9.3.2), and no encoded slash in a path.

FastAPI routes a ``GET`` route for GET only, so ``HEAD`` on any of them was a 405: monitors,
link checkers and ``curl -I`` expect the headers GET would send (status, ``Content-Type``,
``Content-Length``, ``Cache-Control``) with no body. :class:`HeadAsGet` runs a HEAD request
through the application as the GET it stands for and drops the body it sends; the status,
headers and ``Content-Length`` stay those of the GET. A route that serves no GET still answers
405 with its ``Allow``. (HTTP semantics only: a GET changes nothing here, so neither does HEAD.)

Starlette decodes ``%2F`` in the path before routing, so ``/v1/datasets/<id>%2Fbudget`` was
served as ``/v1/datasets/<id>/budget``: one resource under two URLs, the second invisible to a
proxy rule, cache key or log search on path segments. A path whose raw form holds an encoded
slash names no resource here: 404, in the service's error format.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_ENCODED_SLASH = b"%2f"
NO_ENCODED_SLASH = json.dumps(
    {
        "error": "not_found",
        "detail": "path: an encoded slash (%2F) names no resource here; ids never contain '/'",
    },
    separators=(",", ":"),
).encode()


class NoEncodedSlash:
    """404 for a path with an encoded slash (inside the security headers layer, which labels
    the answer as any other)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw: bytes = scope.get("raw_path") or b""
        if _ENCODED_SLASH not in raw.split(b"?", 1)[0].lower():
            await self.app(scope, receive, send)
            return
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(NO_ENCODED_SLASH)).encode()),
        ]
        await send({"type": "http.response.start", "status": 404, "headers": headers})
        await send({"type": "http.response.body", "body": NO_ENCODED_SLASH})


class HeadAsGet:
    """HEAD as the GET it stands for, without the body (outside the security headers layer,
    which hashes a docs page's body, and outside every layer that may answer on its own, so
    that a 404, 405, 429 or 500 answered to HEAD has no body either)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def send_headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, send_headers_only)
