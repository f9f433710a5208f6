"""The suite's own order (tests/conftest.py): every test it moves to the front still exists, so a
rename cannot silently send a long test back to the tail of an xdist run."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONG_TESTS

ROOT = Path(__file__).resolve().parents[1]


def test_every_long_test_moved_first_is_a_test_of_the_suite() -> None:
    missing = []
    for name in LONG_TESTS:
        path, function = name.split("::")
        source = ROOT / path
        if not source.is_file() or f"def {function}(" not in source.read_text():
            missing.append(name)
    assert missing == []
    assert len(set(LONG_TESTS)) == len(LONG_TESTS)
