"""Dashes, the minus sign and digit groups do not make a second person (an outside audit of
issue 34, after the invisible characters).

A word processor or a web page writes ``123\\u201145\\u20116789`` (non-breaking hyphens),
``AB\\u201312`` (an en dash) or ``\\u22127`` (the minus sign): each renders as
``123-45-6789``, ``AB-12``, ``-7``. A spreadsheet saved as CSV writes a number as it is
displayed, ``1,234`` or ``1\\u00a0234``, where the next batch's Parquet holds the integer
``1234``. The identifier rule kept each apart, so the person became a second unit, bounded
apart: protected only at twice the stated epsilon. New datasets read them as one
(service.privacy_unit.spelled_key, the fifth rule of
service.unit_keys); a dataset uploaded under an earlier rule keeps its digests for its appends."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from service import unit_keys
from service.privacy_unit import spelled_key
from tests.api.test_append_rows import append
from tests.api.test_privacy_unit_http import parquet_bytes, upload
from tests.api.test_privacy_unit_identifiers import csv_rows
from tests.conftest import bearer

pytestmark = pytest.mark.release_seed(3421)

#: Spellings that render as the key's, or that a spreadsheet writes for its number.
SPELLED: dict[str, list[object]] = {
    "-7": [-7, "\u22127", "\u20107", "\u20117", "\u20137", "\u207b7", "\ufe637"],
    "1234": [1234, 1234.0, "1,234", "1\u00a0234", "1\u202f234", "1 234", "1'234", "1_234"],
    "1234567": [1234567, "1,234,567", "1\u2009234\u2009567", "1'234'567"],
    "123-45-6789": ["123\u201145\u20116789", "123\u201045\u20106789", "123\u201345\u20136789"],
    "ab-12": ["AB\u201312", "ab\u201412", "Ab\u221212"],
}


def _quoted(value: str) -> str:
    return f'"{value}"' if "," in value else value


def test_dashes_and_digit_groups_name_the_same_person() -> None:
    secret = unit_keys.new_secret()
    assert unit_keys.rule_of(secret) == "spelled"
    for plain, spellings in SPELLED.items():
        assert {spelled_key(s) for s in spellings} == {spelled_key(plain)}, plain
        digests = unit_keys.row_digests(secret, [plain, *spellings])
        assert len({row.tobytes() for row in digests}) == 1, plain
    # Visible differences still name different people; groups must be of three digits.
    assert spelled_key("ab-12") != spelled_key("ab12")
    assert spelled_key("1,23") != spelled_key(123)
    assert spelled_key("12,3456") != spelled_key(123456)
    assert spelled_key("1,234 567") != spelled_key(1234567)  # one separator throughout
    assert spelled_key("1.234") != spelled_key(1234)  # a point is the decimal mark


def test_a_dataset_of_an_earlier_rule_keeps_its_digests() -> None:
    secret = bytes([unit_keys.VISIBLE_RULE]) + bytes(range(32))
    assert unit_keys.rule_of(secret) == "visible"
    assert unit_keys.digest(secret, "\u22127") != unit_keys.digest(secret, -7)
    assert unit_keys.digest(secret, "1,234") != unit_keys.digest(secret, 1234)
    assert unit_keys.digest(secret, "7\u200b") == unit_keys.digest(secret, 7)


def test_an_append_in_other_spellings_adds_no_person(client, keys) -> None:
    rng = np.random.default_rng(7)
    plain = ["-7", "1234", "123-45-6789", "ab-12"]
    made = upload(
        client,
        keys.owner,
        "x.csv",
        csv_rows(plain, rng.normal(size=(len(plain), 2)) * 0.1),
        privacy_unit_column="patient",
    )
    assert made.status_code == 201, made.text
    assert made.json()["n_units"] == 4
    texts = [_quoted(s) for key in plain for s in SPELLED[key] if isinstance(s, str)]
    grown = append(
        client,
        keys.owner,
        made.json()["id"],
        csv_rows(texts, rng.normal(size=(len(texts), 2)) * 0.1),
        filename="more.csv",
        privacy_unit_column="patient",
    )
    assert grown.status_code == 201, grown.text
    # The spreadsheet's batch, then the database's Parquet batch with the numbers as numbers.
    table = pa.table({"patient": pa.array([-7, 1234]), "a": rng.normal(size=2) * 0.1})
    table = table.append_column("b", pa.array(rng.normal(size=2) * 0.1))
    numbers = append(
        client,
        keys.owner,
        made.json()["id"],
        parquet_bytes(table),
        filename="db.parquet",
        privacy_unit_column="patient",
    )
    assert numbers.status_code == 201, numbers.text
    shown = client.get(f"/v1/datasets/{made.json()['id']}", headers=bearer(keys.analyst)).json()
    # Before: 4 + len(texts) (each spelling a new person of one row).
    assert (shown["n_rows"], shown["n_units"]) == (len(plain) + len(texts) + 2, 4)
