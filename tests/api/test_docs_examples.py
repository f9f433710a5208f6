"""Every operation of the manual has examples (request body, successful and error responses),
and every example validates against the schema it illustrates."""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest

from service.api.examples import REQUESTS, RESPONSES


def media_types(operation: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = [
        ("request " + name, media)
        for name, media in operation.get("requestBody", {}).get("content", {}).items()
    ]
    for code, response in operation["responses"].items():
        found += [(f"{code} {name}", media) for name, media in response.get("content", {}).items()]
    return found


def test_every_operation_has_examples_that_validate(client):
    document = client.get("/openapi.json").json()
    components = document["components"]
    used: set[tuple[str, str]] = set()
    checked = 0
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            assert operation["tags"] and operation.get("summary"), (method, path)
            if "requestBody" in operation:
                used.add((method, path))
            assert any(code.startswith("2") for code in operation["responses"]), (method, path)
            for where, media in media_types(operation):
                assert media.get("examples"), (method, path, where)
                schema = {"allOf": [media["schema"]], "components": components}
                validator = jsonschema_rs.Draft202012Validator(schema)
                for name, example in media["examples"].items():
                    errors = [error.message for error in validator.iter_errors(example["value"])]
                    assert not errors, (method, path, where, name, errors)
                    checked += 1
    assert used == set(REQUESTS)  # no request example left without its operation
    assert checked > 100


def test_every_parameter_is_described(client):
    # The README promises "every field is described": path ids (dataset_id, release_id, ...)
    # were bare UUIDs on the page, saying neither whose id nor where it comes from.
    document = client.get("/openapi.json").json()
    bare = [
        (method, path, parameter["name"])
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
        for parameter in operation.get("parameters", [])
        if len(parameter.get("description") or parameter["schema"].get("description") or "") < 10
    ]
    assert not bare
    assert (
        sum(len(op.get("parameters", [])) for m in document["paths"].values() for op in m.values())
        > 40
    )


def test_every_tag_has_a_description(client):
    document = client.get("/openapi.json").json()
    described = {tag["name"]: tag["description"] for tag in document["tags"]}
    operation_tags = {
        tag
        for methods in document["paths"].values()
        for operation in methods.values()
        for tag in operation["tags"]
    }
    assert operation_tags == set(described)
    assert all(len(text) > 20 for text in described.values())


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_each_response_example_names_a_published_schema(client, name):
    assert name in client.get("/openapi.json").json()["components"]["schemas"]
