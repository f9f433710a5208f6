"""Release history: ``GET /v1/releases`` and ``GET /v1/datasets/{id}/releases``.

Visibility (analysts their own, owners their datasets'), every filter, keyset pagination with a
total that neither skips nor repeats while releases arrive, bounded parameters, and the side
channels of single reads holding in lists too.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from service.db.models import Release, utcnow
from tests.conftest import bearer, post_release
from tests.factories import near_subspace

GAUSS = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-7"}
SPECTRUM = {"mechanism": "spectrum", "k": 2, "epsilon": "0.1", "delta": "1e-7"}
TIMING = ("started_at", "finished_at", "attempts")


@pytest.fixture
def data(rng):
    return near_subspace(rng, 60, 4, 2)[0]


def listing(client: TestClient, key: str, path: str = "/v1/releases", **params: Any) -> Any:
    response = client.get(path, headers=bearer(key), params=params)
    assert response.status_code == 200, response.text
    return response.json()


def walk(
    client: TestClient, key: str, path: str = "/v1/releases", field: str = "id", **params: Any
) -> list[Any]:
    """Every item's ``field`` of a list, page by page."""
    ids: list[Any] = []
    cursor = None
    while True:
        page = listing(client, key, path, **params, **({"cursor": cursor} if cursor else {}))
        ids += [item[field] for item in page["items"]]
        cursor = page["next"]
        if cursor is None:
            return ids


def test_analysts_list_their_own_and_owners_their_datasets(
    client, keys, make_key, upload_dataset, data
):
    other_owner, other_analyst = make_key("owner"), make_key("analyst")
    mine = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)["id"]
    theirs = upload_dataset(client, other_owner, data, row_norm_bound=1.0)["id"]
    a1 = post_release(client, keys.analyst, mine, **GAUSS)
    a2 = post_release(client, keys.analyst, theirs, **GAUSS)
    b1 = post_release(client, other_analyst, mine, **GAUSS)

    analyst = listing(client, keys.analyst)
    assert {item["id"] for item in analyst["items"]} == {a1, a2} and analyst["total"] == 2
    assert listing(client, other_analyst)["total"] == 1
    owner = listing(client, keys.owner)
    assert {item["id"] for item in owner["items"]} == {a1, b1} and owner["total"] == 2
    assert [item["id"] for item in listing(client, other_owner)["items"]] == [a2]
    assert listing(client, make_key("owner")) == {"items": [], "total": 0, "next": None}

    of_dataset = listing(client, keys.owner, f"/v1/datasets/{mine}/releases")
    assert {item["id"] for item in of_dataset["items"]} == {a1, b1}
    for key in (other_owner, keys.analyst):
        response = client.get(f"/v1/datasets/{mine}/releases", headers=bearer(key))
        assert response.status_code == 404, response.text
    missing = client.get(f"/v1/datasets/{uuid.uuid4()}/releases", headers=bearer(keys.owner))
    assert missing.status_code == 404
    for key in (keys.admin, keys.auditor):
        assert client.get("/v1/releases", headers=bearer(key)).status_code == 403


def test_each_filter(client, keys, upload_dataset, data, run_worker, session_factory):
    first = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)["id"]
    second = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)["id"]
    gauss = post_release(client, keys.analyst, first, **GAUSS)
    spectrum = post_release(client, keys.analyst, second, **SPECTRUM)
    assert run_worker() == 2
    queued = post_release(client, keys.analyst, first, **GAUSS)
    # Times a client can state apart: the releases are made within milliseconds.
    base = datetime(2030, 1, 1, tzinfo=UTC)
    with session_factory.begin() as session:
        for offset, release_id in enumerate((gauss, spectrum, queued)):
            session.execute(
                update(Release)
                .where(Release.id == uuid.UUID(release_id))
                .values(created_at=base + timedelta(hours=offset), visible_at=None)
            )

    def ids(**params: Any) -> set[str]:
        page = listing(client, keys.analyst, **params)
        assert page["total"] == len(page["items"])
        return {item["id"] for item in page["items"]}

    assert ids(dataset_id=first) == {gauss, queued}
    assert ids(dataset_id=second) == {spectrum}
    assert ids(mechanism="spectrum") == {spectrum}
    assert ids(status="queued") == {queued}
    assert ids(status="succeeded") == {gauss, spectrum}
    assert ids(status="failed") == set()
    assert ids(created_after="2030-01-01T00:30:00Z") == {spectrum, queued}
    assert ids(created_before="2030-01-01T01:00:00+00:00") == {gauss}
    assert ids(created_after="2030-01-01T00:00:00Z", created_before="2030-01-01T02:00:00Z") == {
        spectrum
    }
    assert ids(dataset_id=first, status="succeeded", mechanism="analyze_gauss") == {gauss}
    on_dataset = listing(client, keys.owner, f"/v1/datasets/{first}/releases", status="queued")
    assert [item["id"] for item in on_dataset["items"]] == [queued]


def test_pages_are_stable_while_releases_arrive(client, keys, upload_dataset, data):
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)["id"]
    made = [post_release(client, keys.analyst, dataset, **GAUSS) for _ in range(7)]
    first = listing(client, keys.analyst, limit=3)
    assert first["total"] == 7 and len(first["items"]) == 3 and first["next"]
    seen = [item["id"] for item in first["items"]]
    cursor = first["next"]
    arrived = []
    while cursor is not None:
        # A release made between two pages goes before the first page, never into a later one.
        arrived.append(post_release(client, keys.analyst, dataset, **GAUSS))
        page = listing(client, keys.analyst, limit=3, cursor=cursor)
        assert page["total"] == 7 + len(arrived)
        seen += [item["id"] for item in page["items"]]
        cursor = page["next"]
    assert sorted(seen) == sorted(made) and len(seen) == len(set(seen)) == 7
    # Newest first by (created_at, id), as the whole list read at once.
    assert (
        seen
        == [item["id"] for item in listing(client, keys.analyst, limit=200)["items"]][
            len(arrived) :
        ]
    )
    assert walk(client, keys.owner, limit=4)[: len(arrived)] == arrived[::-1]


def test_list_items_show_what_a_single_read_shows_but_the_basis(
    client, keys, upload_dataset, data, run_worker
):
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=1.0)["id"]
    release_id = post_release(client, keys.analyst, dataset, **GAUSS)
    assert run_worker() == 1
    single = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()
    assert single["status"] == "succeeded" and single["result"]["basis"]
    [item] = listing(client, keys.analyst)["items"]
    assert item["result"]["basis"] is None
    assert item["result"]["basis_sha256"] == single["result"]["basis_sha256"]
    assert {**item, "result": None} == {**single, "result": None}
    [full] = listing(client, keys.analyst, with_basis="true")["items"]
    assert full == single


def test_side_channels_hold_in_lists(padded_client, keys, upload_dataset, data, run_worker):
    dataset = upload_dataset(padded_client, keys.owner, data, row_norm_bound=1.0)["id"]
    release_id = post_release(padded_client, keys.analyst, dataset, **GAUSS)
    assert run_worker() == 1
    [item] = listing(padded_client, keys.analyst)["items"]
    assert item["id"] == release_id and item["status"] == "queued"
    assert item["result"] is None and item["reason"] is None
    assert all(item[name] is None for name in TIMING)
    # The status filter matches what the analyst is shown, so it cannot reveal the outcome.
    assert listing(padded_client, keys.analyst, status="succeeded")["total"] == 0
    assert listing(padded_client, keys.analyst, status="queued")["total"] == 1
    # The owner is shown the same (the real state would tell when the job ahead of it in the
    # queue ended: service.visibility), in the row, the filter and the count.
    [owned] = listing(padded_client, keys.owner)["items"]
    assert owned == item
    assert listing(padded_client, keys.owner, status="succeeded")["total"] == 0
    assert listing(padded_client, keys.owner, status="queued")["total"] == 1


def test_visible_releases_show_their_outcome_but_never_timing(
    padded_client, keys, upload_dataset, data, run_worker, session_factory
):
    dataset = upload_dataset(padded_client, keys.owner, data, row_norm_bound=1.0)["id"]
    release_id = post_release(padded_client, keys.analyst, dataset, **GAUSS)
    assert run_worker() == 1
    with session_factory.begin() as session:
        session.execute(
            update(Release)
            .where(Release.id == uuid.UUID(release_id))
            # The outcome's step of its schedule too (issue 30: stored with the outcome).
            .values(
                visible_at=utcnow() - timedelta(seconds=1),
                outcome_visible_at=utcnow() - timedelta(seconds=1),
            )
        )
    [item] = listing(padded_client, keys.analyst, status="succeeded")["items"]
    assert item["result"]["basis_sha256"] and all(item[name] is None for name in TIMING)


@pytest.mark.parametrize(
    ("parameter", "value"),
    [
        ("limit", "0"),
        ("limit", "201"),
        ("limit", str(2**70)),
        ("cursor", ""),
        ("cursor", "x" * 201),
        ("cursor", "not-a-cursor"),
        ("cursor", "WyJkYXRhc2V0IiwiMjAzMC0wMS0wMVQwMDowMDowMCswMDowMCIsIngiXQ"),
        ("status", "done"),
        ("mechanism", "m" * 65),
        # PostgreSQL refuses a NUL in a text parameter: it was a 500 there (200 on SQLite)
        ("mechanism", "\x00"),
        ("mechanism", "analyze\x00gauss"),
        ("mechanism", "analyze\ngauss"),
        ("dataset_id", "7"),
        ("created_after", "yesterday"),
        ("created_after", "2030-01-01T00:00:00"),
        ("created_after", "0.5"),
        ("created_before", "1700000000"),
        ("created_before", "99999-01-01T00:00:00Z"),
        # Valid ISO 8601 whose UTC time is off the calendar: the conversion overflowed (a 500)
        ("created_after", "9999-12-31T23:59:59-23:59"),
        ("created_before", "0001-01-01T00:00:00+23:59"),
    ],
)
def test_bad_query_parameters_are_422_naming_them(client, keys, parameter, value):
    response = client.get("/v1/releases", headers=bearer(keys.analyst), params={parameter: value})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_input"
    assert parameter in response.json()["detail"]


@pytest.mark.parametrize("path", ["/v1/datasets", "/v1/keys", "/v1/audit"])
def test_every_list_has_items_total_and_next_with_a_working_cursor(
    client, keys, upload_dataset, data, path
):
    for _ in range(3):
        upload_dataset(client, keys.owner, data)
    key = {"/v1/datasets": keys.owner, "/v1/keys": keys.admin, "/v1/audit": keys.auditor}[path]
    whole = listing(client, key, path, limit=1000)
    assert set(whole) >= {"items", "total", "next"} and whole["next"] is None
    assert whole["total"] == len(whole["items"]) >= 3
    field = "seq" if path == "/v1/audit" else "id"
    assert walk(client, key, path, field, limit=2) == [item[field] for item in whole["items"]]
    bad = client.get(path, headers=bearer(key), params={"cursor": "bm9wZQ"})
    assert bad.status_code == 422 and "cursor" in bad.json()["detail"]


def test_a_one_shot_releases_epochs_refuse_a_cursor_they_did_not_issue(
    client, keys, upload_dataset, data
):
    # A one-shot release answers its (always empty) epoch page before reading one, and the
    # cursor was never parsed: garbage, or the cursor of another list, was a 200.
    dataset = upload_dataset(client, keys.owner, data, row_norm_bound=10.0)["id"]
    first = post_release(client, keys.analyst, dataset, **GAUSS)
    post_release(client, keys.analyst, dataset, **GAUSS)
    releases_cursor = listing(client, keys.owner, limit=1)["next"]
    assert releases_cursor is not None
    for cursor in ("garbage", releases_cursor):
        for key in (keys.owner, keys.analyst):
            response = client.get(
                f"/v1/releases/{first}/epochs", headers=bearer(key), params={"cursor": cursor}
            )
            assert response.status_code == 422, response.text
            assert response.json()["detail"].startswith("cursor: not a cursor"), response.text
    assert listing(client, keys.owner, f"/v1/releases/{first}/epochs")["items"] == []
