"""A change to an object of a dataset by reference *undone* before the release's outcome was due
must not tell the owner whether a worker claimed the release inside the changed window.

The owner rewrites an object (size and mtime kept), then puts the original bytes and mtime
back, all before the due moment. A job that read in between failed (its digests differed); one
that read outside it succeeded. Before, the re-check at the due moment compared the size, the
mtime and the digests, all restored, found nothing, and showed each job's own outcome: the owner
read whether the job ahead in the shared queue had ended inside the window of their choice. Now
an object's identity carries what the writer cannot set back (a file's inode change time; an S3
object's LastModified), so the re-check finds the undone change too and both worlds show
``failed`` with the one fixed reason. On both databases.
"""

from __future__ import annotations

import os
import struct
import time
import uuid
from pathlib import Path

from service.db.models import Release
from service.reference import objects
from service.visibility import REFERENCE_CHANGED_BEFORE_SHOWN_REASON
from tests.conftest import post_release
from tests.reference import test_reference_change_race as base
from tests.reference.test_integrity import forge_in_place
from tests.reference.test_reference_change_race import (
    RELEASE,
    Race,
    register,
    seen,
    settle,
)

# The race's fixtures (its padding, roots and rows, the denied opens, the fixtures in one).
settings = base.settings
rows = base.rows
permission_denied = base.permission_denied
race = base.race


def undone_world(race: Race, name: str, in_window: bool) -> tuple[str, str]:
    """A release whose job read inside the window of a change undone before its due moment
    (``in_window``) or before the change."""
    data = -race.rows if in_window else race.rows
    dataset_id = register(race.client, race.factory, race.keys, race.root, name, data)
    release_id = post_release(race.client, race.keys.analyst, dataset_id, **RELEASE)
    target = race.root / name / "a.parquet"
    value = float(data[50, 1])

    def change() -> None:
        forge_in_place(target, value, struct.pack("<d", -value))

    def undo() -> None:
        forge_in_place(target, -value, struct.pack("<d", value))

    if in_window:
        change()
    assert race.worker.run_pending() == 1
    if not in_window:
        change()
    undo()
    return dataset_id, release_id


def test_a_change_undone_before_the_due_moment_shows_the_same_either_way(race: Race) -> None:
    outside = undone_world(race, "outside", in_window=False)
    inside = undone_world(race, "inside", in_window=True)
    with race.factory() as session:
        stored = [session.get(Release, uuid.UUID(r)) for _, r in (outside, inside)]
        # The worlds really differ in the store (so the comparison could fail).
        assert [row.status for row in stored if row] == ["succeeded", "failed"]
    # The bytes and the mtime really are back: only the inode change time tells.
    for folder in ("outside", "inside"):
        original = (race.root / folder / "a.parquet").stat()
        assert original.st_ctime_ns != original.st_mtime_ns
    for dataset_id, _ in (outside, inside):
        settle(race.factory, race.settings, dataset_id)
    one, other = seen(race.client, race.keys, *outside), seen(race.client, race.keys, *inside)
    assert one == other
    shown = one["owner release"]
    assert (shown["status"], shown["reason"], shown["refunded"]) == (
        "failed",
        REFERENCE_CHANGED_BEFORE_SHOWN_REASON,
        False,
    )
    with race.factory() as session:
        row = session.get(Release, uuid.UUID(outside[1]))
        assert row is not None and row.reference_check == "changed"


def test_an_untouched_object_is_unchanged_by_its_inode_change_time(race: Race) -> None:
    """The negative control: reading (the job, the re-check) changes no inode change time."""
    dataset_id, release_id = race.released("untouched")
    settle(race.factory, race.settings, dataset_id)
    with race.factory() as session:
        row = session.get(Release, uuid.UUID(release_id))
        assert row is not None and row.reference_check == "unchanged"
        assert row.status == "succeeded"


def test_identity_records_what_the_writer_cannot_set_back(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    path.write_bytes(b"abc")
    location = objects.Location("file")
    before = objects._identity(None, location, str(path))
    assert objects.CTIME_NS in before
    requested = time.time_ns()
    status = path.stat()
    path.write_bytes(b"xyz")
    path.write_bytes(b"abc")
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    after = objects._identity(None, location, str(path))
    assert after["mtime_ns"] == before["mtime_ns"] and after["size"] == before["size"]
    # Changed and undone after the release's request: a change.
    assert objects.identity_differs(before, after, since_ns=requested)
    # Before the request (a same-bytes rewrite long ago), or with no request to compare: not.
    assert not objects.identity_differs(before, after, since_ns=time.time_ns() + 10**10)
    assert not objects.identity_differs(before, after)
    # A record made before the field existed compares the fields it has.
    legacy = {k: v for k, v in before.items() if k != objects.CTIME_NS}
    assert not objects.identity_differs(legacy, after, since_ns=requested)


def test_a_change_stamped_by_the_coarse_clock_counts(tmp_path: Path) -> None:
    """The kernel stamps a change time from its coarse clock (the last timer tick), which may
    lie before a release's request taken before the change: a change made and undone just
    after the request then carried stamps before it, and its release was shown as if nothing
    had changed (seen here: a link made after ``time.time_ns()`` stamped 1.6 ms before it).
    Stamps within a tick's slack before the request count; one long before does not."""
    path = tmp_path / "x.parquet"
    path.write_bytes(b"abc")
    location = objects.Location("file")
    before = objects._identity(None, location, str(path))
    requested = before[objects.CTIME_NS] + 10**9
    for behind_ms in (1, 4, 10):
        after = {**before, objects.CTIME_NS: requested - behind_ms * 10**6}
        assert objects.identity_differs(before, after, since_ns=requested), behind_ms
    long_ago = {**before, objects.CTIME_NS: requested - 10**9 // 2}
    assert not objects.identity_differs(before, long_ago, since_ns=requested)
    # On this machine's file system: a hard link added right after the request (only the
    # change time moves) is a change, whatever tick stamped it.
    requested = time.time_ns()
    os.link(path, tmp_path / "y.parquet")
    after = objects._identity(None, location, str(path))
    assert objects.identity_differs(before, after, since_ns=requested)


def test_an_s3_object_put_again_with_its_old_bytes_differs(bucket: str, s3_endpoint: str) -> None:
    """On an unversioned bucket the ETag of the same bytes is the same; LastModified is not."""
    from tests.reference.conftest import s3fs_for

    fs = s3fs_for(s3_endpoint)
    key = f"{bucket}/undo.parquet"
    fs.pipe(key, b"original")
    location = objects.Location("s3", s3_endpoint)
    before = objects._identity(fs, location, key)
    requested = time.time_ns()
    time.sleep(1.1)  # LastModified has whole seconds on S3
    fs.pipe(key, b"changed!")
    fs.pipe(key, b"original")
    after = objects._identity(fs, location, key)
    assert (after["etag"], after["size"]) == (before["etag"], before["size"])
    assert objects.identity_differs(before, after, since_ns=requested)
    assert not objects.identity_differs(before, after, since_ns=time.time_ns() + 10**10)
