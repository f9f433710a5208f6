"""The same rows written again are the same rows (a budget per row, not per byte).

Every cover row of an object was a name of its *bytes*: its path, its inode, its footer's
digest with its chunks' digests (whole, as a set, per column). A new footer over the very
same column chunks (a column renamed, key-value metadata added, the other columns dropped or
reordered: one ``pq.write_table`` each, the chunks byte for byte as before) or the rows written
again with another compression, row-group size, encoding or integer width shared none of them,
so the same rows became a second dataset with a second budget: every case below registered
``ready`` before. Now each chosen column's values in row order name the rows (``values://``,
:class:`~service.reference.integrity.ColumnValues`), and each ends ``failed`` with nothing
kept, on both databases. Columns too plain to name rows (a constant, a row index, a sorted
flag) are left out, so unrelated datasets holding them are still accepted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db.models import DatasetReferenceObject
from service.reference.integrity import ColumnValues
from tests.conftest import Keys
from tests.reference import helpers
from tests.reference.conftest import s3fs_for, write_local, write_parquet


@pytest.fixture
def settings(settings: Settings, root: Path, s3_endpoint: str, bucket: str) -> Settings:
    return settings.model_copy(
        update={"reference_roots": f"{root},s3://{bucket}/lake", "s3_endpoint_url": s3_endpoint}
    )


def test_the_same_rows_written_again_are_refused(
    client: TestClient,
    keys: Keys,
    make_key: Callable[[str], str],
    root: Path,
    session_factory: sessionmaker[Session],
) -> None:
    rng = np.random.default_rng(30)
    rows = rng.normal(size=(600, 3)) / 4
    counts = rng.integers(0, 1000, size=600)
    table = pa.table({"c0": rows[:, 0], "c1": rows[:, 1], "c2": rows[:, 2], "n": counts})
    first = helpers.register(
        client,
        keys.owner,
        write_local(root / "set" / "a.parquet", table, row_group_size=200),
        ["c0", "c1", "n"],
        helpers.FILE_BUDGET,
    )
    assert first.json()["registration_status"] == "ready", first.text
    with session_factory() as session:
        covers = session.query(DatasetReferenceObject).count()
    other = make_key("owner")
    same = {"row_group_size": 200}
    cases: list[tuple[str, str, list[str]]] = [
        # A new footer over the same chunks.
        (
            "a column renamed",
            write_local(
                root / "x" / "renamed.parquet", table.rename_columns(["v", "c1", "c2", "n"]), **same
            ),
            ["v"],
        ),
        (
            "key-value metadata",
            write_local(
                root / "x" / "meta.parquet", table.replace_schema_metadata({"k": "v"}), **same
            ),
            ["c0", "c1"],
        ),
        (
            "the other columns dropped",
            write_local(root / "x" / "one.parquet", table.select(["c1"]), **same),
            ["c1"],
        ),
        # The rows encoded again.
        (
            "zstd, row groups of 64, no dictionary",
            write_local(
                root / "x" / "recoded.parquet",
                table,
                compression="zstd",
                row_group_size=64,
                use_dictionary=False,
            ),
            ["c0", "c2"],
        ),
        (
            "an integer column as float64",
            write_local(
                root / "x" / "cast.parquet",
                table.select(["n", "c2"]).cast(
                    pa.schema([("n", pa.float64()), ("c2", pa.float64())])
                ),
            ),
            ["n", "c2"],
        ),
    ]
    outcomes = []
    for label, uri, columns in cases:
        response = helpers.register(client, other, uri, columns, helpers.FILE_BUDGET)
        assert response.status_code == 200, (label, response.text)
        body = response.json()
        outcomes.append((label, body["registration_status"]))
        if body["registration_status"] == "failed":
            assert "another live dataset" in body["registration_reason"], (label, body)
    assert all(status == "failed" for _, status in outcomes), outcomes
    with session_factory() as session:
        assert session.query(DatasetReferenceObject).count() == covers
    # The first dataset's column c2 was never registered: a file of it alone is its own.
    alone = write_local(root / "x" / "c2.parquet", table.select(["c2"]))
    fresh = helpers.register(client, other, alone, ["c2"], helpers.FILE_BUDGET)
    assert fresh.json()["registration_status"] == "ready", fresh.text


def test_the_same_rows_on_s3_and_in_a_file_are_refused(
    client: TestClient,
    keys: Keys,
    make_key: Callable[[str], str],
    root: Path,
    s3_endpoint: str,
    bucket: str,
) -> None:
    """The values are no object's bytes: rows registered on S3 and written again, to another
    key or to a local file under another root, are the same rows."""
    fs = s3fs_for(s3_endpoint)
    rows = np.random.default_rng(31).normal(size=(400, 2)) / 4
    names = write_parquet(fs, f"{bucket}/lake/a.parquet", rows, 100)
    helpers.registered(client, keys.owner, f"s3://{bucket}/lake/a.parquet", names)
    other = make_key("owner")
    table = pa.table({"u": rows[:, 0], "w": rows[:, 1]})
    with fs.open(f"{bucket}/lake/b.parquet", "wb") as handle:
        pq.write_table(table, handle, compression="gzip", row_group_size=150)
    local = write_local(root / "y" / "b.parquet", table, use_dictionary=False)
    for uri, columns in [(f"s3://{bucket}/lake/b.parquet", ["w"]), (local, ["u", "w"])]:
        refused = helpers.register(client, other, uri, columns, helpers.FILE_BUDGET)
        assert "another live dataset" in helpers.refusal(refused), (uri, refused.text)


def test_plain_columns_do_not_name_rows(
    client: TestClient, keys: Keys, make_key: Callable[[str], str], root: Path
) -> None:
    """Two unrelated datasets of one row count, each with a constant, a row index, a sorted
    flag and a rare flag besides its own values, are both registered."""
    n = 500
    plain = {
        "one": np.ones(n),
        "index": np.arange(n, dtype=np.float64),
        "grid": np.arange(n) * 0.1 - 3.0,
        "sorted_flag": (np.arange(n) >= n // 2).astype(np.float64),
        "rare_flag": (np.arange(n) % 50 == 7).astype(np.float64),
    }
    names = [*plain, "x"]
    for seed, key in ((1, keys.owner), (2, make_key("owner"))):
        x = np.random.default_rng(seed).normal(size=n) / 4
        uri = write_local(root / f"plain{seed}" / "a.parquet", pa.table({**plain, "x": x}))
        response = helpers.register(client, key, uri, names, helpers.FILE_BUDGET)
        assert response.json()["registration_status"] == "ready", (seed, response.text)


def test_a_column_chosen_twice_under_two_names_is_one_dataset(
    client: TestClient, keys: Keys, root: Path
) -> None:
    """Two chosen columns of one object holding the same values give one ``values://`` name
    (a cover row's names are unique: the registration was refused as covered elsewhere)."""
    x = np.random.default_rng(4).normal(size=300) / 4
    uri = write_local(root / "twice" / "a.parquet", pa.table({"x": x, "x_copy": x}))
    helpers.registered(client, keys.owner, uri, ["x", "x_copy"])


def _digest(values: np.ndarray[Any, Any], cut: int | None = None) -> str | None:
    column = ColumnValues()
    for part in np.split(values, [] if cut is None else [cut]):
        column.add(part)
    return column.digest()


def test_column_values_digest() -> None:
    """The digest is of the values in row order, however they are batched (row groups of
    another size batch them otherwise), with ``-0.0`` as ``0.0``; plain columns have none."""
    x = np.random.default_rng(3).normal(size=400)
    assert _digest(x) is not None
    assert _digest(x) == _digest(x, 1) == _digest(x, 250)
    assert _digest(x[::-1]) != _digest(x)
    zeros = np.where(x > 0, x, 0.0)
    assert _digest(zeros) == _digest(np.where(x > 0, x, -0.0)) is not None
    assert _digest(np.full(400, 2.5)) is None
    assert _digest(np.arange(400.0), 123) is None  # a progression across batches too
    assert _digest(np.arange(400) * 0.1 + 7.0) is None
    flag = (np.arange(400) % 3 == 0).astype(np.float64)
    assert _digest(flag) is not None  # 134 rows off the most common value, unsorted
    assert _digest(np.sort(flag)) is None
    assert _digest((np.arange(400) % 4 == 0).astype(np.float64)) is None  # 100 off it
