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


ACCOUNTINGS = {"basic", "gaussian", "zcdp", "hybrid"}


def _accounting_fields(schema: dict[str, Any], components: dict[str, Any]) -> list[str]:
    """The properties of ``schema`` whose values are accounting names (or lists of them)."""
    found = []
    for name, prop in schema.get("properties", {}).items():
        options = [prop, prop.get("items", {}), *prop.get("anyOf", [])]
        if name == "accountings" or any(
            set(option.get("enum", ())) == ACCOUNTINGS for option in options
        ):
            found.append(name)
    return found


def test_no_schema_states_a_default_accounting_other_than_the_service_s(client):
    # Response schemas said `"accounting": {"default": "basic"}` (and a mechanism's
    # `accountings` defaulted to ["basic"]): the manual a new user reads stated basic where
    # the service's default is hybrid. A response always says which accounting it is in
    # (required); a request's default, if any, is the service's.
    from service.config import Settings

    document = client.get("/openapi.json").json()
    components = document["components"]["schemas"]
    default = Settings.model_fields["default_accounting"].default
    checked = 0
    for name, schema in components.items():
        for field in _accounting_fields(schema, components):
            checked += 1
            stated = schema["properties"][field].get("default")
            assert stated in (None, default), (name, field, stated)
            response = not name.endswith(("Create", "Request", "Plan"))
            if response and field != "recommended_accounting":
                assert field in schema.get("required", []), (name, field)
    assert checked >= 6
    for name, example in RESPONSES.items():
        budget = example.get("budget", example) if isinstance(example, dict) else {}
        if isinstance(budget, dict) and "accounting" in budget:
            assert budget["accounting"] == default, name
