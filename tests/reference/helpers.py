"""Registering a dataset by reference in tests as an owner does: the POST (202, or a 4xx for
what needs no read), then a worker runs the registration, then the owner reads the dataset."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fastapi.testclient import TestClient

from service.config import Settings
from service.reference import objects
from service.worker import Worker
from tests.conftest import Keys, bearer, fetch_release, post_release

BUDGET = {"name": "lake", "epsilon_budget": "5", "delta_budget": "1e-4"}
#: A budget for continual releases over a lake (a large delta, so that the tree's epochs fit).
CONTINUAL_BUDGET = {
    "name": "lake",
    "epsilon_budget": "100",
    "delta_budget": "0.5",
    "row_norm_bound": 1.0,
    "allow_large_delta": True,
}
#: A dataset by reference with room for many releases (delta 0.01), and the release the
#: integrity, registration, mutation and audit tests make on it.
FILE_BUDGET = {
    "name": "lake",
    "epsilon_budget": "10",
    "delta_budget": "0.01",
    "row_norm_bound": 1.0,
}
FILE_RELEASE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "1", "delta": "1e-5"}
#: The release key continual tests fix, so that two releases draw the same noise.
RELEASE_KEY = bytes(range(32))


def lake_settings(settings: Settings, s3_endpoint: str, bucket: str) -> Settings:
    """``settings`` with the bucket's ``lake/`` as the one reference root, on moto's S3."""
    return settings.model_copy(
        update={"reference_roots": f"s3://{bucket}/lake", "s3_endpoint_url": s3_endpoint}
    )


def run_registrations(client: TestClient) -> int:
    """Run every registration waiting, with a worker on the app's database, store and
    settings; how many ran."""
    state = client.app.state  # type: ignore[attr-defined]
    worker = Worker(state.session_factory, state.store, state.settings)
    count = 0
    while worker.run_registration():
        count += 1
    return count


def register(
    client: TestClient, key: str, uri: str, columns: list[str], budget: dict[str, Any] | None = None
) -> httpx.Response:
    """The POST's answer when it refused; else, after a worker ran the registration, the
    owner's ``GET /v1/datasets/{id}`` (``registration_status`` ready or failed)."""
    posted = client.post(
        "/v1/dataset-references",
        headers=bearer(key),
        json={**(BUDGET if budget is None else budget), "uri": uri, "columns": columns},
    )
    if posted.status_code != 202:
        return posted
    assert posted.json()["registration_status"] == "registering", posted.text
    run_registrations(client)
    return client.get(f"/v1/datasets/{posted.json()['id']}", headers=bearer(key))


def registered(client: TestClient, key: str, uri: str, columns: list[str]) -> Any:
    """The dataset, registered ``ready``."""
    response = register(client, key, uri, columns)
    assert response.status_code == 200, response.text
    assert response.json()["registration_status"] == "ready", response.text
    return response.json()


def refusal(response: httpx.Response) -> str:
    """Why a registration was refused: the 4xx's detail, or the failed registration's reason."""
    if response.status_code >= 400:
        return str(response.json()["detail"])
    body = response.json()
    assert body["registration_status"] == "failed", response.text
    assert body["n_rows"] == 0, response.text
    return str(body["registration_reason"])


def release(
    client: TestClient, keys: Keys, dataset: str, worker: Worker, read_as: str = "analyst"
) -> Any:
    """One :data:`FILE_RELEASE` by the analyst, run by ``worker`` (the only job pending), read
    back by ``read_as`` (``"analyst"`` or ``"owner"``)."""
    release_id = post_release(client, keys.analyst, dataset, **FILE_RELEASE)
    assert worker.run_pending() == 1
    return fetch_release(client, getattr(keys, read_as), release_id)


def seeded_parquet(folder: Path, seed: int, n_rows: int, n_cols: int) -> list[str]:
    """``folder`` made, holding ``a.parquet``: ``n_rows`` normal rows of the seed, divided by 4
    (inside the unit ball), as columns ``c0..``; their names."""
    folder.mkdir(parents=True)
    rows = np.random.default_rng(seed).normal(size=(n_rows, n_cols)) / 4
    names = [f"c{i}" for i in range(n_cols)]
    pq.write_table(pa.table({n: rows[:, i] for i, n in enumerate(names)}), folder / "a.parquet")
    return names


def post_data(
    client: TestClient,
    key: str,
    kind: str,
    folder: Path,
    names: list[str],
    dataset_id: str | None,
) -> httpx.Response:
    """``folder`` posted by reference: with ``kind`` "registration" as a new dataset of the
    columns ``names``, otherwise as a batch appended to ``dataset_id``; the answer."""
    if kind == "registration":
        return client.post(
            "/v1/dataset-references",
            headers=bearer(key),
            json={**FILE_BUDGET, "uri": str(folder), "columns": names},
        )
    return client.post(
        f"/v1/dataset-references/{dataset_id}/batches",
        headers=bearer(key),
        json={"uri": str(folder)},
    )


def past_the_slack(path: Path) -> None:
    """Return once a release requested now counts ``path``'s last change as made before its
    request (its change time more than the slack before now, ``objects.STAMP_SLACK_NS``): a
    test of a change made *before* a request."""
    slack = objects.STAMP_SLACK_NS[objects.CTIME_NS]
    while time.time_ns() <= os.lstat(path).st_ctime_ns + slack:
        time.sleep(slack / 1e9)
