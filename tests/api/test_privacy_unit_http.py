"""Issue 34 through HTTP: a privacy unit column on upload (CSV by name, .npy by index, Parquet
by name or index), the column removed and its values never stored or shown; person-level
releases from analyze_gauss and spectrum, and from friendly_aggregate and histogram_aggregate
on a partition of people; a clear 422 naming privacy_unit_column for every
mechanism or step without a person-level argument, for appends and for references."""

from __future__ import annotations

import io
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service import datadir, privacy_unit, privacy_unit_centre
from service.mechanisms.registry import get_mechanism
from tests.api.test_append_rows import append
from tests.api.test_datasets import stored_files
from tests.conftest import bearer, npy_bytes, post_release

pytestmark = pytest.mark.release_seed(3400)

#: Identifiers no output may ever contain.
MARK = "pz7Q"


def people(n_people: int, rows_each: list[int], d: int, seed: int) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    ids: list[str] = []
    for person in range(n_people):
        ids += [f"{MARK}-{person:04d}"] * rows_each[person % len(rows_each)]
    order = rng.permutation(len(ids))
    ids = [ids[i] for i in order]
    basis = np.linalg.qr(rng.normal(size=(d, 2)))[0]
    rows = rng.normal(size=(len(ids), 2)) @ basis.T * 0.3 + rng.normal(size=(len(ids), d)) * 0.01
    return ids, rows


def csv_bytes(ids: list[str], rows: np.ndarray, id_at: int = 0) -> bytes:
    names = [f"f{j}" for j in range(rows.shape[1])]
    names.insert(id_at, "patient")
    lines = [",".join(names)]
    for ident, row in zip(ids, rows, strict=True):
        cells = [repr(float(v)) for v in row]
        cells.insert(id_at, ident)
        lines.append(",".join(cells))
    return ("\n".join(lines) + "\n").encode()


def upload(client, key, filename, content, **form):
    fields = {"name": "people", "epsilon_budget": "10", "delta_budget": "1e-6", **form}
    return client.post(
        "/v1/datasets",
        headers=bearer(key),
        files={"file": (filename, content, "application/octet-stream")},
        data={k: str(v) for k, v in fields.items()},
    )


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


def test_a_csv_upload_names_its_unit_column_and_the_column_is_not_a_feature(
    client, keys, person_dataset, settings, store
):
    body, ids, rows = person_dataset
    assert body["privacy_unit"] == "person"
    assert body["n_units"] == 60
    assert (body["n_rows"], body["n_cols"]) == (len(ids), 6)
    # 20 people of each of 1, 3 and 20 rows.
    assert body["rows_per_unit"] == {"1": 20, "2-5": 20, "6-20": 20, "21-100": 0, "over 100": 0}
    assert body["rows_dropped_by_bound"] == 0
    files = stored_files(settings)
    matrix_file = next(f for f in files if f.parent == settings.datasets_dir)
    np.testing.assert_allclose(np.load(matrix_file), rows)
    units = store.open_units(matrix_file.name)
    # The dense index groups exactly the rows of each identifier; the identifiers are gone.
    for person in {ids[0], ids[5], ids[-1]}:
        rows_of = {i for i, ident in enumerate(ids) if ident == person}
        assert {i for i, u in enumerate(units) if u == units[min(rows_of)]} == rows_of
    for path in files:
        assert MARK.encode() not in path.read_bytes()
    for key in (keys.owner, keys.analyst):
        for path in ("/v1/datasets", f"/v1/datasets/{body['id']}"):
            text = client.get(path, headers=bearer(key)).text
            assert MARK not in text and "rows_per_unit" not in text
            assert '"privacy_unit":"person"' in text.replace(" ", "")


def test_without_a_unit_column_the_dataset_says_its_unit_is_the_row(client, keys, upload_dataset):
    dataset = upload_dataset(client, keys.owner, np.ones((5, 2)))
    assert dataset["privacy_unit"] == "row" and dataset["n_units"] is None
    assert dataset["rows_per_unit"] is None and dataset["rows_dropped_by_bound"] is None


def parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("filename", "content", "column"),
    [
        ("x.npy", npy_bytes(np.array([[7, 1.0, 2.0], [7, 3.0, 4.0], [9, 5.0, 6.0]])), "0"),
        (
            "x.parquet",
            parquet_bytes(pa.table({"a": [1.0, 3.0, 5.0], "id": ["u", "u", "v"], "b": [2, 4, 6]})),
            "id",
        ),
        (
            "x.parquet",
            parquet_bytes(pa.table({"a": [1.0, 3.0, 5.0], "id": [4, 4, 5], "b": [2, 4, 6]})),
            "1",
        ),
        ("x.csv", b"7,1,2\n7,3,4\n9,5,6\n", "0"),
        ("x.csv", b"ua,1,2\nua,3,4\nvb,5,6\n", "0"),
    ],
)
def test_every_format_takes_a_unit_column(client, keys, settings, filename, content, column):
    response = upload(client, keys.owner, filename, content, privacy_unit_column=column)
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["n_rows"], body["n_cols"], body["n_units"]) == (3, 2, 2)
    matrix_file = next(f for f in stored_files(settings) if f.parent == settings.datasets_dir)
    np.testing.assert_allclose(np.load(matrix_file), [[1, 2], [3, 4], [5, 6]])


@pytest.mark.parametrize(
    ("filename", "content", "column", "says"),
    [
        ("x.csv", b"a,b\n1,2\n3,4\n", "patient", "no column of that name"),
        ("x.npy", npy_bytes(np.ones((3, 3))), "patient", "give the column's 0-based index"),
        ("x.npy", npy_bytes(np.ones((3, 3))), "3", "beyond the file's 3 columns"),
        ("x.npy", npy_bytes(np.ones((3, 1))), "0", "a feature column besides"),
        ("x.csv", f"id,a\n{MARK},1\n,2\n".encode(), "id", "empty value"),
        (
            "x.parquet",
            parquet_bytes(pa.table({"a": [1.0, 2.0], "id": pa.array([True, False])})),
            "id",
            "text or integers",
        ),
    ],
)
def test_a_bad_unit_column_is_refused_naming_the_field(
    client, keys, settings, filename, content, column, says
):
    response = upload(client, keys.owner, filename, content, privacy_unit_column=column)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("privacy_unit_column: ") and says in detail, detail
    assert MARK not in response.text
    assert stored_files(settings) == []


@pytest.mark.parametrize(
    ("mechanism", "params"),
    [
        ("exact_gapmax", {}),
        ("smooth_sensitivity", {}),
        ("gap_perturbation", {}),
    ],
)
def test_a_release_without_a_person_level_argument_is_refused_before_charging(
    client, keys, person_dataset, mechanism, params
):
    body, _, _ = person_dataset
    response = client.post(
        f"/v1/datasets/{body['id']}/releases",
        headers=bearer(keys.analyst),
        json={"mechanism": mechanism, "k": 2, "epsilon": "1", "delta": "1e-7", "params": params},
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("privacy_unit_column: "), response.text
    budget = client.get(f"/v1/datasets/{body['id']}/budget", headers=bearer(keys.analyst))
    assert budget.json()["epsilon_spent"] == "0"


@pytest.mark.parametrize("mechanism", ["analyze_gauss", "spectrum"])
def test_gram_mechanisms_release_per_person_and_no_output_carries_an_identifier(
    client, keys, person_dataset, run_worker, caplog, mechanism
):
    body, _, _ = person_dataset
    request = {"mechanism": mechanism, "k": 2, "epsilon": "1", "delta": "1e-7"}
    preview = client.post(
        f"/v1/datasets/{body['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=request,
    )
    assert preview.status_code == 200, preview.text
    notes = " ".join(preview.json()["meaning"])
    assert "privacy unit: person (60 people)" in notes and "per person" in notes
    with caplog.at_level(logging.DEBUG):
        release_id = post_release(client, keys.analyst, body["id"], **request)
        assert run_worker() == 1
    result = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst))
    assert result.json()["status"] == "succeeded", result.text
    for text in (result.text, caplog.text, preview.text):
        assert MARK not in text and "patient" not in text


@pytest.mark.parametrize(
    ("mechanism", "params"),
    [
        ("analyze_gauss", {"center": "private"}),
        ("analyze_gauss", {"clip_quantile": 0.5}),
        ("analyze_gauss", {"center": "private", "center_route": "mean"}),
        ("spectrum", {"center": "private"}),
    ],
)
def test_a_private_centre_and_a_clip_quantile_are_made_per_person(
    client, keys, person_dataset, run_worker, monkeypatch, caplog, mechanism, params
):
    body, _, _ = person_dataset
    request = {"mechanism": mechanism, "k": 2, "epsilon": "1", "delta": "1e-7", "params": params}
    preview = client.post(
        f"/v1/datasets/{body['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=request,
    )
    assert preview.status_code == 200, preview.text
    shown = preview.json()
    notes = " ".join(shown["meaning"])
    assert "Per person:" in notes, notes
    if params.get("center") == "private":
        # The mean's noise is stated at the 60 people, not the 480 rows.
        assert "sensitivity 2C/60" in notes
        assert "one per person" in notes
    real = privacy_unit_centre.run_person_centred
    used: list[str] = []

    def spy(mechanism_, data, units, spec, rng):
        used.append(mechanism_.name)
        return real(mechanism_, data, units, spec, rng)

    monkeypatch.setattr(privacy_unit_centre, "run_person_centred", spy)
    with caplog.at_level(logging.DEBUG):
        release_id = post_release(client, keys.analyst, body["id"], **request)
        assert run_worker() == 1
    assert used == [mechanism]
    result = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst))
    assert result.json()["status"] == "succeeded", result.text
    extras = result.json()["result"]["extras"]
    if params.get("center") == "private":
        assert len(extras["center"]) == 6
    if mechanism == "analyze_gauss" and "centring" in extras:
        assert extras["centring"] == "mean"
    for text in (result.text, caplog.text, preview.text):
        assert MARK not in text and "patient" not in text


def test_auto_releases_per_person_and_refuses_delta_zero(
    client, keys, person_dataset, run_worker, caplog
):
    body, _, _ = person_dataset
    refused = client.post(
        f"/v1/datasets/{body['id']}/releases",
        headers=bearer(keys.analyst),
        json={"mechanism": "auto", "k": 2, "epsilon": "1", "delta": "0"},
    )
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert detail.startswith("privacy_unit_column: ") and "smooth_sensitivity" in detail
    request = {"mechanism": "auto", "k": 2, "epsilon": "1", "delta": "1e-7"}
    preview = client.post(
        f"/v1/datasets/{body['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=request,
    )
    assert preview.status_code == 200, preview.text
    assert "privacy unit: person (60 people)" in preview.json()["scales"]["auto_details"]
    with caplog.at_level(logging.DEBUG):
        release_id = post_release(client, keys.analyst, body["id"], **request)
        assert run_worker() == 1
    result = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst))
    assert result.json()["status"] == "succeeded", result.text
    assert result.json()["result"]["extras"]["auto_choice"] == "analyze_gauss"
    for text in (result.text, caplog.text, preview.text, refused.text):
        assert MARK not in text and "patient" not in text
    budget = client.get(f"/v1/datasets/{body['id']}/budget", headers=bearer(keys.analyst))
    assert budget.json()["epsilon_spent"] == "1"


def test_the_row_unit_is_stated_in_the_dry_run(client, keys, upload_dataset):
    dataset = upload_dataset(client, keys.owner, np.eye(4) * 0.5, row_norm_bound=1.0)
    preview = client.post(
        f"/v1/datasets/{dataset['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json={"mechanism": "analyze_gauss", "k": 1, "epsilon": "1", "delta": "1e-7"},
    )
    assert preview.status_code == 200, preview.text
    assert any(line.startswith("privacy unit: row") for line in preview.json()["meaning"])


def test_appends_to_a_person_level_dataset_are_refused(client, keys, person_dataset, settings):
    body, _, _ = person_dataset
    before = stored_files(settings)
    response = append(client, keys.owner, body["id"], b"patient,a\nx,1\n", filename="b.csv")
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("privacy_unit_column: ")
    assert stored_files(settings) == before


def test_a_reference_with_a_unit_column_is_refused(client, keys):
    response = client.post(
        "/v1/dataset-references",
        headers=bearer(keys.owner),
        json={
            "name": "r",
            "epsilon_budget": "1",
            "delta_budget": "1e-6",
            "uri": "/nowhere/x.parquet",
            "columns": ["a"],
            "privacy_unit_column": "id",
        },
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("privacy_unit_column: ")


@pytest.mark.parametrize(
    ("mechanism", "rule"), [("analyze_gauss", "trace"), ("spectrum", "frobenius")]
)
def test_the_worker_bounds_each_person_before_the_mechanism_reads_the_rows(
    client, keys, person_dataset, run_worker, monkeypatch, mechanism, rule
):
    body, _, _ = person_dataset
    real = privacy_unit.bound_contributions
    seen: dict[str, object] = {}

    def spy(data, units, clip_norm, used_rule, **kwargs):
        seen.update(clip_norm=clip_norm, rule=used_rule, units=np.array(units))
        return real(data, units, clip_norm, used_rule, **kwargs)

    target = get_mechanism(mechanism)
    assert target is not None
    real_run = type(target).run
    fed: list[np.ndarray] = []

    def run(self, data, spec, rng):
        fed.append(np.array(data))
        return real_run(self, data, spec, rng)

    monkeypatch.setattr(privacy_unit, "bound_contributions", spy)
    monkeypatch.setattr(type(target), "run", run)
    release_id = post_release(
        client,
        keys.analyst,
        body["id"],
        mechanism=mechanism,
        k=2,
        epsilon="1",
        delta="1e-7",
        params={"clip_norm": 0.5},
    )
    assert run_worker() == 1
    assert (
        client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()["status"]
        == "succeeded"
    )
    assert seen["rule"] == rule and seen["clip_norm"] == 0.5
    units = seen["units"]
    assert isinstance(units, np.ndarray) and len(set(units.tolist())) == 60
    (data,) = fed
    for person in range(60):
        g = data[units == person].T @ data[units == person]
        size = np.trace(g) if rule == "trace" else np.linalg.norm(g)
        assert size <= 0.25 * (1 + 1e-9)


def test_the_data_directory_check_names_a_missing_unit_index(
    client, keys, person_dataset, settings, store, session_factory
):
    with session_factory() as session:
        assert datadir.check(session, store)[0] == []
    units_file = next(f for f in stored_files(settings) if f.parent.name == "units")
    units_file.unlink()
    with session_factory() as session:
        problems, _ = datadir.check(session, store)
    assert len(problems) == 1 and "has no unit index" in problems[0], problems


def test_a_release_without_its_unit_index_fails_refunded_never_runs_per_row(
    client, keys, person_dataset, settings, run_worker
):
    body, _, _ = person_dataset
    next(f for f in stored_files(settings) if f.parent.name == "units").unlink()
    release_id = post_release(
        client, keys.analyst, body["id"], mechanism="spectrum", k=2, epsilon="1", delta="1e-7"
    )
    assert run_worker() == 1
    result = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()
    assert result["status"] == "failed", result
    budget = client.get(f"/v1/datasets/{body['id']}/budget", headers=bearer(keys.analyst))
    assert budget.json()["epsilon_spent"] == "0"


@pytest.fixture
def many_people(client, keys):
    """250 people of 1, 3 or 8 rows (1000 rows): enough people for the default t = 100."""
    ids, rows = people(250, [1, 3, 8], 4, seed=2)
    response = upload(
        client,
        keys.owner,
        "visits.csv",
        csv_bytes(ids, rows),
        privacy_unit_column="patient",
        delta_budget="1e-4",
    )
    assert response.status_code == 201, response.text
    return response.json(), ids


@pytest.mark.parametrize(
    ("mechanism", "params"),
    [("friendly_aggregate", {}), ("histogram_aggregate", {"gamma": 0.1})],
)
def test_sample_and_aggregate_partition_people_and_release_per_person(
    client, keys, many_people, run_worker, monkeypatch, caplog, mechanism, params
):
    body, ids = many_people
    request = {"mechanism": mechanism, "k": 2, "epsilon": "5", "delta": "1e-5", "params": params}
    preview = client.post(
        f"/v1/datasets/{body['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=request,
    )
    assert preview.status_code == 200, preview.text
    notes = " ".join(preview.json()["meaning"])
    assert "privacy unit: person (250 people)" in notes and "partition people" in notes
    target = get_mechanism(mechanism)
    assert target is not None
    real_run = type(target).run
    fed: list[tuple[np.ndarray, np.ndarray]] = []

    def run(self, data, spec, rng, units=None):
        fed.append((np.array(data), np.array(units)))
        return real_run(self, data, spec, rng, units=units)

    monkeypatch.setattr(type(target), "run", run)
    with caplog.at_level(logging.DEBUG):
        release_id = post_release(client, keys.analyst, body["id"], **request)
        assert run_worker() == 1
    result = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst))
    assert result.json()["status"] == "succeeded", result.text
    ((data, units),) = fed
    # The rows as stored (no per-person scaling) and the unit index of every row.
    assert data.shape == (len(ids), 4) and units.shape == (len(ids),)
    assert len(set(units.tolist())) == 250
    for text in (result.text, caplog.text, preview.text):
        assert MARK not in text and "patient" not in text


@pytest.mark.parametrize("mechanism", ["friendly_aggregate", "histogram_aggregate"])
def test_more_subsets_than_people_is_refused_before_charging(client, keys, many_people, mechanism):
    body, _ = many_people
    response = client.post(
        f"/v1/datasets/{body['id']}/releases",
        headers=bearer(keys.analyst),
        json={
            "mechanism": mechanism,
            "k": 1,
            "epsilon": "2",
            "delta": "1e-5",
            "params": {"t": 251},
        },
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("t: "), response.text
    assert "250 people" in response.json()["detail"]
    budget = client.get(f"/v1/datasets/{body['id']}/budget", headers=bearer(keys.analyst))
    assert budget.json()["epsilon_spent"] == "0"


@pytest.mark.parametrize("mechanism", ["analyze_gauss", "spectrum"])
def test_a_public_centre_is_applied_by_the_worker_before_the_per_person_bound(
    client, keys, person_dataset, run_worker, monkeypatch, settings, store, mechanism
):
    body, _, rows = person_dataset
    center = [0.1, -0.2, 0.0, 0.3, 0.0, 0.05]
    target = get_mechanism(mechanism)
    assert target is not None
    real_run = type(target).run
    fed: list[tuple[np.ndarray, object]] = []

    def run(self, data, spec, rng):
        fed.append((np.array(data), spec.params.center))
        return real_run(self, data, spec, rng)

    request = {
        "mechanism": mechanism,
        "k": 2,
        "epsilon": "1",
        "delta": "1e-7",
        "params": {"clip_norm": 0.5, "center": center},
    }
    preview = client.post(
        f"/v1/datasets/{body['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=request,
    )
    assert preview.status_code == 200, preview.text
    assert "centred on the public centre" in " ".join(preview.json()["meaning"])
    monkeypatch.setattr(type(target), "run", run)
    release_id = post_release(client, keys.analyst, body["id"], **request)
    assert run_worker() == 1
    result = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()
    assert result["status"] == "succeeded", result
    assert result["params"]["center"] == center  # the request's public centre, as asked
    ((data, used_center),) = fed
    # The mechanism ran uncentred on rows the worker centred and then bounded per person.
    assert used_center == "none"
    rule = privacy_unit.PERSON_LEVEL_RULES[mechanism]
    matrix_file = next(f for f in stored_files(settings) if f.parent == settings.datasets_dir)
    units = store.open_units(matrix_file.name)
    expected = privacy_unit.bound_contributions(rows, units, 0.5, rule, center=np.array(center))
    np.testing.assert_array_equal(data, expected)


def test_histogram_boosting_is_refused_on_a_person_level_dataset(client, keys, many_people):
    body, _ = many_people
    response = client.post(
        f"/v1/datasets/{body['id']}/releases",
        headers=bearer(keys.analyst),
        json={
            "mechanism": "histogram_aggregate",
            "k": 1,
            "epsilon": "2",
            "delta": "1e-5",
            "params": {"t": 50, "boost_beta": 0.3, "boost_alpha": 0.2},
        },
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("boost_beta: "), response.text


@pytest.mark.parametrize(
    ("mechanism", "params"),
    [
        ("analyze_gauss", {"clip_norm": 1.0}),
        ("analyze_gauss", {"clip_norm": 1.0, "center": "private"}),
        ("analyze_gauss", {"clip_norm": 1.0, "center": [0.1, 0.0, -0.1]}),
        ("spectrum", {"clip_norm": 1.0, "center": "private"}),
        ("friendly_aggregate", {}),
        ("histogram_aggregate", {"gamma": 0.1}),
        ("auto", {"clip_norm": 1.0}),
    ],
)
def test_a_public_prior_is_used_on_every_person_level_path(
    client, keys, many_people, run_worker, mechanism, params
):
    """A public prior (params.prior_basis) on a person-level dataset: every per-person path
    (plain bound, private centre, partition of people, auto) runs inside the prior's span, as
    it was prepared and charged, never a charged no_result for a wrapped mechanism nor a run
    in all d columns that ignores the prior."""
    body, _ = many_people
    prior = np.linalg.qr(np.random.default_rng(5).normal(size=(4, 3)))[0]
    request = {
        "mechanism": mechanism,
        "k": 2,
        "epsilon": "5",
        "delta": "1e-5",
        "params": {**params, "prior_basis": prior.tolist()},
    }
    release_id = post_release(client, keys.analyst, body["id"], **request)
    assert run_worker() == 1
    shown = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()
    assert shown["status"] == "succeeded", shown
    extras = shown["result"]["extras"]
    assert extras["prior"]["dimension"] == 3, extras
    if mechanism != "spectrum":
        basis = np.array(shown["result"]["basis"])
        assert basis.shape == (4, 2)
        assert np.linalg.norm(basis - prior @ (prior.T @ basis)) < 1e-9
    if params.get("center") == "private":
        centre = np.array(extras["center"])
        assert centre.shape == (4,)
        assert np.linalg.norm(centre - prior @ (prior.T @ centre)) < 1e-9


def test_the_dry_run_states_the_per_person_route_the_run_takes_inside_a_prior(
    client, keys, person_dataset, run_worker
):
    """60 people at epsilon 0.7: in all 6 columns the per-person mean's noise fills the ball
    (route "none"), inside a 3-column prior it does not ("mean"); the dry run must state the
    route of the columns the release runs in."""
    body, _, _ = person_dataset
    prior = np.linalg.qr(np.random.default_rng(6).normal(size=(6, 3)))[0]
    request = {
        "mechanism": "analyze_gauss",
        "k": 2,
        "epsilon": "0.7",
        "delta": "1e-7",
        "params": {"center": "private", "prior_basis": prior.tolist()},
    }
    preview = client.post(
        f"/v1/datasets/{body['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=request,
    )
    assert preview.status_code == 200, preview.text
    (note,) = [m for m in preview.json()["meaning"] if "centring route is chosen" in m]
    release_id = post_release(client, keys.analyst, body["id"], **request)
    assert run_worker() == 1
    shown = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()
    assert shown["status"] == "succeeded", shown
    route = shown["result"]["extras"]["centring"]
    assert route == "mean"
    assert f"public facts only: {route} " in note, note
