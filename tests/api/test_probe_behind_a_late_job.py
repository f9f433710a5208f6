"""A job requested behind a *late* one must not tell when that one really ended.

The padding's queue term counts the one-shot releases not yet past their own ``visible_at``
(``tests/reference/test_probe_behind_a_long_job.py``). A job past its ``visible_at`` but still
running (late: its outcome shows only at the next step of its public late schedule) counted
for nothing, yet the one worker was still busy with it. So a cheap probe requested after the
late job's ``visible_at`` was padded to its floor and showed at its ``visible_at`` if the late
job had ended by then, a step later if not: anyone (on any dataset) read the late job's real
end to within the probe's floor, where its own analysts learn only the step of its schedule.
Now a late job whose outcome is not shown counts until the next step of its schedule (a
public moment), so in two worlds where the late job ends at different moments within the same
step, the probe shows the same at the same moments.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db.models import Release, utcnow
from service.padding import late_schedule
from service.worker import Worker
from tests.conftest import Keys, bearer

PAD = 1.0
JOB = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}
#: When the slow world's late job really ends, after the request of the probe: past the
#: probe's former visible_at (PAD), before the late job's next step (about 2 PAD).
SLOW_END = PAD + 0.6


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"release_padding_floor_seconds": PAD, "release_padding_calibrated": False}
    )


def _at(moment: str) -> float:
    """Seconds from now to ``moment`` (an API timestamp)."""
    when = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    return (when - datetime.now(when.tzinfo)).total_seconds()


def _status(client: TestClient, key: str, release: str) -> str:
    return str(client.get(f"/v1/releases/{release}", headers=bearer(key)).json()["status"])


def _end(session_factory: sessionmaker[Session], late: uuid.UUID) -> None:
    """The late job really ends now: stored with its late schedule's step, as a worker does."""
    with session_factory.begin() as session:
        row = session.get(Release, late)
        assert row is not None and row.visible_at is not None
        now = utcnow()
        row.status, row.reason, row.finished_at = "no_result", "no gap", now
        row.outcome_visible_at = late_schedule(row.created_at, row.visible_at, now)[0]
        row.lease_owner = None


def test_a_probe_behind_a_late_job_shows_the_same_whichever_moment_it_ended(
    client: TestClient,
    keys: Keys,
    make_key: Any,
    upload_dataset: Any,
    worker: Worker,
    session_factory: sessionmaker[Session],
) -> None:
    rows = np.random.default_rng(0).normal(size=(200, 3)) / 4
    target = upload_dataset(client, make_key("owner"), rows, row_norm_bound=1.0)
    mine = upload_dataset(client, keys.owner, rows[::-1].copy(), row_norm_bound=1.0)
    seen: dict[str, list[str]] = {}
    offsets: list[float] = []
    for world in ("early", "late"):
        made = client.post(
            f"/v1/datasets/{target['id']}/releases", headers=bearer(keys.analyst), json=JOB
        )
        assert made.status_code == 202, made.text
        late = uuid.UUID(made.json()["id"])
        with session_factory.begin() as session:
            # Requested 2.05 paddings ago and still running on another worker: past its
            # visible_at and its first late step, shown `running` until its next step.
            row = session.get(Release, late)
            assert row is not None and row.visible_at is not None
            padding = row.visible_at - row.created_at
            row.created_at = utcnow() - padding * 2.05
            row.visible_at = row.created_at + padding
            row.status, row.lease_owner = "running", "another worker"
            row.lease_expires_at = utcnow() + timedelta(hours=1)
            row.started_at = row.created_at
            created = row.created_at

        probe = client.post(
            f"/v1/datasets/{mine['id']}/releases", headers=bearer(keys.analyst), json=JOB
        )
        assert probe.status_code == 202, probe.text
        requested = time.monotonic()
        probe_id = probe.json()["id"]
        if world == "early":
            _end(
                session_factory, late
            )  # the late job really ended at once: the worker goes on to the probe
            offsets = [PAD + 0.2, max(PAD, _at(probe.json()["visible_at"])) + 0.3]
        else:
            time.sleep(max(0.0, SLOW_END - (time.monotonic() - requested)))
            _end(session_factory, late)
        assert worker.run_pending() == 1  # the probe
        with session_factory() as session:
            # Both worlds' late job ended within the same step of its schedule.
            row = session.get(Release, late)
            assert row is not None and row.outcome_visible_at == created + padding * 4
        views = []
        for offset in offsets:
            time.sleep(max(0.0, offset - (time.monotonic() - requested)))
            views.append(_status(client, keys.analyst, probe_id))
        seen[world] = views
        assert world == "late" or views[-1] == "succeeded", views
    assert seen["early"] == seen["late"], seen
