"""Identifiers that name one person are one person, whatever file and spelling they come in
(outside privacy audit of the privacy unit). A person whose rows carry ``7`` in a Parquet batch
and ``"7"`` in a CSV append, or ``"José"`` composed in one file and decomposed in another, or
``"alice"`` and ``"Alice "``, was split into several units: each part was bounded apart, so the
person was protected only at a multiple of the stated epsilon (group privacy). Merging
identifiers that differ only by such spelling never weakens a bound (a unit of two people bounds
each of them); splitting one person does. A dataset uploaded before this keeps its own rule for
its appends (its stored digests were made with it), tested in
``tests/mechanisms/test_unit_identifiers.py``."""

from __future__ import annotations

import io
import unicodedata

import numpy as np
import pyarrow as pa
import pytest

from service import unit_keys
from tests.api.test_append_rows import append
from tests.api.test_privacy_unit_http import parquet_bytes, upload
from tests.conftest import bearer

pytestmark = pytest.mark.release_seed(3410)

NFC = unicodedata.normalize("NFC", "Jos\u00e9")
NFD = unicodedata.normalize("NFD", "Jos\u00e9")


def csv_rows(ids: list[str], rows: np.ndarray) -> bytes:
    lines = ["patient," + ",".join(f"f{j}" for j in range(rows.shape[1]))]
    for ident, row in zip(ids, rows, strict=True):
        lines.append(ident + "," + ",".join(repr(float(v)) for v in row))
    return ("\n".join(lines) + "\n").encode()


def test_spellings_of_one_identifier_in_one_file_are_one_person(client, keys) -> None:
    ids = ["7", "7.0", " 7", "007", "+7", NFC, NFD, f"{NFC} ", "alice", "Alice", "ALICE  "]
    rows = np.random.default_rng(1).normal(size=(len(ids), 3)) * 0.1
    response = upload(
        client, keys.owner, "x.csv", csv_rows(ids, rows), privacy_unit_column="patient"
    )
    assert response.status_code == 201, response.text
    # Three people: 7, José, alice (before: 11, each spelling a person of one row).
    assert response.json()["n_units"] == 3


@pytest.mark.parametrize("first", ["parquet", "csv"])
def test_a_person_keeps_one_unit_across_formats_and_spellings(client, keys, first) -> None:
    """An upload in one format, an append in the other: the returning people stay the upload's
    three people (before: the append added three new units, one for each of them)."""
    rng = np.random.default_rng(2)
    numbers = [1001, 1001, 42]
    texts = ["1001", "1001.0", "42"]
    parquet = parquet_bytes(
        pa.table(
            {
                "patient": pa.array(numbers, pa.int64()),
                "a": rng.normal(size=3) * 0.1,
                "b": rng.normal(size=3) * 0.1,
            }
        )
    )
    csv = csv_rows(texts, rng.normal(size=(3, 2)) * 0.1)
    files = {"parquet": ("x.parquet", parquet), "csv": ("x.csv", csv)}
    second = "csv" if first == "parquet" else "parquet"
    name, content = files[first]
    response = upload(client, keys.owner, name, content, privacy_unit_column="patient")
    assert response.status_code == 201, response.text
    dataset = response.json()
    assert dataset["n_units"] == 2
    name, content = files[second]
    grown = append(
        client, keys.owner, dataset["id"], content, filename=name, privacy_unit_column="patient"
    )
    assert grown.status_code == 201, grown.text
    shown = client.get(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.analyst)).json()
    assert (shown["n_rows"], shown["n_units"]) == (6, 2)
    # Text across files too: the decomposed spelling and a trailing space are the same person.
    text = upload(
        client,
        keys.owner,
        "t.csv",
        csv_rows([NFC, "bob"], np.eye(2) * 0.1),
        privacy_unit_column="patient",
    )
    assert text.status_code == 201, text.text
    more = append(
        client,
        keys.owner,
        text.json()["id"],
        csv_rows([NFD, "Bob ", "carol"], np.eye(3, 2) * 0.1),
        filename="m.csv",
        privacy_unit_column="patient",
    )
    assert more.status_code == 201, more.text
    shown = client.get(f"/v1/datasets/{text.json()['id']}", headers=bearer(keys.analyst)).json()
    assert shown["n_units"] == 3


def test_new_secrets_carry_the_spelled_rule() -> None:
    # The rounded rule, with invisible characters of text dropped (test_privacy_unit_invisible),
    # dashes one and digit groups joined (test_privacy_unit_spellings).
    assert unit_keys.rule_of(unit_keys.new_secret()) == "spelled"


def npy_with_ids(ids: np.ndarray, rows: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.column_stack([ids, rows]), allow_pickle=False)
    return buffer.getvalue()


BIG = 12345678901234567  # above 2**53: a float64 holds 12345678901234568 instead


@pytest.mark.parametrize("first", ["csv", "parquet"])
def test_an_identifier_beyond_2_53_is_one_person_in_a_float_file(client, keys, first) -> None:
    """A person whose identifier is beyond 2**53 (a 17-digit national number) keeps one unit
    when a batch comes as a float64 ``.npy`` (whose values can hold it only rounded). Before,
    the CSV text and the Parquet int64 were the exact integer and the ``.npy`` float its
    rounding: two digests, so the returning person became a second unit, bounded twice."""
    rng = np.random.default_rng(5)
    if first == "csv":
        name, content = "x.csv", csv_rows([str(BIG), "42"], rng.normal(size=(2, 2)) * 0.1)
    else:
        table = pa.table(
            {
                "patient": pa.array([BIG, 42], pa.int64()),
                "a": rng.normal(size=2) * 0.1,
                "b": rng.normal(size=2) * 0.1,
            }
        )
        name, content = "x.parquet", parquet_bytes(table)
    response = upload(client, keys.owner, name, content, privacy_unit_column="patient")
    assert response.status_code == 201, response.text
    dataset = response.json()
    assert dataset["n_units"] == 2
    batch = npy_with_ids(np.array([float(BIG), 42.0]), rng.normal(size=(2, 2)) * 0.1)
    grown = append(client, keys.owner, dataset["id"], batch, privacy_unit_column=0)
    assert grown.status_code == 201, grown.text
    shown = client.get(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.analyst)).json()
    assert (shown["n_rows"], shown["n_units"]) == (4, 2)


@pytest.mark.parametrize(
    "ids",
    [[0.1, 0.2], [float(2**24 + 2), 3.0]],
    ids=["fraction", "beyond_2_24"],
)
@pytest.mark.parametrize("kind", ["npy", "parquet"])
def test_a_narrow_float_identifier_that_is_not_a_small_integer_is_refused(
    client, keys, ids, kind
) -> None:
    """A float32 identifier has no one spelling: 0.1 stored as float32 is 0.10000000149 as a
    number, so the person written "0.1" in a CSV batch was another unit; beyond 2**24 it holds
    several integers' rounding. Such a column is refused (422 naming privacy_unit_column,
    without the value); a float32 column of small integers is exact and accepted."""
    rng = np.random.default_rng(6)
    values = np.asarray(ids, dtype=np.float32)
    rows = (rng.normal(size=(2, 2)) * 0.1).astype(np.float32)
    if kind == "npy":
        name, content = "x.npy", npy_with_ids(values, rows)
        column: object = 0
    else:
        table = pa.table(
            {"patient": pa.array(values, pa.float32()), "a": rows[:, 0], "b": rows[:, 1]}
        )
        name, content = "x.parquet", parquet_bytes(table)
        column = "patient"
    response = upload(client, keys.owner, name, content, privacy_unit_column=column)
    assert response.status_code == 422, response.text
    body = response.text
    assert "privacy_unit_column" in body
    for value in values:
        assert repr(float(value)) not in body and str(value) not in body
    small = np.asarray([3.0, 7.0], dtype=np.float32)
    content = (
        npy_with_ids(small, rows)
        if kind == "npy"
        else parquet_bytes(
            pa.table({"patient": pa.array(small, pa.float32()), "a": rows[:, 0], "b": rows[:, 1]})
        )
    )
    accepted = upload(client, keys.owner, name, content, privacy_unit_column=column)
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["n_units"] == 2


@pytest.mark.parametrize("batch_kind", ["npy", "csv"])
def test_a_person_rule_dataset_refuses_identifiers_beyond_2_53(
    client, keys, monkeypatch, batch_kind
) -> None:
    """A dataset whose secret carries the person rule (uploaded before the rounded one) keeps
    integers beyond 2**53 exact, so its appends cannot merge the float a .npy holds with the
    exact integer: such identifiers are refused with 422 (no value named) instead of splitting
    the person. Before, the append was accepted and the person became a second unit."""
    monkeypatch.setattr(
        unit_keys, "new_secret", lambda: bytes([unit_keys.PERSON_RULE]) + bytes(range(32))
    )
    rng = np.random.default_rng(8)
    content = csv_rows(["42", "43"], rng.normal(size=(2, 2)) * 0.1)
    response = upload(client, keys.owner, "x.csv", content, privacy_unit_column="patient")
    assert response.status_code == 201, response.text
    dataset = response.json()
    if batch_kind == "npy":
        name = "rows.npy"
        batch = npy_with_ids(np.array([float(BIG), 42.0]), rng.normal(size=(2, 2)) * 0.1)
        column: object = 0
    else:
        name, column = "rows.csv", "patient"
        batch = csv_rows([str(BIG), "42"], rng.normal(size=(2, 2)) * 0.1)
    grown = append(
        client, keys.owner, dataset["id"], batch, filename=name, privacy_unit_column=column
    )
    assert grown.status_code == 422, grown.text
    assert "privacy_unit_column" in grown.text
    assert str(BIG) not in grown.text and str(BIG + 1) not in grown.text
    shown = client.get(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.analyst)).json()
    assert (shown["n_rows"], shown["n_units"]) == (2, 2)
    # Identifiers within 2**53 still append.
    small = csv_rows(["42", "44"], rng.normal(size=(2, 2)) * 0.1)
    grown = append(
        client, keys.owner, dataset["id"], small, filename="rows.csv", privacy_unit_column="patient"
    )
    assert grown.status_code == 201, grown.text
