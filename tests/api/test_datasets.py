"""Uploads: every format, a corpus of bad inputs (each a 4xx that leaves nothing behind)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import func, select

from service.db.models import AuditEvent, Dataset
from tests.conftest import bearer, npy_bytes

MATRIX = np.array([[1.5, -2.0, 0.25], [0.0, 3.0, 1.0], [4.0, 5.5, -6.0]])


def parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def post(client, key, filename, content, **form):
    fields = {"name": "d", "epsilon_budget": "1", "delta_budget": "1e-6", **form}
    return client.post(
        "/v1/datasets",
        headers=bearer(key),
        files={"file": (filename, content, "application/octet-stream")},
        data={k: v for k, v in fields.items() if v is not None},
    )


def stored_files(settings) -> list[Path]:
    """Every file in the store except the (empty) lock files of live upload sessions."""
    root = settings.datasets_dir
    if not root.exists():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != ".lock")


GOOD_UPLOADS = {
    "csv_header": ("x.csv", b"a,b,c\n1.5,-2,0.25\n0,3,1\n4,5.5,-6\n"),
    "csv_no_header": ("x.csv", b"1.5,-2,0.25\n0,3,1\n4,5.5,-6\n"),
    "csv_crlf": ("x.CSV", b"1.5,-2,0.25\r\n0,3,1\r\n4,5.5,-6\r\n"),
    "npy_float64": ("x.npy", npy_bytes(MATRIX)),
    "npy_float32_fortran": ("x.npy", npy_bytes(np.asfortranarray(MATRIX.astype(np.float32)))),
    "parquet": (
        "x.parquet",
        parquet_bytes(
            pa.table({"a": [1.5, 0.0, 4.0], "b": [-2.0, 3.0, 5.5], "c": [0.25, 1.0, -6.0]})
        ),
    ),
}


@pytest.mark.parametrize("case", GOOD_UPLOADS)
def test_every_format_is_stored_as_float64(client, keys, settings, store, case):
    name, content = GOOD_UPLOADS[case]
    response = post(client, keys.owner, name, content, row_norm_bound="10")
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["n_rows"], body["n_cols"]) == (3, 3)
    assert body["row_norm_bound"] == 10.0
    assert body["budget"]["epsilon_remaining"] == "1"
    files = stored_files(settings)
    assert len(files) == 1 and files[0].suffix == ".npy"
    stored = np.load(files[0])
    assert stored.dtype == np.float64
    np.testing.assert_allclose(stored, MATRIX, rtol=1e-6)


def test_integer_parquet_columns_are_accepted(client, keys):
    content = parquet_bytes(pa.table({"a": pa.array([1, 2, 3], pa.int64()), "b": [0.5, 1.5, 2.5]}))
    assert post(client, keys.owner, "x.parquet", content).status_code == 201


def test_metadata_never_carries_values(client, keys):
    distinctive = np.full((4, 2), 123.456789)
    response = post(client, keys.owner, "x.npy", npy_bytes(distinctive))
    dataset_id = response.json()["id"]
    for path in ("/v1/datasets", f"/v1/datasets/{dataset_id}", f"/v1/datasets/{dataset_id}/budget"):
        text = client.get(path, headers=bearer(keys.owner)).text
        assert "123.45" not in text


def test_the_upload_tells_its_owner_how_many_rows_exceed_the_bound(client, keys):
    rows = np.array([[0.6, 0.8], [3.0, 4.0], [1e300, 1e300], [0.0, 0.0], [0.3, 0.1]])
    response = post(client, keys.owner, "x.npy", npy_bytes(rows), row_norm_bound="1.0")
    assert response.status_code == 201, response.text
    # 0.6/0.8 has norm 1 (not above); 3/4 and the huge row are above; decided at any scale.
    assert response.json()["rows_above_bound"] == 2
    dataset_id = response.json()["id"]
    # Shown once, to the owner: not in the metadata anyone reads afterwards.
    for key in (keys.owner, keys.analyst):
        for path in ("/v1/datasets", f"/v1/datasets/{dataset_id}"):
            assert "rows_above_bound" not in client.get(path, headers=bearer(key)).text
    unbounded = post(client, keys.owner, "y.npy", npy_bytes(rows[:2]))
    assert unbounded.status_code == 201 and unbounded.json()["rows_above_bound"] is None


BAD_UPLOADS = {
    "csv_ragged": ("x.csv", b"1,2,3\n4,5\n", "inconsistent widths"),
    "csv_too_wide": ("x.csv", b"1,2\n3,4,5\n", "inconsistent widths"),
    "csv_text_cell": ("x.csv", b"1,2\n3,secret\n", "non-numeric value in column 2"),
    "csv_nan": ("x.csv", b"1,2\n3,nan\n", "NaN"),
    "csv_inf": ("x.csv", b"1,2\n3,inf\n", "non-finite"),
    "csv_one_row": ("x.csv", b"1,2\n", "at least 2 rows"),
    "csv_header_only": ("x.csv", b"a,b\n", "at least 2 rows"),
    "csv_empty": ("x.csv", b"", "empty"),
    # A file's only line without a line end was refused as "not a readable numeric CSV file"
    # (pyarrow infers no columns from it); cut inside a quote, the refusal names row and column.
    "csv_one_line_no_line_end": ("x.csv", b"1,2", "at least 2 rows"),
    "csv_header_only_no_line_end": ("x.csv", b"a,secret", "at least 2 rows"),
    "csv_one_line_cut_in_a_quote": (
        "x.csv",
        b'1,2,"secret',
        "row 1, column 3: a quoted field is not closed (is the file cut short",
    ),
    "npy_1d": ("x.npy", npy_bytes(np.ones(5)), "2-D (it has 1 dimension)"),
    "npy_3d": ("x.npy", npy_bytes(np.ones((2, 2, 2))), "2-D (it has 3 dimensions)"),
    "npy_strings": ("x.npy", npy_bytes(np.array([["a", "b"], ["c", "d"]])), "numeric"),
    "npy_complex": ("x.npy", npy_bytes(np.ones((2, 2), dtype=complex)), "numeric"),
    "npy_nan": ("x.npy", npy_bytes(np.array([[1.0, np.nan], [1.0, 2.0]])), "non-finite"),
    "npy_one_row": ("x.npy", npy_bytes(np.ones((1, 3))), "at least 2 rows"),
    "npy_no_columns": ("x.npy", npy_bytes(np.ones((3, 0))), "no columns"),
    "npy_garbage": ("x.npy", b"this is not numpy", ".npy"),
    "parquet_text_column": (
        "x.parquet",
        parquet_bytes(pa.table({"a": [1.0, 2.0], "name": ["x", "y"]})),
        "not numeric",
    ),
    "parquet_null": ("x.parquet", parquet_bytes(pa.table({"a": [1.0, None, 2.0]})), "missing"),
    "parquet_garbage": ("x.parquet", b"PAR1 nope", "Parquet"),
    "unknown_suffix": ("x.xlsx", b"1,2\n3,4\n", "unsupported file type"),
    "no_suffix": ("data", b"1,2\n3,4\n", "unsupported file type"),
}


@pytest.mark.parametrize("case", BAD_UPLOADS)
def test_bad_files_are_refused_and_leave_nothing(client, keys, settings, session_factory, case):
    name, content, expected = BAD_UPLOADS[case]
    response = post(client, keys.owner, name, content)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "invalid_input"
    assert body["detail"].startswith("file:")
    assert expected in body["detail"]
    assert "secret" not in body["detail"]
    assert stored_files(settings) == []
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Dataset)) == 0
        assert (
            session.scalar(
                select(func.count())
                .select_from(AuditEvent)
                .where(AuditEvent.event_type == "dataset_created")
            )
            == 0
        )


BAD_FORMS = {
    "missing_name": ({"name": None}, "name"),
    "empty_name": ({"name": ""}, "name"),
    "missing_epsilon": ({"epsilon_budget": None}, "epsilon_budget"),
    "zero_epsilon": ({"epsilon_budget": "0"}, "epsilon_budget"),
    "text_epsilon": ({"epsilon_budget": "lots"}, "epsilon_budget"),
    "infinite_epsilon": ({"epsilon_budget": "inf"}, "epsilon_budget"),
    "delta_one": ({"delta_budget": "1"}, "delta_budget"),
    "negative_delta": ({"delta_budget": "-0.1"}, "delta_budget"),
    "negative_norm": ({"row_norm_bound": "-1"}, "row_norm_bound"),
    "nan_norm": ({"row_norm_bound": "nan"}, "row_norm_bound"),
}


@pytest.mark.parametrize("case", BAD_FORMS)
def test_bad_form_fields_are_refused_and_leave_nothing(client, keys, settings, case):
    overrides, field = BAD_FORMS[case]
    response = post(client, keys.owner, "x.npy", npy_bytes(MATRIX), **overrides)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(field)
    assert stored_files(settings) == []


def test_missing_file_part(client, keys, settings):
    response = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        data={"name": "d", "epsilon_budget": "1", "delta_budget": "0"},
        files={"other": ("x.csv", b"1,2\n3,4\n")},
    )
    assert response.status_code == 422
    assert response.json()["detail"].startswith("file: missing")
    assert stored_files(settings) == []


def test_json_body_is_refused(client, keys):
    response = client.post("/v1/datasets", headers=bearer(keys.owner), json={"name": "d"})
    assert response.status_code == 422
    assert "multipart/form-data" in response.json()["detail"]


def test_upload_over_the_size_limit_is_refused_while_streaming(client, keys, settings):
    too_big = npy_bytes(np.ones((6 * 1024 * 1024 // 8 // 4 + 10, 4)))  # just over 6 MiB > 5 MiB
    response = post(client, keys.owner, "x.npy", too_big)
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    assert stored_files(settings) == []


def test_upload_needs_owner_role_and_reads_nothing(client, keys, settings):
    response = post(client, keys.analyst, "x.npy", npy_bytes(MATRIX))
    assert response.status_code == 403
    assert stored_files(settings) == []


def test_delete_purges_rows_and_keeps_ledger_and_audit(
    client, keys, settings, upload_dataset, session_factory
):
    dataset = upload_dataset(client, keys.owner, MATRIX)
    assert len(stored_files(settings)) == 1
    response = client.delete(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner))
    assert response.status_code == 204
    assert stored_files(settings) == []
    assert (
        client.get(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner)).status_code == 404
    )
    with session_factory() as session:
        types = list(session.scalars(select(AuditEvent.event_type).order_by(AuditEvent.seq)))
    assert types[-1] == "dataset_deleted"
    release = client.post(
        f"/v1/datasets/{dataset['id']}/releases",
        headers=bearer(keys.analyst),
        json={
            "mechanism": "analyze_gauss",
            "k": 1,
            "epsilon": "0.1",
            "delta": "1e-6",
            "params": {"clip_norm": 1},
        },
    )
    assert release.status_code == 409
    assert release.json()["error"] == "dataset_deleted"


def test_owners_see_only_their_datasets(client, keys, make_key, upload_dataset):
    other_owner = make_key("owner")
    mine = upload_dataset(client, keys.owner, MATRIX)
    assert client.get(f"/v1/datasets/{mine['id']}", headers=bearer(other_owner)).status_code == 404
    assert (
        client.delete(f"/v1/datasets/{mine['id']}", headers=bearer(other_owner)).status_code == 404
    )
    assert client.get("/v1/datasets", headers=bearer(other_owner)).json()["items"] == []
    listed = client.get("/v1/datasets", headers=bearer(keys.analyst)).json()["items"]
    assert [item["id"] for item in listed] == [mine["id"]]


def test_rows_scaled_to_the_bound_are_not_counted_above_it(client, keys):
    """Unit rows read back with norms like 1 + 1e-16 (a CSV round trip, another BLAS): the
    owner is not told they exceed a bound of 1; a row above it beyond rounding still counts."""
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(400, 10))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    rows *= 1.0 + 2.0**-50  # every row's norm now a few ulps above 1
    rows[0] *= 1.0 + 1e-9
    assert np.count_nonzero(np.linalg.norm(rows, axis=1) > 1.0) > 100
    response = post(client, keys.owner, "x.npy", npy_bytes(rows), row_norm_bound="1.0")
    assert response.status_code == 201, response.text
    assert response.json()["rows_above_bound"] == 1


@pytest.mark.parametrize(
    ("limit_mb", "said"), [(0.01, "10,485 bytes"), (0.25, "0.25 MiB"), (1.5, "1.5 MiB")]
)
def test_an_upload_refusal_states_the_limit_truly(
    client, keys, settings, limit_mb, said, monkeypatch
):
    # A limit below 1 MiB was "0 MiB", and 1.5 was "1 MiB": whole MiB, rounded down.
    monkeypatch.setattr(settings, "max_upload_mb", limit_mb)
    too_big = npy_bytes(np.ones((int(limit_mb * 1024 * 1024) // 8 + 64, 1)))
    response = post(client, keys.owner, "x.npy", too_big)
    assert response.status_code == 413, response.text
    assert f"larger than the limit of {said} (DPSS_MAX_UPLOAD_MB)" in response.json()["detail"]
    assert stored_files(settings) == []


@pytest.mark.parametrize("case", ["csv_nan", "csv_inf", "npy_nan", "parquet_null"])
def test_a_missing_or_non_finite_value_says_what_to_do(client, keys, case):
    # An audit of common mistakes: the refusal named where the bad value was but not what to do
    # about it (the service neither drops nor fills rows, so the owner must).
    name, content, _ = BAD_UPLOADS[case]
    detail = post(client, keys.owner, name, content).json()["detail"]
    assert "before uploading" in detail and "remove" in detail, detail


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("x.csv", b"person,a,b\np1,1,2\np2,3,nan\np3,4,5\n"),
        (
            "x.parquet",
            parquet_bytes(pa.table({"person": ["p1", "p2"], "a": [1.0, 2.0], "b": [1.0, None]})),
        ),
    ],
)
def test_a_missing_value_is_placed_in_the_file_s_columns_beside_a_person_column(
    client, keys, name, content
):
    # An audit: with a privacy unit column the missing value's column was counted among the
    # features left after that column was removed, so "column 2" pointed at the wrong column.
    response = post(client, keys.owner, name, content, privacy_unit_column="person")
    assert response.status_code == 422, response.text
    assert "missing or NaN value in column 3;" in response.json()["detail"], response.text


def test_a_file_sent_as_a_text_field_is_named_as_such(client, keys, settings):
    # An audit of a common mistake: `curl -F file=data.csv` (no @) sends the text "data.csv",
    # not the file; the refusal said "unsupported file type (none)", as if the format were wrong.
    response = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files={"file": (None, "data.csv")},
        data={"name": "d", "epsilon_budget": "1", "delta_budget": "1e-6"},
    )
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("file: sent as a text field, not a file"), detail
    assert "-F file=@" in detail and "data.csv" not in detail  # the value is never echoed
    assert stored_files(settings) == []


@pytest.mark.parametrize("name", ["x.csv", "x.npy", "x.parquet"])
def test_an_empty_file_is_called_empty_in_every_format(client, keys, settings, name):
    # An audit: a zero-byte .npy was "not a readable .npy file (its header is not valid)" and a
    # zero-byte .parquet "not a readable Parquet file", as if the format were wrong; only the
    # CSV said it was empty.
    response = post(client, keys.owner, name, b"")
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith("file: the file is empty (0 bytes)") and "file=@" in detail, detail
    assert stored_files(settings) == []
