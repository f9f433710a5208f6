"""What a release on a dataset by reference reads is provably the registered data (issue 30):
content digests fixed at registration and checked as the bytes are read, containment and
regular-file checks at every open, registration's value checks repeated on what is read, row
counts that cannot be forged in a footer, non-regular files refused without hanging, a total
size bound, and no object covered by two live datasets. Every case ends ``failed`` or 4xx
with nothing released from data other than what was registered; on both databases."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import struct
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from service import reference as reference_module
from service.config import Settings
from service.db.models import DatasetReferenceObject
from service.errors import PayloadTooLarge
from service.reference import ParquetRows, Reference, ReferenceFault, inspect
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import Keys, bearer, fetch_release, post_release
from tests.reference import helpers
from tests.reference.conftest import s3fs_for, write_parquet

BUDGET = helpers.FILE_BUDGET
RELEASE = helpers.FILE_RELEASE


@pytest.fixture
def settings(settings: Settings, root: Path) -> Settings:
    return settings.model_copy(update={"reference_roots": str(root)})


@pytest.fixture
def rows() -> np.ndarray[Any, Any]:
    return np.random.default_rng(8).normal(size=(400, 3)) / 4


def plain_parquet(path: Path, rows: np.ndarray[Any, Any], row_group_rows: int = 100) -> list[str]:
    """Uncompressed, plain-encoded columns ``c0..``: each value's 8 bytes stand in the file."""
    names = [f"c{i}" for i in range(rows.shape[1])]
    table = pa.table({name: rows[:, i] for i, name in enumerate(names)})
    pq.write_table(
        table, path, row_group_size=row_group_rows, compression="none", use_dictionary=False
    )
    return names


def register(client: TestClient, key: str, uri: str, columns: list[str]) -> Any:
    """The POST's 4xx, or the dataset once a worker ran its registration (ready or failed)."""
    return helpers.register(client, key, uri, columns, BUDGET)


def registered(client: TestClient, key: str, uri: str, columns: list[str]) -> Any:
    response = register(client, key, uri, columns)
    assert response.json()["registration_status"] == "ready", response.text
    return response.json()


def forge_in_place(path: Path, old: float, new: bytes) -> None:
    """Overwrite the 8 bytes of value ``old`` with ``new``: same size, mtime put back."""
    status = path.stat()
    data = path.read_bytes()
    at = data.index(struct.pack("<d", old))
    path.write_bytes(data[:at] + new + data[at + 8 :])
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert path.stat().st_size == status.st_size
    assert path.stat().st_mtime_ns == status.st_mtime_ns


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(lambda v: struct.pack("<d", -v), id="negated"),
        pytest.param(lambda v: struct.pack("<d", float("nan")), id="nan"),
        pytest.param(lambda v: struct.pack("<d", 1e300), id="huge"),
    ],
)
def test_a_file_rewritten_in_place_with_its_mtime_put_back_fails_the_release(
    forged: Any,
    client: TestClient,
    keys: Keys,
    worker: Worker,
    root: Path,
    rows: np.ndarray[Any, Any],
) -> None:
    target = root / "set" / "a.parquet"
    names = plain_parquet(target, rows)
    dataset = register(client, keys.owner, str(root / "set"), names)
    assert dataset.json()["registration_status"] == "ready", dataset.text
    forge_in_place(target, float(rows[250, 1]), forged(float(rows[250, 1])))
    outcome = helpers.release(client, keys, dataset.json()["id"], worker)
    assert outcome["status"] == "failed", outcome
    assert outcome.get("result") is None
    assert "changed since registration" in outcome["reason"]
    # Decided by the digest, not by a value, but charged: whether a job met the change tells
    # when it was claimed (service.reference.integrity.object_fault).
    assert outcome["refunded"] is False


def test_a_file_swapped_for_a_symlink_out_of_the_roots_is_not_read(
    client: TestClient,
    keys: Keys,
    worker: Worker,
    root: Path,
    tmp_path: Path,
    rows: np.ndarray[Any, Any],
) -> None:
    """The link's target has the registered file's size and mtime (what was compared before),
    even its bytes: it lies outside DPSS_REFERENCE_ROOTS, so it is never opened."""
    target = root / "set" / "a.parquet"
    names = plain_parquet(target, rows)
    dataset = registered(client, keys.owner, str(target), names)
    outside = tmp_path / "private.parquet"
    shutil.copy2(target, outside)
    target.unlink()
    target.symlink_to(outside)
    outcome = helpers.release(client, keys, dataset["id"], worker)
    assert outcome["status"] == "failed", outcome
    assert "no longer a regular file" in outcome["reason"]


def _piece_reader(reference: Any, settings: Settings) -> Any:
    rows = ParquetRows(reference, settings)
    piece = reference.pieces[0]
    return lambda: reference_module._read_piece(
        rows.reference.location, piece, reference.columns, rows.records[piece.path]
    )


def test_every_open_checks_containment_and_regular_file(
    tmp_path: Path, root: Path, rows: np.ndarray[Any, Any]
) -> None:
    """Between the identity check and a task's open anything may be swapped: each open
    refuses a symlink, a directory on the way swapped for a symlink, a FIFO, and a path no
    longer under the roots."""
    settings = Settings(data_dir=tmp_path, reference_roots=str(root))
    target = root / "set" / "a.parquet"
    names = plain_parquet(target, rows)
    reference = inspect(str(root / "set"), names, settings)
    read = _piece_reader(reference, settings)
    assert read().shape == (100, 3)
    moved = tmp_path / "moved"
    shutil.copytree(root / "set", moved, copy_function=shutil.copy2)
    for swap in ("file-link", "directory-link", "fifo"):
        if (root / "set").is_symlink():
            (root / "set").unlink()
        shutil.rmtree(root / "set", ignore_errors=True)
        if swap == "directory-link":
            (root / "set").symlink_to(moved)
        else:
            (root / "set").mkdir()
            if swap == "file-link":
                target.symlink_to(moved / "a.parquet")
            else:
                os.mkfifo(target)
        with pytest.raises(ReferenceFault, match="no longer a regular file") as fault:
            read()
        assert fault.value.refund is False  # object_fault: never refunded
    shutil.rmtree(root / "set")
    shutil.copytree(moved, root / "set", copy_function=shutil.copy2)
    assert read().shape == (100, 3)
    elsewhere = Settings(data_dir=tmp_path, reference_roots=str(tmp_path / "other"))
    with pytest.raises(ReferenceFault, match="no longer a regular file"):
        _piece_reader(Reference.from_json(reference.to_json(), elsewhere), elsewhere)()


def test_an_s3_object_read_is_checked_against_its_digest(
    tmp_path: Path, s3_endpoint: str, bucket: str, rows: np.ndarray[Any, Any]
) -> None:
    """A task reading an overwritten object (past the ETag check) refuses its bytes."""
    settings = Settings(
        data_dir=tmp_path, reference_roots=f"s3://{bucket}", s3_endpoint_url=s3_endpoint
    )
    fs = s3fs_for(s3_endpoint)
    names = write_parquet(fs, f"{bucket}/d/a.parquet", rows, 100)
    reference = inspect(f"s3://{bucket}/d", names, settings)
    assert all(len(o["footer_sha256"]) == 64 for o in reference.objects)
    read = _piece_reader(reference, settings)
    np.testing.assert_array_equal(read(), rows[:100])
    write_parquet(fs, f"{bucket}/d/a.parquet", -rows, 100)
    with pytest.raises(ReferenceFault, match="changed since registration"):
        read()


def test_values_are_checked_again_as_they_are_read(
    tmp_path: Path, root: Path, rows: np.ndarray[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were the digest ever to pass on other bytes (a collision, simulated here), a NaN read
    still ends the release failed, and unrefunded: that failure would depend on a value."""
    settings = Settings(data_dir=tmp_path, reference_roots=str(root))
    target = root / "set" / "a.parquet"
    names = plain_parquet(target, rows)
    reference = inspect(str(target), names, settings)
    forge_in_place(target, float(rows[10, 0]), struct.pack("<d", float("nan")))
    monkeypatch.setattr(reference_module.reading, "_sha256", lambda data: "collision")
    for record in reference.objects:
        record["footer_sha256"] = "collision"
    reference.pieces = [
        reference_module.Piece(
            p.path,
            p.row_group,
            p.offset,
            p.rows,
            tuple(reference_module.Chunk(c.start, c.length, "collision") for c in p.chunks),
        )
        for p in reference.pieces
    ]
    with pytest.raises(ReferenceFault, match="differ from the registered ones") as fault:
        _piece_reader(reference, settings)()
    assert fault.value.refund is False


def test_a_reference_registered_before_digests_fails_refunded(
    tmp_path: Path, root: Path, rows: np.ndarray[Any, Any]
) -> None:
    settings = Settings(data_dir=tmp_path, reference_roots=str(root))
    names = plain_parquet(root / "set" / "a.parquet", rows)
    raw = inspect(str(root / "set"), names, settings).to_json()
    raw["pieces"] = [piece[:4] for piece in raw["pieces"]]  # as 0012 stored them
    with (
        pytest.raises(ReferenceFault, match="before content digests") as fault,
        reference_module.open_rows(raw, settings),
    ):
        pass
    assert fault.value.refund


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def lying_footer(data: bytes, true: int, claim: int, every_count: bool) -> bytes:
    """The file with its footer's row counts (the file's and the row group's; with
    ``every_count`` the column chunks' value counts too) set to ``claim``: the compact
    protocol's ``num_rows``/``num_values`` fields (i64, header byte 0x16, zigzag varint)."""
    length = struct.unpack("<I", data[-8:-4])[0]
    start = len(data) - 8 - length
    footer = data[start:-8]
    old, new = b"\x16" + _varint(2 * true), b"\x16" + _varint(2 * claim)
    found = [i for i in range(len(footer)) if footer.startswith(old, i)]
    assert len(found) >= 3  # the file's num_rows, each chunk's num_values, the group's num_rows
    for at in reversed(found if every_count else [found[0], found[-1]]):
        footer = footer[:at] + new + footer[at + len(old) :]
    return data[:start] + footer + struct.pack("<I", len(footer)) + b"PAR1"


@pytest.mark.parametrize("claim", [500, 999, 1001, 1_000_000])
@pytest.mark.parametrize("every_count", [False, True], ids=["row-counts", "every-count"])
def test_a_footer_lying_about_its_rows_is_refused(
    claim: int, every_count: bool, tmp_path: Path, root: Path
) -> None:
    """pyarrow decodes as many rows as the footer says: 500 for 1,000 silently dropped half,
    1,000,000 registered that public n for 1,000 rows. Counted from the pages, both refused."""
    settings = Settings(data_dir=tmp_path, reference_roots=str(root))
    rows = np.random.default_rng(2).normal(size=(1000, 2)) / 4
    path = root / "set" / "liar.parquet"
    names = plain_parquet(path, rows, row_group_rows=1000)
    path.write_bytes(lying_footer(path.read_bytes(), 1000, claim, every_count))
    assert pq.ParquetFile(path).metadata.num_rows == claim
    with pytest.raises(reference_module.InvalidInput) as refused:
        inspect(str(path), names, settings)
    assert refused.value.field == "uri"
    assert f"the footer says {claim} rows, the data holds 1000" in refused.value.detail


def test_a_lying_footer_fails_its_registration_and_registers_nothing(
    client: TestClient, keys: Keys, root: Path, session_factory: sessionmaker[Session]
) -> None:
    rows = np.random.default_rng(2).normal(size=(1000, 2)) / 4
    path = root / "set" / "liar.parquet"
    names = plain_parquet(path, rows, row_group_rows=1000)
    path.write_bytes(lying_footer(path.read_bytes(), 1000, 1_000_000, every_count=False))
    response = register(client, keys.owner, str(path), names)
    assert helpers.refusal(response).startswith("uri: "), response.text
    assert "the footer says 1000000 rows" in helpers.refusal(response)
    # Failed: no rows, no reference, no object covered, and no release taken.
    assert response.json()["reference"] == str(path)
    with session_factory() as session:
        assert session.query(DatasetReferenceObject).count() == 0


def test_a_release_counts_the_rows_it_reads(
    tmp_path: Path, root: Path, rows: np.ndarray[Any, Any]
) -> None:
    """Each task compares the rows it decoded with the registered count (a record that says
    otherwise ends the release failed, nothing released)."""
    settings = Settings(data_dir=tmp_path, reference_roots=str(root))
    names = plain_parquet(root / "set" / "a.parquet", rows)
    reference = inspect(str(root / "set"), names, settings)
    first = reference.pieces[0]
    reference.pieces[0] = reference_module.Piece(
        first.path, first.row_group, first.offset, first.rows + 1, first.chunks
    )
    with pytest.raises(ReferenceFault, match="differ from the registered ones"):
        _piece_reader(reference, settings)()


def _unblock(fifo: Path) -> None:
    """Let a reader blocked on ``fifo`` go (a writer opens and closes it), if any."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def _inspect_in_thread(uri: str, settings: Settings) -> BaseException | None:
    """:func:`inspect` in a thread; what it raised, or a failure if it is still blocked after a
    generous minute (before the fix it blocked in ``open`` for good)."""
    outcome: list[BaseException | None] = []

    def work() -> None:
        try:
            inspect(uri, ["c0", "c1", "c2"], settings)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(60)
    return outcome[0] if outcome else TimeoutError("still blocked")


def test_a_fifo_named_parquet_is_refused_at_once(
    tmp_path: Path, root: Path, rows: np.ndarray[Any, Any]
) -> None:
    settings = Settings(data_dir=tmp_path, reference_roots=str(root))
    plain_parquet(root / "set" / "a.parquet", rows)
    fifo = root / "set" / "b.parquet"
    os.mkfifo(fifo)
    try:
        for uri in (str(fifo), str(root / "set"), str(root)):
            refused = _inspect_in_thread(uri, settings)
            assert isinstance(refused, reference_module.InvalidInput), refused
            assert refused.field == "uri" and "not a regular file" in refused.detail
    finally:
        _unblock(fifo)


def test_registration_is_bounded_in_time(
    tmp_path: Path, root: Path, rows: np.ndarray[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past DPSS_REFERENCE_READ_SECONDS between two reads, the registration is refused (a
    clock that moves a minute per reading stands in for a slow share)."""
    settings = Settings(data_dir=tmp_path, reference_roots=str(root), reference_read_seconds=90)
    names = plain_parquet(root / "set" / "a.parquet", rows)
    ticks = itertools.count()
    monkeypatch.setattr(reference_module.objects.time, "monotonic", lambda: 60.0 * next(ticks))
    with pytest.raises(reference_module.InvalidInput, match="within 90 s"):
        inspect(str(root / "set"), names, settings)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"uri": "/data/a\x00.parquet", "columns": ["c0"]}, "uri"),
        ({"uri": "s3://bucket/a\x00b", "columns": ["c0"]}, "uri"),
        ({"uri": "/data", "columns": ["c\x000"]}, "columns.0"),
    ],
)
def test_a_nul_byte_answers_422_naming_the_field(
    body: dict[str, Any], field: str, client: TestClient, keys: Keys
) -> None:
    response = client.post(
        "/v1/dataset-references", headers=bearer(keys.owner), json={**BUDGET, **body}
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(f"{field}: "), response.text


def test_a_nul_byte_is_refused_by_the_domain_too(tmp_path: Path, root: Path) -> None:
    settings = Settings(data_dir=tmp_path, reference_roots=str(root))
    with pytest.raises(reference_module.InvalidInput, match="NUL"):
        inspect(f"{root}/a\x00b", ["c0"], settings)


def test_the_total_size_of_a_reference_is_bounded(
    tmp_path: Path, root: Path, rows: np.ndarray[Any, Any]
) -> None:
    """Row groups each far below the per-group bound, over several objects, together above
    DPSS_MAX_DATASET_BYTES: refused (413) before their bytes are read; at the bound, accepted."""
    names = plain_parquet(root / "set" / "a.parquet", rows[:200], row_group_rows=50)
    plain_parquet(root / "set" / "b.parquet", rows[200:], row_group_rows=50)
    exact = 400 * 3 * 8
    for limit in (exact - 8, exact // 2):
        settings = Settings(data_dir=tmp_path, reference_roots=str(root), max_dataset_bytes=limit)
        with pytest.raises(PayloadTooLarge) as refused:
            inspect(str(root / "set"), names, settings)
        assert refused.value.detail.startswith("uri: ")
        assert "DPSS_MAX_DATASET_BYTES" in refused.value.detail
    roomy = Settings(data_dir=tmp_path, reference_roots=str(root), max_dataset_bytes=2 * exact)
    assert inspect(str(root / "set"), names, roomy).shape == (400, 3)


def test_an_object_covered_by_a_live_dataset_is_refused(
    client: TestClient,
    keys: Keys,
    make_key: Callable[[str], str],
    root: Path,
    tmp_path: Path,
    rows: np.ndarray[Any, Any],
    session_factory: sessionmaker[Session],
) -> None:
    """By two owners or one, by the same path, another spelling of it, a directory holding it,
    or a copy of its bytes: 409 while the first dataset lives; registrable again once deleted."""
    names = plain_parquet(root / "set" / "a.parquet", rows[:200])
    plain_parquet(root / "set" / "b.parquet", rows[200:])
    first = register(client, keys.owner, str(root / "set" / "a.parquet"), names)
    assert first.json()["registration_status"] == "ready", first.text
    other = make_key("owner")
    (root / "copy").mkdir()
    shutil.copy(root / "set" / "a.parquet", root / "copy" / "x.parquet")
    (root / "alias").symlink_to(root / "set")
    # The object itself (however spelt) and a directory holding it (however spelt) are
    # refused by the POST; a copy only once read: the registration fails with the same reason.
    for key, uri, at_once in [
        (other, str(root / "set" / "a.parquet"), True),
        (keys.owner, str(root / "set" / "a.parquet"), True),
        (other, str(root / "set"), True),
        (other, str(root), True),
        (other, f"{root}/alias/../set/a.parquet", True),
        (other, str(root / "alias"), True),
        (other, str(root / "copy"), False),
    ]:
        response = register(client, key, uri, names)
        assert response.status_code == (409 if at_once else 200), (uri, response.text)
        if at_once:
            assert response.json()["error"] == "object_registered"
        detail = helpers.refusal(response)
        assert detail.startswith("uri: ") and "another live dataset" in detail, detail
    # Nothing was kept by the refusals: only the first dataset, its one object.
    with session_factory() as session:
        # The object's path, and its aliases (its columns in any order, its inode, each
        # column of a copy, each column's values).
        kinds = sorted(
            row.object_key.split("://")[0] for row in session.query(DatasetReferenceObject)
        )
        assert kinds == sorted(
            ["content-set", "file", "file-id", *["column", "values"] * len(names)]
        )
    registered(client, other, str(root / "set" / "b.parquet"), names)
    deleted = client.delete(f"/v1/datasets/{first.json()['id']}", headers=bearer(keys.owner))
    assert deleted.status_code == 204
    registered(client, other, str(root / "set" / "a.parquet"), names)


def test_the_same_s3_object_twice_is_refused(
    client: TestClient,
    keys: Keys,
    make_key: Callable[[str], str],
    settings: Settings,
    s3_endpoint: str,
    bucket: str,
    rows: np.ndarray[Any, Any],
) -> None:
    fs = s3fs_for(s3_endpoint)
    names = write_parquet(fs, f"{bucket}/lake/a.parquet", rows, 100)
    settings.reference_roots = f"s3://{bucket}/lake"
    settings.s3_endpoint_url = s3_endpoint
    registered(client, keys.owner, f"s3://{bucket}/lake", names)
    again = register(client, make_key("owner"), f"s3://{bucket}/lake/a.parquet", names)
    assert again.status_code == 409, again.text
    assert again.json()["error"] == "object_registered"


def test_copies_within_one_registration_are_refused(
    tmp_path: Path, root: Path, rows: np.ndarray[Any, Any]
) -> None:
    settings = Settings(data_dir=tmp_path, reference_roots=str(root))
    names = plain_parquet(root / "set" / "a.parquet", rows)
    shutil.copy(root / "set" / "a.parquet", root / "set" / "b.parquet")
    with pytest.raises(reference_module.InvalidInput, match="holds the same data as"):
        inspect(str(root / "set"), names, settings)


def test_the_database_refuses_a_second_live_cover(
    client: TestClient,
    keys: Keys,
    root: Path,
    rows: np.ndarray[Any, Any],
    session_factory: sessionmaker[Session],
) -> None:
    """Two registrations racing past the query: the unique constraints decide."""
    names = plain_parquet(root / "set" / "a.parquet", rows)
    first = registered(client, keys.owner, str(root / "set"), names)
    with session_factory() as session:
        (row,) = session.query(DatasetReferenceObject).filter(
            DatasetReferenceObject.object_key.startswith("file://")
        )
        for key_sha, content in [(row.key_sha256, "0" * 64), ("0" * 64, row.content_sha256)]:
            session.add(
                DatasetReferenceObject(
                    dataset_id=uuid.UUID(first["id"]),
                    object_key="x",
                    key_sha256=key_sha,
                    content_sha256=content,
                )
            )
            with pytest.raises(IntegrityError):
                session.flush()
            session.rollback()


@pytest.fixture
def empty_cluster() -> Iterator[str]:
    """A Dask scheduler with no worker at all."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=0, processes=False, dashboard_address=None, scheduler_port=0
    ) as cluster:
        yield cluster.scheduler_address


@pytest.mark.parametrize("when", ["before-the-first-task", "after-submission"])
def test_a_cluster_without_workers_fails_the_release(
    when: str,
    client: TestClient,
    keys: Keys,
    root: Path,
    rows: np.ndarray[Any, Any],
    settings: Settings,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    empty_cluster: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every Dask worker gone: the release stayed ``running`` until one came back. Now it ends
    ``failed`` after DPSS_DASK_WAIT_SECONDS. Refunded only when no worker came before its
    first task (nothing was read); once its tasks were submitted (simulated by skipping the
    first wait) a task may have read rows, so the cost stays charged (DESIGN: a refund only
    when the job provably never read the data)."""
    names = plain_parquet(root / "set" / "a.parquet", rows)
    dataset = registered(client, keys.owner, str(root / "set"), names)
    if when == "after-submission":
        monkeypatch.setattr(ParquetRows, "_await_workers", lambda self: None)
        monkeypatch.setattr(reference_module.engine, "WATCH_SECONDS", 0.2)
    on_empty = settings.model_copy(
        update={"dask_scheduler": empty_cluster, "dask_wait_seconds": 1.0}
    )
    release_id = post_release(client, keys.analyst, dataset["id"], **RELEASE)
    worker = Worker(session_factory, store, on_empty)
    runner = threading.Thread(target=worker.run_pending, daemon=True)
    runner.start()
    runner.join(120)  # generous: before the fix it never returned
    assert not runner.is_alive(), "the release still waits on a cluster without workers"
    outcome = fetch_release(client, keys.analyst, release_id)
    assert outcome["status"] == "failed", outcome
    assert "DPSS_DASK_WAIT_SECONDS" in outcome["reason"]
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget", headers=bearer(keys.owner))
    if when == "before-the-first-task":
        assert outcome["refunded"] is True, outcome
        assert "nothing was read" in outcome["reason"]
        assert budget.json()["epsilon_spent"] == "0"
    else:
        assert outcome["refunded"] is False, outcome
        assert "stays charged" in outcome["reason"]
        assert budget.json()["epsilon_spent"] == RELEASE["epsilon"]


def test_a_cluster_fault_after_submission_stays_charged(
    settings: Settings, root: Path, rows: np.ndarray[Any, Any]
) -> None:
    """Any cluster fault (a KilledWorker, a lost connection) is refunded only while no task
    was submitted: the class, not only the lost-workers wait."""
    from distributed import KilledWorker

    names = plain_parquet(root / "set" / "a.parquet", rows)
    on_dask = settings.model_copy(update={"reference_roots": str(root)})
    rows_source = ParquetRows(inspect(str(root / "set"), names, on_dask), on_dask)
    for exc in (KilledWorker("task", "worker", 1), OSError("gone")):
        rows_source._submitted = False
        assert rows_source._cluster_fault(exc).refund is True
        rows_source._submitted = True
        fault = rows_source._cluster_fault(exc)
        assert fault.refund is False and "stays charged" in fault.reason


def test_a_wide_row_group_is_fetched_in_few_requests(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Digests per column chunk, but the chunks of a row group side by side are fetched in one
    read: d requests per row group would make a wide table on S3 d times slower."""
    wide = np.random.default_rng(5).normal(size=(300, 40)) / 20
    names = plain_parquet(root / "set" / "w.parquet", wide, row_group_rows=100)
    settings = Settings(data_dir=tmp_path, reference_roots=str(root))
    reads: list[tuple[int, int]] = []
    original = reference_module._Object.read

    def counted(self: Any, start: int, length: int) -> bytes:
        reads.append((start, length))
        return original(self, start, length)

    monkeypatch.setattr(reference_module._Object, "read", counted)
    reference = inspect(str(root / "set"), names[::2], settings)  # every other column
    assert len(reference.pieces) == 3 and all(len(p.chunks) == 20 for p in reference.pieces)
    assert len(reads) == 2 + 3  # the footer's length and the footer, then one per row group
    reads.clear()
    np.testing.assert_array_equal(_piece_reader(reference, settings)(), wide[:100, ::2])
    assert len(reads) == 2


def test_a_forged_file_fails_the_release_on_dask_too(
    client: TestClient,
    keys: Keys,
    root: Path,
    rows: np.ndarray[Any, Any],
    settings: Settings,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    dask_scheduler: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The digest check runs in the Dask worker process that reads the row group; its fault
    comes back to the release's worker as such (failed, charged, the object named)."""
    target = root / "set" / "a.parquet"
    names = plain_parquet(target, rows)
    dataset = registered(client, keys.owner, str(root / "set"), names)
    forge_in_place(target, float(rows[310, 2]), struct.pack("<d", -float(rows[310, 2])))
    on_dask = Worker(
        session_factory, store, settings.model_copy(update={"dask_scheduler": dask_scheduler})
    )
    outcome = helpers.release(client, keys, dataset["id"], on_dask)
    assert outcome["status"] == "failed" and outcome["refunded"] is False, outcome
    assert outcome["reason"].startswith("a referenced object changed since registration")
    # The object is named in the worker's log only, never in the reason.
    assert str(target) not in outcome["reason"]
    assert any(f"({target})" in r.getMessage() for r in caplog.records)
