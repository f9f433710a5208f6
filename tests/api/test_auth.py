"""Every endpoint against every role, and the key lifecycle."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from service import datasets as datasets_service
from tests.conftest import bearer, npy_bytes

ROLES = ("admin", "owner", "analyst", "auditor")


@pytest.fixture
def world(client, keys, upload_dataset, run_worker):
    data = np.random.default_rng(0).normal(size=(40, 4)) * 0.3
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)
    release = client.post(
        f"/v1/datasets/{dataset['id']}/releases",
        headers=bearer(keys.analyst),
        json={"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-6"},
    ).json()
    run_worker()
    return {"dataset": dataset["id"], "release": release["id"]}


def calls(world, keys_by_role):
    ds, rel = world["dataset"], world["release"]
    release_body = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-6"}
    upload = {
        "files": {"file": ("x.npy", npy_bytes(np.eye(3)), "application/octet-stream")},
        "data": {"name": "n", "epsilon_budget": "1", "delta_budget": "0"},
    }
    return {
        # name: (method, path, kwargs, roles allowed, success status)
        "list_datasets": ("GET", "/v1/datasets", {}, {"owner", "analyst"}, 200),
        "get_dataset": ("GET", f"/v1/datasets/{ds}", {}, {"owner", "analyst"}, 200),
        "get_budget": ("GET", f"/v1/datasets/{ds}/budget", {}, {"owner", "analyst"}, 200),
        "upload": ("POST", "/v1/datasets", upload, {"owner"}, 201),
        "request_release": (
            "POST",
            f"/v1/datasets/{ds}/releases",
            {"json": release_body},
            {"analyst"},
            202,
        ),
        "get_release": ("GET", f"/v1/releases/{rel}", {}, {"owner", "analyst"}, 200),
        "mechanisms": ("GET", "/v1/mechanisms", {}, set(ROLES), 200),
        "audit": ("GET", "/v1/audit", {}, {"auditor", "admin"}, 200),
        "list_keys": ("GET", "/v1/keys", {}, {"admin"}, 200),
        "create_key": (
            "POST",
            "/v1/keys",
            {"json": {"role": "analyst", "name": "x"}},
            {"admin"},
            201,
        ),
        "delete_dataset": ("DELETE", f"/v1/datasets/{ds}", {}, {"owner"}, 204),
    }


ENDPOINTS = [
    "list_datasets",
    "get_dataset",
    "get_budget",
    "upload",
    "request_release",
    "get_release",
    "mechanisms",
    "audit",
    "list_keys",
    "create_key",
    "delete_dataset",
]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("role", ROLES)
def test_every_endpoint_against_every_role(client, keys, world, endpoint, role):
    method, path, kwargs, allowed, success = calls(world, keys)[endpoint]
    response = client.request(method, path, headers=bearer(getattr(keys, role)), **kwargs)
    if role in allowed:
        assert response.status_code == success, response.text
    else:
        assert response.status_code == 403, response.text
        assert response.json()["error"] == "forbidden"


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic abc", "Bearer "])
def test_every_endpoint_needs_a_valid_key(client, keys, world, endpoint, header):
    method, path, kwargs, _, _ = calls(world, keys)[endpoint]
    headers = {"Authorization": header} if header else {}
    response = client.request(method, path, headers=headers, **kwargs)
    assert response.status_code == 401
    assert response.json()["error"] == "unauthenticated"
    assert response.headers["www-authenticate"] == "Bearer"


def test_two_authorization_headers_or_a_malformed_one_are_refused(client, keys, world):
    # Two headers answered as the first one did (a proxy adding its own header in front of the
    # client's chose the role), and "Bearer<TAB>key" was "missing API key".
    key_of = {"admin": keys.admin, "owner": keys.owner, "analyst": keys.analyst}
    key_of["auditor"] = keys.auditor
    before = client.get("/v1/keys", headers=bearer(keys.admin)).json()["total"]
    for endpoint in ENDPOINTS:
        method, path, kwargs, roles, _ = calls(world, keys)[endpoint]
        key = key_of[sorted(roles)[0]]
        for headers in (
            [("Authorization", f"Bearer {key}"), ("Authorization", "Bearer nope")],
            [("Authorization", f"Bearer {keys.analyst}"), ("Authorization", f"Bearer {key}")],
            [("Authorization", f"Bearer {key}"), ("Authorization", f"Bearer {key}")],
            [("Authorization", f"Bearer\t{key}")],
        ):
            response = client.request(method, path, headers=headers, **kwargs)
            assert response.status_code == 401, (endpoint, response.text)
            assert response.json()["detail"].startswith("Authorization: "), endpoint
            assert response.headers["www-authenticate"] == "Bearer"
            assert key not in response.text
    assert client.get("/v1/keys", headers=bearer(keys.admin)).json()["total"] == before
    assert client.get(f"/v1/datasets/{world['dataset']}", headers=bearer(keys.owner)).is_success


def test_health_needs_no_key(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ok", "workers_alive": 0}


def test_created_key_works_once_shown_and_revoked_key_fails(client, keys):
    created = client.post(
        "/v1/keys", headers=bearer(keys.admin), json={"role": "auditor", "name": "eve"}
    )
    body = created.json()
    assert body["role"] == "auditor" and body["key"].startswith("dpss_")
    assert client.get("/v1/audit", headers=bearer(body["key"])).status_code == 200
    listed = client.get("/v1/keys", headers=bearer(keys.admin)).json()
    assert listed["total"] == len(listed["items"]) and listed["next"] is None
    assert body["id"] in [item["id"] for item in listed["items"]]
    assert all("key" not in item for item in listed["items"])
    assert body["key"] not in client.get("/v1/keys", headers=bearer(keys.admin)).text
    assert client.delete(f"/v1/keys/{body['id']}", headers=bearer(keys.admin)).status_code == 204
    assert client.get("/v1/audit", headers=bearer(body["key"])).status_code == 401
    missing = client.delete(
        "/v1/keys/00000000-0000-0000-0000-000000000000", headers=bearer(keys.admin)
    )
    assert missing.status_code == 404


def test_key_role_is_validated(client, keys):
    response = client.post(
        "/v1/keys", headers=bearer(keys.admin), json={"role": "root", "name": "x"}
    )
    assert response.status_code == 422
    assert response.json()["detail"].startswith("role")


def test_secrets_are_stored_hashed(client, keys, session_factory):
    from sqlalchemy import select

    from service.db.models import ApiKey

    with session_factory() as session:
        hashes = list(session.scalars(select(ApiKey.key_hash)))
    assert keys.analyst not in hashes and len(hashes) == 4


def test_bootstrap_admin_key_from_settings(settings, session_factory):
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from service.app import create_app

    settings.admin_api_key = SecretStr("bootstrap-secret-123")
    with TestClient(create_app(settings, session_factory=session_factory)) as client:
        response = client.get("/v1/keys", headers=bearer("bootstrap-secret-123"))
        assert response.status_code == 200
    # A second start does not create a second key.
    with TestClient(create_app(settings, session_factory=session_factory)) as client:
        assert client.get("/v1/keys", headers=bearer("bootstrap-secret-123")).json()["total"] == 1


def test_internal_errors_leak_nothing(client, keys, monkeypatch, caplog):
    def explode(*_args, **_kwargs):
        raise RuntimeError("row 7 is [3.14159, 2.71828]")

    monkeypatch.setattr(datasets_service, "page_datasets", explode)
    with caplog.at_level(logging.ERROR):
        response = client.get("/v1/datasets", headers=bearer(keys.owner))
    assert response.status_code == 500
    assert response.json() == {
        "error": "internal_error",
        "detail": "internal error; see the service log",
    }
    assert "3.14159" not in caplog.text
    assert "RuntimeError" in caplog.text


def test_unknown_routes_and_methods_use_the_error_shape(client, keys):
    missing = client.get("/v1/nothing-here", headers=bearer(keys.owner))
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    wrong = client.put("/v1/datasets", headers=bearer(keys.owner))
    assert wrong.status_code == 405 and wrong.json()["error"] == "method_not_allowed"
    bad_id = client.get("/v1/datasets/not-a-uuid", headers=bearer(keys.owner))
    assert bad_id.status_code == 422 and bad_id.json()["detail"].startswith("path.dataset_id")


def test_mechanisms_list_describes_each_mechanism(client, keys):
    items = client.get("/v1/mechanisms", headers=bearer(keys.analyst)).json()["items"]
    names = {item["name"] for item in items}
    assert "analyze_gauss" in names
    gauss = next(item for item in items if item["name"] == "analyze_gauss")
    assert "clip_norm" in gauss["params_schema"]["properties"]
    assert gauss["paper"].startswith("Dwork")
    assert gauss["allows_pure_dp"] is False


def test_openapi_documents_every_field(client):
    schema = client.get("/openapi.json").json()
    for name, component in schema["components"]["schemas"].items():
        if name.startswith(("HTTPValidationError", "ValidationError")):
            continue
        for field, spec in component.get("properties", {}).items():
            assert spec.get("description"), f"{name}.{field} has no description"
