"""Building an app declares no route: every parameter's validator is built once, at import.

FastAPI builds a parameter's validator when a route is declared, from a ``Field`` carrying the
alias it gives every parameter; pydantic warns (``UnsupportedFieldAttributeWarning``) that the
alias has no effect there, and FastAPI silences that with ``warnings.catch_warnings`` and an
``ignore`` filter. The filter list is process-wide: another thread entering and leaving
``catch_warnings`` meanwhile (a Dask cluster's event loop in the test process) can put back a
list without the filter, and the warning got out in some test orders. Routes declared inside
``create_app`` (the dashboard's were) built validators on every call; now none does.
"""

from __future__ import annotations

import warnings

import pytest
from pydantic.warnings import UnsupportedFieldAttributeWarning
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.config import Settings


def test_create_app_builds_no_parameter_validator(
    settings: Settings, session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every filter FastAPI would add is dropped, as a racing thread's catch_warnings would.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monkeypatch.setattr(warnings, "simplefilter", lambda *args, **kwargs: None)
        for _ in range(2):
            create_app(settings, session_factory=session_factory)
    unsupported = [w for w in caught if issubclass(w.category, UnsupportedFieldAttributeWarning)]
    assert unsupported == [], [str(w.message)[:80] for w in unsupported]
