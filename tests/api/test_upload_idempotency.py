"""Idempotent uploads and appends (``Idempotency-Key``): a retry after a lost answer gets the
dataset or batch the first request made, never a second dataset with a second budget on the
same people; the same key with another body is a 409 that keeps nothing."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service import auth
from service.app import create_app
from service.db.models import AuditEvent, Dataset, DatasetBatch
from tests.api.test_datasets import stored_files
from tests.conftest import bearer, npy_bytes
from tests.test_concurrency import simultaneously

FORM = {"name": "d", "epsilon_budget": "1", "delta_budget": "1e-5", "row_norm_bound": "1"}
DATA = np.random.default_rng(5).normal(size=(60, 4)) * 0.6


def upload(client, key, *, idempotency_key=None, data=DATA, form=FORM):
    headers = bearer(key) | ({"Idempotency-Key": idempotency_key} if idempotency_key else {})
    return client.post(
        "/v1/datasets",
        headers=headers,
        files={"file": ("x.npy", npy_bytes(data), "application/octet-stream")},
        data=form,
    )


def append(client, key, dataset_id, *, idempotency_key=None, data=DATA[:10]):
    headers = bearer(key) | ({"Idempotency-Key": idempotency_key} if idempotency_key else {})
    return client.post(
        f"/v1/datasets/{dataset_id}/rows",
        headers=headers,
        files={"file": ("x.npy", npy_bytes(data), "application/octet-stream")},
    )


def count(session_factory, model) -> int:
    with session_factory() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def events(session_factory, kind: str) -> int:
    with session_factory() as session:
        return int(
            session.scalar(
                select(func.count()).select_from(AuditEvent).where(AuditEvent.event_type == kind)
            )
            or 0
        )


def test_a_retried_upload_is_the_same_dataset(client, keys, settings, session_factory):
    """Fails before: the retry made a second dataset (two budgets on the same 60 rows)."""
    first = upload(client, keys.owner, idempotency_key="upload-1")
    assert first.status_code == 201, first.text
    again = upload(client, keys.owner, idempotency_key="upload-1")
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    # What only the first answer told the owner is told again (it may never have arrived).
    assert again.json() == first.json()
    assert first.json()["rows_above_bound"] > 0
    assert count(session_factory, Dataset) == 1
    assert events(session_factory, "dataset_created") == 1
    assert len([p for p in stored_files(settings) if p.suffix == ".npy"]) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"data": DATA[:-1]},
        {"data": DATA + 1e-9},
        {"form": {**FORM, "epsilon_budget": "2"}},
        {"form": {**FORM, "name": "other"}},
    ],
    ids=["fewer_rows", "other_values", "other_budget", "other_name"],
)
def test_the_same_key_with_another_body_is_a_409_that_keeps_nothing(
    client, keys, settings, session_factory, change
):
    first = upload(client, keys.owner, idempotency_key="upload-2")
    assert first.status_code == 201, first.text
    files = stored_files(settings)
    other = upload(client, keys.owner, idempotency_key="upload-2", **change)
    assert other.status_code == 409, other.text
    assert other.json()["error"] == "idempotency_conflict"
    assert count(session_factory, Dataset) == 1
    assert stored_files(settings) == files


def test_keys_are_per_owner_and_no_key_is_no_deduplication(client, keys, make_key, session_factory):
    other_owner = make_key("owner")
    a = upload(client, keys.owner, idempotency_key="shared")
    b = upload(client, other_owner, idempotency_key="shared")
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]
    # Without a key, two uploads are two datasets, as before (same name and file included).
    c, d = upload(client, keys.owner), upload(client, keys.owner)
    assert (c.status_code, d.status_code) == (201, 201)
    assert count(session_factory, Dataset) == 4


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("x" * 201, "200 characters"),
        ("dpss_" + "a" * 40, "API key"),
        ("has space", "visible ASCII"),
    ],
)
def test_an_unusable_key_is_a_422_naming_the_header_before_the_body(
    client, keys, settings, session_factory, key, problem
):
    response = upload(client, keys.owner, idempotency_key=key)
    assert response.status_code == 422, response.text
    assert "idempotency-key" in response.json()["detail"].lower()
    assert problem in response.json()["detail"]
    assert key not in response.text
    assert count(session_factory, Dataset) == 0
    assert stored_files(settings) == []


def test_a_retried_append_is_the_same_batch(client, keys, settings, session_factory):
    """Fails before: the retry appended the 10 rows a second time (counted twice)."""
    dataset = upload(client, keys.owner).json()["id"]
    first = append(client, keys.owner, dataset, idempotency_key="batch-1")
    assert first.status_code == 201, first.text
    again = append(client, keys.owner, dataset, idempotency_key="batch-1")
    assert again.status_code == 200, again.text
    assert again.json()["seq"] == first.json()["seq"] == 1
    assert again.json()["n_rows_total"] == 70
    other = append(client, keys.owner, dataset, idempotency_key="batch-1", data=DATA[:11])
    assert other.status_code == 409, other.text
    assert other.json()["error"] == "idempotency_conflict"
    assert client.get(f"/v1/datasets/{dataset}", headers=bearer(keys.owner)).json()["n_rows"] == 70
    assert count(session_factory, DatasetBatch) == 2
    assert events(session_factory, "dataset_rows_appended") == 1
    # The file holds the committed rows only: 70, not 80 or 81.
    (stored,) = [p for p in stored_files(settings) if p.suffix == ".npy"]
    assert stored.stat().st_size - 128 <= 70 * 4 * 8 < stored.stat().st_size
    # Keys are per dataset: the same key on another dataset is that dataset's batch.
    second = upload(client, keys.owner, form={**FORM, "name": "e"}).json()["id"]
    assert append(client, keys.owner, second, idempotency_key="batch-1").status_code == 201


def test_concurrent_retries_of_one_upload_make_one_dataset(committed_db, settings):
    """Six copies of one upload with one key at once (a client retrying while the first is
    still parsed): one 201, the others 200 with its id; one dataset, one file in the store."""
    _, factory = committed_db
    app = create_app(settings, session_factory=factory)
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)

    def send(client: TestClient) -> tuple[int, dict[str, Any]]:
        r = upload(client, owner, idempotency_key="raced-upload")
        return r.status_code, r.json()

    answers = simultaneously(app, 6, send)
    assert Counter(s for s, _ in answers) == Counter({201: 1, 200: 5}), answers
    assert len({a["id"] for _, a in answers}) == 1
    assert count(factory, Dataset) == 1
    assert len([p for p in stored_files(settings) if p.suffix == ".npy"]) == 1


def test_concurrent_uploads_with_one_name_and_no_key_are_separate_datasets(committed_db, settings):
    """Names are labels, not identities: four same-name uploads at once are four datasets,
    each with its own file (no mix-up of files or rows between them)."""
    _, factory = committed_db
    app = create_app(settings, session_factory=factory)
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
    rows = iter(range(4))

    def send(client: TestClient) -> tuple[int, dict[str, Any]]:
        r = upload(client, owner, data=DATA[: 20 + next(rows)])
        return r.status_code, r.json()

    answers = simultaneously(app, 4, send)
    assert [s for s, _ in answers] == [201] * 4, answers
    assert sorted(a["n_rows"] for _, a in answers) == [20, 21, 22, 23]
    with factory() as session:
        files = session.scalars(select(Dataset.file_name)).all()
    assert len(set(files)) == 4


def test_the_client_resends_a_lost_upload_with_the_same_key(client, keys, session_factory):
    """The Python client's upload and append carry a key and, when the answer is lost after
    the body went out, resend with it: one dataset and one batch, not two of each."""
    from dpss_client import Client

    sent: list[str | None] = []
    lost = {"/v1/datasets": True, "/rows": True}

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get("idempotency-key"))
        answer = client.request(
            request.method, request.url.path, headers=dict(request.headers), content=request.read()
        )
        for suffix, first in lost.items():
            if request.url.path.endswith(suffix) and first:
                lost[suffix] = False
                raise httpx.ReadError("connection reset by peer", request=request)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    http = httpx.Client(transport=httpx.MockTransport(handler))
    dpss = Client("http://testserver", keys.owner, http=http)
    dataset = dpss.upload(DATA, name="c", epsilon_budget=1, delta_budget="1e-5")
    batch = dpss.append_rows(dataset.id, DATA[:10])
    assert len(sent) == 4 and sent[0] == sent[1] and sent[2] == sent[3] and sent[0] != sent[2]
    assert all(sent)
    assert count(session_factory, Dataset) == 1
    assert batch.seq == 1 and batch.n_rows_total == 70
    assert count(session_factory, DatasetBatch) == 2


def test_a_retry_that_reaches_the_insert_is_answered_from_the_unique_index(
    client, keys, settings, session_factory, monkeypatch
):
    """The window between the lookup and the insert (a concurrent retry committing there),
    forced: both lookups of the retry miss, the unique index refuses its row, and the answer
    is still the first dataset (200), with the retry's file purged."""
    from service import upload_idempotency

    first = upload(client, keys.owner, idempotency_key="window")
    assert first.status_code == 201, first.text
    real = upload_idempotency.find_dataset
    misses = iter([True, True])

    def missing_twice(*args: Any) -> Any:
        return None if next(misses, False) else real(*args)

    monkeypatch.setattr(upload_idempotency, "find_dataset", missing_twice)
    again = upload(client, keys.owner, idempotency_key="window")
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert count(session_factory, Dataset) == 1
    assert events(session_factory, "dataset_created") == 1
    assert len([p for p in stored_files(settings) if p.suffix == ".npy"]) == 1


def test_a_retry_after_the_dataset_was_deleted_makes_no_new_budget(
    client, keys, settings, session_factory
):
    """The key stays the deleted dataset's: a retry answers 200 with it (deleted, its rows
    gone, nothing about them told again) and stores nothing, rather than a fresh dataset."""
    first = upload(client, keys.owner, idempotency_key="gone")
    assert first.status_code == 201, first.text
    deleted = client.delete(f"/v1/datasets/{first.json()['id']}", headers=bearer(keys.owner))
    assert deleted.status_code == 204
    again = upload(client, keys.owner, idempotency_key="gone")
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["rows_above_bound"] is None
    assert count(session_factory, Dataset) == 1
    assert stored_files(settings) == []


def test_a_retried_upload_reads_its_rows_holding_no_connection(
    committed_db: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry's answer repeats what only the first told about the rows (a pass over all of
    them). Fails before: it read them inside its unit of work, holding a pooled connection (and
    on SQLite the database's write lock) for as long as the pass took."""
    from service.api import datasets as datasets_api

    _, factory = committed_db
    engine = factory.kw["bind"]
    app = create_app(settings, session_factory=factory)
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
    held: list[int] = []
    count_rows_above = datasets_api.count_rows_above

    def counting(rows: Any, bound: Any) -> int:
        held.append(engine.pool.checkedout())
        return count_rows_above(rows, bound)

    with TestClient(app) as client:
        first = upload(client, owner, idempotency_key="held-upload")
        assert first.status_code == 201, first.text
        monkeypatch.setattr(datasets_api, "count_rows_above", counting)
        again = upload(client, owner, idempotency_key="held-upload")
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert held == [0]
