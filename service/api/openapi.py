"""The published OpenAPI document, made to say what the service really answers.

FastAPI documents a 422 body (``HTTPValidationError``) that the service never sends and knows
nothing of the responses produced outside a route (authentication, rate limits, database
outages, body limits). :func:`install_openapi` post-processes the generated document once:

- every error response is :class:`~api_schemas.common.ErrorBody` (the 409 of a release request
  may also be :class:`~api_schemas.releases.BudgetExceeded`);
- each operation lists the statuses it can return: 400 where a JSON body is parsed (bytes that
  are not UTF-8 JSON), 401 and 429 on every ``/v1`` operation, 403 where a role is required,
  404 where a path names a resource, 409 where state conflicts, 413 where a body has a size
  limit, 422 where anything is parsed, 503 wherever the database is used, 507 on file uploads
  (every ``multipart/form-data`` body); and every error status a route declares itself (a
  body timeout's 408, an append's or a registration's 409), with the route's description,
  except a shared 404 on an operation whose path names no resource;
- a bearer ``securityScheme`` applies to every ``/v1`` operation;
- every request body, successful response and error response has an example
  (:mod:`service.api.examples`);
- the upload form and the mechanism names are described as they are validated.

Query parameters an operation does not declare are refused
(:func:`reject_unknown_query_parameters`, installed by ``create_app``), so the document's
parameter lists are closed, as OpenAPI tools read them.

Tests run schemathesis against this document (tests/api/test_openapi_contract.py).
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from api_schemas.common import unknown_name
from api_schemas.datasets import DatasetCreate
from service.api import examples
from service.errors import InvalidInput, printable
from service.keyformat import looks_like_key
from service.mechanisms.registry import MECHANISMS

ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
BUDGET_EXCEEDED_REF = {"$ref": "#/components/schemas/BudgetExceeded"}
SECURITY_SCHEME = "bearer"

RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "schema": {"type": "integer", "minimum": 0},
    }
}
WWW_AUTHENTICATE = {
    "WWW-Authenticate": {
        "description": "`Bearer`: the authentication scheme to use.",
        "schema": {"type": "string"},
    }
}

DESCRIPTIONS = {
    400: "The body could not be read as JSON (for example, it is not UTF-8).",
    401: "Missing, unknown or revoked API key.",
    403: "The key's role may not do this.",
    404: "No such resource, or not visible to this key.",
    408: "The body was not received within DPSS_BODY_TIMEOUT_SECONDS; nothing was kept.",
    409: "The request conflicts with the resource's state.",
    413: "The body is larger than its limit.",
    422: "A parameter, field or file is invalid (the detail names it). Nothing was changed.",
    429: "Too many requests for this key (or without a known key, from this address or in "
    "total); retry after `Retry-After` seconds.",
    503: "The database is unavailable or busy; retry after `Retry-After` seconds.",
    507: "The server's disk is full; nothing was kept.",
}
HEADERS = {401: WWW_AUTHENTICATE, 429: RETRY_AFTER, 503: RETRY_AFTER}

#: Operations whose role check can refuse a valid key (all but the mechanism list).
OPEN_TO_EVERY_KEY = {("get", "/v1/mechanisms")}
#: Operations that can answer 409, and why.
CONFLICTS = {
    ("post", "/v1/datasets/{dataset_id}/releases"): (
        "`budget_exceeded` (with which budget, `grant` or `dataset`, and its remaining), "
        "`idempotency_conflict`, `dataset_deleted`, or `dataset_not_ready` (a dataset by "
        "reference still registering, or whose registration failed). Nothing is charged."
    ),
    ("post", "/v1/datasets/{dataset_id}/grants"): (
        "`conflict`: the key (or every analyst) already has an active grant on this dataset; "
        "`dataset_deleted`: the dataset's rows were deleted; `dataset_not_ready`: a dataset by "
        "reference still registering, or whose registration failed."
    ),
}
DATABASE_FREE = {("get", "/healthz")}


def _is_upload(operation: dict[str, Any]) -> bool:
    """A file upload (a ``multipart/form-data`` body, limited by DPSS_MAX_UPLOAD_MB and stored
    on the server's disk): the dataset upload, an append, a prior."""
    return "multipart/form-data" in operation.get("requestBody", {}).get("content", {})


def _error_response(status: int, description: str | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description or DESCRIPTIONS[status],
        "content": {"application/json": {"schema": ERROR_REF}},
    }
    if status in HEADERS:
        response["headers"] = copy.deepcopy(HEADERS[status])
    return response


def _statuses(method: str, path: str, operation: dict[str, Any]) -> dict[int, str | None]:
    """The error statuses an operation can answer, with a specific description if any."""
    key = (method, path)
    parameters = operation.get("parameters", [])
    upload = _is_upload(operation)
    statuses: dict[int, str | None] = {}
    if path.startswith("/v1/"):
        statuses[401] = None
        statuses[429] = None
        if key not in OPEN_TO_EVERY_KEY:
            statuses[403] = None
    if any(parameter["in"] == "path" for parameter in parameters):
        statuses[404] = None
    if key in CONFLICTS:
        statuses[409] = CONFLICTS[key]
    if "application/json" in operation.get("requestBody", {}).get("content", {}):
        statuses[400] = None
    if "requestBody" in operation:
        statuses[413] = (
            "The file is larger than DPSS_MAX_UPLOAD_MB."
            if upload
            else "The JSON body is larger than its limit."
        )
    if parameters or "requestBody" in operation:
        statuses[422] = None
    if key not in DATABASE_FREE:
        statuses[503] = None
    if upload:
        statuses[507] = None
    names_resource = any(parameter["in"] == "path" for parameter in parameters)
    for code, response in operation.get("responses", {}).items():
        # What the route itself declares (a body timeout's 408, an append's 409) is answered
        # by it; a shared 404 on an operation whose path names no resource is not.
        if code.isdigit() and int(code) >= 400 and (int(code) != 404 or names_resource):
            declared = response.get("description")
            if int(code) not in statuses:
                statuses[int(code)] = declared
            elif int(code) == 413 and declared:
                # The upload limit in the route's words; a JSON body's limit and the route's
                # own reason for a 413 are both answered.
                statuses[413] = declared if upload else f"{statuses[413]} Or: {declared}"
    return statuses


def _fix_operation(method: str, path: str, operation: dict[str, Any]) -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    errors = _statuses(method, path, operation)
    for code in [code for code in responses if code.isdigit() and int(code) >= 400]:
        if int(code) not in errors:
            del responses[code]  # documented, but this operation cannot answer it
    for status, description in errors.items():
        existing = responses.get(str(status), {})
        response = _error_response(status, description or existing.get("description"))
        media = response["content"]["application/json"]
        media["examples"] = {
            "example": examples.example(examples.ERRORS[status], response["description"])
        }
        if status == 409 and (method, path) in CONFLICTS:
            media["schema"] = {"anyOf": [BUDGET_EXCEEDED_REF, ERROR_REF]}
            media["examples"] = {
                "budget_exceeded": examples.example(examples.BUDGET_EXCEEDED, "Not enough budget."),
                "conflict": examples.example(examples.ERRORS[409], "Another conflict."),
            }
        responses[str(status)] = response
    _success_examples(method, path, operation)
    if path.startswith("/v1/"):
        operation["security"] = [{SECURITY_SCHEME: []}]


def _success_examples(method: str, path: str, operation: dict[str, Any]) -> None:
    """Attach the request example and, to each successful JSON response, its schema's example."""
    body = examples.REQUESTS.get((method, path))
    for media in operation.get("requestBody", {}).get("content", {}).values():
        if body is not None:
            media["examples"] = {"example": examples.example(body, operation.get("summary", ""))}
    for code, response in operation.get("responses", {}).items():
        if not code.startswith("2"):
            continue
        media = response.get("content", {}).get("application/json")
        reference = (media or {}).get("schema", {}).get("$ref", "")
        name = reference.rsplit("/", 1)[-1]
        if media is not None and name in examples.RESPONSES:
            media["examples"] = {name: examples.example(examples.RESPONSES[name], name)}


def _upload_form(document: dict[str, Any]) -> None:
    """Form fields are text: each field's schema is the text its validator accepts."""
    operation = document["paths"]["/v1/datasets"]["post"]
    form = operation["requestBody"]["content"]["multipart/form-data"]["schema"]
    form["additionalProperties"] = False
    fields = DatasetCreate.model_json_schema()["properties"]
    for name, field in fields.items():
        branches = field.get("anyOf", [field])
        text = next((b for b in branches if b.get("type") == "string"), {"type": "string"})
        form["properties"][name] = {**text, "description": field.get("description", "")}


def _mechanism_names(document: dict[str, Any]) -> None:
    request = document["components"]["schemas"]["ReleaseRequest"]["properties"]["mechanism"]
    request["enum"] = sorted(MECHANISMS)


def truthful_openapi(document: dict[str, Any]) -> dict[str, Any]:
    """Rewrite FastAPI's document to match the service's real responses (see module doc)."""
    document = copy.deepcopy(document)
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            _fix_operation(method, path, operation)
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    components["securitySchemes"] = {
        SECURITY_SCHEME: {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key: `Authorization: Bearer <key>`.",
        }
    }
    _upload_form(document)
    _mechanism_names(document)
    return document


def _query_names(dependant: Dependant) -> frozenset[str]:
    names = {parameter.alias for parameter in dependant.query_params}
    for dependency in dependant.dependencies:
        names |= _query_names(dependency)
    return frozenset(names)


def _header_names(dependant: Dependant) -> frozenset[str]:
    names = {parameter.alias.lower() for parameter in dependant.header_params}
    for dependency in dependant.dependencies:
        names |= _header_names(dependency)
    return frozenset(names)


#: Declared query parameters by route (routes live as long as the app; APIRoute is unhashable).
_DECLARED: dict[int, frozenset[str]] = {}
#: Declared header parameters by route, lower case.
_DECLARED_HEADERS: dict[int, frozenset[str]] = {}


def _declared_query(route: APIRoute) -> frozenset[str]:
    names = _DECLARED.get(id(route))
    if names is None:
        names = _DECLARED[id(route)] = _query_names(route.dependant)
    return names


async def reject_unknown_query_parameters(request: Request) -> None:
    """Refuse query parameters an operation does not declare (a misspelt ``limt=5`` is an
    error, not silently the default): the document's parameter lists are closed, and true.
    A parameter given twice is refused too (every one is a single value).

    ``async`` although it awaits nothing: FastAPI runs a plain ``def`` dependency in its
    thread pool, a thread hop (and two wake-ups of the event loop) on every request."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    declared = _declared_query(route)
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        shown = (
            printable(name)
            if looks_like_key(name) or (name.isprintable() and len(name) <= 40)
            else "(unprintable or long)"
        )
        if name not in declared:
            raise InvalidInput(f"query.{shown}", unknown_name(name, sorted(declared), "parameter"))
        if name in seen:
            # Every parameter is a single value: neither of two silently wins.
            raise InvalidInput(f"query.{shown}", "given twice; send each parameter once")
        seen.add(name)
    headers = _DECLARED_HEADERS.get(id(route))
    if headers is None:
        headers = _DECLARED_HEADERS[id(route)] = _header_names(route.dependant)
    for header in headers:
        if len(request.headers.getlist(header)) > 1:
            # As for the query: two Idempotency-Key headers answered as the first one did.
            raise InvalidInput(f"header.{header}", "given twice; send the header once")


def install_openapi(app: FastAPI) -> None:
    """Serve the truthful document at ``/openapi.json`` (and to the docs pages)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = truthful_openapi(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
