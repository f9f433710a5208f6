"""HTTP semantics every route shares: HEAD, path ids in one spelling, a long poll's `wait`.

- HEAD on any GET route answers as GET without a body (RFC 9110, 9.3.2); it was 405.
- A path id has one spelling, ``str(uuid)``: uppercase, ``{...}``, ``urn:uuid:`` and 32 bare
  digits were served as the same resource, and so was ``<id>%2Fbudget`` as ``<id>/budget``.
- ``wait`` outside 0..30 (nan, inf, negative, huge, text) is one 422 naming ``wait`` and its
  range; ``nan`` and ``inf`` were told "less than or equal to 30".
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.conftest import bearer, post_release

GAUSS = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-7"}


def _world(client: TestClient, keys: Any, upload_dataset: Any) -> dict[str, str]:
    data = np.random.default_rng(3).normal(size=(40, 4))
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=10.0)["id"]
    release = post_release(client, keys.analyst, dataset, **GAUSS)
    return {"dataset_id": dataset, "release_id": release}


def _get_paths(client: TestClient, ids: dict[str, str]) -> list[str]:
    """Every GET route of the API, its path parameters filled with real ids where there are
    (a random id elsewhere: then both methods answer 404)."""
    paths = []
    for template, operations in client.app.openapi()["paths"].items():
        if "get" not in operations:
            continue
        paths.append(
            re.sub(
                r"\{([a-z_]+)\}",
                lambda m: ids.get(
                    m.group(1), "datasets" if m.group(1) == "view" else str(uuid.uuid4())
                ),
                template,
            )
        )
    return paths


def test_head_answers_every_get_route_as_get_without_a_body(client, keys, upload_dataset):
    ids = _world(client, keys, upload_dataset)
    paths = _get_paths(client, ids)
    assert len(paths) > 15
    for key in (keys.owner, keys.analyst, keys.admin):
        for path in paths:
            got = client.get(path, headers=bearer(key))
            head = client.head(path, headers=bearer(key))
            assert head.status_code == got.status_code, (path, head.status_code, got.text)
            assert head.content == b"", path
            assert head.headers.get("content-type") == got.headers.get("content-type"), path
            assert head.headers.get("cache-control") == got.headers.get("cache-control"), path
    # Byte for byte the same head where the body is stable.
    for path in ("/healthz", f"/v1/datasets/{ids['dataset_id']}", "/v1/mechanisms"):
        got = client.get(path, headers=bearer(keys.owner))
        head = client.head(path, headers=bearer(keys.owner))
        assert head.status_code == 200
        assert int(head.headers["content-length"]) == len(got.content) > 0
    # Anonymous: the same 401, without its body.
    assert client.head("/v1/datasets").status_code == 401


def test_head_on_a_route_without_get_is_405_naming_the_methods(client, keys):
    head = client.head("/v1/keys", headers=bearer(keys.admin))
    got = client.get("/v1/keys", headers=bearer(keys.admin))
    assert head.status_code == got.status_code
    answer = client.head(f"/v1/keys/{uuid.uuid4()}", headers=bearer(keys.admin))
    assert answer.status_code == 405 and answer.content == b""
    assert "HEAD" not in answer.headers["allow"] and "DELETE" in answer.headers["allow"]
    # Where GET is served, Allow says HEAD is too.
    wrong = client.put("/v1/datasets", headers=bearer(keys.owner))
    assert wrong.status_code == 405
    assert {"GET", "HEAD", "POST"} <= set(wrong.headers["allow"].split(", "))


def _spellings(canonical: str) -> list[str]:
    # A random id whose first eight hex digits are all decimal (about 1 in 43) upper-cased to
    # itself there, and a CI run read 200 for that "spelling": the mixed case is its first
    # letter's, which a uuid4 lacks once in 1.3 million (its 30 random digits and its variant
    # digit all decimal), so the case is tested in every run but those; a spelling equal to
    # the canonical one is left out.
    letter = next((i for i, c in enumerate(canonical) if c.isalpha()), 0)
    spellings = [
        canonical.upper(),
        "{" + canonical + "}",
        "urn:uuid:" + canonical,
        canonical.replace("-", ""),
        canonical[:letter] + canonical[letter].upper() + canonical[letter + 1 :],
    ]
    return [spelled for spelled in spellings if spelled != canonical]


def test_a_path_id_has_one_spelling(client, keys, upload_dataset):
    ids = _world(client, keys, upload_dataset)
    dataset, release = ids["dataset_id"], ids["release_id"]
    assert client.get(f"/v1/datasets/{dataset}", headers=bearer(keys.owner)).status_code == 200
    for spelled in _spellings(dataset):
        for path, key in (
            (f"/v1/datasets/{spelled}", keys.owner),
            (f"/v1/datasets/{spelled}/budget", keys.analyst),
            (f"/v1/datasets/{spelled}/releases", keys.owner),
            (f"/v1/releases?dataset_id={spelled}", keys.analyst),
        ):
            answer = client.get(path, headers=bearer(key))
            assert answer.status_code == 422, (path, answer.text)
            assert "dataset_id" in answer.json()["detail"], answer.text
            assert "canonical" in answer.json()["detail"], answer.text
    for spelled in _spellings(release):
        answer = client.get(f"/v1/releases/{spelled}", headers=bearer(keys.analyst))
        assert answer.status_code == 422 and "release_id" in answer.json()["detail"]
    # Writes too: no spend through a second spelling of the dataset.
    answer = client.post(
        f"/v1/datasets/{dataset.upper()}/releases", headers=bearer(keys.analyst), json=GAUSS
    )
    assert answer.status_code == 422, answer.text


def test_an_encoded_slash_names_no_resource(client, keys, upload_dataset):
    dataset = _world(client, keys, upload_dataset)["dataset_id"]
    for path in (
        f"/v1/datasets/{dataset}%2Fbudget",
        f"/v1/datasets/{dataset}%2fbudget",
        f"/v1/datasets%2F{dataset}",
    ):
        answer = client.get(path, headers=bearer(keys.owner))
        assert answer.status_code == 404, (path, answer.text)
        assert answer.json()["error"] == "not_found"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert client.head(path, headers=bearer(keys.owner)).content == b""
    assert client.get(f"/v1/datasets/{dataset}/budget", headers=bearer(keys.owner)).is_success


@pytest.mark.parametrize(
    "wait",
    ["nan", "NaN", "inf", "-inf", "Infinity", "-1", "-0.5", "30.0001", "1e308", "1e400", "soon"],
)
def test_a_wait_outside_its_range_is_one_422_naming_wait_and_the_range(
    client, keys, upload_dataset, wait
):
    ids = _world(client, keys, upload_dataset)
    release, dataset = ids["release_id"], ids["dataset_id"]
    for method, path in (
        ("GET", f"/v1/releases/{release}"),
        ("GET", f"/v1/releases/{release}/epochs"),
        ("POST", f"/v1/datasets/{dataset}/releases"),
    ):
        answer = client.request(
            method,
            path,
            headers=bearer(keys.analyst),
            params={"wait": wait},
            json=GAUSS if method == "POST" else None,
        )
        assert answer.status_code == 422, (path, answer.text)
        detail = answer.json()["detail"]
        assert detail.startswith("query.wait: a number of seconds from 0 to 30"), detail
    assert client.get(
        f"/v1/releases/{release}", headers=bearer(keys.analyst), params={"wait": "0"}
    ).is_success
