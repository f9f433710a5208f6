"""An outside audit of "a referenced file cannot change under its budget": every way a shared
filesystem lets an object change between registration and a release (or during it), each
ending either ``succeeded`` on exactly the registered bytes (the same basis, bit for bit, as a
release before the change, drawn with the same noise) or ``failed`` and charged with nothing
released (never refunded: whether a job met the change tells when it was claimed); never a
success on other bytes. On both databases.

``tests/reference/test_integrity.py`` covers an in-place rewrite with its mtime put back, a
symlink to a file outside the roots, an overwritten S3 object and the Dask path; this covers
the cases nobody named there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service import oneshot
from service.config import Settings
from service.reference import ParquetRows
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import Keys, bearer, fetch_release, post_release
from tests.reference import helpers
from tests.reference.conftest import s3fs_for, write_parquet
from tests.reference.test_integrity import forge_in_place, plain_parquet

BUDGET = helpers.FILE_BUDGET
RELEASE = helpers.FILE_RELEASE


@pytest.fixture
def settings(settings: Settings, root: Path) -> Settings:
    return settings.model_copy(update={"reference_roots": str(root)})


@pytest.fixture
def rows() -> np.ndarray[Any, Any]:
    return np.random.default_rng(8).normal(size=(400, 3)) / 4


@pytest.fixture(autouse=True)
def same_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every release draws the same noise: a release on the registered bytes gives one basis."""
    monkeypatch.setattr(oneshot, "secure_generator", lambda: np.random.default_rng(11))


def release(client: TestClient, keys: Keys, dataset: str, worker: Worker) -> Any:
    return helpers.release(client, keys, dataset, worker, read_as="owner")


def keep_times(path: Path, like: os.stat_result) -> None:
    os.utime(path, ns=(like.st_atime_ns, like.st_mtime_ns))


def two_files(root: Path, rows: np.ndarray[Any, Any]) -> tuple[list[str], Path, Path]:
    first, second = root / "set" / "a.parquet", root / "set" / "b.parquet"
    names = plain_parquet(first, rows[:200])
    plain_parquet(second, rows[200:])
    return names, first, second


def registered_files(
    client: TestClient, keys: Keys, root: Path, rows: np.ndarray[Any, Any]
) -> tuple[Any, Path]:
    """The owner registers :func:`two_files` (under ``root/set``): the dataset's body and the
    first file."""
    names, first, _ = two_files(root, rows)
    return helpers.register(client, keys.owner, str(root / "set"), names, BUDGET).json(), first


@contextlib.contextmanager
def registered_on_s3(
    settings: Settings,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    owner: str,
    uri: str,
    names: list[str],
    budget: dict[str, Any] = BUDGET,
) -> Iterator[tuple[TestClient, Worker, Any]]:
    """A client of an app on ``settings`` (an S3 lake) and a worker, and in it the owner's
    registration of the objects ``names`` under ``uri``: the client, the worker and the
    dataset's body."""
    from service.app import create_app

    app = create_app(settings, session_factory=session_factory)
    worker = Worker(session_factory, store, settings)
    with TestClient(app) as client:
        yield client, worker, helpers.register(client, owner, uri, names, budget).json()


def renamed_over(root: Path, rows: np.ndarray[Any, Any]) -> None:
    """Atomic replace: a new inode of the same size and mtime holding other values."""
    target = root / "set" / "a.parquet"
    status = target.stat()
    fresh = root / "set" / ".a.tmp"
    plain_parquet(fresh, -rows[:200])
    keep_times(fresh, status)
    assert fresh.stat().st_size == status.st_size
    os.replace(fresh, target)


def renamed_same_bytes(root: Path, rows: np.ndarray[Any, Any]) -> None:
    """Atomic replace by a copy of the very bytes (a new inode): the registered bytes."""
    target = root / "set" / "a.parquet"
    fresh = root / "set" / ".a.tmp"
    shutil.copy2(target, fresh)
    os.replace(fresh, target)
    helpers.past_the_slack(target)  # a change made before the request, not just after it


def through_a_hardlink(root: Path, rows: np.ndarray[Any, Any]) -> None:
    """Another name of the same inode, outside the set, rewritten in place, mtime put back."""
    target = root / "set" / "a.parquet"
    other = root / "elsewhere.bin"
    os.link(target, other)
    forge_in_place(other, float(rows[50, 1]), struct.pack("<d", -float(rows[50, 1])))


def truncated(root: Path, rows: np.ndarray[Any, Any]) -> None:
    target = root / "set" / "b.parquet"
    status = target.stat()
    with open(target, "r+b") as handle:
        handle.truncate(status.st_size - 8)
    keep_times(target, status)


def appended(root: Path, rows: np.ndarray[Any, Any]) -> None:
    target = root / "set" / "b.parquet"
    status = target.stat()
    with open(target, "ab") as handle:
        handle.write(b"PAR1")
    keep_times(target, status)


def parent_swapped_for_a_symlink(root: Path, rows: np.ndarray[Any, Any]) -> None:
    """The directory renamed away and a symlink put in its place, to a forged copy under the
    same root (same names, sizes and mtimes)."""
    forged = root / "forged"
    shutil.copytree(root / "set", forged)
    for name in ("a.parquet", "b.parquet"):
        forge_target = forged / name
        status = forge_target.stat()
        data = forge_target.read_bytes().replace(
            struct.pack("<d", float(rows[10, 0])), struct.pack("<d", -float(rows[10, 0]))
        )
        forge_target.write_bytes(data)
        keep_times(forge_target, status)
    os.rename(root / "set", root / "set-old")
    os.symlink(forged, root / "set")


def file_swapped_for_a_symlink_inside(root: Path, rows: np.ndarray[Any, Any]) -> None:
    """A symlink to a forged copy under the roots (so containment alone does not refuse it)."""
    target = root / "set" / "a.parquet"
    forged = root / "forged.parquet"
    shutil.copy2(target, forged)
    forge_in_place(forged, float(rows[20, 2]), struct.pack("<d", -float(rows[20, 2])))
    target.unlink()
    target.symlink_to(forged)


def names_swapped(root: Path, rows: np.ndarray[Any, Any]) -> None:
    """The two objects' names exchanged (each keeps the other's size and mtime)."""
    first, second = root / "set" / "a.parquet", root / "set" / "b.parquet"
    one, two = first.stat(), second.stat()
    os.rename(first, root / "set" / "tmp")
    os.rename(second, first)
    os.rename(root / "set" / "tmp", second)
    keep_times(first, one)
    keep_times(second, two)


def one_removed(root: Path, rows: np.ndarray[Any, Any]) -> None:
    (root / "set" / "b.parquet").unlink()


def one_added(root: Path, rows: np.ndarray[Any, Any]) -> None:
    """A new object in the directory: not registered, so never read."""
    plain_parquet(root / "set" / "0-new.parquet", -rows[:100])


def touched(root: Path, rows: np.ndarray[Any, Any]) -> None:
    """Same bytes, a new mtime: the identity changed, so the release is refused (stricter)."""
    target = root / "set" / "a.parquet"
    status = target.stat()
    os.utime(target, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))


FAILED = [
    pytest.param(renamed_over, id="atomic-rename-same-size-and-mtime"),
    pytest.param(through_a_hardlink, id="hardlink-rewritten"),
    pytest.param(truncated, id="truncated"),
    pytest.param(appended, id="appended"),
    pytest.param(parent_swapped_for_a_symlink, id="parent-directory-symlink"),
    pytest.param(file_swapped_for_a_symlink_inside, id="file-symlink-inside-roots"),
    pytest.param(names_swapped, id="names-swapped"),
    pytest.param(one_removed, id="object-removed"),
    pytest.param(touched, id="mtime-only"),
]


@pytest.mark.parametrize("change", FAILED)
def test_a_changed_file_fails_the_release_charged(
    change: Callable[[Path, np.ndarray[Any, Any]], None],
    client: TestClient,
    keys: Keys,
    worker: Worker,
    root: Path,
    rows: np.ndarray[Any, Any],
) -> None:
    dataset, _ = registered_files(client, keys, root, rows)
    assert dataset["registration_status"] == "ready", dataset
    before = release(client, keys, dataset["id"], worker)
    assert before["status"] == "succeeded", before
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner))
    change(root, rows)
    outcome = release(client, keys, dataset["id"], worker)
    assert outcome["status"] == "failed", outcome
    # Charged (no refund): whether a job met the change tells when a worker claimed it, that
    # is when the job ahead in the shared queue ended (service.reference.integrity.object_fault).
    assert outcome["refunded"] is False, outcome
    assert outcome.get("result") is None
    after = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner))
    spent = (budget.json()["epsilon_spent"], after.json()["epsilon_spent"])
    assert [float(x) for x in spent] == [1.0, 2.0]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(renamed_same_bytes, id="atomic-rename-same-bytes"),
        pytest.param(one_added, id="object-added"),
    ],
)
def test_a_change_that_keeps_the_registered_bytes_releases_from_them(
    change: Callable[[Path, np.ndarray[Any, Any]], None],
    client: TestClient,
    keys: Keys,
    worker: Worker,
    root: Path,
    rows: np.ndarray[Any, Any],
) -> None:
    dataset, _ = registered_files(client, keys, root, rows)
    before = release(client, keys, dataset["id"], worker)
    assert before["status"] == "succeeded", before
    change(root, rows)
    outcome = release(client, keys, dataset["id"], worker)
    assert outcome["status"] == "succeeded", outcome
    assert outcome["result"]["basis_sha256"] == before["result"]["basis_sha256"]
    assert outcome["n_rows_read"] == before["n_rows_read"] == 400


def test_a_change_after_the_first_check_is_caught_as_the_bytes_are_read(
    client: TestClient,
    keys: Keys,
    worker: Worker,
    root: Path,
    rows: np.ndarray[Any, Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """TOCTOU: the object changes (same size and mtime) right after the identities were
    compared and before any row group is read: the digest of the bytes read refuses them."""
    dataset, first = registered_files(client, keys, root, rows)
    checked = ParquetRows.check_unchanged
    calls: list[int] = []

    def then_forge(self: ParquetRows) -> None:
        checked(self)
        calls.append(1)
        if len(calls) == 1:
            forge_in_place(first, float(rows[60, 0]), struct.pack("<d", -float(rows[60, 0])))

    monkeypatch.setattr(ParquetRows, "check_unchanged", then_forge)
    outcome = release(client, keys, dataset["id"], worker)
    assert outcome["status"] == "failed" and outcome["refunded"] is False, outcome
    assert outcome["reason"].startswith("a referenced object changed since registration")
    # The object is named in the worker's log only, never in the reason.
    assert str(first) not in outcome["reason"]
    assert any(f"({first})" in r.getMessage() for r in caplog.records)


def test_a_change_between_passes_of_one_run_fails_it(
    client: TestClient,
    keys: Keys,
    worker: Worker,
    root: Path,
    rows: np.ndarray[Any, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A mechanism reading the rows twice (a clip quantile's norms, then the Gram pass): the object
    changes after the first pass; the second pass's reads refuse the new bytes, and the change
    put back before the final identity check does not make the release succeed."""
    dataset, first = registered_files(client, keys, root, rows)
    original = first.read_bytes()
    status = first.stat()
    passes = ParquetRows._compute
    seen: list[int] = []

    def forge_between(self: ParquetRows, *args: Any, **kwargs: Any) -> Any:
        seen.append(1)
        out = passes(self, *args, **kwargs)
        if len(seen) == 1:
            forge_in_place(first, float(rows[70, 1]), struct.pack("<d", -float(rows[70, 1])))
        return out

    monkeypatch.setattr(ParquetRows, "_compute", forge_between)
    body = {**RELEASE, "params": {"clip_quantile": 0.9}}
    release_id = post_release(client, keys.analyst, dataset["id"], **body)
    real_check = ParquetRows.check_unchanged
    checks: list[int] = []

    def restore_before_last(self: ParquetRows) -> None:
        checks.append(1)
        if len(checks) == 2:  # the check after the run: the bytes put back
            first.write_bytes(original)
            keep_times(first, status)
        real_check(self)

    monkeypatch.setattr(ParquetRows, "check_unchanged", restore_before_last)
    assert worker.run_pending() == 1
    outcome = fetch_release(client, keys.owner, release_id)
    assert len(seen) == 2  # the norms' pass, then the Gram pass, which refused the bytes
    assert outcome["status"] == "failed" and outcome["refunded"] is False, outcome


@pytest.fixture
def s3_settings(settings: Settings, s3_endpoint: str, bucket: str) -> Settings:
    return helpers.lake_settings(settings, s3_endpoint, bucket)


def test_an_s3_object_rewritten_with_the_same_bytes_releases_them_and_other_bytes_fail(
    s3_settings: Settings,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    keys: Keys,
    bucket: str,
    s3_endpoint: str,
    rows: np.ndarray[Any, Any],
) -> None:
    """Same bytes, same ETag (an unversioned bucket): the registered bytes, released; other
    bytes: failed and charged, nothing released."""
    fs = s3fs_for(s3_endpoint)
    names = write_parquet(fs, f"{bucket}/lake/d/a.parquet", rows, 100)
    uri = f"s3://{bucket}/lake/d/"
    with registered_on_s3(s3_settings, session_factory, store, keys.owner, uri, names) as (
        client,
        worker,
        dataset,
    ):
        assert dataset["registration_status"] == "ready", dataset
        before = release(client, keys, dataset["id"], worker)
        assert before["status"] == "succeeded", before
        write_parquet(fs, f"{bucket}/lake/d/a.parquet", rows, 100)
        # LastModified has whole seconds: a put in the second before a request counts as a
        # change after it (service.reference.objects.identity_differs).
        time.sleep(1.1)
        same = release(client, keys, dataset["id"], worker)
        assert same["status"] == "succeeded", same
        assert same["result"]["basis_sha256"] == before["result"]["basis_sha256"]
        write_parquet(fs, f"{bucket}/lake/d/a.parquet", -rows, 100)
        other = release(client, keys, dataset["id"], worker)
        assert other["status"] == "failed" and other["refunded"] is False, other
        assert other.get("result") is None


def test_a_versioned_s3_object_overwritten_fails_and_its_registered_version_releases(
    s3_settings: Settings,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    keys: Keys,
    bucket: str,
    s3_endpoint: str,
    rows: np.ndarray[Any, Any],
) -> None:
    """A versioned bucket: the registration records the object's VersionId. Overwritten (a new
    current version, other bytes): failed and charged. The new version deleted (the registered
    one current again): the same basis as before, bit for bit."""
    fs = s3fs_for(s3_endpoint)
    fs.make_bucket_versioned(bucket)
    key = f"{bucket}/lake/v/a.parquet"
    names = write_parquet(fs, key, rows, 100)
    uri = f"s3://{bucket}/lake/v/"
    with registered_on_s3(s3_settings, session_factory, store, keys.owner, uri, names) as (
        client,
        worker,
        dataset,
    ):
        assert dataset["registration_status"] == "ready", dataset
        before = release(client, keys, dataset["id"], worker)
        assert before["status"] == "succeeded", before
        write_parquet(fs, key, -rows, 100)
        newest = fs.info(key, refresh=True)["VersionId"]
        assert newest is not None
        other = release(client, keys, dataset["id"], worker)
        assert other["status"] == "failed" and other["refunded"] is False, other
        assert other.get("result") is None
        fs.call_s3("delete_object", Bucket=bucket, Key="lake/v/a.parquet", VersionId=newest)
        again = release(client, keys, dataset["id"], worker)
        assert again["status"] == "succeeded", again
        assert again["result"]["basis_sha256"] == before["result"]["basis_sha256"]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(renamed_over, id="atomic-rename-same-size-and-mtime"),
        pytest.param(parent_swapped_for_a_symlink, id="parent-directory-symlink"),
        pytest.param(names_swapped, id="names-swapped"),
    ],
)
def test_a_changed_file_fails_the_release_charged_on_dask_too(
    change: Callable[[Path, np.ndarray[Any, Any]], None],
    client: TestClient,
    keys: Keys,
    root: Path,
    rows: np.ndarray[Any, Any],
    settings: Settings,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    dask_scheduler: str,
) -> None:
    """The same changes, the row groups read by Dask's workers: failed, charged."""
    dataset, _ = registered_files(client, keys, root, rows)
    on_dask = Worker(
        session_factory, store, settings.model_copy(update={"dask_scheduler": dask_scheduler})
    )
    before = release(client, keys, dataset["id"], on_dask)
    assert before["status"] == "succeeded", before
    change(root, rows)
    outcome = release(client, keys, dataset["id"], on_dask)
    assert outcome["status"] == "failed" and outcome["refunded"] is False, outcome
    assert outcome.get("result") is None
