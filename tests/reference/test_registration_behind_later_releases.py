"""A registration (or batch) by reference must not wait behind releases requested after it.

A worker took a registration only when no release waited, so a release requested *after* the
registration ran before it. The registration's padding (fixed at its request) could not count
that release, so whether the registration showed at its ``visible_at`` or a step ``j`` later
followed that release's real run time (anyone's, on any dataset, possibly depending on one of
its rows). The workers now take registrations in the releases' order, by their request's
public moment (:func:`service.claims.registration_ahead`), and a release requested behind a
pending registration is padded for it (:func:`service.padding_queue.registration_seconds`).

The two worlds differ only in how long another dataset's release, requested just after the
registration, really ran (at once, or longer than the registration's whole padding); what the
registration's owner is shown (its status, reason and rows, and the step of its late schedule
it shows at) must be the same.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service import oneshot
from service.config import Settings
from service.db.models import Dataset, Release, utcnow
from tests.conftest import bearer
from tests.reference.conftest import Registrations, padded

#: The registration's padding (the release floor: nothing of its objects is known before a read).
PAD = 2.0
#: The other release's run in the slow world: past the registration's whole padding.
SLOW = PAD + 0.6
OTHER = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}


@pytest.fixture
def settings(settings: Settings, root: Path) -> Settings:
    return padded(settings, root, PAD)


def _backdate(session_factory: sessionmaker[Session]) -> None:
    """Every release and registration an hour into the past (ended, shown): what one world
    left is no queue of the next (a public term of its own)."""
    hour = timedelta(hours=1)
    with session_factory.begin() as session:
        for release in session.scalars(select(Release)).all():
            release.created_at -= hour
            if release.visible_at is not None:
                release.visible_at -= hour
            if release.outcome_visible_at is not None:
                release.outcome_visible_at -= hour
            if release.status in ("queued", "running"):
                release.status, release.reason = "failed", "x"
                release.outcome_visible_at = release.visible_at
        for row in session.scalars(select(Dataset)).all():
            row.created_at -= hour
            for name in (
                "registration_visible_at",
                "registration_shown_at",
                "batch_requested_at",
                "batch_visible_at",
                "batch_shown_at",
            ):
                if getattr(row, name) is not None:
                    setattr(row, name, getattr(row, name) - hour)


def _step(requested: Any, visible: Any, shown: Any) -> int:
    """The step ``j`` of the late schedule ``shown`` is (0: at ``visible``)."""
    if shown <= visible:
        return 0
    ratio = (shown - requested) / (visible - requested)
    return round(np.log2(ratio))


@pytest.mark.parametrize("kind", ["registration", "batch"])
def test_a_registration_shows_the_same_whatever_a_later_release_ran(
    kind: str, registrations: Registrations, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, keys, worker = registrations.client, registrations.keys, registrations.worker
    root, session_factory = registrations.root, registrations.session_factory
    target = registrations.other(200, 3)
    real = oneshot.execute
    slow = {"on": False}

    def execute(job: Any, *args: Any, **kwargs: Any) -> Any:
        if slow["on"]:
            time.sleep(SLOW)  # the run time that depends on the target's rows
        return real(job, *args, **kwargs)

    monkeypatch.setattr(oneshot, "execute", execute)
    owner = registrations.make_key("owner")
    seen: dict[str, tuple[Any, ...]] = {}
    for number, world in enumerate(("fast", "slow")):
        slow["on"] = world == "slow"
        ready = None
        if kind == "batch":
            ready = registrations.registered(owner, world, 2 * number)
            _backdate(session_factory)
        posted = registrations.post(owner, kind, root / world / "b1", 2 * number + 1, ready)
        pending = uuid.UUID(posted.id)
        # Another dataset's release, requested just after the registration.
        other = client.post(
            f"/v1/datasets/{target['id']}/releases", headers=bearer(keys.analyst), json=OTHER
        )
        assert other.status_code == 202, other.text
        assert worker.run_pending() == 1
        with session_factory() as session:
            row = session.get(Dataset, pending)
            assert row is not None
            if kind == "registration":
                requested, visible = row.created_at, row.registration_visible_at
                shown = row.registration_shown_at
            else:
                requested, visible = row.batch_requested_at, row.batch_visible_at
                shown = row.batch_shown_at
            assert requested is not None and visible is not None and shown is not None
        # What its owner sees once it shows.
        wait = (shown - utcnow()).total_seconds()
        if wait > 0:
            time.sleep(wait + 0.05)
        got = client.get(f"/v1/datasets/{pending}", headers=bearer(owner))
        assert got.status_code == 200, got.text
        body = got.json()
        seen[world] = (
            _step(requested, visible, shown),
            round((visible - requested).total_seconds(), 3),
            body["registration_status"],
            body.get("registration_reason"),
            body["n_rows"],
            body.get("batch_status"),
            body.get("batch_reason"),
        )
        _backdate(session_factory)
    assert seen["fast"] == seen["slow"], seen
    assert seen["fast"][0] == 0, seen
