"""Outside-style audit of hostile files in every accepted format (CSV, ``.npy``, Parquet).

Each malformed or hostile file gets a 4xx naming the field, changes nothing (no dataset row, no
file in the store or its ``incoming/``), and no value of the file appears in the response, in a
log line, or in any file outside the store. Every row value is built from a marker number that
nothing else in the service would print, so a leak is a substring search."""

from __future__ import annotations

import io
import logging
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import func, select

from service import upload_formats
from service.db.models import Dataset
from tests.api.test_datasets import stored_files
from tests.conftest import bearer, npy_bytes

FORM = {"name": "audit", "epsilon_budget": "1", "delta_budget": "1e-6"}
#: Digits no figure of the service contains: the raw values of every hostile file.
MARKER = 7310421
MARKS = (str(MARKER), "7310421", "SECRETROW")


def rows(n: int = 4, d: int = 3) -> np.ndarray:
    return MARKER + np.arange(n * d, dtype=np.float64).reshape(n, d)


def _npy_raw(header: dict[str, object], body: bytes) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + body


def _npy_object() -> bytes:
    out = io.BytesIO()
    array = np.array([["SECRETROW", MARKER], [MARKER, "SECRETROW"]], dtype=object)
    np.save(out, array, allow_pickle=True)
    return out.getvalue()


def _parquet(table: pa.Table, **options: object) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, **options)
    return out.getvalue()


def _numeric_table(n: int = 6) -> pa.Table:
    return pa.table(
        {f"c{i}": pa.array(MARKER + np.arange(n, dtype=np.float64) + i) for i in range(3)}
    )


def _zigzag(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _parquet_lying_rows(occurrences: int = -1) -> bytes:
    """A Parquet file of 4,097 rows whose footer declares 8,191: everywhere (file, row group,
    column chunks), or only in its first ``occurrences`` counts (the file's own count first)."""
    data = bytearray(_parquet(_numeric_table(4097)))
    footer_len = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_len
    footer = bytes(data[start:-8])
    true, false = _zigzag(4097), _zigzag(8191)
    assert len(true) == len(false) and true in footer
    return bytes(data[:start]) + footer.replace(true, false, occurrences) + bytes(data[-8:])


def _parquet_dictionary() -> bytes:
    values = pa.array(MARKER + np.arange(6, dtype=np.float64))
    return _parquet(
        pa.table({"a": values.dictionary_encode(), "b": values, "c": values}), use_dictionary=True
    )


HOSTILE: dict[str, tuple[str, bytes]] = {
    # .npy
    "npy_object_pickle": ("x.npy", _npy_object()),
    "npy_structured_1d": (
        "x.npy",
        npy_bytes(np.array([(MARKER, MARKER)] * 3, dtype=[("a", "<f8"), ("b", "<f8")])),
    ),
    "npy_structured_2d": (
        "x.npy",
        npy_bytes(np.array([[(MARKER, 1)] * 2] * 3, dtype=[("a", "<f8"), ("b", "<i4")])),
    ),
    "npy_0d": ("x.npy", npy_bytes(np.array(float(MARKER)))),
    "npy_1d": ("x.npy", npy_bytes(rows().ravel())),
    "npy_3d": ("x.npy", npy_bytes(rows(4, 4).reshape(2, 2, 4))),
    "npy_huge_shape_tiny_body": (
        "x.npy",
        _npy_raw({"descr": "<f8", "fortran_order": False, "shape": (10**12, 10**3)}, b"\0" * 64),
    ),
    "npy_overflowing_shape": (
        "x.npy",
        _npy_raw({"descr": "<f8", "fortran_order": False, "shape": (2**62, 2**62)}, b"\0" * 64),
    ),
    "npy_nan": ("x.npy", npy_bytes(np.vstack([rows(), [np.nan, MARKER, MARKER]]))),
    "npy_inf": ("x.npy", npy_bytes(np.vstack([rows(), [MARKER, -np.inf, MARKER]]))),
    "npy_big_endian_inf": ("x.npy", npy_bytes(np.vstack([rows(), [np.inf] * 3]).astype(">f8"))),
    "npy_complex": ("x.npy", npy_bytes(rows().astype(np.complex128))),
    "npy_text": ("x.npy", npy_bytes(rows().astype(str))),
    "npy_datetime": ("x.npy", npy_bytes(np.full((3, 2), np.datetime64(MARKER, "s")))),
    "npy_float16_overflow": ("x.npy", npy_bytes(np.full((3, 2), np.inf, dtype=np.float16))),
    "npy_one_row": ("x.npy", npy_bytes(rows(1))),
    "npy_no_columns": ("x.npy", npy_bytes(np.zeros((3, 0)))),
    "npy_bad_header": ("x.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': 7310421}  \n" + b"\0" * 8),
    "npy_padded_body": ("x.npy", npy_bytes(rows()) + b"SECRETROW"),
    # CSV
    "csv_quoted_newline": ("x.csv", f'{MARKER},"{MARKER}\n{MARKER}",1\n1,2,3\n'.encode()),
    "csv_formula_injection": (
        "x.csv",
        f"{MARKER},2,3\n=HYPERLINK(\"SECRETROW\"),@SUM(1),+cmd|' /C calc'!A0\n".encode(),
    ),
    "csv_mixed_types": ("x.csv", f"{MARKER},1\n{MARKER},SECRETROW\n{MARKER},2\n".encode()),
    "csv_nan_text": ("x.csv", f"{MARKER},1\nnan,{MARKER}\n1,2\n".encode()),
    "csv_inf_text": ("x.csv", f"{MARKER},1\ninf,{MARKER}\n1,2\n".encode()),
    "csv_overflow_number": ("x.csv", f"{MARKER},1\n1e400,{MARKER}\n1,2\n".encode()),
    "csv_ragged": ("x.csv", f"{MARKER},1,2\n{MARKER},1\n1,2,3\n".encode()),
    "csv_header_only": ("x.csv", b"a,b,c\n"),
    "csv_bom_only": ("x.csv", b"\xef\xbb\xbf"),
    "csv_bom_then_text": ("x.csv", b"\xef\xbb\xbfa,b\n" + f"SECRETROW,{MARKER}\n1,2\n".encode()),
    "csv_nul_bytes": ("x.csv", f"{MARKER},1\n{MARKER}\0SECRETROW,2\n".encode()),
    "csv_invalid_utf8": ("x.csv", f"{MARKER},1\n{MARKER}".encode() + b"\xff\xfe,2\n1,2\n"),
    "csv_semicolons": ("x.csv", f"{MARKER};1,5\n{MARKER};2,5\n3;4\n".encode()),
    "csv_empty_cell": ("x.csv", f"{MARKER},1\n,{MARKER}\n1,2\n".encode()),
    "csv_hex_number": ("x.csv", f"{MARKER},1\n0x1F,{MARKER}\n1,2\n".encode()),
    # Parquet
    "parquet_list_column": (
        "x.parquet",
        _parquet(pa.table({"a": [[MARKER, 1.0]] * 3, "b": [float(MARKER)] * 3})),
    ),
    "parquet_struct_column": (
        "x.parquet",
        _parquet(pa.table({"a": [{"x": MARKER}] * 3, "b": [float(MARKER)] * 3})),
    ),
    "parquet_text_column": (
        "x.parquet",
        _parquet(pa.table({"a": ["SECRETROW"] * 3, "b": [float(MARKER)] * 3})),
    ),
    "parquet_raw_value_as_column_name": (
        "x.parquet",
        _parquet(pa.table({"1.5": [1.0] * 3, f"SECRETROW {MARKER}": ["x"] * 3})),
    ),
    "parquet_raw_value_as_nested_field_name": (
        "x.parquet",
        _parquet(pa.table({"a": [{f"SECRETROW{MARKER}": 1.0}] * 3, "b": [1.0] * 3})),
    ),
    "parquet_key_as_column_name": (
        "x.parquet",
        _parquet(pa.table({"a": [1.0] * 3, "dpss_SECRETROW" + "x" * 29: [True] * 3})),
    ),
    "parquet_null": (
        "x.parquet",
        _parquet(pa.table({"a": [float(MARKER), None, 1.0], "b": [float(MARKER)] * 3})),
    ),
    "parquet_nan": (
        "x.parquet",
        _parquet(pa.table({"a": [float(MARKER), float("nan"), 1.0], "b": [1.0] * 3})),
    ),
    "parquet_no_rows": ("x.parquet", _parquet(_numeric_table(0))),
    "parquet_lying_row_count": ("x.parquet", _parquet_lying_rows()),
    "parquet_lying_file_row_count": ("x.parquet", _parquet_lying_rows(1)),
    "parquet_lying_row_group_count": ("x.parquet", _parquet_lying_rows(2)),
    "parquet_truncated": ("x.parquet", _parquet(_numeric_table())[:-40] + b"PAR1"),
    "parquet_garbage": ("x.parquet", b"PAR1" + b"SECRETROW" * 10 + b"\x10\0\0\0PAR1"),
    "parquet_decimal": (
        "x.parquet",
        _parquet(pa.table({"a": pa.array([Decimal(f"{MARKER}.25")] * 3), "b": [1.0] * 3})),
    ),
}


#: Files that are valid and must be read exactly, whatever their layout or encoding.
VALID: dict[str, tuple[str, bytes]] = {
    "npy_fortran_order": ("x.npy", npy_bytes(np.asfortranarray(rows()))),
    "npy_big_endian": ("x.npy", npy_bytes(rows().astype(">f8"))),
    "npy_big_endian_int": ("x.npy", npy_bytes(rows().astype(">i8"))),
    "npy_version_3": ("x.npy", None),  # filled below
    "parquet_dictionary": ("x.parquet", _parquet_dictionary()),
    "parquet_many_row_groups": ("x.parquet", _parquet(_numeric_table(600), row_group_size=1)),
    "csv_bom_header": (
        "x.csv",
        "\ufeffa,b,c\n".encode()
        + "\n".join(",".join(str(v) for v in row) for row in rows().tolist()).encode()
        + b"\n",
    ),
}


def _npy_v3() -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, rows(), version=(3, 0))
    return out.getvalue()


VALID["npy_version_3"] = ("x.npy", _npy_v3())


def _count(session_factory) -> int:
    with session_factory() as session:
        return int(session.scalar(select(func.count()).select_from(Dataset)) or 0)


def _leaks_in_files(root: Path, store_root: Path) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if not path.is_file() or store_root in path.parents:
            continue
        data = path.read_bytes()
        if any(mark.encode() in data for mark in MARKS):
            found.append(path)
    return found


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_file_is_a_4xx_naming_the_field_and_changes_nothing(
    client, keys, settings, session_factory, caplog, tmp_path, case
):
    name, content = HOSTILE[case]
    with caplog.at_level(logging.DEBUG):
        response = client.post(
            "/v1/datasets",
            headers=bearer(keys.owner),
            files={"file": (name, content, "application/octet-stream")},
            data=FORM,
        )
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    body = response.json()
    assert body["detail"].startswith("file"), body
    assert not any(mark in response.text for mark in MARKS), response.text
    assert not any(mark in caplog.text for mark in MARKS), caplog.text
    assert stored_files(settings) == []
    assert _count(session_factory) == 0
    assert _leaks_in_files(tmp_path, settings.datasets_dir) == []


@pytest.mark.parametrize("case", list(VALID))
def test_a_valid_file_in_any_layout_is_read_exactly(client, keys, settings, case):
    name, content = VALID[case]
    response = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files={"file": (name, content, "application/octet-stream")},
        data=FORM,
    )
    assert response.status_code == 201, response.text
    (stored,) = [p for p in stored_files(settings) if p.suffix == ".npy"]
    matrix = np.load(stored, allow_pickle=False)
    if case.startswith("parquet"):
        expected = np.column_stack(
            [
                MARKER
                + np.arange(len(matrix), dtype=np.float64)
                + (0 if case == "parquet_dictionary" else i)
                for i in range(3)
            ]
        )
    else:
        expected = rows()
    np.testing.assert_array_equal(matrix, expected)


def test_a_csv_row_longer_than_a_block_is_a_4xx_and_changes_nothing(
    client, keys, settings, session_factory, caplog, tmp_path, monkeypatch
):
    """The 1 GB line, scaled: the block bound is 64 KiB here (16 MiB in service), the second
    row 200 KiB of one cell; refused by the reader's block bound, not held in memory."""
    monkeypatch.setattr(upload_formats, "CSV_BLOCK_BYTES", 64 * 1024)
    long_cell = str(MARKER) * (200 * 1024 // 7)
    content = f"{MARKER},1\n{long_cell},2\n1,2\n".encode()
    with caplog.at_level(logging.DEBUG):
        response = client.post(
            "/v1/datasets",
            headers=bearer(keys.owner),
            files={"file": ("x.csv", content, "application/octet-stream")},
            data=FORM,
        )
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("file"), response.text
    assert not any(mark in response.text + caplog.text for mark in MARKS)
    assert stored_files(settings) == []
    assert _count(session_factory) == 0
    assert _leaks_in_files(tmp_path, settings.datasets_dir) == []


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_append_is_a_4xx_and_leaves_the_dataset_as_it_was(
    client, keys, settings, session_factory, caplog, tmp_path, case
):
    """The same files as a batch: a 4xx naming ``file``, the dataset's rows, batches and file
    unchanged, nothing in ``incoming/``, no value in the answer, a log line or a file."""
    made = client.post(
        "/v1/datasets",
        headers=bearer(keys.owner),
        files={"file": ("x.npy", npy_bytes(rows(4, 3) - MARKER), "application/octet-stream")},
        data=FORM,
    )
    assert made.status_code == 201, made.text
    dataset = made.json()["id"]
    (stored,) = stored_files(settings)
    size = stored.stat().st_size
    name, content = HOSTILE[case]
    with caplog.at_level(logging.DEBUG):
        response = client.post(
            f"/v1/datasets/{dataset}/rows",
            headers=bearer(keys.owner),
            files={"file": (name, content, "application/octet-stream")},
        )
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    assert response.json()["detail"].startswith("file"), response.text
    assert not any(mark in response.text + caplog.text for mark in MARKS)
    after = client.get(f"/v1/datasets/{dataset}", headers=bearer(keys.owner)).json()
    assert (after["n_rows"], after["n_batches"]) == (4, 1)
    assert stored_files(settings) == [stored] and stored.stat().st_size == size
    assert _leaks_in_files(tmp_path, settings.datasets_dir) == []
