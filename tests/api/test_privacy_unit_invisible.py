"""Invisible characters do not make a second person (an outside audit of issue 34). An
identifier copied from a web page, a right-to-left document or a spreadsheet may carry
characters that render as nothing: a left-to-right mark (U+200E), a zero-width space (U+200B),
a byte-order mark inside a value (U+FEFF), a soft hyphen (U+00AD). ``"\\u200e7"`` looks exactly
like ``"7"``, yet the identifier rule kept them apart (they are not whitespace), so a person
whose append carried one became a second unit, bounded apart: protected only at twice the
stated epsilon. New datasets drop them (service.privacy_unit.visible_key, the fourth rule of
service.unit_keys); a dataset uploaded under an earlier rule keeps its digests for its appends."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from service import unit_keys
from service.privacy_unit import visible_key
from tests.api.test_append_rows import append
from tests.api.test_privacy_unit_http import parquet_bytes, upload
from tests.api.test_privacy_unit_identifiers import csv_rows
from tests.conftest import bearer

pytestmark = pytest.mark.release_seed(3420)

#: Spellings of "7" and "alice" that render exactly as they do.
INVISIBLE = {
    "7": ["\u200e7", "7\u200b", "\u2060 7", "\u00ad7", "7\ufe0f", "\u200f7\u200f"],
    "alice": ["al\u200bice", "\u200dalice", "alice\u2066"],
}


def test_invisible_characters_name_the_same_person() -> None:
    secret = bytes([unit_keys.VISIBLE_RULE]) + bytes(range(32))
    assert unit_keys.rule_of(secret) == "visible"
    for plain, spellings in INVISIBLE.items():
        assert {visible_key(s) for s in spellings} == {visible_key(plain)}, plain
        digests = unit_keys.row_digests(secret, [plain, *spellings])
        assert len({row.tobytes() for row in digests}) == 1, plain
    # Visible differences still name different people.
    assert visible_key("alice") != visible_key("alicf")
    assert visible_key("7") != visible_key("7\u0301")  # a combining accent shows


def test_a_dataset_of_an_earlier_rule_keeps_its_digests() -> None:
    secret = bytes([unit_keys.ROUNDED_RULE]) + bytes(range(32))
    assert unit_keys.rule_of(secret) == "rounded"
    assert unit_keys.digest(secret, "\u200e7") != unit_keys.digest(secret, "7")
    assert unit_keys.digest(secret, " 7") == unit_keys.digest(secret, 7)


def test_an_append_with_invisible_characters_adds_no_person(client, keys) -> None:
    rng = np.random.default_rng(4)
    made = upload(
        client,
        keys.owner,
        "x.csv",
        csv_rows(["7", "alice", "bob"], rng.normal(size=(3, 2)) * 0.1),
        privacy_unit_column="patient",
    )
    assert made.status_code == 201, made.text
    assert made.json()["n_units"] == 3
    spellings = [*INVISIBLE["7"], *INVISIBLE["alice"]]
    grown = append(
        client,
        keys.owner,
        made.json()["id"],
        csv_rows(spellings, rng.normal(size=(len(spellings), 2)) * 0.1),
        filename="more.csv",
        privacy_unit_column="patient",
    )
    assert grown.status_code == 201, grown.text
    shown = client.get(f"/v1/datasets/{made.json()['id']}", headers=bearer(keys.analyst)).json()
    # Before: 12 (each spelling a new person of one row).
    assert (shown["n_rows"], shown["n_units"]) == (3 + len(spellings), 3)


@pytest.mark.parametrize(
    ("values", "layout"),
    [
        (["7", "alice", "7"], "dictionary"),
        ([7, 9, 7], "dictionary"),
        (["7", "alice", "7"], "string_view"),
    ],
    ids=["categorical-text", "categorical-integers", "string-view"],
)
def test_an_identifier_column_in_another_arrow_layout_is_read_by_its_values(
    client, keys, values, layout
) -> None:
    """A Parquet identifier column stored as a dictionary (pandas' ``category`` dtype, common
    for identifiers) or in Arrow's string-view layout was refused with 422 "must hold text or
    integers" although it held text; it is read by its values, so its people are the same as
    in a plain column's batch."""
    rng = np.random.default_rng(5)
    plain_ids = pa.array(values)
    ids = (
        plain_ids.dictionary_encode()
        if layout == "dictionary"
        else plain_ids.cast(pa.string_view())
    )
    table = pa.table({"patient": ids, "a": rng.normal(size=3) * 0.1})
    made = upload(
        client, keys.owner, "x.parquet", parquet_bytes(table), privacy_unit_column="patient"
    )
    assert made.status_code == 201, made.text
    assert made.json()["n_units"] == 2
    plain = pa.table({"patient": pa.array(values), "a": rng.normal(size=3) * 0.1})
    grown = append(
        client,
        keys.owner,
        made.json()["id"],
        parquet_bytes(plain),
        filename="more.parquet",
        privacy_unit_column="patient",
    )
    assert grown.status_code == 201, grown.text
    shown = client.get(f"/v1/datasets/{made.json()['id']}", headers=bearer(keys.analyst)).json()
    assert (shown["n_rows"], shown["n_units"]) == (6, 2)


def test_an_identifier_of_invisible_characters_only_is_empty(client, keys) -> None:
    """A cell holding only a zero-width space is as empty as an empty one: refused (with no
    value named), as an empty identifier is, rather than taken for a person."""
    rows = np.random.default_rng(6).normal(size=(2, 2)) * 0.1
    refused = upload(
        client,
        keys.owner,
        "x.csv",
        csv_rows(["7", "\u200b\u200e"], rows),
        privacy_unit_column="patient",
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"].startswith("privacy_unit_column:")
    assert "\u200b" not in refused.text
