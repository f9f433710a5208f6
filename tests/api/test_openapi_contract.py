"""The published OpenAPI document is true: schemathesis runs every check on every operation with
an admin, an owner and an analyst key, on both databases, and finds nothing.

A short run (few examples per operation) is part of the default suite; ``scripts/schemathesis.sh``
runs the CLI for longer against a live server.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.core.parameters import ParameterLocation
from sqlalchemy.orm import sessionmaker

from service.app import create_app
from service.config import Settings
from tests.conftest import bearer

ROLES = ["admin", "owner", "analyst"]
ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
#: Examples per operation: few by default; scripts/schemathesis.sh raises it.
MAX_EXAMPLES = int(os.environ.get("DPSS_SCHEMATHESIS_EXAMPLES", "8"))


class _CurrentApp:
    """The ASGI app under test: schemathesis loads the document once, at import, and each test
    points this proxy at its own app (its database backend, its store)."""

    def __init__(self) -> None:
        self.app: Any = create_app(
            Settings(data_dir=Path(tempfile.mkdtemp()), database_url="sqlite://"),
            session_factory=sessionmaker(),
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


CURRENT = _CurrentApp()
schema = schemathesis.openapi.from_asgi("/openapi.json", CURRENT)


@pytest.fixture
def dataset_id(app, client, keys, upload_dataset):
    """A real dataset: generated ids reach only 404, this one reaches the rest of the code."""
    CURRENT.app = app
    data = np.random.default_rng(0).normal(size=(30, 4)) * 0.1
    return upload_dataset(client, keys.owner, data, row_norm_bound="1")["id"]


def auth(case: Any, key: str) -> dict[str, str]:
    """The key's header, unless the case is about headers being wrong (a missing Authorization
    is one of the negative cases schemathesis generates from the security scheme)."""
    components = case.meta.components if case.meta is not None else {}
    header = components.get(ParameterLocation.HEADER)
    return {} if header is not None and header.mode.is_negative else bearer(key)


def _long_wait(value: Any) -> bool:
    """Whether ``value`` is a valid ``wait`` longer than a tenth of a second."""
    try:
        return 0.1 < float(value) <= 30
    except (TypeError, ValueError):
        return False


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_matches_its_openapi_document(case, dataset_id, keys):
    if _long_wait((case.query or {}).get("wait")):
        # No worker runs here: a long poll (a release request's included) would wait out its
        # bound on every example. Its shape, not its length, is what is checked.
        case.query["wait"] = "0.1"
    for role in ROLES:
        case.call_and_validate(headers=auth(case, getattr(keys, role)))
    positive = case.meta is not None and case.meta.generation.mode.is_positive
    if positive and "dataset_id" in (case.path_parameters or {}):
        case.path_parameters["dataset_id"] = dataset_id
        for role in ROLES:
            case.call_and_validate(headers=auth(case, getattr(keys, role)))


def test_the_document_describes_errors_and_security_as_served(client):
    document = client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            if path.startswith("/v1/"):
                assert operation["security"] == [{"bearer": []}], (method, path)
                assert {"401", "429", "503"} <= codes, (method, path)
            else:
                assert "security" not in operation
            for code, response in operation["responses"].items():
                if int(code) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert ERROR_REF in [schema, *schema.get("anyOf", [])], (method, path, code)
    upload = document["paths"]["/v1/datasets"]["post"]["responses"]
    assert {"413", "422", "507"} <= set(upload)
    release = document["paths"]["/v1/datasets/{dataset_id}/releases"]["post"]["responses"]
    assert {"400", "404", "409", "413", "422"} <= set(release)
    assert "404" not in document["paths"]["/v1/datasets"]["get"]["responses"]
    assert "403" not in document["paths"]["/v1/mechanisms"]["get"]["responses"]


def test_a_405_lists_every_method_of_the_path(client, keys):
    response = client.put("/v1/keys", headers=bearer(keys.admin))
    assert response.status_code == 405
    assert set(response.headers["allow"].split(", ")) >= {"GET", "POST"}
    assert response.json()["error"] == "method_not_allowed"


def test_an_unknown_path_says_which_and_where_the_paths_are(client, keys):
    # A new user's base URL with /v1 in it (Client("http://host:8000/v1")) got "Not Found".
    response = client.get("/v1/v1/datasets", headers=bearer(keys.owner))
    assert response.status_code == 404
    body = response.json()
    assert body["error"] == "not_found"
    assert "GET /v1/v1/datasets" in body["detail"] and "/docs" in body["detail"]
    # A 404 of an existing path (no such dataset) keeps its own message.
    missing = client.get(f"/v1/datasets/{uuid.uuid4()}", headers=bearer(keys.owner))
    assert missing.status_code == 404 and "/docs" not in missing.json()["detail"]
    refused = client.put("/v1/keys", headers=bearer(keys.admin)).json()["detail"]
    assert "PUT" in refused and "GET" in refused and "POST" in refused


def test_unknown_query_parameters_are_refused(client, keys):
    response = client.get("/v1/datasets", params={"limt": "5"}, headers=bearer(keys.owner))
    assert response.status_code == 422
    assert response.json()["detail"].startswith("query.limt: unknown parameter")
    assert "limit, offset" in response.json()["detail"]
    assert client.get("/v1/datasets", params={"limit": "5"}, headers=bearer(keys.owner)).is_success


def test_a_trailing_slash_is_a_404_naming_the_path_without_it(client, keys):
    # Starlette redirected it (307, no body, an undocumented status) to an absolute URL built
    # from the Host header, to which a client following redirects re-sent its key.
    for path, key in (("/v1/datasets/", keys.owner), ("/v1/keys/", keys.admin)):
        response = client.get(path, headers=bearer(key), follow_redirects=False)
        assert response.status_code == 404, response.text
        assert "location" not in response.headers
        detail = response.json()["detail"]
        assert detail.endswith(f"no trailing slash: {path.rstrip('/')}"), detail
    created = client.post("/v1/keys/", headers=bearer(keys.admin), json={"role": "analyst"})
    assert created.status_code == 404 and "no trailing slash: /v1/keys" in created.text
