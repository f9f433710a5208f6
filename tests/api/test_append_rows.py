"""Appending batches: the rows land after the committed ones, all or nothing, and one-shot
releases read the prefix present when they were requested."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import func, select

from service.db.models import AuditEvent, DatasetBatch
from tests.api.test_datasets import stored_files
from tests.conftest import bearer, npy_bytes, post_release


def append(client, key, dataset_id, content, filename="rows.npy", **form):
    return client.post(
        f"/v1/datasets/{dataset_id}/rows",
        headers=bearer(key),
        files={"file": (filename, content, "application/octet-stream")},
        data=form,
    )


@pytest.fixture
def grown(client, keys, upload_dataset, rng):
    first = rng.normal(size=(5, 3))
    dataset = upload_dataset(client, keys.owner, first, row_norm_bound=10)
    return dataset, first


def test_append_adds_a_batch_after_the_committed_rows(client, keys, grown, rng, store, settings):
    dataset, first = grown
    second = rng.normal(size=(4, 3))
    response = append(client, keys.owner, dataset["id"], npy_bytes(second))
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["seq"], body["n_rows"], body["n_rows_total"], body["n_batches"]) == (1, 4, 9, 2)
    third = append(client, keys.owner, dataset["id"], b"1,2,3\n4,5,6\n", filename="b.csv")
    assert third.status_code == 201 and third.json()["seq"] == 2
    meta = client.get(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner)).json()
    assert (meta["n_rows"], meta["n_batches"]) == (11, 3)
    files = stored_files(settings)
    assert len(files) == 1  # one data file per dataset; the batch files are gone
    rows = store.open(files[0].name, 11)
    np.testing.assert_array_equal(rows, np.vstack([first, second, [[1, 2, 3], [4, 5, 6]]]))
    np.testing.assert_array_equal(store.open(files[0].name, 5), first)


@pytest.mark.parametrize(
    ("content", "filename", "field"),
    [
        (npy_bytes(np.ones((4, 2))), "x.npy", "file"),  # wrong width
        (b"1,2,3\n4,nan,6\n", "x.csv", "file"),
        (npy_bytes(np.ones((1, 3))), "x.npy", "file"),  # fewer than 2 rows
        (b"1,2,3\n", "x.txt", "file"),
    ],
)
def test_a_bad_batch_is_refused_naming_the_field_and_nothing_is_kept(
    client, keys, grown, settings, session_factory, content, filename, field
):
    dataset, _ = grown
    before = [(p.name, p.stat().st_size) for p in stored_files(settings)]
    response = append(client, keys.owner, dataset["id"], content, filename=filename)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(f"{field}:")
    assert [(p.name, p.stat().st_size) for p in stored_files(settings)] == before
    meta = client.get(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner)).json()
    assert (meta["n_rows"], meta["n_batches"]) == (5, 1)
    with session_factory() as session:
        assert session.execute(select(func.count()).select_from(DatasetBatch)).scalar_one() == 1
        appended = select(func.count()).where(AuditEvent.event_type == "dataset_rows_appended")
        assert session.execute(appended).scalar_one() == 0


def test_only_the_owner_appends(client, keys, grown, make_key, rng):
    dataset, _ = grown
    content = npy_bytes(rng.normal(size=(3, 3)))
    assert append(client, keys.analyst, dataset["id"], content).status_code == 403
    assert append(client, make_key("owner"), dataset["id"], content).status_code == 404
    client.delete(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner))
    assert append(client, keys.owner, dataset["id"], content).status_code in (404, 409)


def test_an_unknown_form_field_is_refused(client, keys, grown, rng):
    dataset, _ = grown
    response = append(client, keys.owner, dataset["id"], npy_bytes(rng.normal(size=(3, 3))), x="1")
    assert response.status_code == 422 and response.json()["detail"].startswith("x:")


def test_a_one_shot_release_reads_the_prefix_present_at_its_request(
    client, keys, grown, rng, worker, monkeypatch
):
    dataset, _ = grown
    release_id = post_release(
        client, keys.analyst, dataset["id"], mechanism="analyze_gauss", k=1,
        epsilon="0.5", delta="1e-6",
    )  # fmt: skip
    assert append(client, keys.owner, dataset["id"], npy_bytes(rng.normal(size=(7, 3)))).is_success
    seen: list[tuple[int, ...]] = []
    original = worker.store.open

    def spy(file_name, n_rows=None):
        data = original(file_name, n_rows)
        seen.append(data.shape)
        return data

    monkeypatch.setattr(worker.store, "open", spy)
    assert worker.run_pending() == 1
    assert seen == [(5, 3)]
    release = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()
    assert release["status"] == "succeeded"
    assert (release["n_rows_read"], release["batches_read"]) == (5, 1)


def test_an_append_whose_transaction_fails_leaves_no_row_on_disk(
    client, keys, grown, rng, settings, monkeypatch
):
    """The rows are written before the commit; when the transaction then fails, they are cut
    off again (under the lock) and no batch exists."""
    from service import datasets
    from service.store import DatasetStore

    dataset, first = grown
    before = [(p.name, p.stat().st_size) for p in stored_files(settings)]
    record = datasets.audit.record

    def failing(session, event_type, **kwargs):
        if event_type == "dataset_rows_appended":
            raise RuntimeError("the database went away")
        return record(session, event_type, **kwargs)

    monkeypatch.setattr(datasets.audit, "record", failing)
    response = append(client, keys.owner, dataset["id"], npy_bytes(rng.normal(size=(6, 3))))
    assert response.status_code == 500
    assert [(p.name, p.stat().st_size) for p in stored_files(settings)] == before
    monkeypatch.undo()
    meta = client.get(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner)).json()
    assert (meta["n_rows"], meta["n_batches"]) == (5, 1)
    later = rng.normal(size=(2, 3))
    assert append(client, keys.owner, dataset["id"], npy_bytes(later)).status_code == 201
    rows = DatasetStore(settings.datasets_dir).open(stored_files(settings)[0].name, 7)
    np.testing.assert_array_equal(rows, np.vstack([first, later]))


def test_an_append_after_a_release_adds_rows_never_budget(client, keys, grown, rng, worker):
    """One budget covers every batch: an append after a charged release leaves the totals,
    the spend and the remainder as they were, and the next release is charged from that same
    remainder (a batch is not a fresh dataset with a fresh budget on the same people)."""
    dataset, _ = grown
    path = f"/v1/datasets/{dataset['id']}/budget"
    post_release(
        client, keys.analyst, dataset["id"], mechanism="analyze_gauss", k=1,
        epsilon="0.5", delta="1e-6",
    )  # fmt: skip
    assert worker.run_pending() == 1
    before = client.get(path, headers=bearer(keys.owner)).json()
    assert append(client, keys.owner, dataset["id"], npy_bytes(rng.normal(size=(7, 3)))).is_success
    after = client.get(path, headers=bearer(keys.owner)).json()
    assert after == before
    post_release(
        client, keys.analyst, dataset["id"], mechanism="analyze_gauss", k=1,
        epsilon="0.5", delta="1e-6",
    )  # fmt: skip
    spent = client.get(path, headers=bearer(keys.owner)).json()
    assert float(spent["epsilon_spent"]) == float(before["epsilon_spent"]) + 0.5
    assert spent["epsilon_total"] == before["epsilon_total"]
