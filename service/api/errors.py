"""Every error becomes ``{"error": code, "detail": message}``; mapped here once."""

from __future__ import annotations

import logging
import re
from decimal import Decimal
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from api_schemas.common import canonical_decimal
from service.db.engine import database_unavailable
from service.errors import (
    Conflict,
    DomainError,
    Forbidden,
    InsufficientStorage,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    ServiceUnavailable,
    Unauthenticated,
    field_path,
    printable,
    safe_traceback,
)

log = logging.getLogger("dpss.api")

STATUS_OF: list[tuple[type[DomainError], int]] = [
    (InvalidInput, 422),
    (PayloadTooLarge, 413),
    (InsufficientStorage, 507),
    (Unauthenticated, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
    (RequestTimeout, 408),
    (ServiceUnavailable, 503),
]

UNAVAILABLE = "the database is unavailable; retry shortly"

HTTP_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
    503: "service_unavailable",
}


def _body(code: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"error": code, "detail": detail, **{k: _extra(v) for k, v in extra.items()}}


def _extra(value: Any) -> Any:
    # Decimals as canonical strings (exact); counts such as retry_after stay integers.
    if isinstance(value, Decimal):
        return canonical_decimal(value)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return str(value)


def _headers(exc: DomainError, status: int) -> dict[str, str] | None:
    if status == 401:
        return {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, ServiceUnavailable):
        return {"Retry-After": str(exc.retry_after)}
    return None


#: Pydantic's error types for a body that is not an object (FastAPI hands a body sent without
#: a JSON content type to the model as bytes or text).
_NOT_AN_OBJECT = frozenset({"model_attributes_type", "dict_type", "model_type"})


def _describe_validation(exc: RequestValidationError, content_type: str | None = None) -> str:
    # Only the location and pydantic's message: the offending input is never echoed back.
    parts = []
    for error in exc.errors()[:5]:
        if (
            tuple(error.get("loc", ())) == ("body",)
            and error.get("type") in _NOT_AN_OBJECT
            and "json" not in (content_type or "").lower()
        ):
            # FastAPI parses JSON only under a JSON content type (curl -d sends
            # application/x-www-form-urlencoded): say which header to send, not pydantic's
            # "a valid dictionary or object to extract fields from".
            sent = printable(content_type[:100]) if content_type else "none"
            parts.append(
                "body: send a JSON object with the header 'content-type: application/json' "
                f"(this request's content type: {sent})"
            )
            continue
        if error.get("type") == "json_invalid":
            # FastAPI locates it at ("body", <character offset>): the field is the body, and
            # json's reason ("Expecting value", "Extra data") never quotes the document.
            where = error.get("loc", ())[-1:]
            reason = printable(str(error.get("ctx", {}).get("error", "JSON decode error")))
            at = f" at character {where[0]}" if where and isinstance(where[0], int) else ""
            parts.append(f"body: not valid JSON ({reason}{at})")
            continue
        location = printable(".".join(p for p in field_path(error.get("loc", ())) if p != "body"))
        message = str(error.get("msg", "invalid"))
        if error.get("type") == "value_error":
            # A validator's own sentence, without pydantic's "Value error, " in front.
            message = message.removeprefix("Value error, ")
        parts.append(f"{location or 'body'}: {message}")
    return "; ".join(parts)


def _allowed_methods(request: Request) -> str | None:
    """Every method the API serves at this path (RFC 9110 ``Allow``), from its OpenAPI paths;
    Starlette's own 405 names only the methods of the first route whose path matched."""
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, request.url.path):
            methods |= {method.upper() for method in operations}
    if "GET" in methods:
        methods.add("HEAD")  # every GET is also served as HEAD (service.api.http_methods)
    return ", ".join(sorted(methods)) if methods else None


def _served(request: Request, path: str) -> bool:
    """Whether some route of the app serves ``path`` (with any method)."""
    scope = {**request.scope, "path": path}
    return any(route.matches(scope)[0] != Match.NONE for route in request.app.router.routes)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _domain(_: Request, exc: DomainError) -> JSONResponse:
        status = next((s for kind, s in STATUS_OF if isinstance(exc, kind)), 400)
        body = _body(exc.code, exc.detail, **exc.extra)
        return JSONResponse(body, status, headers=_headers(exc, status))

    @app.exception_handler(SQLAlchemyError)
    async def _database(request: Request, exc: SQLAlchemyError) -> JSONResponse:
        # Requests reach the database through service.api.deps.Database, which already turns
        # an outage into ServiceUnavailable; this keeps any other path from answering 500 (and
        # closing the connection) for a database that merely cannot serve right now.
        if database_unavailable(exc):
            retry_after = request.app.state.settings.retry_after_seconds
            unavailable = ServiceUnavailable(UNAVAILABLE, retry_after)
            return await _domain(request, unavailable)
        return await _internal(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        described = _describe_validation(exc, request.headers.get("content-type"))
        return JSONResponse(_body("invalid_input", described), 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = HTTP_CODES.get(exc.status_code, "error")
        detail = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        headers = dict(exc.headers or {})
        allowed = _allowed_methods(request) if exc.status_code == 405 else None
        if allowed is not None:
            headers["Allow"] = allowed
            detail = f"{request.method} is not allowed on this path; it takes {allowed}"
        elif exc.status_code == 404 and exc.detail == "Not Found":
            # The router's own 404: no route matched (a handler's 404 names what is missing).
            # Usually a base URL with a path in it: the client adds /v1/... itself.
            shown = printable(request.url.path, 200)
            stripped = request.url.path.rstrip("/")
            if stripped and stripped != request.url.path and _served(request, stripped):
                # Starlette answered these with a 307 to the URL without the slash: a status no
                # operation documents, with no body, whose absolute Location is built from the
                # Host header (behind a TLS proxy, an http:// URL the client then re-sends its key
                # to). The router redirects no more (create_app); this says what to send.
                detail = (
                    f"no such path: {request.method} {shown}; "
                    f"the path has no trailing slash: {printable(stripped, 200)}"
                )
            else:
                detail = (
                    f"no such path: {request.method} {shown}; the API's paths are listed at "
                    "/docs (a client's URL is the service's base, e.g. http://127.0.0.1:8000, "
                    "without /v1)"
                )
        return JSONResponse(_body(code, detail), exc.status_code, headers=headers or None)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        # Type and location only; the request id on this line leads to the access line, which
        # has the path template (the raw path is whatever the client typed).
        log.error("internal error: %s", safe_traceback(exc))
        return JSONResponse(_body("internal_error", "internal error; see the service log"), 500)
