"""The key check (:func:`service.auth.authenticate`) on both databases."""

from __future__ import annotations

import pytest

from service import auth
from service.db.models import ApiKey, utcnow
from service.errors import Unauthenticated


def test_the_key_check_gives_the_principal_and_refuses_revoked_and_unknown_keys(
    session_factory,
):
    # Issue 35 item 2 made the check select the columns a Principal needs instead of the
    # ApiKey entity (CPU only: the same statement count, the same answers, pinned here).
    with session_factory.begin() as session:
        key, secret = auth.create_key(session, "analyst", "reader", actor_key_id=None)
        key_id = key.id
    with session_factory() as session:
        principal = auth.authenticate(session, secret)
        assert principal == auth.Principal(key_id, "analyst", "reader", restore_held=False)
    with session_factory.begin() as session:
        revoked = session.get(ApiKey, key_id)
        assert revoked is not None
        revoked.revoked_at = utcnow()
    with session_factory() as session, pytest.raises(Unauthenticated):
        auth.authenticate(session, secret)
    with session_factory() as session, pytest.raises(Unauthenticated):
        auth.authenticate(session, "not-a-key")
