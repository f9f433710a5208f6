"""The published manual keeps every error status a route declares and answers: the document's
post-processing (service.api.openapi) used to delete any status outside its generic list, so
the manual did not say that an upload, an append or a prior can answer 408 (body timeout) or
507 (disk full), nor that an upload or an append answers 409 (idempotency conflict, deleted
dataset), and gave appends and priors the 413 of a JSON body. Checked two ways: against what
the routes declare, and against real answers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api import openapi
from tests.api.test_append_rows import append
from tests.conftest import bearer, npy_bytes


def documented(client: TestClient, method: str, path: str) -> dict[str, Any]:
    responses: dict[str, Any] = client.get("/openapi.json").json()["paths"][path][method][
        "responses"
    ]
    return responses


def test_every_status_a_route_declares_is_published(client, monkeypatch):
    raw: dict[str, Any] = {}
    original = openapi.truthful_openapi

    def keep(document: dict[str, Any]) -> dict[str, Any]:
        raw.update(document)
        return original(document)

    monkeypatch.setattr(openapi, "truthful_openapi", keep)
    client.app.openapi_schema = None
    published = client.app.openapi()
    missing = []
    for path, methods in raw["paths"].items():
        for method, operation in methods.items():
            names = any(p["in"] == "path" for p in operation.get("parameters", []))
            for code in operation["responses"]:
                if not code.isdigit() or int(code) < 400 or (code == "404" and not names):
                    continue
                if code not in published["paths"][path][method]["responses"]:
                    missing.append((method, path, code))
    assert not missing
    for path, methods in published["paths"].items():
        for method, operation in methods.items():
            if "multipart/form-data" in operation.get("requestBody", {}).get("content", {}):
                responses = operation["responses"]
                assert {"408", "413", "507"} <= set(responses), (method, path)
                assert "JSON" not in responses["413"]["description"], (method, path)


@pytest.fixture
def dataset(client, keys, upload_dataset) -> str:
    rows = np.random.default_rng(0).normal(size=(10, 3))
    return str(upload_dataset(client, keys.owner, rows, row_norm_bound=3)["id"])


def test_an_appends_real_conflicts_are_in_the_manual(client, keys, dataset):
    rows = np.random.default_rng(1).normal(size=(4, 3))
    first = append(client, keys.owner, dataset, npy_bytes(rows))
    assert first.status_code == 201
    headers = {**bearer(keys.owner), "Idempotency-Key": "k-1"}
    url = f"/v1/datasets/{dataset}/rows"
    files = {"file": ("r.npy", npy_bytes(rows), "application/octet-stream")}
    assert client.post(url, headers=headers, files=files).status_code == 201
    files = {"file": ("r.npy", npy_bytes(rows + 1), "application/octet-stream")}
    reused = client.post(url, headers=headers, files=files)
    assert reused.status_code == 409, reused.text
    assert "409" in documented(client, "post", "/v1/datasets/{dataset_id}/rows")


def test_an_uploads_idempotency_conflict_is_in_the_manual(client, keys):
    headers = {**bearer(keys.owner), "Idempotency-Key": "u-1"}
    form = {"name": "x", "epsilon_budget": "1", "delta_budget": "1e-5"}
    for shift, status in ((0, 201), (1, 409)):
        rows = np.random.default_rng(2).normal(size=(10, 3)) + shift
        files = {"file": ("x.npy", npy_bytes(rows), "application/octet-stream")}
        answer = client.post("/v1/datasets", headers=headers, files=files, data=form)
        assert answer.status_code == status, answer.text
    assert "409" in documented(client, "post", "/v1/datasets")
