"""Issue 34, appends per person: a batch of a person-level dataset names its identifier column,
a person who reappears keeps their unit index (keyed digests, service.unit_keys), new people
follow, and every release after the append bounds each person over all batches. The
identifiers are never stored, shown or logged; mismatched units are refused with 422 naming
privacy_unit_column before anything is kept."""

from __future__ import annotations

import dataclasses
import logging
import uuid

import numpy as np
import pytest

from service import privacy_unit
from service.db.models import ReleaseState
from service.mechanisms.continual_gauss import ContinualState
from tests.api.test_append_rows import append
from tests.api.test_datasets import stored_files
from tests.api.test_privacy_unit_http import MARK, csv_bytes, people, upload
from tests.conftest import bearer, post_release

pytestmark = pytest.mark.release_seed(3401)


@pytest.fixture
def person_dataset(client, keys):
    ids, rows = people(60, [1, 3, 20], 6, seed=1)
    response = upload(
        client,
        keys.owner,
        "visits.csv",
        csv_bytes(ids, rows, id_at=2),
        privacy_unit_column="patient",
        row_norm_bound="1",
    )
    assert response.status_code == 201, response.text
    return response.json(), ids, rows


def dataset_file(settings):
    return next(f for f in stored_files(settings) if f.parent == settings.datasets_dir)


def test_a_returning_person_keeps_their_unit_and_new_people_follow(
    client, keys, person_dataset, settings, store, run_worker, monkeypatch, caplog
):
    body, ids, _ = person_dataset
    returning = ids[0]
    batch_ids = [returning] * 5 + [f"{MARK}-new-a"] * 3 + [f"{MARK}-new-b"] * 2
    batch = np.random.default_rng(2).normal(size=(10, 6)) * 0.1
    with caplog.at_level(logging.DEBUG):
        response = append(
            client,
            keys.owner,
            body["id"],
            csv_bytes(batch_ids, batch, id_at=0),
            filename="more.csv",
            privacy_unit_column="patient",
        )
    assert response.status_code == 201, response.text
    shown = client.get(f"/v1/datasets/{body['id']}", headers=bearer(keys.analyst)).json()
    assert shown["n_units"] == 62 and shown["n_rows"] == len(ids) + 10
    matrix = dataset_file(settings)
    units = store.open_units(matrix.name, len(ids) + 10)
    old, new = units[: len(ids)], units[len(ids) :]
    person = old[ids.index(returning)]
    assert np.all(new[:5] == person)
    assert set(new[5:8].tolist()) == {60} and set(new[8:].tolist()) == {61}
    np.testing.assert_allclose(store.open(matrix.name, len(ids) + 10)[len(ids) :], batch)
    for path in settings.datasets_dir.rglob("*"):
        if path.is_file():
            assert MARK.encode() not in path.read_bytes()
    # A release after the append bounds the returning person over both batches as one.
    real = privacy_unit.bound_contributions
    seen: dict[str, np.ndarray] = {}

    def spy(data, units_, clip_norm, rule, **kwargs):
        seen["units"] = np.array(units_)
        return real(data, units_, clip_norm, rule, **kwargs)

    monkeypatch.setattr(privacy_unit, "bound_contributions", spy)
    with caplog.at_level(logging.DEBUG):
        release_id = post_release(
            client, keys.analyst, body["id"], mechanism="spectrum", k=2, epsilon="1", delta="1e-7"
        )
        assert run_worker() == 1
    result = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst))
    assert result.json()["status"] == "succeeded", result.text
    assert int(np.count_nonzero(seen["units"] == person)) == ids.count(returning) + 5
    for text in (response.text, result.text, caplog.text):
        assert MARK not in text and "patient" not in text


@pytest.mark.parametrize(
    ("person_level", "form", "says"),
    [
        (True, {}, "name the batch's identifier column"),
        (False, {"privacy_unit_column": "patient"}, "privacy unit is the row"),
    ],
)
def test_a_batch_whose_unit_does_not_match_its_dataset_is_refused(
    client, keys, person_dataset, upload_dataset, settings, person_level, form, says
):
    if person_level:
        dataset_id = person_dataset[0]["id"]
    else:
        dataset_id = upload_dataset(client, keys.owner, np.eye(6) * 0.5, row_norm_bound=1.0)["id"]
    before = stored_files(settings)
    content = csv_bytes([f"{MARK}-x", f"{MARK}-y"], np.eye(2, 6) * 0.1, id_at=0)
    response = append(client, keys.owner, dataset_id, content, filename="b.csv", **form)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("privacy_unit_column: ") and says in detail, detail
    assert MARK not in response.text
    assert stored_files(settings) == before


def test_a_dataset_without_its_secret_refuses_appends_clearly(
    client, keys, person_dataset, settings, store
):
    body, _, _ = person_dataset
    store.secret_path(dataset_file(settings).name).unlink()
    content = csv_bytes([f"{MARK}-x", f"{MARK}-y"], np.eye(2, 6) * 0.1, id_at=0)
    response = append(
        client, keys.owner, body["id"], content, filename="b.csv", privacy_unit_column="patient"
    )
    assert response.status_code == 422, response.text
    assert "uploaded before appends per person existed" in response.json()["detail"]


def test_a_continual_release_bounds_each_person_once_over_all_batches(
    client, keys, person_dataset, settings, run_worker, monkeypatch, caplog
):
    """The carried item: a person seen in epoch 1 whose rows return in batch 2 used to be
    dropped there; now their rows count within what epoch 1 left of their bound (the usage
    kept in the release's private state across the two worker runs)."""
    body, ids, rows = person_dataset
    real = privacy_unit.continual_batch_rows
    kept: list[tuple[np.ndarray, np.ndarray]] = []

    def spy(rows_, units, row_offset, clip_norm, used):
        out = real(rows_, units, row_offset, clip_norm, used)
        kept.append(out)
        return out

    monkeypatch.setattr(privacy_unit, "continual_batch_rows", spy)
    request = {
        "mechanism": "continual_gauss",
        "k": 2,
        "epsilon": "1",
        "delta": "1e-7",
        "params": {"horizon": 2},
    }
    preview = client.post(
        f"/v1/datasets/{body['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=request,
    )
    assert preview.status_code == 200, preview.text
    assert "one bound over all batches" in " ".join(preview.json()["meaning"])
    returning = next(i for i in ids if ids.count(i) == 1)
    first_size = float(np.sum(rows[ids.index(returning)] ** 2))  # one row of norm < C = 1
    assert 0 < first_size < 0.5
    with caplog.at_level(logging.DEBUG):
        release_id = post_release(client, keys.analyst, body["id"], **request)
        assert run_worker() == 1
        batch_ids = [returning] * 4 + [f"{MARK}-new"] * 3
        batch = np.full((7, 6), 0.2)
        response = append(
            client,
            keys.owner,
            body["id"],
            csv_bytes(batch_ids, batch, id_at=0),
            filename="more.csv",
            privacy_unit_column="patient",
        )
        assert response.status_code == 201, response.text
        assert run_worker() == 1
    result = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst))
    shown = result.json()
    assert shown["status"] == "succeeded" and shown["epochs_done"] == 2, result.text
    # Epoch 2: the returning person's 4 rows (F = 4 * 0.24 = 0.96) take what is left of the
    # bound, 1 - ||x||^2; the new person's are bounded to the whole of it.
    second, used = kept[-1]
    person = second[:4]
    assert np.linalg.norm(person.T @ person) == pytest.approx(1.0 - first_size, rel=1e-9)
    assert np.linalg.norm(second[4:].T @ second[4:]) <= 1.0 + 1e-9
    assert np.all(used <= 1.0) and used.shape == (61,)
    for text in (result.text, preview.text, caplog.text):
        assert MARK not in text and "patient" not in text


def _ingest(store, content: bytes, **kwargs):
    path = store.new_incoming_path()
    path.write_bytes(content)
    return store.ingest(path, ".csv", unit_column="patient", **kwargs)


def test_an_uncommitted_append_leaves_no_person_behind(store):
    """A batch mapped but never committed (its transaction failed): the next append starts
    from the committed rows and people, so the index stays dense and a person keeps theirs."""
    first = _ingest(store, csv_bytes(["a", "b", "a"], np.eye(3, 2)))
    assert first.n_units == 2
    secret = store.unit_secret(first.file_name)
    lost = _ingest(store, csv_bytes(["c", "a"], np.eye(2)), batch=True, unit_secret=secret)
    assert lost.unit_digests is not None
    # Mapped (c becomes person 2), then the commit fails: the database still says 3 rows, 2.
    assert store.append_units(first.file_name, lost.unit_digests, 3, 2)[0] == 3
    store.discard(lost.file_name)
    again = _ingest(store, csv_bytes(["d", "b", "d"], np.eye(3, 2)), batch=True, unit_secret=secret)
    assert again.unit_digests is not None
    n_units, _ = store.append_units(first.file_name, again.unit_digests, 3, 2)
    assert n_units == 3  # d is person 2: c left nothing
    np.testing.assert_array_equal(store.open_units(first.file_name, 6), [0, 1, 0, 2, 1, 2])
    assert not store.path_of(lost.file_name + ".ids").exists()


def test_a_release_running_across_the_upgrade_keeps_the_first_batch_rule(
    client, keys, person_dataset, run_worker, monkeypatch, session_factory
):
    """A state stored before usage was kept (no ``person_used`` after epoch 1): epoch 2 runs
    the rule the release ran under, each person in their first batch only (the returning
    person's rows zero), and the state it stores carries usage on from there."""
    body, ids, _ = person_dataset
    real = privacy_unit.continual_batch_rows
    kept: list[tuple[np.ndarray, np.ndarray]] = []

    def spy(rows_, units, row_offset, clip_norm, used):
        out = real(rows_, units, row_offset, clip_norm, used)
        kept.append(out)
        return out

    monkeypatch.setattr(privacy_unit, "continual_batch_rows", spy)
    request = {
        "mechanism": "continual_gauss",
        "k": 2,
        "epsilon": "1",
        "delta": "1e-7",
        "params": {"horizon": 3},
    }
    release_id = post_release(client, keys.analyst, body["id"], **request)
    assert run_worker() == 1
    with session_factory.begin() as session:
        row = session.get(ReleaseState, uuid.UUID(release_id))
        state = ContinualState.from_bytes(row.state)
        assert state.person_used is not None and state.person_used.shape == (60,)
        row.state = dataclasses.replace(state, person_used=None).to_bytes()
    returning = next(i for i in ids if ids.count(i) == 1)
    response = append(
        client,
        keys.owner,
        body["id"],
        csv_bytes([returning] * 3 + [f"{MARK}-new"] * 2, np.full((5, 6), 0.2), id_at=0),
        filename="more.csv",
        privacy_unit_column="patient",
    )
    assert response.status_code == 201, response.text
    assert run_worker() == 1
    second, used = kept[-1]
    assert np.all(second[:3] == 0.0) and np.all(np.abs(second[3:]) > 0)
    assert np.all(used[:60] == 1.0) and 0 < used[60] <= 1.0
    with session_factory() as session:
        after = ContinualState.from_bytes(session.get(ReleaseState, uuid.UUID(release_id)).state)
    np.testing.assert_array_equal(after.person_used, used)
