"""A lock held by another session bounds an API request's wait: 503 with ``Retry-After`` after
``DPSS_DB_LOCK_TIMEOUT_SECONDS``, nothing changed.

Before, a request whose statement met a lock held outside the service (an idle transaction
holding a dataset's row, a maintenance ``LOCK TABLE``, an outside SQLite writer) waited as long
as that session chose, on its connection, slot and thread: for ever on PostgreSQL, 60 s (the
busy timeout) on SQLite. Fifteen such requests held every slot of an API process.

Real commits and a real pooled engine (the app builds its own), the lock taken on a connection
of its own. The request runs in a thread joined with a generous guard: the test does not time
anything; the guard only turns the old hang into a failure instead of a stuck suite.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, make_url, text

from service import auth
from service.app import create_app
from service.config import Settings
from service.db.engine import make_pooled_engine
from tests.conftest import bearer

#: Far beyond the lock timeout the test sets (0.2 s): reached only by a request that waits for
#: the lock itself (the old code: 60 s on SQLite, for ever on PostgreSQL).
GUARD_SECONDS = 40


def _answer_while_locked(hold: Any, release: Any, request: Any) -> Any:
    """``request()`` in a thread while ``hold()``'s lock is held; its answer (or None when it
    was still waiting after the guard), the lock released either way."""
    box: list[Any] = []
    hold()
    try:
        thread = threading.Thread(target=lambda: box.append(request()), daemon=True)
        thread.start()
        thread.join(GUARD_SECONDS)
        answered = box[0] if box else None
    finally:
        release()
    thread.join(GUARD_SECONDS)
    return answered


def test_a_lock_held_outside_the_service_gives_503_and_changes_nothing(
    settings, committed_db, backend, upload_dataset
):
    url, factory = committed_db
    settings = settings.model_copy(update={"db_lock_timeout_seconds": 0.2})
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "owner", actor_key_id=None)  # type: ignore[arg-type]
        _, analyst = auth.create_key(session, "analyst", "analyst", actor_key_id=None)  # type: ignore[arg-type]
    rows = np.random.default_rng(0).normal(size=(50, 4)) / 4
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        dataset = upload_dataset(client, owner, rows, row_norm_bound=1.0)["id"]
        body = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-6"}

        def request() -> Any:
            return client.post(
                f"/v1/datasets/{dataset}/releases", headers=bearer(analyst), json=body
            )

        if backend == "sqlite":
            # Another program writing to the store: it holds SQLite's write lock.
            outside = sqlite3.connect(make_url(url).database or "", isolation_level=None)

            def hold() -> None:
                outside.execute("BEGIN IMMEDIATE")

            def release() -> None:
                outside.execute("ROLLBACK")
                outside.close()

        else:
            # An idle transaction elsewhere holding the dataset's row (the row a release
            # request locks to charge the budget).
            engine = create_engine(url)
            connection = engine.connect()

            def hold() -> None:
                connection.execute(
                    text("SELECT 1 FROM datasets WHERE id = :id FOR UPDATE"), {"id": dataset}
                )

            def release() -> None:
                connection.rollback()
                connection.close()
                engine.dispose()

        answer = _answer_while_locked(hold, release, request)
        assert answer is not None, "the request waited for the outside lock"
        assert answer.status_code == 503, answer.text
        assert int(answer.headers["Retry-After"]) >= 1
        assert answer.json()["error"] == "service_unavailable"
        assert "Traceback" not in answer.text
        # Nothing was queued or charged, and the service serves once the lock is gone.
        listed = client.get(f"/v1/datasets/{dataset}/releases", headers=bearer(owner))
        assert listed.status_code == 200 and listed.json()["total"] == 0, listed.text
        spent = client.get(f"/v1/datasets/{dataset}/budget", headers=bearer(analyst)).json()
        assert spent["epsilon_spent"] == "0", spent
        again = request()
        assert again.status_code == 202, again.text


def test_the_api_engine_bounds_lock_waits_by_the_setting(tmp_path, database_urls, backend):
    settings = Settings(
        data_dir=tmp_path, database_url=database_urls[backend], db_lock_timeout_seconds=1.5
    )
    engine = make_pooled_engine(settings)
    try:
        with engine.connect() as connection:
            if backend == "sqlite":
                shown = connection.exec_driver_sql("PRAGMA busy_timeout").scalar()
                assert shown == 1500
            else:
                shown = connection.exec_driver_sql("SHOW lock_timeout").scalar()
                assert shown == "1500ms"
    finally:
        engine.dispose()
