"""An app's request validators are built by ``create_app``, never while it serves.

FastAPI builds each parameter's validator from a ``Field`` carrying the alias it gives every
parameter; pydantic warns (``UnsupportedFieldAttributeWarning``) that the alias has no effect
there, and FastAPI silences that with ``warnings.catch_warnings`` and an ``ignore`` filter. The
filter list is one per process: another thread in ``catch_warnings`` meanwhile (another app's
server building its own routes) can put back a list without the filter, and the warning got
out in some test orders, from routes FastAPI built lazily at an app's first request.
"""

from __future__ import annotations

import warnings

import pytest
from fastapi.testclient import TestClient
from pydantic.warnings import UnsupportedFieldAttributeWarning
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.config import Settings
from tests.conftest import Keys, bearer


def test_serving_builds_no_validator(
    settings: Settings,
    session_factory: sessionmaker[Session],
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = create_app(settings, session_factory=session_factory)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Every filter FastAPI would add from now on is dropped, as a racing thread would.
        monkeypatch.setattr(warnings, "simplefilter", lambda *args, **kwargs: None)
        with TestClient(app, raise_server_exceptions=False) as client:
            for path in (
                "/healthz",
                "/v1/datasets?limit=5",
                "/v1/releases?limit=5&with_basis=false",
                "/v1/audit?limit=5",
                "/dashboard/owner",
                "/openapi.json",
            ):
                assert client.get(path, headers=bearer(keys.admin)).status_code < 500, path
    unsupported = [w for w in caught if issubclass(w.category, UnsupportedFieldAttributeWarning)]
    assert unsupported == [], [str(w.message)[:80] for w in unsupported]
