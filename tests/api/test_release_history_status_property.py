"""The history's status filter (SQL, :func:`service.history._status_as_shown`) lists exactly the
releases a single read (:func:`service.visibility.view`) shows with that status, for analysts
and owners, at any moment: over random reachable states of one-shot and continual releases
(padding, late ends, epochs not yet visible, datasets deleted before or after an outcome was
due), so a rule changed in one of the two places and not the other fails here."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import numpy as np
from sqlalchemy import select

from service.auth import Principal
from service.db.models import Dataset, Release, ReleaseEpoch
from service.history import ReleaseFilters, list_releases
from service.visibility import view
from tests.api.test_append_rows import append
from tests.conftest import npy_bytes, post_release

STATUSES = ["queued", "running", "succeeded", "no_result", "failed"]
TRIALS, MOMENTS = 20, 4


def test_the_status_filter_lists_what_a_read_shows(
    client, keys, upload_dataset, run_worker, session_factory
):
    rng = np.random.default_rng(0)
    datasets = [
        upload_dataset(client, keys.owner, rng.normal(size=(30, 4)), row_norm_bound=3)["id"]
        for _ in range(3)
    ]
    for dataset in datasets:
        for mechanism, params in (("analyze_gauss", {}), ("continual_gauss", {"horizon": 3})):
            post_release(
                client, keys.analyst, dataset, mechanism=mechanism, k=1, epsilon="0.1",
                delta="1e-7", params=params,
            )  # fmt: skip
    run_worker()
    for dataset in datasets:
        assert append(client, keys.owner, dataset, npy_bytes(rng.normal(size=(5, 4)))).status_code
    run_worker()
    with session_factory() as session:
        analyst = session.execute(select(Release.requester_key_id)).scalars().first()
        owner = session.execute(select(Dataset.owner_key_id)).scalars().first()
    assert analyst is not None and owner is not None
    principals = [Principal(analyst, "analyst", "a"), Principal(owner, "owner", "o")]
    draw = random.Random(1)
    mismatches = []
    for _ in range(TRIALS):
        with session_factory.begin() as session:
            releases = session.execute(select(Release)).scalars().all()
            base = min(release.created_at for release in releases)
            for dataset in datasets:
                row = session.get(Dataset, uuid.UUID(dataset))
                assert row is not None
                moment = base + timedelta(seconds=draw.randint(0, 150))
                row.deleted_at = draw.choice([None, None, moment])
            for release in releases:
                continual = release.mechanism == "continual_gauss"
                # Reachable states: a continual release with epochs is running or ended
                # early; every release is padded, its epochs and end after visible_at, in order.
                release.status = draw.choice(
                    ["running", "failed", "no_result"] if continual else STATUSES
                )
                release.visible_at = release.created_at + timedelta(seconds=draw.randint(1, 40))
                last = release.visible_at
                epochs = session.execute(
                    select(ReleaseEpoch)
                    .where(ReleaseEpoch.release_id == release.id)
                    .order_by(ReleaseEpoch.epoch)
                ).scalars()
                for epoch in epochs:
                    last = last + timedelta(seconds=draw.randint(0, 30))
                    epoch.visible_at = last
                ended = release.status in ("succeeded", "no_result", "failed")
                release.outcome_visible_at = (
                    last + timedelta(seconds=draw.randint(0, 30)) if ended else None
                )
        for _ in range(MOMENTS):
            now = base + timedelta(seconds=draw.randint(-5, 160))
            with session_factory() as session:
                for principal in principals:
                    shown = {
                        release.id: view(session, release, principal, now).status
                        for release in session.execute(select(Release)).scalars()
                    }
                    for status in STATUSES:
                        page = list_releases(
                            session, principal, ReleaseFilters(status=status), 100, now=now
                        )
                        listed = {release.id for release in page.items}
                        wanted = {key for key, value in shown.items() if value == status}
                        if listed != wanted or page.total != len(wanted):
                            mismatches.append((principal.role, status, now, listed ^ wanted))
    assert not mismatches, mismatches[:5]
