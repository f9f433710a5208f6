"""An outside audit: changing an object of a dataset by reference must not tell its owner (or
the analyst) when a worker claimed one of its releases.

The workers share one queue, so a release of dataset B is claimed when the job ahead of it (on
any dataset) ends. B's owner chooses when to change one of B's objects. Before, a release whose
job read before the change ended ``succeeded`` with its basis, one that read after it
``failed`` and refunded ("a referenced object changed since registration"), both shown at the
same ``visible_at``: one bit per release about another dataset's run time, on the release, the
status filters, the ledger, the budget and the grants. Now the outcome analysts and owners see
is decided by a re-check of the objects at a public moment (``service.reference_recheck``): a
change made before the outcome was due shows the release ``failed`` with one fixed reason, no
result and no refund, whichever way the race went. On both databases.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service import padding_epochs, reference_recheck, visibility
from service.config import Settings
from service.db.models import Dataset, DatasetBatch, LedgerEntry, Release, ReleaseEpoch, utcnow
from service.reference import objects
from service.reference_recheck import recheck_due
from service.visibility import REFERENCE_CHANGED_BEFORE_SHOWN_REASON
from service.worker import Worker
from tests.conftest import Keys, bearer, fetch_release, post_release
from tests.reference import helpers
from tests.reference.test_integrity import forge_in_place, plain_parquet

RELEASE = helpers.FILE_RELEASE
#: What differs between two answers about two different releases or datasets whatever happened.
PER_RELEASE = (
    "id",
    "dataset_id",
    "grant_id",
    "created_at",
    "visible_at",
    "release_id",
    "next",
    "name",
)
#: The padding (one hour: no test outlives it) and the re-check's grace (a quarter of it).
PADDING = timedelta(hours=1)
GRACE = PADDING / 4


@pytest.fixture
def settings(settings: Settings, root: Path) -> Settings:
    return settings.model_copy(
        update={
            "reference_roots": str(root),
            "release_padding_floor_seconds": PADDING.total_seconds(),
            "release_padding_multiplier": 1.0,
        }
    )


@pytest.fixture
def rows() -> np.ndarray[Any, Any]:
    return np.random.default_rng(8).normal(size=(400, 3)) / 4


def rewritten(folder: Path, rows: np.ndarray[Any, Any]) -> None:
    """One value's bytes rewritten in place, size and mtime put back (issue 30, item 3)."""
    forge_in_place(folder / "a.parquet", float(rows[50, 1]), struct.pack("<d", -float(rows[50, 1])))


def row_group_replaced(folder: Path, rows: np.ndarray[Any, Any]) -> None:
    """The object replaced (a new inode) by one whose row groups hold other values."""
    target = folder / "a.parquet"
    status = target.stat()
    fresh = folder / ".a.tmp"
    plain_parquet(fresh, -rows[:200])
    os.utime(fresh, ns=(status.st_atime_ns, status.st_mtime_ns))
    os.replace(fresh, target)


def removed(folder: Path, rows: np.ndarray[Any, Any]) -> None:
    (folder / "b.parquet").unlink()


def symlinked(folder: Path, rows: np.ndarray[Any, Any]) -> None:
    """A symlink to an exact copy in its place: the same bytes, no longer a regular file."""
    target = folder / "a.parquet"
    copy = folder.parent / f"{folder.name}-copy.parquet"
    shutil.copy2(target, copy)
    target.unlink()
    target.symlink_to(copy)


#: Paths whose open is refused as a removed permission is (root reads any file whatever its
#: mode, so the open itself is made to refuse them too: :func:`permission_denied`).
DENIED: set[str] = set()


@pytest.fixture(autouse=True)
def permission_denied(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real = objects._open_regular

    def opened(path: str, roots: Any) -> int:
        if path in DENIED:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(path, roots)

    monkeypatch.setattr(objects, "_open_regular", opened)
    yield
    DENIED.clear()


def unreadable(folder: Path, rows: np.ndarray[Any, Any]) -> None:
    target = folder / "a.parquet"
    target.chmod(0)
    DENIED.add(os.path.realpath(target))


CHANGES = [
    pytest.param(rewritten, id="rewritten-same-size-and-mtime"),
    pytest.param(row_group_replaced, id="row-group-replaced"),
    pytest.param(removed, id="removed"),
    pytest.param(symlinked, id="symlink"),
    pytest.param(unreadable, id="permissions-removed"),
]


def register(
    client: TestClient,
    factory: sessionmaker[Session],
    keys: Keys,
    root: Path,
    name: str,
    rows: Any,
    batch: bool = False,
) -> str:
    """A dataset by reference of two objects (and with ``batch`` a batch of a third appended),
    with a grant to every analyst."""
    folder = root / name
    folder.mkdir()
    names = plain_parquet(folder / "a.parquet", rows[:200])
    plain_parquet(folder / "b.parquet", rows[200:])
    posted = helpers.register(client, keys.owner, str(folder), names, helpers.FILE_BUDGET)
    dataset_id = str(posted.json()["id"])
    # The registration is padded as a release is: as if its padding had passed.
    with factory.begin() as session:
        row = session.get(Dataset, uuid.UUID(dataset_id))
        assert row is not None and row.registration_shown_at is not None
        row.registration_visible_at = row.registration_shown_at = utcnow() - PADDING
    dataset = client.get(f"/v1/datasets/{dataset_id}", headers=bearer(keys.owner))
    assert dataset.json()["registration_status"] == "ready", dataset.text
    if batch:
        # A batch appended by reference (a third object), registered and shown before the
        # release is requested: the release reads it too.
        plain_parquet(folder / "c.parquet", rows[:100] / 2)
        appended = client.post(
            f"/v1/dataset-references/{dataset_id}/batches",
            headers=bearer(keys.owner),
            json={"uri": str(folder / "c.parquet")},
        )
        assert appended.status_code == 202, appended.text
        assert helpers.run_registrations(client) == 1
        with factory.begin() as session:
            row = session.get(Dataset, uuid.UUID(dataset_id))
            assert row is not None and row.batch_shown_at is not None
            row.batch_visible_at = row.batch_shown_at = utcnow() - PADDING
            # The batch's commit as its registration shows it (its shown moment): a continual
            # epoch reading it is due one epoch's padding after that.
            appended_batch = session.get(DatasetBatch, (row.id, 1))
            assert appended_batch is not None
            appended_batch.created_at = row.batch_shown_at
        grown = client.get(f"/v1/datasets/{dataset_id}", headers=bearer(keys.owner)).json()
        assert (grown["n_batches"], grown["n_rows"], grown["batch_status"]) == (2, 500, None)
    granted = client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=bearer(keys.owner),
        json={"epsilon": "5", "delta": "1e-3"},
    )
    assert granted.status_code == 201, granted.text
    return dataset_id


def later(factory: sessionmaker[Session], dataset_id: str, by: timedelta) -> None:
    """As if ``by`` had passed: every moment of the dataset's releases and ledger ``by``
    earlier."""
    moments = (
        "created_at",
        "visible_at",
        "outcome_visible_at",
        "finished_at",
        "started_at",
        "reference_checked_at",
        "reference_shown_at",
    )
    with factory.begin() as session:
        key = uuid.UUID(dataset_id)
        for release in session.scalars(select(Release).where(Release.dataset_id == key)).all():
            for name in moments:
                if getattr(release, name) is not None:
                    setattr(release, name, getattr(release, name) - by)
            for epoch in session.scalars(
                select(ReleaseEpoch).where(ReleaseEpoch.release_id == release.id)
            ).all():
                for name in ("created_at", *moments[1:2], *moments[-2:]):
                    if getattr(epoch, name, None) is not None:
                        setattr(epoch, name, getattr(epoch, name) - by)
        for entry in session.scalars(
            select(LedgerEntry).where(LedgerEntry.dataset_id == key)
        ).all():
            entry.created_at -= by


def settle(factory: sessionmaker[Session], settings: Settings, dataset_id: str) -> None:
    """Past the outcome's due moment, the re-check runs (within its grace), then its verdict's
    moment passes."""
    later(factory, dataset_id, PADDING + GRACE / 3)
    recheck_due(factory, settings, utcnow())
    later(factory, dataset_id, GRACE)


def scrub(value: Any, per_release: tuple[str, ...] = PER_RELEASE) -> Any:
    if isinstance(value, dict):
        return {k: scrub(v, per_release) for k, v in value.items() if k not in per_release}
    if isinstance(value, list):
        return [scrub(v, per_release) for v in value]
    return value


def seen(
    client: TestClient,
    keys: Keys,
    dataset_id: str,
    release_id: str,
    per_release: tuple[str, ...] = PER_RELEASE,
    owner_reads: tuple[str, ...] = ("ledger", "budget", "grants"),
) -> dict[str, Any]:
    """Everything the analyst and the owner read of the release (and its epochs), its lists,
    the ledger, the budget and the grants (``owner_reads``: a deleted dataset has a ledger
    only)."""
    answers: dict[str, Any] = {}
    for who in ("analyst", "owner"):
        key = getattr(keys, who)
        answers[f"{who} release"] = fetch_release(client, key, release_id)
        epochs = client.get(f"/v1/releases/{release_id}/epochs", headers=bearer(key))
        assert epochs.status_code == 200, epochs.text
        answers[f"{who} epochs"] = epochs.json()
        for status in ("queued", "running", "succeeded", "failed", "no_result"):
            if who == "analyst":
                path, params = "/v1/releases", {"status": status, "dataset_id": dataset_id}
            else:
                path, params = f"/v1/datasets/{dataset_id}/releases", {"status": status}
            listed = client.get(path, headers=bearer(key), params=params)
            assert listed.status_code == 200, listed.text
            answers[f"{who} {status}"] = listed.json()["total"]
        if who == "analyst":
            path, params = "/v1/releases", {"dataset_id": dataset_id}
        else:
            path, params = f"/v1/datasets/{dataset_id}/releases", {}
        listed = client.get(path, headers=bearer(key), params=params)
        assert listed.status_code == 200, listed.text
        answers[f"{who} list"] = listed.json()["items"]
    for what in owner_reads:
        answer = client.get(f"/v1/datasets/{dataset_id}/{what}", headers=bearer(keys.owner))
        assert answer.status_code == 200, answer.text
        answers[what] = answer.json()
    return dict(scrub(answers, per_release))


def world(
    client: TestClient,
    factory: sessionmaker[Session],
    keys: Keys,
    worker: Worker,
    root: Path,
    rows: Any,
    name: str,
    change: Callable[[Path, Any], None],
    change_first: bool,
    batch: bool = False,
    release: dict[str, Any] = RELEASE,
) -> tuple[str, str]:
    """A release whose job read before the owner's change (``change_first`` false: the job
    ahead ended early) or after it; the change is before ``visible_at`` either way."""
    # Other values in each world (one object backs one live dataset), the same shape.
    data = -rows if change_first else rows
    dataset_id = register(client, factory, keys, root, name, data, batch)
    release_id = post_release(client, keys.analyst, dataset_id, **release)
    if change_first:
        change(root / name, data)
    assert worker.run_pending() == 1
    if not change_first:
        change(root / name, data)
    return dataset_id, release_id


@dataclass
class Race:
    """The fixtures every test here reads, in one (each test listed all seven before)."""

    client: TestClient
    factory: sessionmaker[Session]
    keys: Keys
    worker: Worker
    root: Path
    rows: np.ndarray[Any, Any]
    settings: Settings

    def world(
        self,
        name: str,
        change: Callable[[Path, Any], None],
        change_first: bool,
        batch: bool = False,
        release: dict[str, Any] = RELEASE,
    ) -> tuple[str, str]:
        """:func:`world` with these fixtures."""
        fixtures = (self.client, self.factory, self.keys, self.worker, self.root, self.rows)
        return world(*fixtures, name, change, change_first, batch, release)

    def released(
        self,
        name: str,
        rows: Any = None,
        batch: bool = False,
        release: dict[str, Any] = RELEASE,
    ) -> tuple[str, str]:
        """A dataset :func:`register` ed as ``name`` (of ``rows``, by default the fixture's),
        one release asked of it and its job run: its id and the release's."""
        data = self.rows if rows is None else rows
        dataset_id = register(self.client, self.factory, self.keys, self.root, name, data, batch)
        release_id = post_release(self.client, self.keys.analyst, dataset_id, **release)
        assert self.worker.run_pending() == 1
        return dataset_id, release_id


@pytest.fixture
def race(
    client: TestClient,
    keys: Keys,
    worker: Worker,
    root: Path,
    rows: np.ndarray[Any, Any],
    session_factory: sessionmaker[Session],
    settings: Settings,
) -> Race:
    return Race(client, session_factory, keys, worker, root, rows, settings)


@pytest.mark.parametrize("change", CHANGES)
def test_a_release_shows_the_same_whether_it_read_before_or_after_its_object_changed(
    change: Callable[[Path, Any], None],
    race: Race,
) -> None:
    early = race.world("early", change, change_first=False)
    late = race.world("late", change, change_first=True)
    with race.factory() as session:
        stored = [session.get(Release, uuid.UUID(r)) for _, r in (early, late)]
        # The two worlds really differ in the store (so the comparison could fail).
        assert [row.status for row in stored if row] == ["succeeded", "failed"]
        assert [row.refunded for row in stored if row] == [False, False]
    for dataset_id, _ in (early, late):
        settle(race.factory, race.settings, dataset_id)
    one, other = seen(race.client, race.keys, *early), seen(race.client, race.keys, *late)
    assert one == other
    shown = one["analyst release"]
    assert (shown["status"], shown["reason"], shown["refunded"], shown.get("result")) == (
        "failed",
        REFERENCE_CHANGED_BEFORE_SHOWN_REASON,
        False,
        None,
    )
    assert (one["analyst failed"], one["owner failed"], one["owner succeeded"]) == (1, 1, 0)
    assert [entry["kind"] for entry in one["ledger"]["items"]] == ["charge"]
    # Nothing about the objects in what is shown.
    assert str(race.root) not in str(one) and "parquet" not in str(one)
    # Nothing was rewritten: the store keeps what happened (admins and auditors see it).
    with race.factory() as session:
        row = session.get(Release, uuid.UUID(early[1]))
        assert row is not None and row.status == "succeeded"
        assert row.reference_check == "changed" and row.reference_checked_at is not None


def batch_rewritten(folder: Path, rows: np.ndarray[Any, Any]) -> None:
    """The appended batch's object rewritten in place, size and mtime put back."""
    value = float(rows[10, 0]) / 2
    forge_in_place(folder / "c.parquet", value, struct.pack("<d", -value))


@pytest.mark.parametrize("change", [batch_rewritten, removed])
def test_the_same_holds_for_a_batch_appended_by_reference(
    change: Callable[[Path, Any], None],
    race: Race,
) -> None:
    early = race.world("early", change, False, True)
    late = race.world("late", change, True, True)
    with race.factory() as session:
        stored = [session.get(Release, uuid.UUID(r)) for _, r in (early, late)]
        assert [(row.status, row.n_rows_read) for row in stored if row] == [
            ("succeeded", 500),
            ("failed", 500),
        ]
    for dataset_id, _ in (early, late):
        settle(race.factory, race.settings, dataset_id)
    one, other = seen(race.client, race.keys, *early), seen(race.client, race.keys, *late)
    assert one == other
    assert one["owner release"]["reason"] == REFERENCE_CHANGED_BEFORE_SHOWN_REASON


def test_an_unchanged_dataset_shows_the_outcome_once_the_recheck_shows(
    race: Race,
) -> None:
    dataset_id, release_id = race.released("kept")
    # Past visible_at, the re-check not yet run: running, whatever the job did.
    later(race.factory, dataset_id, PADDING + GRACE / 3)
    for key in (race.keys.analyst, race.keys.owner):
        assert fetch_release(race.client, key, release_id)["status"] == "running"
    recheck_due(race.factory, race.settings, utcnow())
    # The verdict shows at the due moment plus the grace, not when the re-check ran.
    assert fetch_release(race.client, race.keys.owner, release_id)["status"] == "running"
    later(race.factory, dataset_id, GRACE)
    shown = fetch_release(race.client, race.keys.analyst, release_id)
    assert shown["status"] == "succeeded" and shown["result"] is not None, shown
    with race.factory() as session:
        row = session.get(Release, uuid.UUID(release_id))
        assert row is not None and row.visible_at is not None
        assert row.reference_check == "unchanged"
        assert row.reference_shown_at == row.visible_at + GRACE


def test_a_change_after_the_recheck_keeps_the_outcome(
    race: Race,
) -> None:
    dataset_id, release_id = race.released("after")
    settle(race.factory, race.settings, dataset_id)
    removed(race.root / "after", race.rows)
    assert fetch_release(race.client, race.keys.owner, release_id)["status"] == "succeeded"


def test_a_late_recheck_shows_at_a_step_of_the_late_schedule(
    race: Race,
) -> None:
    """No worker re-checked within the grace: the verdict shows at the first step of the
    release's late schedule after the re-check, not at the moment it ran."""
    dataset_id, release_id = race.released("slow")
    later(race.factory, dataset_id, PADDING + GRACE * 2)
    recheck_due(race.factory, race.settings, utcnow())
    with race.factory() as session:
        row = session.get(Release, uuid.UUID(release_id))
        assert row is not None and row.reference_shown_at is not None
        assert row.reference_shown_at == row.created_at + PADDING * 2
    assert fetch_release(race.client, race.keys.analyst, release_id)["status"] == "running"
    long_poll = race.client.get(
        f"/v1/releases/{release_id}", headers=bearer(race.keys.analyst), params={"wait": 0}
    )
    assert long_poll.json()["status"] == "running"


def test_the_worker_thread_runs_due_rechecks(
    race: Race,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thread :meth:`Worker.run_forever` starts beside the job loop takes the re-checks
    that are due (here one pass, then the stop), and only those."""
    dataset_id, due = race.released("thread")
    later(race.factory, dataset_id, PADDING + GRACE / 3)
    _, not_due = race.released("not-yet", -race.rows)
    stop = threading.Event()
    passes: list[int] = []

    def once(*args: Any, **kwargs: Any) -> int:
        passes.append(real(*args, **kwargs))
        stop.set()
        return passes[-1]

    real = reference_recheck.recheck_due
    monkeypatch.setattr(reference_recheck, "recheck_due", once)
    reference_recheck.run(race.factory, race.settings, stop)
    assert passes == [1]
    with race.factory() as session:
        checks = {r: session.get(Release, uuid.UUID(r)) for r in (due, not_due)}
        assert {r: row.reference_check for r, row in checks.items() if row} == {
            due: "unchanged",
            not_due: "pending",
        }


# -- continual releases: one re-check per epoch ---------------------------------------------------


#: A continual release reading the two batches of :func:`register` with ``batch``: epoch 1 the
#: upload's two objects, epoch 2 the appended one; horizon 3 leaves it waiting after epoch 2.
def continual_release(horizon: int) -> dict[str, Any]:
    return {
        "mechanism": "continual_gauss",
        "k": 2,
        "epsilon": "1",
        "delta": "1e-5",
        "params": {"horizon": horizon},
    }


def differing(one: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """What differs between two worlds' answers (:func:`seen`), by what was read."""
    return sorted(key for key in one.keys() | other.keys() if one.get(key) != other.get(key))


#: The epochs' bases differ between the worlds (their data does: :func:`world`); whether an
#: epoch is shown, and all else, must not.
PER_EPOCH = (*PER_RELEASE, "basis", "basis_sha256", "basis_base64", "result", "extras")


@pytest.mark.parametrize("horizon", [2, 3])
@pytest.mark.parametrize(
    ("change", "epochs_before"),
    [
        # The appended batch's object rewritten with its size and mtime kept: its inode change
        # time differs, and every epoch checks every object's identity, so from epoch 1 on
        # (before the identity carried it, epoch 1 was shown and epoch 2 not).
        pytest.param(batch_rewritten, [], id="epoch-2-object"),
        pytest.param(removed, [], id="epoch-1"),
    ],
)
def test_a_continual_release_shows_the_same_whether_an_epoch_read_before_or_after(
    change: Callable[[Path, Any], None],
    epochs_before: list[int],
    horizon: int,
    race: Race,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner changes the object an epoch reads (the appended batch's, read by epoch 2, or
    one of the upload's, read by epoch 1) before that epoch's ``visible_at``. Its job read
    before the change (the epoch stored; with horizon 3 the release then waits, really
    ``running``) or after it (the release ended ``failed`` there). Either way, once the epoch's
    re-check shows, analysts and owners read the epochs before it and the release ``failed``
    with the fixed reason, no refund; and before that, the same ``running``."""
    release = continual_release(horizon)
    # The two worlds share one database: the second world's release, requested while the
    # first's epochs are not shown, would be padded for them (service.padding_epochs: a public
    # term, the same whatever the first world's worker did; tests/continual/
    # test_probe_behind_an_epoch.py) and the worlds' public moments would differ by that
    # term, not by the race this test is about. Each world is padded as if it were alone.
    monkeypatch.setattr(padding_epochs, "epoch_seconds", lambda *args: 0.0)
    # Likewise an epoch's own padding counts the epochs before it in the workers' order
    # (service.padding_epochs._Chain: the other world's, and its own release's epoch 1, which
    # holds epoch 2 a padding later): none, each epoch padded as before, from its batch alone.
    # The chain is tested in tests/continual/test_epoch_behind_other_epochs.py.
    monkeypatch.setattr(padding_epochs._Chain, "ahead", lambda *args: None)
    worlds = [
        race.world(name, change, first, True, release)
        for name, first in (("early", False), ("late", True))
    ]
    with race.factory() as session:
        stored = [session.get(Release, uuid.UUID(r)) for _, r in worlds]
        # The two worlds really differ in the store (so the comparison could fail).
        early_status = "succeeded" if horizon == 2 else "running"
        assert [(row.status, row.epochs_done) for row in stored if row] == [
            (early_status, 2),
            ("failed", len(epochs_before)),
        ]
        assert [row.refunded for row in stored if row] == [False, False]
    # Past the epochs' visible_at, no re-check run yet: the same (running, nothing shown).
    for dataset_id, _ in worlds:
        later(race.factory, dataset_id, PADDING + GRACE / 3)
    pending = [seen(race.client, race.keys, *w, per_release=PER_EPOCH) for w in worlds]
    assert differing(*pending) == []
    assert pending[0]["analyst release"]["status"] == "running"
    assert pending[0]["owner epochs"]["items"] == []
    # A long poll wakes at the same public moment in both worlds (the verdict's earliest: the
    # epoch's, or the end's, due moment plus the grace), not when the re-check runs.
    with race.factory() as session:
        wakes = []
        for _, release_id in worlds:
            row = session.get(Release, uuid.UUID(release_id))
            assert row is not None
            moment = visibility.next_shown_at(session, row, 0, utcnow())
            assert moment is not None
            wakes.append(moment - row.created_at)
        assert wakes == [PADDING + GRACE] * 2
    for dataset_id, _ in worlds:
        recheck_due(race.factory, race.settings, utcnow())
        later(race.factory, dataset_id, GRACE)
    one, other = (seen(race.client, race.keys, *w, per_release=PER_EPOCH) for w in worlds)
    assert differing(one, other) == []
    assert one == other
    shown = one["analyst release"]
    assert (shown["status"], shown["reason"], shown["refunded"], shown.get("result")) == (
        "failed",
        REFERENCE_CHANGED_BEFORE_SHOWN_REASON,
        False,
        None,
    )
    assert [e["epoch"] for e in shown["epochs"]] == epochs_before
    assert shown["epochs_done"] == len(epochs_before)
    assert [e["epoch"] for e in one["owner epochs"]["items"]] == epochs_before
    assert (one["analyst failed"], one["owner failed"], one["owner running"]) == (1, 1, 0)
    assert one["owner succeeded"] == 0
    assert [entry["kind"] for entry in one["ledger"]["items"]] == ["charge"]
    assert str(race.root) not in str(one) and "parquet" not in str(one)
    # Nothing was rewritten: admins and auditors see what happened.
    with race.factory() as session:
        row = session.get(Release, uuid.UUID(worlds[0][1]))
        assert row is not None and (row.status, row.epochs_done) == (early_status, 2)
        checks = session.scalars(
            select(ReleaseEpoch.reference_check)
            .where(ReleaseEpoch.release_id == row.id)
            .order_by(ReleaseEpoch.epoch)
        ).all()
        assert checks == (["unchanged", "changed"] if epochs_before else ["changed"] * 2)


def test_an_unchanged_continual_release_shows_each_epoch_once_its_recheck_shows(
    race: Race,
) -> None:
    dataset_id, release_id = race.released("kept", batch=True, release=continual_release(2))
    later(race.factory, dataset_id, PADDING + GRACE / 3)
    recheck_due(race.factory, race.settings, utcnow())
    # The verdicts show at each epoch's visible_at plus the grace, not when the re-check ran.
    assert fetch_release(race.client, race.keys.owner, release_id)["epochs"] == []
    # Epoch 2 runs after epoch 1, so it is padded a padding after it (service.padding_epochs):
    # its re-check is due then.
    later(race.factory, dataset_id, PADDING)
    recheck_due(race.factory, race.settings, utcnow())
    later(race.factory, dataset_id, GRACE)
    shown = fetch_release(race.client, race.keys.analyst, release_id)
    assert (shown["status"], shown["epochs_done"]) == ("succeeded", 2), shown
    assert shown["result"] is not None and shown["refunded"] is False
    listed = race.client.get(
        "/v1/releases", headers=bearer(race.keys.analyst), params={"status": "succeeded"}
    )
    assert listed.json()["total"] == 1
    with race.factory() as session:
        epochs = session.scalars(
            select(ReleaseEpoch).where(ReleaseEpoch.release_id == uuid.UUID(release_id))
        ).all()
        assert [e.reference_check for e in epochs] == ["unchanged"] * 2
        assert all(e.reference_shown_at == e.visible_at + GRACE for e in epochs)
        row = session.get(Release, uuid.UUID(release_id))
        assert row is not None and row.reference_check == "unchanged"


def deleted_later(factory: sessionmaker[Session], dataset_id: str, by: timedelta) -> None:
    """:func:`later`, the dataset's deletion moment included."""
    later(factory, dataset_id, by)
    with factory.begin() as session:
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert dataset is not None and dataset.deleted_at is not None
        dataset.deleted_at -= by


def registered_before_0014(factory: sessionmaker[Session], dataset_id: str) -> None:
    """As a dataset registered by reference before migration 0014: no request kept."""
    with factory.begin() as session:
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert dataset is not None and dataset.reference is not None
        dataset.registration_request = None


@pytest.mark.parametrize("pre_0014", [False, True], ids=["request-kept", "pre-0014"])
def test_a_deleted_dataset_shows_its_release_at_the_same_moment_whichever_ran_first(
    race: Race, pre_0014: bool
) -> None:
    """The owner deletes the dataset by reference (an act that forgets its reference) before
    the release's outcome is due. Before, a job that ran before the deletion was marked for
    the re-check (shown ``running`` until the verdict's moment, the due moment plus the grace)
    and one claimed after it was not (shown ``failed`` from the due moment): between the two
    moments the status, the lists' counts and the long poll told the owner whether the job
    ahead in the shared queue had ended by the deletion."""
    early = race.released("early")
    if pre_0014:
        registered_before_0014(race.factory, early[0])
    deleted = race.client.delete(f"/v1/datasets/{early[0]}", headers=bearer(race.keys.owner))
    assert deleted.status_code == 204, deleted.text
    dataset_id = register(
        race.client, race.factory, race.keys, race.root, "late", -race.rows, batch=False
    )
    if pre_0014:
        # (The deletion keeps the reference's URI as the request: cheaper than a migration.)
        registered_before_0014(race.factory, dataset_id)
    release_id = post_release(race.client, race.keys.analyst, dataset_id, **RELEASE)
    deleted = race.client.delete(f"/v1/datasets/{dataset_id}", headers=bearer(race.keys.owner))
    assert deleted.status_code == 204, deleted.text
    assert race.worker.run_pending() == 1
    late = (dataset_id, release_id)
    with race.factory() as session:
        stored = [session.get(Release, uuid.UUID(r)) for _, r in (early, late)]
        # The two worlds really differ in the store (so the comparison could fail).
        assert [row.status for row in stored if row] == ["succeeded", "failed"]
    # Past the outcome's due moment, the re-checks run; their verdicts' moment not yet.
    for dataset_id, _ in (early, late):
        deleted_later(race.factory, dataset_id, PADDING + GRACE / 3)
    recheck_due(race.factory, race.settings, utcnow())
    one = seen(race.client, race.keys, *early, owner_reads=("ledger",))
    other = seen(race.client, race.keys, *late, owner_reads=("ledger",))
    assert one == other
    assert one["analyst release"]["status"] == "running"
    # Once the verdict's moment passed: the same fixed end in both.
    for dataset_id, _ in (early, late):
        deleted_later(race.factory, dataset_id, GRACE)
    one = seen(race.client, race.keys, *early, owner_reads=("ledger",))
    other = seen(race.client, race.keys, *late, owner_reads=("ledger",))
    assert one == other
    shown = one["analyst release"]
    assert (shown["status"], shown["reason"], shown["refunded"]) == (
        "failed",
        visibility.DELETED_BEFORE_SHOWN_REASON,
        False,
    )
    assert [entry["kind"] for entry in one["ledger"]["items"]] == ["charge"]


def refused_when_run(factory: sessionmaker[Session], release_id: str) -> None:
    """As after an upgrade that refuses the release's stored params: its job fails before it
    reads an object, a failure the service refunds (decided on public facts)."""
    with factory.begin() as session:
        release = session.get(Release, uuid.UUID(release_id))
        assert release is not None
        release.params = {**(release.params or {}), "no_such_param": 1}


#: :data:`PER_RELEASE`, and the params (:func:`refused_when_run` changed them).
PER_REFUNDED = (*PER_RELEASE, "params")


def refunded_release(race: Race, name: str, rows: Any = None) -> tuple[str, str]:
    """A dataset :func:`register` ed as ``name`` and one release on it whose job failed before
    reading, refunded (stored: ``failed``, ``refunded``, its re-check pending)."""
    data = race.rows if rows is None else rows
    dataset_id = register(race.client, race.factory, race.keys, race.root, name, data)
    release_id = post_release(race.client, race.keys.analyst, dataset_id, **RELEASE)
    refused_when_run(race.factory, release_id)
    assert race.worker.run_pending() == 1
    with race.factory() as session:
        row = session.get(Release, uuid.UUID(release_id))
        assert row is not None
        assert (row.status, row.refunded, row.reference_check) == ("failed", True, "pending")
    return dataset_id, release_id


def figures(answers: dict[str, Any]) -> dict[str, Any]:
    """What each read says of the refund: the release's ``refunded`` (analyst and owner), the
    ledger's entries, the budget's and the grant's spent epsilon."""
    return {
        "refunded": [answers[f"{who} release"]["refunded"] for who in ("analyst", "owner")],
        "ledger": [entry["kind"] for entry in answers["ledger"]["items"]],
        "budget": answers["budget"]["epsilon_spent"],
        "grants": [grant["epsilon_spent"] for grant in answers["grants"]["items"]],
    }


def test_a_refund_on_a_rechecked_release_takes_effect_when_the_release_shows_it(
    race: Race,
) -> None:
    """A release on a dataset by reference whose job failed before reading (refunded) shows
    its outcome at its re-check verdict's moment, one grace after its due moment. Before, its
    refund took effect at the due moment: between the two the release read ``running`` while
    the ledger, the budget and the grant had it back, and differed from those of a release
    that succeeded (the outcome read from the budget one grace early). Now every read is
    the same as the succeeded release's until the verdict's moment, and says ``refunded``
    from then on."""
    succeeded = race.released("succeeded")
    refunded = refunded_release(race, "refunded", -race.rows)
    for dataset_id, _ in (succeeded, refunded):
        later(race.factory, dataset_id, PADDING + GRACE / 3)
    assert recheck_due(race.factory, race.settings, utcnow()) == 2
    with race.factory() as session:
        checks = [session.get(Release, uuid.UUID(r)) for _, r in (succeeded, refunded)]
        assert [row.reference_check for row in checks if row] == ["unchanged", "unchanged"]
    # Past the due moment, before the verdict's: nothing tells the two apart.
    one, other = (
        seen(race.client, race.keys, *succeeded, PER_REFUNDED),
        seen(race.client, race.keys, *refunded, PER_REFUNDED),
    )
    assert one == other
    assert other["analyst release"]["status"] == "running"
    cost = other["ledger"]["items"][0]["epsilon"]
    assert figures(other) == {
        "refunded": [False, False],
        "ledger": ["charge"],
        "budget": cost,
        "grants": [cost],
    }
    # From the verdict's moment: the release and every figure say refunded, together.
    for dataset_id, _ in (succeeded, refunded):
        later(race.factory, dataset_id, GRACE)
    shown = seen(race.client, race.keys, *refunded, PER_REFUNDED)
    assert shown["analyst release"]["status"] == "failed"
    assert Decimal(shown["budget"]["epsilon_spent"]) == 0
    assert figures(shown) == {
        "refunded": [True, True],
        "ledger": ["charge", "refund"],
        "budget": shown["budget"]["epsilon_spent"],
        "grants": [shown["budget"]["epsilon_spent"]],
    }
    with race.factory() as session:
        row = session.get(Release, uuid.UUID(refunded[1]))
        entry = session.scalars(
            select(LedgerEntry).where(
                LedgerEntry.release_id == uuid.UUID(refunded[1]), LedgerEntry.kind == "refund"
            )
        ).one()
        assert row is not None and entry.created_at == row.reference_shown_at


@pytest.mark.parametrize("change", [removed, rewritten])
def test_a_refund_on_a_release_whose_recheck_found_a_change_never_takes_effect(
    change: Callable[[Path, Any], None], race: Race
) -> None:
    """The owner changes an object before the refunded release's outcome is due: the verdict
    ``changed`` shows the release ``failed`` without a refund, whatever the job did. Before,
    the ledger, the budget and the grant still counted the refund (from the due moment on):
    they told which failure the job met, and disagreed with the release. Now the charge
    stands everywhere, as for a release whose job succeeded before the change."""
    succeeded = race.released("succeeded")
    refunded = refunded_release(race, "refunded", -race.rows)
    change(race.root / "succeeded", race.rows)
    change(race.root / "refunded", -race.rows)
    for dataset_id, _ in (succeeded, refunded):
        settle(race.factory, race.settings, dataset_id)
    with race.factory() as session:
        checks = [session.get(Release, uuid.UUID(r)) for _, r in (succeeded, refunded)]
        assert [(row.status, row.reference_check) for row in checks if row] == [
            ("succeeded", "changed"),
            ("failed", "changed"),
        ]
    one, other = (
        seen(race.client, race.keys, *succeeded, PER_REFUNDED),
        seen(race.client, race.keys, *refunded, PER_REFUNDED),
    )
    assert one == other
    shown = other["analyst release"]
    assert (shown["status"], shown["reason"]) == ("failed", REFERENCE_CHANGED_BEFORE_SHOWN_REASON)
    cost = other["ledger"]["items"][0]["epsilon"]
    assert figures(other) == {
        "refunded": [False, False],
        "ledger": ["charge"],
        "budget": cost,
        "grants": [cost],
    }


def test_a_deletion_after_the_recheck_and_before_its_verdict_shows_ends_the_release_unrefunded(
    race: Race,
) -> None:
    """The re-check read ``unchanged``, then the owner deleted the dataset before the verdict's
    moment (the moment the release's outcome and its refund would show). The refund never
    takes effect after a deletion, so the release shows ``failed`` for the deletion, no
    refund, as the ledger does (before, it showed the refund the ledger did not have), and
    as when the re-check ran after the deletion (``changed``)."""
    checked = refunded_release(race, "checked")
    unchecked = refunded_release(race, "unchecked", -race.rows)
    for dataset_id, _ in (checked, unchecked):
        later(race.factory, dataset_id, PADDING + GRACE / 3)
    # One re-check runs before the deletion; the other (the other world) after it.
    assert reference_recheck.recheck(race.factory, race.settings, uuid.UUID(checked[1])) == (
        "unchanged"
    )
    for dataset_id, _ in (checked, unchecked):
        deleted = race.client.delete(f"/v1/datasets/{dataset_id}", headers=bearer(race.keys.owner))
        assert deleted.status_code == 204, deleted.text
    assert recheck_due(race.factory, race.settings, utcnow()) == 1
    with race.factory() as session:
        checks = [session.get(Release, uuid.UUID(r)) for _, r in (checked, unchecked)]
        assert [row.reference_check for row in checks if row] == ["unchanged", "changed"]
    for dataset_id, _ in (checked, unchecked):
        deleted_later(race.factory, dataset_id, GRACE)
    one = seen(race.client, race.keys, *checked, PER_REFUNDED, owner_reads=("ledger",))
    other = seen(race.client, race.keys, *unchecked, PER_REFUNDED, owner_reads=("ledger",))
    assert one == other
    shown = one["analyst release"]
    assert (shown["status"], shown["reason"], shown["refunded"]) == (
        "failed",
        visibility.DELETED_BEFORE_SHOWN_REASON,
        False,
    )
    assert [entry["kind"] for entry in one["ledger"]["items"]] == ["charge"]
    assert (one["analyst failed"], one["owner failed"]) == (1, 1)


def refunded_continual_release(race: Race, name: str, rows: Any) -> tuple[str, str]:
    """:func:`refunded_release`, continual: its end, with no epoch released, refunded and
    re-checked as a one-shot outcome (stored: ``failed``, ``refunded``, ``epochs_done`` 0)."""
    dataset_id = register(race.client, race.factory, race.keys, race.root, name, rows)
    release_id = post_release(race.client, race.keys.analyst, dataset_id, **continual_release(2))
    refused_when_run(race.factory, release_id)
    assert race.worker.run_pending() == 1
    with race.factory() as session:
        row = session.get(Release, uuid.UUID(release_id))
        assert row is not None
        stored = (row.status, row.refunded, row.reference_check, row.epochs_done)
        assert stored == ("failed", True, "pending", 0)
    return dataset_id, release_id


def test_a_continual_release_that_released_no_epoch_ends_as_a_one_shot_one_on_a_deletion(
    race: Race, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The continual twin of the test above: a release whose job was refused before its first
    epoch (refunded, no epoch released), its end's re-check ``unchanged``, then the dataset
    deleted before the verdict's moment. Before, the release showed ``refunded: true`` (with
    the refusal's reason) while the ledger never counted the refund (it would take effect
    after the deletion), and the world whose re-check ran after the deletion showed the
    ``changed`` reason: now both show ``failed`` for the deletion, no refund, as the ledger.
    A third world kept (not deleted) shows the refund in the release and the ledger together,
    from the verdict's moment, and neither before."""
    # Each world padded as if it were alone (see the continual test above).
    monkeypatch.setattr(padding_epochs, "epoch_seconds", lambda *args: 0.0)
    monkeypatch.setattr(padding_epochs._Chain, "ahead", lambda *args: None)
    checked = refunded_continual_release(race, "checked", race.rows)
    unchecked = refunded_continual_release(race, "unchecked", -race.rows)
    kept = refunded_continual_release(race, "kept", race.rows / 2)
    worlds = (checked, unchecked, kept)
    for dataset_id, _ in worlds:
        later(race.factory, dataset_id, PADDING + GRACE / 3)
    for world_ in (checked, kept):
        found = reference_recheck.recheck(race.factory, race.settings, uuid.UUID(world_[1]))
        assert found == "unchanged"
    for dataset_id, _ in (checked, unchecked):
        deleted = race.client.delete(f"/v1/datasets/{dataset_id}", headers=bearer(race.keys.owner))
        assert deleted.status_code == 204, deleted.text
    assert recheck_due(race.factory, race.settings, utcnow()) == 1
    with race.factory() as session:
        checks = [session.get(Release, uuid.UUID(r)) for _, r in worlds]
        verdicts = [row.reference_check for row in checks if row]
        assert verdicts == ["unchanged", "changed", "unchanged"]
    # Before the verdict's moment: running, the charge alone, in every world.
    before = [
        seen(race.client, race.keys, *w, PER_REFUNDED, owner_reads=("ledger",)) for w in worlds
    ]
    for answers in before:
        assert answers["analyst release"]["status"] == "running"
        assert answers["owner release"]["refunded"] is False
        assert [entry["kind"] for entry in answers["ledger"]["items"]] == ["charge"]
    for dataset_id, _ in (checked, unchecked):
        deleted_later(race.factory, dataset_id, GRACE)
    later(race.factory, kept[0], GRACE)
    one = seen(race.client, race.keys, *checked, PER_REFUNDED, owner_reads=("ledger",))
    other = seen(race.client, race.keys, *unchecked, PER_REFUNDED, owner_reads=("ledger",))
    # What the release says of the refund, as the ledger (differed before: true vs charge).
    assert [one[f"{who} release"]["refunded"] for who in ("analyst", "owner")] == [False] * 2
    assert [entry["kind"] for entry in one["ledger"]["items"]] == ["charge"]
    assert differing(one, other) == []
    shown = one["analyst release"]
    assert (shown["status"], shown["reason"], shown["refunded"], shown["epochs"]) == (
        "failed",
        visibility.DELETED_BEFORE_SHOWN_REASON,
        False,
        [],
    )
    assert (one["analyst failed"], one["owner failed"], one["owner running"]) == (1, 1, 0)
    # Not deleted: the refund shows in the release, the ledger, the budget and the grant.
    after = seen(race.client, race.keys, *kept, PER_REFUNDED)
    assert after["analyst release"]["status"] == "failed"
    assert Decimal(after["budget"]["epsilon_spent"]) == 0
    assert figures(after) == {
        "refunded": [True, True],
        "ledger": ["charge", "refund"],
        "budget": after["budget"]["epsilon_spent"],
        "grants": [after["budget"]["epsilon_spent"]],
    }
