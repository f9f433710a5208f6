"""Two workers' re-check threads take the same due re-check at once (real commits, separate
connections: ``committed_db``): one verdict is stored, once, and the other thread stores
nothing (it finds the release no longer pending under the row's lock)."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service import reference_recheck
from service.db.models import Release, utcnow
from tests.conftest import bearer
from tests.test_concurrency import RELEASE, service_with_dataset


def test_two_rechecks_of_one_release_store_one_verdict(
    committed_db: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, factory, analyst, releases_url = service_with_dataset(committed_db, settings, "1")
    with TestClient(app) as client:
        answer = client.post(releases_url, headers=bearer(analyst), json=RELEASE)
    assert answer.status_code == 202, answer.text
    release_id = uuid.UUID(answer.json()["id"])
    # As a worker leaves a one-shot release on a dataset by reference, its outcome due: the
    # dataset here is an upload (no record to read), so the verdict is ``changed``.
    with factory.begin() as session:
        release = session.get(Release, release_id)
        assert release is not None
        release.status, release.reference_check = "succeeded", reference_recheck.PENDING
        release.created_at = utcnow() - timedelta(minutes=65)
        release.visible_at = release.created_at + timedelta(hours=1)
    both_read = threading.Barrier(2, timeout=30)
    real = reference_recheck.verdict

    def meet(*args: Any, **kwargs: Any) -> str:
        both_read.wait()  # both threads found it pending before either stores
        return real(*args, **kwargs)

    monkeypatch.setattr(reference_recheck, "verdict", meet)
    stored: list[str | None] = []
    threads = [
        threading.Thread(
            target=lambda: stored.append(reference_recheck.recheck(factory, settings, release_id))
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(map(str, stored)) == ["None", "changed"]
    with factory() as session:
        release = session.get(Release, release_id)
        assert release is not None and release.visible_at is not None
        assert release.reference_check == "changed"
        assert release.reference_shown_at == release.visible_at + timedelta(minutes=15)
