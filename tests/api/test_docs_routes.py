"""Every route the prose docs name exists on the app, with the method they name.

The docs name routes in prose (``GET /v1/datasets/{id}/ledger``, ``POST
/v1/dataset-references/{id}/batches``, a bare ``/v1/audit/verification``); an outside reader
checks each against the service. A route renamed or removed in the code must not survive in
the docs (nothing else reads that prose)."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.routing import APIRoute
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "clients/python/README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]

#: ``GET /v1/...`` in prose; a path runs to the first character a path cannot hold.
_WITH_METHOD = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE) `?(/[\w/{}.\-]*)")
#: A bare ``/v1/...`` path (not part of a URL or file path before it).
_BARE = re.compile(r"(?<![\w.:/])(/v1/[\w/{}\-]*)")


def _shape(path: str) -> str:
    """A path with every ``{parameter}`` one placeholder, so ``{id}`` matches ``{dataset_id}``."""
    return re.sub(r"\{[^}]*\}", "{}", path.rstrip("/.-") or "/")


def _served(client) -> set[tuple[str, str]]:
    """The OpenAPI document's operations and the app's own routes outside it (``/metrics``,
    the dashboard, the docs pages)."""
    document = client.get("/openapi.json").json()
    found = {
        (method.upper(), _shape(path))
        for path, operations in document["paths"].items()
        for method in operations
    }
    for route in client.app.routes:
        if isinstance(route, (APIRoute, Route)):
            for method in route.methods or ():
                found.add((method, _shape(route.path)))
    return found


def test_every_route_named_in_the_docs_exists(client):
    served = _served(client)
    shapes = {shape for _, shape in served}
    missing = []
    named = 0
    for page in PAGES:
        text = page.read_text()
        for method, path in _WITH_METHOD.findall(text):
            named += 1
            if (method, _shape(path.split("?")[0])) not in served:
                missing.append((page.name, method, path))
        for path in _BARE.findall(text):
            named += 1
            shape = _shape(path)
            # A bare prefix (``/v1/dataset-references/``) names the routes under it.
            if shape not in shapes and not any(s.startswith(shape + "/") for s in shapes):
                missing.append((page.name, "?", path))
    assert named > 100
    assert missing == []


def test_the_check_finds_a_route_that_is_not_served(client):
    served = _served(client)
    assert ("GET", _shape("/v1/datasets/{id}/ledger")) in served
    assert ("POST", _shape("/v1/datasets/{id}/ledger")) not in served
    assert ("GET", _shape("/v1/datasets/{id}/budgets")) not in served
