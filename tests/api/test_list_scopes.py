"""A list's cursor pages that list only: same route, same parent resource, same filters.

A cursor names a position by sort key. Given to another list (another dataset's releases or
ledger, another release's epochs, other filters) it named a position there too, and the page
came back 200 and silently wrong: rows skipped that the client never saw. Now it is a 422 naming
``cursor``; in its own list it still walks every row once.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from service import continual
from service.pagination import seq_cursor
from tests.conftest import bearer, post_release

GAUSS = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-7"}
SPECTRUM = {"mechanism": "spectrum", "k": 2, "epsilon": "0.1", "delta": "1e-7"}
OTHER_LIST = "cursor: not a cursor of this list"


def _page(client: TestClient, key: str, path: str, **params: Any) -> Any:
    answer = client.get(path, headers=bearer(key), params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _refused(client: TestClient, key: str, path: str, **params: Any) -> None:
    answer = client.get(path, headers=bearer(key), params=params)
    assert answer.status_code == 422, (path, params, answer.text)
    assert answer.json()["detail"].startswith(OTHER_LIST), answer.text


def _datasets(client: TestClient, keys: Any, upload_dataset: Any) -> tuple[str, str]:
    data = np.random.default_rng(5).normal(size=(60, 4))
    first = upload_dataset(client, keys.owner, data, row_norm_bound=10.0)["id"]
    second = upload_dataset(client, keys.owner, data, row_norm_bound=10.0)["id"]
    for dataset in (first, second):
        for body in (GAUSS, SPECTRUM, GAUSS):
            post_release(client, keys.analyst, dataset, **body)
    return first, second


def test_a_cursor_is_refused_on_another_datasets_releases_and_ledger(client, keys, upload_dataset):
    first, second = _datasets(client, keys, upload_dataset)
    for tail in ("releases", "ledger"):
        mine, theirs = f"/v1/datasets/{first}/{tail}", f"/v1/datasets/{second}/{tail}"
        cursor = _page(client, keys.owner, mine, limit=1)["next"]
        assert cursor is not None
        _refused(client, keys.owner, theirs, cursor=cursor)
        # In its own list it still pages every row once.
        seen, following = [], None
        while True:
            page = _page(
                client, keys.owner, mine, limit=1, **({"cursor": following} if following else {})
            )
            seen += page["items"]
            following = page["next"]
            if following is None:
                break
        assert seen == _page(client, keys.owner, mine, limit=100)["items"]
    # Nor on the other list of the same releases (another route).
    cursor = _page(client, keys.owner, f"/v1/datasets/{first}/releases", limit=1)["next"]
    _refused(client, keys.owner, "/v1/releases", cursor=cursor, dataset_id=first)


def test_a_cursor_is_refused_under_other_filters(client, keys, upload_dataset):
    first, second = _datasets(client, keys, upload_dataset)
    filters = {"mechanism": "analyze_gauss", "dataset_id": first}
    cursor = _page(client, keys.analyst, "/v1/releases", limit=1, **filters)["next"]
    assert cursor is not None
    assert _page(client, keys.analyst, "/v1/releases", limit=1, cursor=cursor, **filters)
    for other in (
        {},
        {"mechanism": "spectrum", "dataset_id": first},
        {"mechanism": "analyze_gauss", "dataset_id": second},
        {"mechanism": "analyze_gauss"},
        {**filters, "status": "queued"},
        {**filters, "created_after": "2000-01-01T00:00:00Z"},
        {**filters, "created_before": "2999-01-01T00:00:00Z"},
    ):
        _refused(client, keys.analyst, "/v1/releases", limit=1, cursor=cursor, **other)
    # Each list's cursor on every other list.
    cursors = {
        "/v1/releases": _page(client, keys.owner, "/v1/releases", limit=1)["next"],
        "/v1/datasets": _page(client, keys.owner, "/v1/datasets", limit=1)["next"],
        "/v1/audit": _page(client, keys.auditor, "/v1/audit", limit=1)["next"],
    }
    lists = {"/v1/releases": keys.owner, "/v1/datasets": keys.owner, "/v1/audit": keys.auditor}
    for origin, cursor in cursors.items():
        assert cursor is not None
        for path, key in lists.items():
            if path != origin:
                _refused(client, key, path, cursor=cursor)


def test_an_epoch_cursor_is_refused_on_another_releases_epochs(client, keys, upload_dataset):
    first, _ = _datasets(client, keys, upload_dataset)
    body = {**GAUSS, "mechanism": "continual_gauss", "epsilon": "0.5", "delta": "1e-6",
            "params": {"horizon": 3}}  # fmt: skip
    releases = [post_release(client, keys.analyst, first, **body) for _ in range(2)]
    # The cursor the service issues after epoch 1 of the first release.
    issued = seq_cursor(continual.EPOCH_CURSOR, continual.epoch_scope(uuid.UUID(releases[0])), 1)
    own = client.get(
        f"/v1/releases/{releases[0]}/epochs",
        headers=bearer(keys.analyst),
        params={"cursor": issued},
    )
    assert own.status_code == 200, own.text
    _refused(client, keys.analyst, f"/v1/releases/{releases[1]}/epochs", cursor=issued)
