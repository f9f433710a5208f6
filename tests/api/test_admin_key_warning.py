"""A service started with no admin key says so at start: without it a new user's POST /v1/keys
met only "invalid or revoked API key", with nothing saying that no admin key exists."""

from __future__ import annotations

import logging

from fastapi.testclient import TestClient

from service import auth
from service.app import create_app


def test_start_without_any_admin_key_warns_and_names_the_setting(
    settings, session_factory, make_key, caplog
):
    with (
        caplog.at_level(logging.WARNING, logger="dpss"),
        TestClient(create_app(settings, session_factory=session_factory)),
    ):
        pass
    warned = [r.getMessage() for r in caplog.records if r.getMessage() == auth.NO_ADMIN_KEY]
    assert len(warned) == 1
    assert "DPSS_ADMIN_API_KEY" in warned[0] and "dpss keys create --role admin" in warned[0]

    # With an active admin key in the database there is nothing to say.
    make_key("admin")
    caplog.clear()
    with (
        caplog.at_level(logging.WARNING, logger="dpss"),
        TestClient(create_app(settings, session_factory=session_factory)),
    ):
        pass
    assert auth.NO_ADMIN_KEY not in caplog.text


def test_a_revoked_admin_key_is_no_admin_key(session_factory, make_key):
    make_key("analyst")
    with session_factory() as session:
        assert not auth.has_admin_key(session)
    with session_factory.begin() as session:
        key, _ = auth.create_key(session, "admin", "first admin", actor_key_id=None)
    with session_factory.begin() as session:
        assert auth.has_admin_key(session)
        auth.revoke_key(session, key.id, actor_key_id=None)
    with session_factory() as session:
        assert not auth.has_admin_key(session)
