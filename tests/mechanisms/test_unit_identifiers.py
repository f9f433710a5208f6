"""The identifier rule (service.privacy_unit.person_key) and its versioning by the dataset's
secret (service.unit_keys): spellings of one identifier are one person for datasets uploaded
from now on, and a dataset uploaded before keeps its first rule for its appends (its stored
digests were made with it; changing the rule under it would split every returning person)."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest

from service import unit_keys
from service.errors import InvalidInput
from service.privacy_unit import canonical_key, person_key, rounded_key

SAME = [
    ["7", "7.0", " 7", "007", "+7", "7e0", np.int64(7), 7.0, np.float32(7.0), "\uff17"],
    [unicodedata.normalize("NFC", "Jos\u00e9"), unicodedata.normalize("NFD", "Jos\u00e9 ")],
    ["alice", "Alice", "ALICE  ", "\u00a0alice"],
    ["Mary  Ann", "mary ann", "Mary\tAnn"],
    ["-0", "0", 0.0, -0.0, np.int32(0)],
    ["1e20", 1e20, "100000000000000000000"],
    ["7.5", 7.5, "07.50"],
]
APART = ["7", "8", "7.5", "alice", "alicia", "1e999", "x" + "1" * 5000, "1" * 5000, "inf", "nan"]


@pytest.mark.parametrize("group", SAME)
def test_spellings_of_one_identifier_are_one_person(group: list) -> None:
    secret = unit_keys.new_secret()
    digests = unit_keys.row_digests(secret, group)
    assert len({row.tobytes() for row in digests}) == 1, group
    assert len({person_key(value) for value in group}) == 1


def test_different_identifiers_stay_apart() -> None:
    secret = unit_keys.new_secret()
    digests = unit_keys.row_digests(secret, APART)
    assert len({row.tobytes() for row in digests}) == len(APART)


def test_a_dataset_from_before_keeps_its_first_rule() -> None:
    """A 32-byte secret (every dataset uploaded before the rule): the digests are the ones its
    stored people have, text as text and numbers as numbers."""
    import hashlib
    import hmac

    old = bytes(range(32))
    assert unit_keys.rule_of(old) == "first"
    assert unit_keys.digest(old, "7") == hmac.new(old, b"s\x007", hashlib.sha256).digest()
    assert unit_keys.digest(old, 7.0) == hmac.new(old, b"n\x007", hashlib.sha256).digest()
    assert unit_keys.digest(old, "7") != unit_keys.digest(old, 7)
    assert canonical_key("7") != canonical_key(7)
    new = bytes([unit_keys.PERSON_RULE]) + old
    assert unit_keys.rule_of(new) == "person"
    assert unit_keys.digest(new, "7") == unit_keys.digest(new, 7)
    for bad in (b"", old[:31], bytes([9]) + old, old + old):
        with pytest.raises(ValueError):
            unit_keys.rule_of(bad)


BEYOND = [
    ["12345678901234567", np.int64(12345678901234567), np.float64(12345678901234567)],
    ["1e300", np.float64(1e300), str(int(1e300)), "1" + "0" * 300],
    [str(2**53), str(2**53 + 1), np.uint64(2**53 + 1), float(2**53)],
    ["18446744073709551615", np.uint64(2**64 - 1), np.float64(2**64)],
]


@pytest.mark.parametrize("group", BEYOND)
def test_beyond_2_53_every_spelling_is_its_float64_rounding(group: list) -> None:
    """The current rule: a float file holds an identifier beyond 2**53 only rounded, so the
    exact integer (CSV text, Parquet int64) and the float are one person (before: two)."""
    secret = unit_keys.new_secret()
    # The current rule (spelled) is the rounded one for numbers.
    assert unit_keys.rule_of(secret) == "spelled"
    digests = unit_keys.row_digests(secret, group)
    rounded = bytes([unit_keys.ROUNDED_RULE]) + bytes(range(32))
    assert len({row.tobytes() for row in unit_keys.row_digests(rounded, group)}) == 1, group
    assert len({row.tobytes() for row in digests}) == 1, group
    assert len({rounded_key(value) for value in group}) == 1


def test_below_2_53_and_beyond_floats_nothing_merges() -> None:
    secret = unit_keys.new_secret()
    apart = [*APART, str(2**53 - 1), str(2**53 - 2), "1" + "0" * 400, "1" + "0" * 399 + "1"]
    digests = unit_keys.row_digests(secret, apart)
    assert len({row.tobytes() for row in digests}) == len(apart)


def test_a_dataset_of_the_person_rule_keeps_it() -> None:
    """A secret marked with the person rule (datasets uploaded before the rounded one): its
    appends keep its digests within 2**53, and refuse a number beyond (exact there, rounded
    in a float file: one person would become two)."""
    secret = bytes([unit_keys.PERSON_RULE]) + bytes(range(32))
    assert unit_keys.rule_of(secret) == "person"
    assert unit_keys.digest(secret, "7") == unit_keys.digest(secret, 7.0)
    assert unit_keys.digest(secret, str(2**53)) == unit_keys.digest(secret, float(2**53))
    for beyond in ("12345678901234567", 12345678901234568.0, np.int64(-(2**60)), "1e300"):
        with pytest.raises(InvalidInput) as refused:
            unit_keys.digest(secret, beyond)
        assert refused.value.field == "privacy_unit_column"
        assert "1234567" not in str(refused.value)
