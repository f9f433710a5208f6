"""Issue 13, item 8: ``{"items", "total", "next"}`` on every list. The analyst's grants
(``GET /v1/grants``), the workers and the mechanisms answered without ``next`` (and the
mechanisms without ``total``), so a client paging every list the same way broke on them.
Checked on the published schemas of every list and on real answers."""

from __future__ import annotations

from typing import Any

#: Not a list but the queue's state, which carries its oldest jobs as ``items``.
STATES = {"/v1/queue"}


def test_every_list_schema_has_items_total_and_next(client):
    document = client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    shapes = {}
    for path, methods in document["paths"].items():
        operation = methods.get("get")
        if operation is None or path in STATES:
            continue
        media = operation["responses"]["200"]["content"]["application/json"]
        name = media["schema"].get("$ref", "").rsplit("/", 1)[-1]
        properties: dict[str, Any] = schemas.get(name, {}).get("properties", {})
        if "items" in properties:
            shapes[path] = {"items", "total", "next"} <= set(properties)
    assert len(shapes) >= 12 and all(shapes.values()), shapes


def test_every_list_answers_items_total_and_next(client, keys):
    for path, key in (
        ("/v1/grants", keys.analyst),
        ("/v1/workers", keys.admin),
        ("/v1/mechanisms", keys.analyst),
        ("/v1/datasets", keys.owner),
    ):
        body = client.get(path, headers={"Authorization": f"Bearer {key}"}).json()
        assert {"items", "total", "next"} <= set(body), (path, sorted(body))
        assert body["total"] == len(body["items"]) and body["next"] is None, path
