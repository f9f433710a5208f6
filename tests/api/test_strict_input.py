"""Strict input: numbers are plain ASCII decimals, booleans are not numbers, strings hold no NUL
or lone surrogate; each refusal is a 422 naming the field, and nothing is stored or charged."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sqlalchemy import func, select

from service.db.models import ApiKey, Dataset, LedgerEntry
from tests.api.test_datasets import stored_files
from tests.conftest import bearer, npy_bytes

DATA = np.random.default_rng(3).normal(size=(30, 3)) * 0.1
GOOD_RELEASE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-9"}


@pytest.fixture
def dataset_id(client, keys, upload_dataset):
    return upload_dataset(client, keys.owner, DATA, row_norm_bound="1")["id"]


def post_json(client, key, path, body, headers=None):
    # Raw JSON text: lone surrogates and NULs travel as \\u escapes, as a hostile client sends them.
    return client.post(
        path,
        headers={**bearer(key), "content-type": "application/json", **(headers or {})},
        content=json.dumps(body).encode(),
    )


def charges(session_factory):
    with session_factory() as session:
        return session.scalar(select(func.count()).select_from(LedgerEntry))


NOT_PLAIN_DECIMALS = [
    "1_0",
    "١",
    "۱",
    "1\u0660",
    "+1",
    " 1",
    "1 ",
    ".5",
    "1.",
    "0x1",
    "Infinity",
    "NaN",
    "1e",
    "",
    "1" * 65,
    "0E1000000000000000000",
    "1e99999",
    True,
    False,
    None,
    [1],
    {"v": 1},
]


@pytest.mark.parametrize("field", ["epsilon", "delta"])
def test_release_costs_must_be_plain_ascii_decimals(
    client, keys, dataset_id, session_factory, field
):
    for value in NOT_PLAIN_DECIMALS:
        body = {**GOOD_RELEASE, field: value}
        response = post_json(client, keys.analyst, f"/v1/datasets/{dataset_id}/releases", body)
        assert response.status_code == 422, (value, response.text)
        assert response.json()["detail"].startswith(field), response.text
    assert charges(session_factory) == 0


def test_plain_decimals_are_accepted(client, keys, dataset_id):
    for value in ["0.25", 0.25, "2.5e-1", "25E-2", 1]:
        body = {**GOOD_RELEASE, "epsilon": value}
        response = post_json(client, keys.analyst, f"/v1/datasets/{dataset_id}/releases", body)
        assert response.status_code == 202, response.text


def test_k_must_be_a_json_integer_and_params_are_strict(client, keys, dataset_id, session_factory):
    path = f"/v1/datasets/{dataset_id}/releases"
    for value in [True, "1", 1.0, "x"]:
        response = post_json(client, keys.analyst, path, {**GOOD_RELEASE, "k": value})
        assert response.status_code == 422, response.text
        assert response.json()["detail"].startswith("k")
    for value in [True, "1.5"]:
        body = {**GOOD_RELEASE, "params": {"clip_norm": value}}
        response = post_json(client, keys.analyst, path, body)
        assert response.status_code == 422, response.text
        assert response.json()["detail"].startswith("params.clip_norm")
    assert charges(session_factory) == 0


BAD_TEXT = ["a\x00b", "\x00", "a\ud800b", "\udfff", "two\nlines", "x" * 201, ""]


def test_key_names_refuse_nul_surrogates_and_control_characters(client, keys, session_factory):
    with session_factory() as session:
        before = session.scalar(select(func.count()).select_from(ApiKey))
    for value in BAD_TEXT:
        response = post_json(client, keys.admin, "/v1/keys", {"role": "owner", "name": value})
        assert response.status_code == 422, response.text
        assert response.json()["detail"].startswith("name")
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(ApiKey)) == before


def test_mechanism_names_and_idempotency_keys_refuse_bad_text(
    client, keys, dataset_id, session_factory
):
    path = f"/v1/datasets/{dataset_id}/releases"
    for value in BAD_TEXT:
        response = post_json(client, keys.analyst, path, {**GOOD_RELEASE, "mechanism": value})
        assert response.status_code == 422, response.text
        assert response.json()["detail"].startswith("mechanism")
    for value in ["a\x00b", "two\nlines", "sp ace", "é", "x" * 201, keys.analyst, "DPSS_x"]:
        # Raw header bytes (latin-1): how a header value reaches the application.
        response = client.post(
            path,
            headers=[
                (b"authorization", f"Bearer {keys.analyst}".encode()),
                (b"idempotency-key", value.encode("latin-1")),
            ],
            json=GOOD_RELEASE,
        )
        assert response.status_code == 422, response.text
        assert "idempotency-key" in response.json()["detail"].lower()
    assert charges(session_factory) == 0


def upload(client, key, **form):
    fields = {"name": "d", "epsilon_budget": "1", "delta_budget": "1e-6", **form}
    return client.post(
        "/v1/datasets",
        headers=bearer(key),
        files={"file": ("x.npy", npy_bytes(DATA), "application/octet-stream")},
        data=fields,
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "a\x00b"),
        ("name", "two\nlines"),
        ("epsilon_budget", "1_0"),
        ("epsilon_budget", "١"),
        ("epsilon_budget", "+1"),
        ("epsilon_budget", " 1"),
        ("delta_budget", "1e-6 "),
        ("row_norm_bound", "1_0"),
        ("row_norm_bound", "٣"),
        ("row_norm_bound", "true"),
    ],
)
def test_upload_form_fields_are_strict(client, keys, settings, session_factory, field, value):
    response = upload(client, keys.owner, **{field: value})
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(field)
    assert stored_files(settings) == []
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Dataset)) == 0


def test_unknown_fields_are_refused_and_named_safely(client, keys, dataset_id, session_factory):
    path = f"/v1/datasets/{dataset_id}/releases"
    for name in ["epsilonn", "a\x00b", "\ud800", "x" * 500]:
        response = post_json(client, keys.analyst, path, {**GOOD_RELEASE, name: 1})
        assert response.status_code == 422, response.text
        detail = response.json()["detail"]
        valid = "valid fields: delta, epsilon, k, mechanism, mu, params, rho"
        assert valid in detail or "unicode" in detail
        assert "\x00" not in detail and len(detail) < 300
    response = post_json(client, keys.admin, "/v1/keys", {"role": "owner", "name": "n", "x": 1})
    assert response.status_code == 422
    assert charges(session_factory) == 0


def test_unknown_form_fields_are_refused(client, keys, settings):
    response = upload(client, keys.owner, row_norm_bnd="1")
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(
        "row_norm_bnd: unknown field (did you mean 'row_norm_bound'?); valid fields: "
    )
    assert stored_files(settings) == []


def post_raw(client, key, path, text):
    return client.post(
        path, headers={**bearer(key), "content-type": "application/json"}, content=text.encode()
    )


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (
            '{"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "epsilon": "0.01", '
            '"delta": "1e-9"}',
            "epsilon",
        ),
        (
            '{"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-9", '
            '"params": {"a": 1, "a": 2}}',
            "a",
        ),
        ('[{"x": 1}, {"y": 1, "y": 1}]', "y"),  # not even an object at the top: still refused
    ],
)
def test_a_key_given_twice_in_any_json_object_is_refused(
    client, keys, dataset_id, session_factory, body, key
):
    response = post_raw(client, keys.analyst, f"/v1/datasets/{dataset_id}/releases", body)
    assert response.status_code == 422, response.text
    assert response.json() == {
        "error": "invalid_input",
        "detail": f"body: the key '{key}' appears twice in one object; send it once",
    }
    assert charges(session_factory) == 0


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ("not json", "body: not valid JSON (Expecting value at character 0)"),
        ('{"k": 1', "body: not valid JSON (Expecting ',' delimiter at character 7)"),
        ('{"k": 1}x', "body: not valid JSON (Extra data at character 8)"),
        # Python refuses to read an integer of more than 4,300 digits (a ValueError that is not
        # a JSONDecodeError: it was a 400 "There was an error parsing the body")
        (
            '{"mechanism": "analyze_gauss", "k": 1' + "0" * 5000 + ', "epsilon": "0.1"}',
            "body: not valid JSON (a number of more than 4300 digits)",
        ),
        ("[" * 5_000, "body: not valid JSON (nested deeper than this service reads)"),
    ],
)
def test_a_body_that_is_not_json_is_refused_naming_the_body(
    client, keys, dataset_id, session_factory, body, detail
):
    # Not "0: JSON decode error": the field is the body, the number where the parse stopped.
    response = post_raw(client, keys.analyst, f"/v1/datasets/{dataset_id}/releases", body)
    assert response.status_code == 422, response.text
    assert response.json() == {"error": "invalid_input", "detail": detail}
    assert charges(session_factory) == 0


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "latin-1"])
def test_a_json_body_that_is_not_utf8_is_refused_naming_the_body(
    client, keys, dataset_id, session_factory, encoding
):
    """JSON between systems is UTF-8 (RFC 8259, 8.1). ``json.loads`` on bytes guesses UTF-16
    and UTF-32 from the first bytes, so such a body was read and charged (202), whatever its
    Content-Type said; a Latin-1 body with a non-ASCII byte was a 400 "There was an error
    parsing the body" outside the service's error format. One rule: UTF-8 only, a 422 naming
    the body (a leading byte order mark is still ignored)."""
    release = GOOD_RELEASE if encoding != "latin-1" else {**GOOD_RELEASE, "mechanism": "\u00e9"}
    body = json.dumps(release, ensure_ascii=False).encode(encoding)
    response = client.post(
        f"/v1/datasets/{dataset_id}/releases",
        headers={**bearer(keys.analyst), "content-type": "application/json"},
        content=body,
    )
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("body: not valid JSON") and "UTF-8" in detail, detail
    assert charges(session_factory) == 0


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_a_json_body_sent_as_another_media_type_is_refused_naming_it(
    client, keys, dataset_id, session_factory, content_type
):
    """FastAPI hands a body of any other media type to validation as bytes: a valid release
    request sent as text/plain was "body: Input should be a valid dictionary or object"."""
    response = client.post(
        f"/v1/datasets/{dataset_id}/releases",
        headers={**bearer(keys.analyst), "content-type": content_type},
        content=json.dumps(GOOD_RELEASE).encode(),
    )
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("body: sent as Content-Type"), detail
    assert content_type in detail and "application/json" in detail
    assert charges(session_factory) == 0
    # application/json and a structured +json suffix stay JSON, as FastAPI reads them.
    for json_type in ("application/json; charset=utf-8", "application/merge-patch+json"):
        response = client.post(
            f"/v1/datasets/{dataset_id}/releases?dry_run=true",
            headers={**bearer(keys.analyst), "content-type": json_type},
            content=json.dumps(GOOD_RELEASE).encode(),
        )
        assert response.status_code == 200, response.text


def test_a_utf8_json_body_with_a_byte_order_mark_is_read(client, keys, dataset_id):
    response = client.post(
        f"/v1/datasets/{dataset_id}/releases",
        headers={**bearer(keys.analyst), "content-type": "application/json"},
        content=b"\xef\xbb\xbf" + json.dumps(GOOD_RELEASE).encode(),
    )
    assert response.status_code == 202, response.text


def test_a_duplicated_role_creates_no_key(client, keys, session_factory):
    with session_factory() as session:
        before = session.scalar(select(func.count()).select_from(ApiKey))
    body = '{"role": "analyst", "name": "n", "role": "admin"}'
    response = post_raw(client, keys.admin, "/v1/keys", body)
    assert response.status_code == 422, response.text
    assert "'role' appears twice" in response.json()["detail"]
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(ApiKey)) == before


def test_grant_bodies_refuse_duplicate_keys_too(client, keys, dataset_id):
    body = '{"epsilon": "0.5", "delta": "1e-9", "delta": "1e-8"}'
    response = post_raw(client, keys.owner, f"/v1/datasets/{dataset_id}/grants", body)
    assert response.status_code == 422, response.text
    assert "'delta' appears twice" in response.json()["detail"]


def test_a_misspelt_field_is_answered_with_the_nearest_and_every_valid_name(
    client, keys, dataset_id
):
    path = f"/v1/datasets/{dataset_id}/releases"
    response = post_json(client, keys.analyst, path, {**GOOD_RELEASE, "epsilonn": "0.1"})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("epsilonn: unknown field (did you mean 'epsilon'?); valid fields: ")
    for name in ("mechanism", "k", "epsilon", "delta", "params"):
        assert name in detail.split("valid fields: ")[1]
    # Every request schema, whichever way it is validated: a key body, mechanism params, a form.
    response = post_json(client, keys.admin, "/v1/keys", {"role": "owner", "nmae": "n"})
    assert "nmae: unknown field (did you mean 'name'?)" in response.json()["detail"]
    body = {**GOOD_RELEASE, "params": {"clip_nrom": 1.0}}
    detail = post_json(client, keys.analyst, path, body).json()["detail"]
    assert detail.startswith("params.clip_nrom: unknown field (did you mean 'clip_norm'?)")
    body = {**GOOD_RELEASE, "mechanism": "analyse_gauss"}
    detail = post_json(client, keys.analyst, path, body).json()["detail"]
    assert detail.startswith("mechanism: unknown mechanism (did you mean 'analyze_gauss'?)")
    detail = client.get("/v1/datasets?limt=5", headers=bearer(keys.analyst)).json()["detail"]
    assert detail.startswith("query.limt: unknown parameter (did you mean 'limit'?)")


def test_a_form_field_or_query_parameter_given_twice_is_refused(client, keys, settings):
    body = [("name", "a"), ("epsilon_budget", "1"), ("epsilon_budget", "9"), ("delta_budget", "0")]
    response = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files=[("file", ("x.npy", npy_bytes(DATA), "application/octet-stream"))]
        + [(name, (None, value)) for name, value in body],
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == "epsilon_budget: given twice; send each form field once"
    assert stored_files(settings) == []
    response = client.get("/v1/datasets?limit=5&limit=1000", headers=bearer(keys.owner))
    assert response.status_code == 422
    assert response.json()["detail"] == "query.limit: given twice; send each parameter once"


def _free_text_query_parameters(client):
    """Each GET route's query parameters that take free text (a string with no format or enum)."""
    document = client.get("/openapi.json").json()
    for path, operations in document["paths"].items():
        get = operations.get("get")
        if get is None or "{" in path:
            continue
        for parameter in get.get("parameters", []):
            if parameter["in"] != "query":
                continue
            schema = parameter["schema"]
            options = schema.get("anyOf", [schema])
            if any(
                option.get("type") == "string" and "format" not in option and "enum" not in option
                for option in options
            ):
                yield path, parameter["name"]


def test_every_free_text_query_parameter_refuses_nul_and_control_characters(client, keys):
    """PostgreSQL refuses NUL in text: a NUL reaching a query was a 500 (schemathesis found one
    in `mechanism`). Every free-text query parameter answers 422 naming itself instead."""
    found = list(_free_text_query_parameters(client))
    assert ("/v1/releases", "mechanism") in found
    for path, name in found:
        for bad in ("a\x00b", "a\nb", "\x7f"):
            for key in (keys.analyst, keys.owner, keys.admin, keys.auditor):
                response = client.get(path, params={name: bad}, headers=bearer(key))
                if response.status_code != 403:
                    break
            assert response.status_code == 422, (path, name, bad, response.text)
            assert name in json.dumps(response.json()["detail"]), response.text


@pytest.mark.parametrize(
    ("content_type", "shown"),
    [
        # curl -d without -H 'content-type: application/json' (the README's walkthrough sends it)
        ("application/x-www-form-urlencoded", "application/x-www-form-urlencoded"),
        ("text/plain", "text/plain"),
        (None, "none"),
    ],
)
def test_a_json_body_sent_without_a_json_content_type_names_the_header(
    client, keys, dataset_id, session_factory, content_type, shown
):
    """A beginner's curl without the content-type header: the body is JSON but the service
    never parses it. Before, the 422 said "body: Input should be a valid dictionary or object
    to extract fields from", which names neither the header nor what to do."""
    headers = {**bearer(keys.analyst)}
    if content_type is not None:
        headers["content-type"] = content_type
    response = client.post(
        f"/v1/datasets/{dataset_id}/releases",
        headers=headers,
        content=json.dumps(GOOD_RELEASE).encode(),
    )
    assert response.status_code == 422, response.text
    # Another media type is refused as it arrives (service.api.routing._require_json); a body
    # with none reaches validation, which names the header to send.
    detail = (
        f"body: sent as Content-Type {content_type!r}; "
        "send the JSON with 'Content-Type: application/json'"
        if content_type is not None
        else "body: send a JSON object with the header 'content-type: application/json' "
        f"(this request's content type: {shown})"
    )
    assert response.json() == {"error": "invalid_input", "detail": detail}
    assert charges(session_factory) == 0


def test_a_json_array_body_is_still_pydantics_message(client, keys, dataset_id):
    """Under a JSON content type a body that is not an object keeps the plain message."""
    response = post_raw(client, keys.analyst, f"/v1/datasets/{dataset_id}/releases", "[1]")
    assert response.status_code == 422
    assert "content-type" not in response.json()["detail"]


def test_a_release_without_a_cost_says_epsilon_alone_is_enough(
    client, keys, dataset_id, session_factory
):
    """delta is optional beside epsilon (the service defaults it), but the 422 said
    "required: epsilon and delta (or mu, or rho)"."""
    body = {"mechanism": "analyze_gauss", "k": 1}
    response = post_json(client, keys.analyst, f"/v1/datasets/{dataset_id}/releases", body)
    assert response.status_code == 422
    detail = response.json()["detail"]
    # Fields quoted as JSON (the clients respell them as their options, dpss_client.spelling).
    assert detail.startswith('epsilon: required: "epsilon"')
    assert '"delta" is optional' in detail and "epsilon and delta" not in detail
    assert charges(session_factory) == 0
    # And the advice holds: epsilon alone is admitted.
    body["epsilon"] = "0.1"
    admitted = post_json(client, keys.analyst, f"/v1/datasets/{dataset_id}/releases", body)
    assert admitted.status_code == 202, admitted.text


def test_a_missing_field_says_what_it_is(client, keys, dataset_id, session_factory):
    """A new user's first slips on the default path answered pydantic's bare "Field required"
    ("mechanism: Field required", "delta_budget: Field required"): the field was named but not
    what it is or what to send. The 422 now gives the field's description. (It used `mechanism`,
    which is no longer required: absent, it is `auto`, as in every client; see
    test_an_omitted_mechanism_is_auto_as_in_the_clients. `k` is the release's required field.)"""
    body = {"epsilon": "0.1"}
    response = post_json(client, keys.analyst, f"/v1/datasets/{dataset_id}/releases", body)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail.startswith("k: required: Dimension of the released subspace"), detail
    upload = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files={"file": ("x.npy", npy_bytes(DATA), "application/octet-stream")},
        data={"name": "x", "epsilon_budget": "1", "row_norm_bound": "1"},
    )
    assert upload.status_code == 422, upload.text
    detail = upload.json()["detail"]
    assert detail.startswith("delta_budget: required: Total delta all releases may spend"), detail
    assert "Field required" not in detail and "0: pure DP" in detail
    assert charges(session_factory) == 0


def test_a_mechanism_parameter_at_the_top_level_says_it_goes_inside_params(
    client, keys, dataset_id, session_factory
):
    """The README's tables say 'pass "center": "private"'; sent at the top level of a release
    it answered "unknown field; valid fields: ..." with no word that it belongs in params."""
    body = {"mechanism": "auto", "k": 1, "epsilon": "0.1", "center": "private"}
    response = post_json(client, keys.analyst, f"/v1/datasets/{dataset_id}/releases", body)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail.startswith("center: unknown field"), detail
    assert 'go inside params: "params": {"center": "private"}' in detail, detail
    assert charges(session_factory) == 0


def test_a_misspelt_required_field_is_named_not_only_missing(
    client, keys, dataset_id, session_factory
):
    """An outside audit's slip: a required field misspelt in an upload form or in a
    mechanism's params is both missing and unknown, and the 422 gave only the first
    ("epsilon_budget: required", "params.horizon: required"), never the name that was sent
    or the nearest valid one, as a JSON body's answer does. It now names the misspelling."""
    response = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files={"file": ("x.npy", npy_bytes(DATA), "application/octet-stream")},
        data={"name": "x", "epsilon_budgt": "1", "delta_budget": "1e-6"},
    )
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("epsilon_budgt: unknown field (did you mean 'epsilon_budget'?)")
    path = f"/v1/datasets/{dataset_id}/releases"
    body = {"mechanism": "continual_gauss", "k": 1, "epsilon": "0.1", "params": {"horizn": 4}}
    response = post_json(client, keys.analyst, path, body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("params.horizn: unknown field (did you mean 'horizon'?)"), detail
    # A field that is only missing is still answered with what it is.
    body = {"mechanism": "continual_gauss", "k": 1, "epsilon": "0.1", "params": {}}
    detail = post_json(client, keys.analyst, path, body).json()["detail"]
    assert detail.startswith("params.horizon: required: Public horizon T"), detail
    assert charges(session_factory) == 0


@pytest.mark.parametrize("mechanism", ["exact_gapmax", "histogram_aggregate"])
def test_too_few_rows_for_the_budget_names_epsilon_not_a_param_that_does_not_exist(
    client, keys, dataset_id, session_factory, mechanism
):
    """An outside audit: too few rows for the request's (epsilon, delta) was refused as
    "params.n_rows: ...; raise epsilon or delta" (`--param n_rows` in the CLI), naming a
    parameter no mechanism takes. The field to change is the cost, and the 422 names it."""
    body = {"mechanism": mechanism, "k": 2, "epsilon": "0.1"}
    response = post_json(client, keys.analyst, f"/v1/datasets/{dataset_id}/releases", body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("epsilon: the dataset has 30 rows"), detail
    assert "n_rows" not in detail and "raise epsilon or delta" in detail
    assert charges(session_factory) == 0


def test_an_omitted_mechanism_is_auto_as_in_the_clients(client, keys, dataset_id, session_factory):
    """`Client.release`, `dpss releases create`, `PrivatePCA` and the README's "with the
    defaults" all send `auto` when no mechanism is named, but the API refused a body without
    `mechanism` ("mechanism: required"). Absent, it is now `auto` on the release, its dry run
    and the OpenAPI page; delta's default is unchanged; a param auto does not take is refused
    saying auto was the default and how to name the mechanism."""
    path = f"/v1/datasets/{dataset_id}/releases"
    body = {"k": 1, "epsilon": "0.1"}
    preview = post_json(client, keys.analyst, f"{path}?dry_run=true", body)
    assert preview.status_code == 200, preview.text
    assert preview.json()["mechanism"] == "auto"
    assert charges(session_factory) == 0
    created = post_json(client, keys.analyst, path, body)
    assert created.status_code == 202, created.text
    assert created.json()["mechanism"] == "auto"
    # delta's default as before: min(1e-6, delta_total / 100).
    assert created.json()["delta"] == preview.json()["delta"]
    assert charges(session_factory) == 1
    for url in (path, f"{path}?dry_run=true"):
        refused = post_json(client, keys.analyst, url, {**body, "params": {"clip_quantile": 0.3}})
        assert refused.status_code == 422, refused.text
        detail = refused.json()["detail"]
        assert detail.startswith(
            'params.clip_quantile: unknown field (no "mechanism" was given, so "auto", the '
            "default, was used"
        ), detail
        assert 'send "mechanism": "analyze_gauss" to set this one); valid fields: ' in detail
        named = {**body, "mechanism": "auto", "params": {"clip_quantile": 0.3}}
        plain = post_json(client, keys.analyst, url, named)
        assert plain.status_code == 422
        assert plain.json()["detail"].startswith("params.clip_quantile: unknown field; valid")
    assert charges(session_factory) == 1
    schema = client.get("/openapi.json").json()["components"]["schemas"]["ReleaseRequest"]
    assert "mechanism" not in schema.get("required", [])
    assert schema["properties"]["mechanism"]["default"] == "auto"
    assert "Absent: `auto`, the default" in schema["properties"]["mechanism"]["description"]
    assert "auto" in schema["properties"]["mechanism"]["enum"]
