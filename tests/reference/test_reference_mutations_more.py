"""A second outside audit of "a referenced file cannot change under its budget", with the cases
``test_reference_mutations.py`` does not name: Parquet changes that keep the file's size and
modification time and touch only the footer (a key-value tag, the column names swapped), a
re-encoding with identical values, S3 (a prefix gaining or losing objects, an overwrite whose
ETag the identity check misses), continual batches (an old batch rewritten after its epoch,
two batches' objects swapped), a change between the tasks of one pass, dry runs on a changed
object and public priors on a dataset by reference. Each ends ``succeeded`` on
exactly the registered bytes, or ``failed`` and charged (a changed object is never refunded)
with nothing released; a dry run reads nothing and charges nothing. Both databases.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service import oneshot
from service.config import Settings
from service.reference import engine
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import Keys, bearer, fetch_release, post_release
from tests.reference import helpers
from tests.reference.conftest import s3fs_for, write_parquet
from tests.reference.test_integrity import plain_parquet
from tests.reference.test_reference_mutations import registered_on_s3

BUDGET = helpers.FILE_BUDGET
RELEASE = helpers.FILE_RELEASE


@pytest.fixture
def rows() -> np.ndarray[Any, Any]:
    return np.random.default_rng(9).normal(size=(400, 3)) / 4


@pytest.fixture(autouse=True)
def same_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oneshot, "secure_generator", lambda: np.random.default_rng(11))


def release(client: TestClient, keys: Keys, dataset: str, worker: Worker) -> Any:
    return helpers.release(client, keys, dataset, worker, read_as="owner")


def budget_of(client: TestClient, keys: Keys, dataset: str) -> Any:
    return client.get(f"/v1/datasets/{dataset}/budget", headers=bearer(keys.owner)).json()


def spent_more(after: Any, before: Any) -> float:
    """The epsilon charged between two budgets: a failed release on a changed object stays
    charged (service.reference.integrity.object_fault)."""
    return float(after["epsilon_spent"]) - float(before["epsilon_spent"])


def tagged_parquet(path: Path, rows: np.ndarray[Any, Any], tag: bytes) -> list[str]:
    """Plain columns ``c0..`` and a key-value ``tag`` in the footer."""
    names = [f"c{i}" for i in range(rows.shape[1])]
    table = pa.table({name: rows[:, i] for i, name in enumerate(names)})
    table = table.replace_schema_metadata({b"tag": tag})
    pq.write_table(table, path, row_group_size=100, compression="none", use_dictionary=False)
    return names


def in_footer(path: Path, swaps: list[tuple[bytes, bytes]]) -> None:
    """Replace byte strings inside the footer only (same size), the mtime put back."""
    status = path.stat()
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - length
    footer = data[start:]
    for old, new in swaps:
        assert len(old) == len(new) and old in footer
        footer = footer.replace(old, new)
    path.write_bytes(data[:start] + footer)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert path.stat().st_size == status.st_size


def footer_tag_changed(root: Path, rows: np.ndarray[Any, Any]) -> None:
    in_footer(root / "set" / "a.parquet", [(b"AAAAAAAA", b"BBBBBBBB")])


def column_names_swapped(root: Path, rows: np.ndarray[Any, Any]) -> None:
    """The footer's names of two columns exchanged: same values, other meanings."""
    in_footer(
        root / "set" / "a.parquet", [(b"c1", b"\x00\x01"), (b"c2", b"c1"), (b"\x00\x01", b"c2")]
    )


def reencoded_same_values(root: Path, rows: np.ndarray[Any, Any]) -> None:
    """The same values, dictionary-encoded and compressed, its mtime put back."""
    target = root / "set" / "a.parquet"
    status = target.stat()
    table = pq.read_table(target)
    pq.write_table(table, target, row_group_size=100, compression="snappy", use_dictionary=True)
    os.utime(target, ns=(status.st_atime_ns, status.st_mtime_ns))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(footer_tag_changed, id="footer-metadata-same-size"),
        pytest.param(column_names_swapped, id="footer-column-names-swapped"),
        pytest.param(reencoded_same_values, id="reencoded-identical-values"),
    ],
)
def test_a_footer_or_encoding_change_fails_the_release_charged_and_a_dry_run_reads_nothing(
    change: Callable[[Path, np.ndarray[Any, Any]], None],
    client: TestClient,
    keys: Keys,
    worker: Worker,
    root: Path,
    settings: Settings,
    rows: np.ndarray[Any, Any],
) -> None:
    settings.reference_roots = str(root)
    names = tagged_parquet(root / "set" / "a.parquet", rows[:200], b"AAAAAAAA")
    plain_parquet(root / "set" / "b.parquet", rows[200:])
    dataset = helpers.register(client, keys.owner, str(root / "set"), names, BUDGET).json()
    assert dataset["registration_status"] == "ready", dataset
    assert release(client, keys, dataset["id"], worker)["status"] == "succeeded"
    preview = client.post(
        f"/v1/datasets/{dataset['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=RELEASE,
    )
    assert preview.status_code == 200, preview.text
    budget = budget_of(client, keys, dataset["id"])
    change(root, rows)
    # A dry run reads no row: the same answer as before the change, nothing charged.
    again = client.post(
        f"/v1/datasets/{dataset['id']}/releases?dry_run=true",
        headers=bearer(keys.analyst),
        json=RELEASE,
    )
    assert again.status_code == 200 and again.json() == preview.json(), again.text
    assert budget_of(client, keys, dataset["id"]) == budget
    outcome = release(client, keys, dataset["id"], worker)
    assert outcome["status"] == "failed" and outcome["refunded"] is False, outcome
    assert outcome.get("result") is None and "a referenced object" in outcome["reason"]
    assert "a.parquet" not in outcome["reason"]
    assert spent_more(budget_of(client, keys, dataset["id"]), budget) == 1.0


@pytest.fixture
def lake(settings: Settings, s3_endpoint: str, bucket: str) -> Settings:
    return helpers.lake_settings(settings, s3_endpoint, bucket)


def test_an_s3_prefix_gaining_objects_is_not_read_and_losing_one_fails(
    lake: Settings,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    keys: Keys,
    bucket: str,
    s3_endpoint: str,
    rows: np.ndarray[Any, Any],
) -> None:
    fs = s3fs_for(s3_endpoint)
    names = write_parquet(fs, f"{bucket}/lake/p/b.parquet", rows[:200], 100)
    write_parquet(fs, f"{bucket}/lake/p/c.parquet", rows[200:], 100)
    uri = f"s3://{bucket}/lake/p/"
    with registered_on_s3(lake, session_factory, store, keys.owner, uri, names) as (
        client,
        worker,
        dataset,
    ):
        before = release(client, keys, dataset["id"], worker)
        assert before["status"] == "succeeded", before
        # Objects sorting before and after the registered ones, and one in a sub-prefix.
        for key in ("a.parquet", "d.parquet", "sub/e.parquet"):
            write_parquet(fs, f"{bucket}/lake/p/{key}", -rows[:150], 50)
        same = release(client, keys, dataset["id"], worker)
        assert same["status"] == "succeeded", same
        assert same["result"]["basis_sha256"] == before["result"]["basis_sha256"]
        assert same["n_rows_read"] == 400
        budget = budget_of(client, keys, dataset["id"])
        fs.rm(f"{bucket}/lake/p/c.parquet")
        gone = release(client, keys, dataset["id"], worker)
        assert gone["status"] == "failed" and gone["refunded"] is False, gone
        assert "a referenced object changed" in gone["reason"]
        assert "c.parquet" not in gone["reason"]
        assert spent_more(budget_of(client, keys, dataset["id"]), budget) == 1.0


def test_an_s3_overwrite_the_identity_check_misses_is_caught_by_the_digests(
    lake: Settings,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    keys: Keys,
    bucket: str,
    s3_endpoint: str,
    rows: np.ndarray[Any, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Other bytes of the same size under the same ETag (a multipart ETag is no content hash,
    and an S3-compatible store may reuse one): the identity check is made to see the recorded
    identity, and the digests of the bytes read still refuse the object, charged."""
    fs = s3fs_for(s3_endpoint)
    key = f"{bucket}/lake/m/a.parquet"
    names = write_parquet(fs, key, rows, 100)
    uri = f"s3://{bucket}/lake/m/"
    with registered_on_s3(lake, session_factory, store, keys.owner, uri, names) as (
        client,
        worker,
        dataset,
    ):
        assert release(client, keys, dataset["id"], worker)["status"] == "succeeded"
        recorded = fs.info(key, refresh=True)
        write_parquet(fs, key, -rows, 100)  # negated: the same size
        assert fs.info(key, refresh=True)["size"] == recorded["size"]
        real = engine._identity

        def stale(fs_: Any, location: Any, path: str) -> dict[str, Any]:
            current = real(fs_, location, path)
            return {**current, "etag": str(recorded.get("ETag", ""))}

        monkeypatch.setattr(engine, "_identity", stale)
        outcome = release(client, keys, dataset["id"], worker)
        assert outcome["status"] == "failed" and outcome["refunded"] is False, outcome
        assert "changed since registration" in outcome["reason"]


def _continual(client: TestClient, keys: Keys, dataset_id: str, horizon: int) -> str:
    return post_release(
        client, keys.analyst, dataset_id, mechanism="continual_gauss", k=2, epsilon="1",
        delta="1e-5", params={"horizon": horizon},
    )  # fmt: skip


@pytest.mark.parametrize("change", ["old-batch-rewritten", "batches-swapped"])
def test_an_old_batch_changed_after_its_epoch_fails_the_next_epoch_charged(
    change: str,
    lake: Settings,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    keys: Keys,
    bucket: str,
    s3_endpoint: str,
) -> None:
    """Epoch 1 released from batch 0; then batch 0's object is rewritten (or batch 0's and
    batch 1's objects exchange names, each keeping its own bytes): epoch 2 is not released, the
    release ends ``failed`` naming the object, charged (epoch 1 was released); a one-shot
    release over both batches fails, charged."""
    data = np.random.default_rng(3).normal(size=(1200, 3)) / 4
    fs = s3fs_for(s3_endpoint)
    names = write_parquet(fs, f"{bucket}/lake/w1/a.parquet", data[:600], 200)
    write_parquet(fs, f"{bucket}/lake/w2/c.parquet", data[600:], 200)
    uri, budget = f"s3://{bucket}/lake/w1/", helpers.CONTINUAL_BUDGET
    with registered_on_s3(lake, session_factory, store, keys.owner, uri, names, budget) as (
        client,
        worker,
        dataset,
    ):
        continual_id = _continual(client, keys, dataset["id"], 2)
        worker.run_pending()
        assert fetch_release(client, keys.owner, continual_id)["epochs_done"] == 1
        posted = client.post(
            f"/v1/dataset-references/{dataset['id']}/batches",
            headers=bearer(keys.owner),
            json={"uri": f"s3://{bucket}/lake/w2/"},
        )
        assert posted.status_code == 202, posted.text
        helpers.run_registrations(client)
        body = client.get(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner)).json()
        assert body["n_batches"] == 2, body
        a, c = f"{bucket}/lake/w1/a.parquet", f"{bucket}/lake/w2/c.parquet"
        if change == "old-batch-rewritten":
            write_parquet(fs, a, data[:600] * 0.5, 200)
        else:
            fs.copy(a, f"{bucket}/lake/tmp.parquet")
            fs.copy(c, a)
            fs.copy(f"{bucket}/lake/tmp.parquet", c)
        one_shot = post_release(client, keys.analyst, dataset["id"], **RELEASE)
        worker.run_pending()
        ended = fetch_release(client, keys.owner, continual_id)
        assert (ended["status"], ended["epochs_done"], ended["refunded"]) == ("failed", 1, False)
        assert "a referenced object changed since registration" in ended["reason"], ended
        failed = fetch_release(client, keys.owner, one_shot)
        assert failed["status"] == "failed" and failed["refunded"] is False, failed


def test_a_prior_is_refused_on_a_dataset_by_reference_before_any_charge(
    client: TestClient,
    keys: Keys,
    root: Path,
    settings: Settings,
    rows: np.ndarray[Any, Any],
) -> None:
    """A stored prior's digest is checked by the worker before a row is read (tests/api/
    test_priors.py); on a dataset by reference a prior is refused outright, inline or stored,
    by a release and by a dry run, naming the field, nothing charged."""
    settings.reference_roots = str(root)
    names = plain_parquet(root / "set" / "a.parquet", rows)
    dataset = helpers.register(client, keys.owner, str(root / "set"), names, BUDGET).json()
    budget = budget_of(client, keys, dataset["id"])
    basis = np.eye(3)[:, :2]
    stored = client.post(
        "/v1/priors",
        headers=bearer(keys.analyst),
        files={"file": ("p.npy", _npy(basis), "application/octet-stream")},
    )
    assert stored.status_code == 201, stored.text
    for params, field in (
        ({"prior_basis": basis.tolist()}, "params.prior_basis"),
        ({"prior_id": stored.json()["id"]}, "params.prior_id"),
    ):
        for query in ("", "?dry_run=true"):
            answer = client.post(
                f"/v1/datasets/{dataset['id']}/releases{query}",
                headers=bearer(keys.analyst),
                json={**RELEASE, "params": params},
            )
            assert answer.status_code == 422, answer.text
            assert str(answer.json()["detail"]).startswith(field), answer.text
    assert budget_of(client, keys, dataset["id"]) == budget


def _npy(matrix: np.ndarray[Any, Any]) -> bytes:
    import io

    out = io.BytesIO()
    np.save(out, matrix, allow_pickle=False)
    return out.getvalue()


def test_a_change_between_tasks_of_one_pass_fails_it(
    client: TestClient,
    keys: Keys,
    root: Path,
    settings: Settings,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    rows: np.ndarray[Any, Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One task per row group (``DPSS_DASK_TASK_MB`` tiny): the object is rewritten in place
    (same size, mtime put back) after the first task read its row group, in a group a later
    task reads; that task's digests refuse it and the pass fails, charged, nothing released
    (each task checks its own bytes, in process as on a Dask worker)."""
    from tests.reference.test_integrity import forge_in_place

    settings.reference_roots = str(root)
    target = root / "set" / "a.parquet"
    names = plain_parquet(target, rows)  # 4 row groups of 100
    dataset = helpers.register(client, keys.owner, str(root / "set"), names, BUDGET).json()
    budget = budget_of(client, keys, dataset["id"])
    real = engine._read_piece
    read: list[int] = []
    forged: list[int] = []

    def then_forge(*args: Any) -> Any:
        read.append(args[1].row_group)
        out = real(*args)
        if len(read) == 1:  # a group no task has read yet (the order is the scheduler's)
            forged.append(3 if read[0] != 3 else 0)
            row = 100 * forged[0] + 50
            forge_in_place(target, float(rows[row, 1]), np.float64(-rows[row, 1]).tobytes())
        return out

    monkeypatch.setattr(engine, "_read_piece", then_forge)
    per_group = Worker(session_factory, store, settings.model_copy(update={"dask_task_mb": 1e-6}))
    outcome = release(client, keys, dataset["id"], per_group)
    assert forged[0] in read[1:], read  # a later task read the new bytes
    assert outcome["status"] == "failed" and outcome["refunded"] is False, outcome
    assert outcome["reason"].startswith("a referenced object changed since registration")
    # The object is named in the worker's log only, never in the reason.
    assert str(target) not in outcome["reason"]
    assert any(f"({target})" in r.getMessage() for r in caplog.records)
    assert spent_more(budget_of(client, keys, dataset["id"]), budget) == 1.0
