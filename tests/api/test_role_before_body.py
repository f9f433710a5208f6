"""docs/security.md: "A role that may not make the request gets 403." For a route with a JSON
body that held only when the body was valid: FastAPI validated the body before the route checked
the role, so a key of another role sending ``{}`` got 422 naming the route's fields (an admin
posting to ``/v1/dataset-references``: 422 "columns: Field required"; an analyst posting to
``/v1/keys``: 422 for ``role``), and 403 only once its body was right. Every route with a JSON
body (enumerated from the app, so a new one must say who may call it) answers a key of any other
role 403 whatever its body, before the body is validated; its own role still gets the 422."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.auth import ROLES
from tests.conftest import bearer

#: Who may call each route with a JSON body (docs/security.md, DESIGN.md's HTTP contract).
MAY_CALL = {
    ("POST", "/v1/keys"): "admin",
    ("POST", "/v1/dataset-references"): "owner",
    ("POST", "/v1/dataset-references/{dataset_id}/batches"): "owner",
    ("POST", "/v1/datasets/{dataset_id}/releases"): "analyst",
    ("POST", "/v1/datasets/{dataset_id}/grants"): "owner",
}


def json_body_routes(app: Any) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()

    def walk(routes: list[Any]) -> None:
        for route in routes:
            if hasattr(route, "original_router"):
                walk(route.original_router.routes)
            elif getattr(route, "body_field", None) is not None:
                found.update((method, route.path) for method in route.methods)

    walk(app.routes)
    return found


@pytest.mark.parametrize("body", [{}, {"unexpected": 1}, [], None], ids=str)
def test_a_role_that_may_not_call_a_json_route_gets_403_whatever_its_body(
    client: TestClient, make_key: Callable[..., str], body: Any
) -> None:
    assert json_body_routes(client.app) == set(MAY_CALL)
    keys = {role: make_key(role) for role in ROLES}
    some_id = str(uuid.uuid4())
    for (method, template), allowed in MAY_CALL.items():
        path = re.sub(r"{\w+}", some_id, template)
        for role, key in keys.items():
            answer = client.request(method, path, headers=bearer(key), json=body)
            if role == allowed:
                # Its own role learns what is wrong with the body (or that there is no dataset).
                assert answer.status_code in (404, 422), (role, path, answer.text)
            else:
                assert answer.status_code == 403, (role, path, answer.text)
                assert answer.json()["error"] == "forbidden", answer.text
