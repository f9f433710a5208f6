"""An outside dependability audit of the re-check thread (``service.reference_recheck``): one
re-check that cannot end must not hold back every other release's verdict, a database outage
is waited out and logged once, and whether the thread keeps up is visible on ``/metrics``.

Before, one release whose re-check raised (any non-outage error) stopped every pass at it: the
due ones behind it (earliest due first) were never re-checked, so never shown, and the error
was logged again every second."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import exc as sa_exc

from service import operations, reference_recheck, visibility
from service.db.models import Release, utcnow
from service.outages import OutageLog
from tests.conftest import bearer
from tests.test_concurrency import RELEASE, service_with_dataset


def _pending_releases(committed_db: Any, settings: Any, count: int) -> tuple[Any, list[uuid.UUID]]:
    """``count`` releases left by a worker as ``succeeded`` with their re-check pending and due
    (the earliest first); the dataset is an upload, so each verdict reads ``changed``."""
    app, factory, analyst, releases_url = service_with_dataset(committed_db, settings, "5")
    ids = []
    with TestClient(app) as client:
        for _ in range(count):
            answer = client.post(releases_url, headers=bearer(analyst), json=RELEASE)
            assert answer.status_code == 202, answer.text
            ids.append(uuid.UUID(answer.json()["id"]))
    with factory.begin() as session:
        for index, release_id in enumerate(ids):
            release = session.get(Release, release_id)
            assert release is not None
            release.status, release.reference_check = "succeeded", reference_recheck.PENDING
            release.created_at = utcnow() - timedelta(minutes=65 - index)
            release.visible_at = release.created_at + timedelta(hours=1)
    return factory, ids


def _checks(factory: Any, ids: list[uuid.UUID]) -> list[str | None]:
    with factory() as session:
        return [session.get(Release, rid).reference_check for rid in ids]


def _thread(factory: Any, settings: Any, outages: OutageLog | None = None) -> Any:
    stop = threading.Event()
    args = (factory, settings, stop) if outages is None else (factory, settings, stop, outages)
    thread = threading.Thread(target=reference_recheck.run, args=args, daemon=True)
    thread.start()
    return stop, thread


def _wait(predicate: Any, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_one_release_whose_recheck_fails_holds_back_no_other(
    committed_db: Any, settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    factory, ids = _pending_releases(committed_db, settings, 3)
    poison = ids[0]  # the earliest due: every pass met it first
    real = visibility.recheck_shown_at

    def shown_at(release: Release, *args: Any) -> Any:
        if release.id == poison:
            raise RuntimeError("an unexpected fault in this one release's re-check")
        return real(release, *args)

    monkeypatch.setattr(reference_recheck, "recheck_shown_at", shown_at)
    caplog.set_level(logging.ERROR, logger="service.reference_recheck")
    stop, thread = _thread(factory, settings)
    try:
        stored = _wait(lambda: _checks(factory, ids)[1:] == ["changed", "changed"])
        time.sleep(1.5)  # more passes: the fault is retried, not logged again each time
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert stored, _checks(factory, ids)
    assert _checks(factory, ids)[0] == "pending"  # left for a retry, not given a verdict
    bugs = [r for r in caplog.records if "BUG: re-check" in r.getMessage()]
    assert len(bugs) == 1, [r.getMessage() for r in bugs]
    assert "unexpected fault" not in caplog.text  # by location only


def test_a_database_outage_is_waited_out_and_logged_once(
    committed_db: Any, settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    factory, ids = _pending_releases(committed_db, settings, 2)
    real = reference_recheck.recheck
    failures = {"left": 4}

    def flaky(*args: Any) -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise sa_exc.TimeoutError("no pooled connection in time")
        return real(*args)

    monkeypatch.setattr(reference_recheck, "recheck", flaky)
    caplog.set_level(logging.WARNING)
    stop, thread = _thread(factory, settings, OutageLog())
    try:
        stored = _wait(lambda: _checks(factory, ids) == ["changed", "changed"])
    finally:
        stop.set()
        thread.join(timeout=10)
    assert stored and not thread.is_alive()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("database unavailable" in m for m in messages) == 1, messages
    assert sum("database available again" in m for m in messages) == 1, messages
    assert not any("BUG" in m for m in messages), messages


def test_metrics_show_how_late_the_earliest_pending_recheck_is(
    committed_db: Any, settings: Any
) -> None:
    factory, _ = _pending_releases(committed_db, settings, 2)
    with factory() as session:
        overdue = operations.figures(session, settings, utcnow()).recheck_overdue_seconds
    # The earliest is due 5 minutes ago (created 65 minutes ago, padded one hour).
    assert 299 <= overdue <= 330, overdue
    assert reference_recheck.recheck_due(factory, settings) == 2
    with factory() as session:
        assert operations.figures(session, settings, utcnow()).recheck_overdue_seconds == 0.0
