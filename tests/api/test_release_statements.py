"""What one release through ``POST /v1/datasets/{id}/releases?wait=`` reads of its dataset
(issue 35, item 2: the service's CPU per release). Counted with an SQLAlchemy event, not timed.

The dataset's row is read once, locked by the charge. The creating transaction's first read of
the release finds it in the session (it selected the whole row again once the charge had let go
of it: the session holds rows weakly), and the read after the worker's hint asks for the one
column it needs, the deletion moment (the whole row, nine exact decimals among its columns, was
most of that read's cost).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event, update

from service import waiters
from service.db.models import Dataset, Release
from service.release_rows import read_release
from service.visibility import dataset_deleted_at
from tests.api.conftest import BODY, Service
from tests.conftest import bearer


def _whole_dataset_row(statement: str) -> bool:
    return "FROM datasets" in statement and "datasets.owner_key_id" in statement


def test_a_waited_release_reads_its_dataset_row_once(
    make_service: Callable[..., Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = make_service()
    import service.api.releases as api_releases

    for module in (waiters, api_releases):  # no re-read at a timer: the hint answers
        monkeypatch.setattr(module, "RECHECK_SECONDS", waiters.MAX_WAIT_SECONDS, raising=False)
    hub = service.client.app.state.release_waiters
    bind = hub.bind
    working = threading.Event()

    def run_then_bind(waiter: waiters.Waiter, release_id: Any) -> None:
        # The worker ends the job between the creating commit and the wait (its statements are
        # not the API's); the wait's read then follows its hint.
        working.set()
        try:
            assert service.worker.run_pending() == 1
        finally:
            working.clear()
        bind(waiter, release_id)

    monkeypatch.setattr(hub, "bind", run_then_bind)
    engine = service.factory.kw["bind"]
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not working.is_set():
            seen.append(" ".join(statement.split()))

    event.listen(engine, "after_cursor_execute", record)
    try:
        answer = service.client.post(
            f"/v1/datasets/{service.dataset}/releases",
            headers=bearer(service.keys["analyst"]),
            json=BODY,
            params={"wait": "30"},
        )
    finally:
        event.remove(engine, "after_cursor_execute", record)
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "succeeded"
    # The answer is the release as a GET shows it.
    assert service.get(answer.json()["id"]).json() == answer.json()
    whole = [statement for statement in seen if _whole_dataset_row(statement)]
    assert len(whole) == 1, whole  # the charge's lock (3 before: each read selected it again)
    # The read after the hint: the dataset's deletion moment comes with the release's row
    # (service.release_rows.read_release), not in a statement of its own.
    deleted_at = [s for s in seen if s.startswith("SELECT datasets.deleted_at FROM datasets")]
    assert deleted_at == [], seen
    with_release = [s for s in seen if s.startswith("SELECT releases.id") and "datasets" in s]
    assert len(with_release) == 1, seen
    assert "datasets.deleted_at" in with_release[0]


def test_the_deletion_moment_is_read_alike_from_the_session_or_the_database(
    make_service: Callable[..., Service],
) -> None:
    service = make_service()
    release_id = uuid.UUID(service.request())
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    with service.factory.begin() as session:
        session.execute(update(Dataset).values(deleted_at=moment))
    with service.factory() as session:
        release = session.get(Release, release_id)
        assert release is not None
        from_column = dataset_deleted_at(session, release)  # not in the session: one column
        held = session.get(Dataset, release.dataset_id)
        assert held is not None
        from_session = dataset_deleted_at(session, release)
        settled = dataset_deleted_at(session, release, settled=True)
    with service.factory() as session:
        read = read_release(session, release_id)  # with the release's own row
        assert read is not None
        with_release = dataset_deleted_at(session, read)
    assert from_column == from_session == settled == with_release == moment
    assert from_column is not None and from_column.tzinfo is not None
