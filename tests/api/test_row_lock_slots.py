"""A request waiting for a dataset's row held elsewhere holds no database slot while it waits.

Before, a request that locks a dataset's row (here a release request) waited for it up to
``DPSS_DB_LOCK_TIMEOUT_SECONDS`` inside its unit of work, holding one of its process's slots and
a pooled connection. With a row held by an outside session, a few requests to that dataset took
every slot, so a request to ANOTHER dataset queued behind them until the first of them gave up
(after the lock timeout), and the requests to the locked dataset that came after the slots were
taken waited for a slot first and then for the row: 503 after twice the lock timeout.

Now (``service.row_locks``, ``service.api.deps.Database.run``) the row is taken in short
attempts; between them the request gives back its connection and slot. PostgreSQL only: SQLite
has no row locks (its one write lock is taken by every transaction, ``tests/api/
test_lock_waits.py`` covers it).

Nothing here is timed against a wall-clock bound: the other dataset's answer must come before
any of the locked requests' (an order of events), and the locked requests' answers must come
together (the last one's time over the first one's, measured in this process: about 1, where
the old code made it about 2).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text

from service import auth, datasets, row_locks
from service.app import create_app
from service.db.engine import make_pooled_engine, make_session_factory
from service.db.models import ApiKey
from tests.conftest import SKIP_POSTGRES, bearer, npy_bytes

pytestmark = [
    pytest.mark.skipif(SKIP_POSTGRES, reason="PostgreSQL only"),
    pytest.mark.parametrize("backend", ["postgresql"], indirect=True),
]

#: The lock timeout the test sets: long enough that the other dataset's request, on a loaded
#: machine, is served well inside it (it needs a slot for milliseconds).
LOCK_TIMEOUT = 4.0
SLOTS = 2
FIRST_ATTEMPT = 0.1
LOCKED_REQUESTS = 4
#: Guard against a hang (the test never waits this long unless something is broken).
GUARD_SECONDS = 60

BODY = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-6"}


def _lock_waiters(engine: Any) -> int:
    """Backends of the test database waiting for a lock now."""
    with engine.connect() as connection:
        return int(
            connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_requests_to_a_locked_dataset_hold_no_slot_while_they_wait(
    settings, committed_db, upload_dataset
):
    url, factory = committed_db
    settings = settings.model_copy(
        update={
            "db_lock_timeout_seconds": LOCK_TIMEOUT,
            # The first attempt short too (the default's is 1 s, for ordinary contention), so
            # the slots' queue does not order the four waits by whole seconds.
            "db_lock_attempt_seconds": FIRST_ATTEMPT,
            "db_pool_size": SLOTS,
            "db_max_overflow": 0,
            "db_wait_seconds": 30,
        }
    )
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "owner", actor_key_id=None)  # type: ignore[arg-type]
        _, analyst = auth.create_key(session, "analyst", "analyst", actor_key_id=None)  # type: ignore[arg-type]
    rows = np.random.default_rng(0).normal(size=(50, 4)) / 4
    outside = create_engine(url)
    connection = outside.connect()
    try:
        with TestClient(create_app(settings), raise_server_exceptions=False) as client:
            locked = upload_dataset(client, owner, rows, row_norm_bound=1.0)["id"]
            other = upload_dataset(client, owner, rows, row_norm_bound=1.0)["id"]
            # Verify the analyst's key once, so that no request below needs a unit of work
            # for it before its body (the same for the old code and the new).
            assert client.get("/v1/whoami", headers=bearer(analyst)).status_code == 200

            answered: list[tuple[str, float, Any]] = []
            done = threading.Lock()
            started = time.monotonic()

            def request(dataset: str, name: str) -> None:
                answer = client.post(
                    f"/v1/datasets/{dataset}/releases", headers=bearer(analyst), json=BODY
                )
                with done:
                    answered.append((name, time.monotonic() - started, answer))

            # An idle transaction elsewhere holding the dataset's row.
            connection.execute(
                text("SELECT 1 FROM datasets WHERE id = :id FOR UPDATE"), {"id": locked}
            )
            with ThreadPoolExecutor(LOCKED_REQUESTS + 1) as pool:
                futures = [
                    pool.submit(request, locked, f"locked-{i}") for i in range(LOCKED_REQUESTS)
                ]
                # Once one of them waits for the row (the old code: with a slot each, both
                # slots taken), the other dataset's request.
                deadline = time.monotonic() + GUARD_SECONDS
                while _lock_waiters(outside) == 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
                futures.append(pool.submit(request, other, "other"))
                for future in futures:
                    future.result(timeout=GUARD_SECONDS)
            connection.rollback()

            order = [name for name, _, _ in answered]
            by_name = {name: answer for name, _, answer in answered}
            assert by_name["other"].status_code == 202, by_name["other"].text
            # The other dataset was served while every request to the locked one still waited.
            assert order[0] == "other", order
            waits = [seconds for name, seconds, _ in answered if name != "other"]
            for name, _, answer in answered:
                if name == "other":
                    continue
                assert answer.status_code == 503, answer.text
                assert int(answer.headers["Retry-After"]) >= 1
                assert answer.json()["error"] == "service_unavailable"
            # Each after about the lock timeout: together, not in two waves (slot, then row).
            print("answers (s from the first request):", [(n, round(t, 2)) for n, t, _ in answered])
            assert max(waits) / min(waits) < 1.5, waits
            # Nothing was queued or charged by them, and the dataset serves again.
            listed = client.get(f"/v1/datasets/{locked}/releases", headers=bearer(owner))
            assert listed.status_code == 200 and listed.json()["total"] == 0, listed.text
            again = client.post(
                f"/v1/datasets/{locked}/releases", headers=bearer(analyst), json=BODY
            )
            assert again.status_code == 202, again.text
    finally:
        connection.close()
        outside.dispose()


def test_an_attempt_gives_the_row_up_and_puts_the_lock_timeout_back(settings, committed_db):
    """:func:`row_locks.lock_one` in a marked session (any row; here a key's): :class:`RowBusy`
    for a row held elsewhere (the transaction then rolls back); once it has the row, the
    connection's own ``lock_timeout`` holds again for the rest of the transaction."""
    url, factory = committed_db
    settings = settings.model_copy(update={"db_lock_timeout_seconds": 1.5})
    with factory.begin() as session:
        key, _ = auth.create_key(session, "owner", "owner", actor_key_id=None)  # type: ignore[arg-type]
        key_id = key.id
    engine = make_pooled_engine(settings)
    sessions = make_session_factory(engine)
    statement = select(ApiKey.id).where(ApiKey.id == key_id).with_for_update()
    outside = create_engine(url)
    try:
        with sessions.begin() as session:
            session.info[row_locks.ATTEMPT_SECONDS] = 0.05
            assert row_locks.lock_one(session, statement) == key_id
            assert session.execute(text("SHOW lock_timeout")).scalar_one() == "1500ms"
        with outside.connect() as connection:
            connection.execute(
                text("SELECT 1 FROM api_keys WHERE id = :id FOR UPDATE"), {"id": key_id}
            )
            with pytest.raises(row_locks.RowBusy), sessions.begin() as session:
                session.info[row_locks.ATTEMPT_SECONDS] = 0.05
                row_locks.lock_one(session, statement)
            connection.rollback()
    finally:
        outside.dispose()
        engine.dispose()


def test_a_unit_of_work_run_again_after_the_row_is_given_back_does_its_work_once(
    settings, committed_db, upload_dataset
):
    """Retry-safety: an append and a release request that found the row held elsewhere (each
    tried at least once in vain, seen as a lock waiter) succeed once it is given back, with the
    appended batch's rows (the ingested file kept between attempts) and one charge."""
    url, factory = committed_db
    settings = settings.model_copy(update={"db_lock_timeout_seconds": 30})
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "owner", actor_key_id=None)  # type: ignore[arg-type]
        _, analyst = auth.create_key(session, "analyst", "analyst", actor_key_id=None)  # type: ignore[arg-type]
    rng = np.random.default_rng(1)
    outside = create_engine(url)
    try:
        with TestClient(create_app(settings), raise_server_exceptions=False) as client:
            dataset = upload_dataset(client, owner, rng.normal(size=(5, 3)) / 4, row_norm_bound=1)
            dataset_id = dataset["id"]
            batch = rng.normal(size=(4, 3)) / 4

            def append() -> Any:
                return client.post(
                    f"/v1/datasets/{dataset_id}/rows",
                    headers=bearer(owner),
                    files={"file": ("rows.npy", npy_bytes(batch), "application/octet-stream")},
                )

            def release() -> Any:
                return client.post(
                    f"/v1/datasets/{dataset_id}/releases", headers=bearer(analyst), json=BODY
                )

            for request, status in ((append, 201), (release, 202)):
                with outside.connect() as connection, ThreadPoolExecutor(1) as pool:
                    connection.execute(
                        text("SELECT 1 FROM datasets WHERE id = :id FOR UPDATE"),
                        {"id": dataset_id},
                    )
                    future = pool.submit(request)
                    # Two sightings of a waiter: at least one attempt timed out in between
                    # (each lasts 0.1 s, then a pause without the row's lock queue).
                    seen, deadline = 0, time.monotonic() + GUARD_SECONDS
                    while seen < 2 and time.monotonic() < deadline and not future.done():
                        if _lock_waiters(outside):
                            seen += 1
                            time.sleep(0.15)
                        time.sleep(0.01)
                    assert not future.done(), future.result().text
                    connection.rollback()
                    answer = future.result(timeout=GUARD_SECONDS)
                assert answer.status_code == status, answer.text
            shown = client.get(f"/v1/datasets/{dataset_id}", headers=bearer(owner)).json()
            assert (shown["n_rows"], shown["n_batches"]) == (9, 2), shown
            listed = client.get(f"/v1/datasets/{dataset_id}/releases", headers=bearer(owner))
            assert listed.json()["total"] == 1, listed.text
        with factory.begin() as session:
            charges = session.execute(
                text("SELECT count(*) FROM ledger_entries WHERE kind = 'charge'")
            ).scalar_one()
        assert charges == 1
    finally:
        outside.dispose()


def test_a_deletion_that_waited_for_the_row_sees_the_deletion_that_held_it(
    settings, committed_db, upload_dataset
):
    """Two deletions of one dataset (a client's retry after a timeout, say): the one that
    waited for the row while the other held it reads the row after the other committed, and
    answers 404; it must not delete again from what it read before the wait (a second
    ``dataset_deleted`` event, ``deleted_at`` moved later: refunds between the two moments
    would then count, ``service.ledger.in_effect``). The wait is one attempt long (the
    attempt as long as the lock timeout), so the other commits while it waits."""
    url, factory = committed_db
    settings = settings.model_copy(
        update={"db_lock_timeout_seconds": 30, "db_lock_attempt_seconds": 30}
    )
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "owner", actor_key_id=None)  # type: ignore[arg-type]
    rows = np.random.default_rng(2).normal(size=(5, 3)) / 4
    outside = create_engine(url)
    try:
        with TestClient(create_app(settings), raise_server_exceptions=False) as client:
            dataset_id = upload_dataset(client, owner, rows, row_norm_bound=1)["id"]
            with outside.connect() as connection, ThreadPoolExecutor(1) as pool:
                # The other deletion, holding the row until it commits.
                first = connection.execute(
                    text(
                        "UPDATE datasets SET deleted_at = now(), file_name = NULL "
                        "WHERE id = :id RETURNING deleted_at"
                    ),
                    {"id": dataset_id},
                ).scalar_one()
                future = pool.submit(
                    client.delete, f"/v1/datasets/{dataset_id}", headers=bearer(owner)
                )
                deadline = time.monotonic() + GUARD_SECONDS
                while not _lock_waiters(outside) and time.monotonic() < deadline:
                    assert not future.done(), future.result().text
                    time.sleep(0.01)
                connection.commit()
                answer = future.result(timeout=GUARD_SECONDS)
            assert answer.status_code == 404, answer.text
        with factory.begin() as session:
            deleted_at, events = session.execute(
                text(
                    "SELECT d.deleted_at, (SELECT count(*) FROM audit_events e "
                    "WHERE e.event_type = 'dataset_deleted') FROM datasets d WHERE d.id = :id"
                ),
                {"id": dataset_id},
            ).one()
        assert deleted_at == first
        assert events == 0
    finally:
        outside.dispose()


def test_an_append_that_never_got_the_row_answers_503_without_waiting_for_it_again(
    settings, committed_db, upload_dataset, monkeypatch
):
    """An append that gave up on a row held elsewhere (503 once ``db_lock_timeout_seconds``
    passed) wrote nothing to the dataset's file: there is nothing to cut off, so it must not
    wait for the row again to trim it (the answer would come after twice the lock timeout,
    not the documented once); its ingested batch is still discarded. Counted, not timed: the
    trim's unit of work is not run."""
    url, factory = committed_db
    settings = settings.model_copy(update={"db_lock_timeout_seconds": 0.5})
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "owner", actor_key_id=None)  # type: ignore[arg-type]
    rng = np.random.default_rng(3)
    trims: list[str] = []
    real_trim = datasets.trim_uncommitted

    def counted_trim(session: Any, store: Any, dataset_id: Any) -> None:
        trims.append(str(dataset_id))
        real_trim(session, store, dataset_id)

    monkeypatch.setattr(datasets, "trim_uncommitted", counted_trim)
    outside = create_engine(url)
    try:
        with TestClient(create_app(settings), raise_server_exceptions=False) as client:
            dataset_id = upload_dataset(
                client, owner, rng.normal(size=(5, 3)) / 4, row_norm_bound=1
            )["id"]
            store_dir = Path(settings.data_dir)
            before = sorted(p.name for p in store_dir.rglob("*") if p.is_file())
            with outside.connect() as connection:
                connection.execute(
                    text("SELECT 1 FROM datasets WHERE id = :id FOR UPDATE"), {"id": dataset_id}
                )
                answer = client.post(
                    f"/v1/datasets/{dataset_id}/rows",
                    headers=bearer(owner),
                    files={
                        "file": (
                            "rows.npy",
                            npy_bytes(rng.normal(size=(4, 3)) / 4),
                            "application/octet-stream",
                        )
                    },
                )
                connection.rollback()
            assert answer.status_code == 503, answer.text
            assert trims == []
            # The ingested batch is gone: the data directory holds what it held before.
            assert sorted(p.name for p in store_dir.rglob("*") if p.is_file()) == before
            shown = client.get(f"/v1/datasets/{dataset_id}", headers=bearer(owner)).json()
            assert (shown["n_rows"], shown["n_batches"]) == (5, 1), shown
    finally:
        outside.dispose()
