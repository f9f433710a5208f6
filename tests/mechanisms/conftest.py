"""Fixtures shared by the mechanism tests."""

from __future__ import annotations

import pytest

from service.mechanisms import friendly_ptr


@pytest.fixture
def basic_accounting(monkeypatch: pytest.MonkeyPatch) -> None:
    """friendly_aggregate with its basic accounting (M6, derivations F1 and F2: a Laplace test
    and sequential composition) instead of the default F3 rule: for the tests that pin the
    basic shares, draws and audits."""
    monkeypatch.setattr(friendly_ptr, "ACCOUNTING", "basic")
