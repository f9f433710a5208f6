"""The same rows in another order, split, merged, trimmed or rounded are the same rows.

Every name of an object's rows was in row order (``values://``: each chosen column's values
as float64, in order) or of its bytes, so the same people's rows permuted, split across two
objects, two objects merged into one, one row dropped or changed, or the values written as
float32 became a second dataset with a second budget: every case below registered ``ready``
before. Now a public sample of the rows names them whatever their order (``row://``,
:class:`~service.reference.integrity.RowMarks`), and each ends ``failed`` with nothing kept,
on both databases. Rows too plain to name a person (integers, a few decimals, a row repeated
in its object) are not sampled, so unrelated datasets of small integers or binary answers,
whose rows coincide, are still accepted."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db.models import DatasetReferenceObject
from service.reference.integrity import ROW_MARKS_KEPT, RowMarks
from tests.conftest import Keys, bearer
from tests.reference import helpers
from tests.reference.conftest import rows_table, write_local

Rows = np.ndarray[Any, Any]
NAMES = ["c0", "c1", "c2"]


@pytest.fixture
def settings(settings: Settings, root: Path) -> Settings:
    return settings.model_copy(update={"reference_roots": str(root)})


def _write(path: Path, rows: Rows, dtype: Any = pa.float64()) -> None:
    write_local(path, rows_table(rows, dtype), row_group_size=700)


def test_the_same_rows_in_another_order_or_part_are_refused(
    client: TestClient,
    keys: Keys,
    make_key: Callable[[str], str],
    root: Path,
    session_factory: sessionmaker[Session],
) -> None:
    rng = np.random.default_rng(40)
    rows = rng.normal(size=(4000, 3)) / 4
    first, second = rows[:2000], rows[2000:]
    _write(root / "set" / "a.parquet", first)
    _write(root / "set" / "b.parquet", second)
    registered = helpers.register(client, keys.owner, str(root / "set"), NAMES, helpers.FILE_BUDGET)
    assert registered.json()["registration_status"] == "ready", registered.text
    with session_factory() as session:
        covers = session.query(DatasetReferenceObject).count()
    changed = second.copy()
    changed[17] += 0.5  # every column: each column's values in order differ
    cases: list[tuple[str, list[tuple[str, Rows]], Any]] = [
        ("rows permuted", [("a", first[rng.permutation(2000)])], pa.float64()),
        ("rows split in two objects", [("a", first[:700]), ("b", first[700:])], pa.float64()),
        ("two objects merged into one", [("a", rows)], pa.float64()),
        ("one row dropped", [("a", np.delete(first, 5, axis=0))], pa.float64()),
        ("one row changed", [("a", changed)], pa.float64()),
        ("values written as float32", [("a", second)], pa.float32()),
    ]
    other = make_key("owner")
    outcomes = []
    for number, (label, objects, dtype) in enumerate(cases):
        for name, held in objects:
            _write(root / f"case{number}" / f"{name}.parquet", held, dtype)
        uri = str(root / f"case{number}")
        response = helpers.register(client, other, uri, NAMES, helpers.FILE_BUDGET)
        assert response.status_code == 200, (label, response.text)
        body = response.json()
        outcomes.append((label, body["registration_status"]))
        if body["registration_status"] == "failed":
            reason = body["registration_reason"]
            assert "another live dataset" in reason, (label, body)
            assert str(root / f"case{number}") in reason, (label, body)
            assert "row://" not in reason, (label, body)  # names an object, never a row
    assert all(status == "failed" for _, status in outcomes), outcomes
    with session_factory() as session:
        assert session.query(DatasetReferenceObject).count() == covers
    # Unrelated rows of the same shape are their own dataset.
    _write(root / "fresh" / "a.parquet", rng.normal(size=(4000, 3)) / 4)
    fresh = helpers.register(client, other, str(root / "fresh"), NAMES, helpers.FILE_BUDGET)
    assert fresh.json()["registration_status"] == "ready", fresh.text


@pytest.mark.parametrize(
    "make_rows",
    [
        pytest.param(lambda rng: rng.integers(0, 2, size=(3000, 3)), id="binary answers"),
        pytest.param(lambda rng: rng.integers(-5, 6, size=(3000, 3)), id="small integers"),
        pytest.param(lambda rng: rng.integers(0, 10**6, size=(3000, 3)), id="large integers"),
        pytest.param(lambda rng: np.round(rng.uniform(0, 0.3, (3000, 3)), 2), id="cents"),
    ],
)
def test_unrelated_plain_rows_that_coincide_are_both_registered(
    client: TestClient,
    keys: Keys,
    make_key: Callable[[str], str],
    root: Path,
    make_rows: Callable[[np.random.Generator], Rows],
) -> None:
    """Two unrelated datasets whose rows coincide (few distinct rows, or values with few
    decimals) are too plain to be the same people: both are accepted."""
    held = [make_rows(np.random.default_rng(seed)).astype(np.float64) for seed in (1, 2)]
    shared = {row.tobytes() for row in held[0]} & {row.tobytes() for row in held[1]}
    assert shared or held[0].max() > 100  # the plain ones coincide, not by chance alone
    for number, (rows, key) in enumerate(zip(held, (keys.owner, make_key("owner")), strict=True)):
        _write(root / f"plain{number}" / "a.parquet", rows)
        uri = str(root / f"plain{number}")
        response = helpers.register(client, key, uri, NAMES, helpers.FILE_BUDGET)
        assert response.json()["registration_status"] == "ready", (number, response.text)


def _marks(rows: Rows, *cuts: int) -> list[str]:
    marks = RowMarks()
    for part in np.split(rows, list(cuts)):
        marks.add(part)
    return marks.names()


def test_row_marks() -> None:
    """The marks depend on the set of rows, not on their order or batching; float32 copies
    and ``-0.0`` give the same; plain rows (integers, few decimals, one column, a row held
    twice) give none; at most :data:`ROW_MARKS_KEPT` are kept, the same ones in any order."""
    rng = np.random.default_rng(41)
    rows = rng.normal(size=(3000, 4))
    marks = _marks(rows)
    assert 4 <= len(marks) <= ROW_MARKS_KEPT
    assert marks == _marks(rows, 1, 999) == _marks(rows[rng.permutation(3000)], 1500)
    assert marks == _marks(rows.astype(np.float32).astype(np.float64))
    part = set(_marks(rows[:1000]))
    assert part and part <= set(marks)
    zeros = np.where(rows > 0, rows, 0.0)
    assert _marks(zeros) == _marks(np.where(rows > 0, rows, -0.0))
    assert _marks(np.round(rows * 1000)) == []  # integers, of any magnitude
    assert _marks(np.round(rows, 2)) == []  # 8 decimals in all: fewer than 12
    assert _marks(rows[:, :1]) == []  # one column: 8 decimals at most
    assert _marks(np.concatenate([rows, rows])) == []  # every row held twice
    many = rng.normal(size=(60000, 2))
    kept = _marks(many)
    assert len(kept) == ROW_MARKS_KEPT
    assert kept == _marks(many[::-1], 7)
    # Kept: the smallest hashes, so a part of the rows keeps those of the whole it holds.
    assert set(kept[:10]) & set(_marks(many[:30000]))


def test_a_batch_repeating_an_earlier_batchs_rows_is_refused_as_this_datasets(
    client: TestClient,
    keys: Keys,
    root: Path,
    session_factory: sessionmaker[Session],
) -> None:
    """A batch by reference whose rows an earlier batch of the same dataset holds (in another
    order, in another object) would count those people twice in the dataset: refused, and
    the reason says the object is already in *this* dataset (it said "another live dataset"),
    naming the object and no value. A batch of new rows is still accepted after it."""
    rng = np.random.default_rng(42)
    rows = rng.normal(size=(6000, 3)) / 4
    _write(root / "set" / "a.parquet", rows[:2000])
    dataset = helpers.registered(client, keys.owner, str(root / "set"), NAMES)

    def append(folder: str, held: Rows) -> Any:
        """``held`` written under ``root / folder`` and appended by reference as a batch, run
        by the worker; the owner's view of the dataset."""
        _write(root / folder / "a.parquet", held)
        posted = helpers.post_data(client, keys.owner, "batch", root / folder, NAMES, dataset["id"])
        assert posted.status_code == 202, posted.text
        assert helpers.run_registrations(client) == 1
        viewed = client.get(f"/v1/datasets/{dataset['id']}", headers=bearer(keys.owner))
        assert viewed.status_code == 200, viewed.text
        return viewed.json()

    grown = append("week1", rows[2000:4000])
    assert (grown["n_rows"], grown["n_batches"], grown["batch_status"]) == (4000, 2, None), grown
    with session_factory() as session:
        covers = session.query(DatasetReferenceObject).count()
    repeated = rows[2000:4000][rng.permutation(2000)]
    for number, held in enumerate((repeated, repeated[:1500])):  # batch 1's rows, or some
        body = append(f"again{number}", held)
        assert body["batch_status"] == "failed", body
        assert (body["n_rows"], body["n_batches"]) == (4000, 2), body
        reason = body["batch_reason"]
        assert "already covered by this dataset" in reason, reason
        assert "another live dataset" not in reason, reason
        assert str(root / f"again{number}" / "a.parquet") in reason, reason
        assert "row://" not in reason, reason
        assert not re.search(r"\d\.\d", reason.replace(str(root), "")), reason  # no value
    with session_factory() as session:
        assert session.query(DatasetReferenceObject).count() == covers
    body = append("week2", rows[4000:])
    assert (body["n_rows"], body["n_batches"], body["batch_status"]) == (6000, 3, None), body
