"""One S3 object, one name: a name the S3 client reads as another object is refused; and one
set of rows, one dataset: a byte copy registered with some of the columns is refused.

s3fs parses a name before it asks for it: ``bucket/a.parquet?versionId=1`` (any suffix after
``?versionId=``, even empty) is read as ``bucket/a.parquet``, the current version, when the
filesystem is not version-aware (the service's is not). The cover rows held the name as given,
so the object another owner had registered became a second live dataset, with its own budget on
the same rows, with any columns: the copy's content digest covers the columns chosen only, and
S3 has no inode to alias. 3 of 3 names were ``ready`` before; each is refused now, and a stored
record holding such a name (registered before) fails at open.

The same hole without a second name: a byte copy (an S3 copy, a file copied to another path)
has no inode in common with the object, and the copy's content digests covered the chosen
columns only (in any order): registered with a subset of the columns, or an overlapping set,
it was a second dataset on the same values of the same rows (4 of 4 ``ready`` before). Each
chosen column of a copy is covered now (``column://``: the footer's digest and the column's
chunks); a copy with none of the columns in common, and an unrelated file of the same
layout, are still accepted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db.models import DatasetReferenceObject
from service.reference import Location, NotRegular, _Object
from tests.conftest import Keys, bearer
from tests.reference import helpers
from tests.reference.conftest import s3fs_for, write_parquet


@pytest.fixture
def settings(settings: Settings, s3_endpoint: str, bucket: str, root: Path) -> Settings:
    """The bucket's ``lake/`` and the local ``root``, both open to references."""
    lake = helpers.lake_settings(settings, s3_endpoint, bucket)
    return lake.model_copy(update={"reference_roots": f"{lake.reference_roots},{root}"})


def test_a_second_name_for_a_registered_s3_object_is_refused(
    client: TestClient,
    keys: Keys,
    make_key: Callable[[str], str],
    bucket: str,
    s3_endpoint: str,
    session_factory: sessionmaker[Session],
) -> None:
    fs = s3fs_for(s3_endpoint)
    rows = np.random.default_rng(3).normal(size=(300, 3)) / 4
    names = write_parquet(fs, f"{bucket}/lake/d/a.parquet", rows, 100)
    uri = f"s3://{bucket}/lake/d/a.parquet"
    first = helpers.register(client, keys.owner, uri, names[:2], helpers.FILE_BUDGET)
    assert first.json()["registration_status"] == "ready", first.text
    with session_factory() as session:
        covers = session.query(DatasetReferenceObject).count()
    other = make_key("owner")
    outcomes = []
    for alias, columns in [
        (f"{uri}?versionId=1", names[2:]),  # the other column alone
        (f"{uri}?versionId=", names[1:]),  # an overlapping set
        (f"{uri}?versionId=null", names[:1]),  # a subset
    ]:
        response = helpers.register(client, other, alias, columns, helpers.FILE_BUDGET)
        body = response.json()
        outcomes.append((alias, response.status_code, body.get("registration_status")))
        if response.status_code == 200 and body["registration_status"] == "failed":
            assert "names another object" in body["registration_reason"], body
    assert all(status != "ready" for *_, status in outcomes), outcomes
    with session_factory() as session:
        assert session.query(DatasetReferenceObject).count() == covers
    # The object's own name still registers once it is free (nothing else is refused).
    deleted = client.delete(f"/v1/datasets/{first.json()['id']}", headers=bearer(keys.owner))
    assert deleted.status_code in (200, 204), deleted.text
    again = helpers.register(client, other, uri, names, helpers.FILE_BUDGET)
    assert again.json()["registration_status"] == "ready", again.text


def test_a_stored_name_read_as_another_object_is_not_opened(bucket: str, s3_endpoint: str) -> None:
    """A record registered before the check (its name held ``?versionId=``): every open, in
    the worker and on a Dask worker, refuses it as no longer the registered object."""
    fs = s3fs_for(s3_endpoint)
    write_parquet(fs, f"{bucket}/lake/d/a.parquet", np.ones((4, 2)), 2)
    location = Location("s3", s3_endpoint, (f"{bucket}/lake",))
    with _Object(location, f"{bucket}/lake/d/a.parquet") as handle:
        assert handle.read(0, 4) == b"PAR1"
    for name in (f"{bucket}/lake/d/a.parquet?versionId=1", f"{bucket}/lake/d/a.parquet?versionId="):
        with pytest.raises(NotRegular):
            _Object(location, name)


@pytest.mark.parametrize("where", ["s3", "file"])
def test_a_byte_copy_with_some_of_the_columns_is_refused(
    where: str,
    client: TestClient,
    keys: Keys,
    make_key: Callable[[str], str],
    bucket: str,
    s3_endpoint: str,
    root: Path,
) -> None:
    fs = s3fs_for(s3_endpoint)
    rows = np.random.default_rng(4).normal(size=(300, 4)) / 4
    folders = ["d", "f", *(f"e{i}" for i in range(5))]
    if where == "s3":
        base = f"{bucket}/lake"
        write = fs
        fs.mkdir(base)
    else:
        base = str(root)
        write = fsspec_local()
        for folder in folders:
            (root / folder).mkdir()
    names = write_parquet(write, f"{base}/d/a.parquet", rows, 100)
    # Other rows: the same rows reversed are the same people, refused since rows are named
    # whatever their order (tests/reference/test_reference_rows_marked.py).
    unrelated = np.random.default_rng(5).normal(size=(300, 4)) / 4
    write_parquet(write, f"{base}/f/a.parquet", unrelated, 100)
    for i in range(5):  # byte copies (S3's CopyObject, or cp), one per attempt
        write.copy(f"{base}/d/a.parquet", f"{base}/e{i}/a.parquet")
    scheme = "s3://" if where == "s3" else ""
    first = helpers.register(
        client, keys.owner, f"{scheme}{base}/d/a.parquet", names[:3], helpers.FILE_BUDGET
    )
    assert first.json()["registration_status"] == "ready", first.text
    other = make_key("owner")
    outcomes = []
    for i, columns in enumerate((names[:1], names[1:3], names[2:], names[::-1])):
        uri = f"{scheme}{base}/e{i}/a.parquet"
        response = helpers.register(client, other, uri, columns, helpers.FILE_BUDGET)
        ready = response.json().get("registration_status") == "ready"
        outcomes.append((columns, "ready" if ready else helpers.refusal(response)))
    # Before: 4 of 4 ready (a subset, an overlapping set, a superset reordered).
    assert all("another live dataset" in why for _, why in outcomes), outcomes
    # No column in common: another dataset (the same people, other values: as an upload).
    uri = f"{scheme}{base}/e4/a.parquet"
    apart = helpers.register(client, other, uri, names[3:], helpers.FILE_BUDGET)
    assert apart.json()["registration_status"] == "ready", apart.text
    # An unrelated file of the same layout and columns.
    uri = f"{scheme}{base}/f/a.parquet"
    same_layout = helpers.register(client, other, uri, names[:3], helpers.FILE_BUDGET)
    assert same_layout.json()["registration_status"] == "ready", same_layout.text


def fsspec_local() -> Any:
    import fsspec

    return fsspec.filesystem("file")
