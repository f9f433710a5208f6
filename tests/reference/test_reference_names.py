"""One S3 object, one name: a name the S3 client reads as another object is refused.

s3fs parses a name before it asks for it: ``bucket/a.parquet?versionId=1`` (any suffix after
``?versionId=``, even empty) is read as ``bucket/a.parquet``, the current version, when the
filesystem is not version-aware (the service's is not). The cover rows held the name as given,
so the object another owner had registered became a second live dataset, with its own budget on
the same rows, with any columns: the copy's content digest covers the columns chosen only, and
S3 has no inode to alias. 3 of 3 names were ``ready`` before; each is refused now, and a stored
record holding such a name (registered before) fails at open."""

from __future__ import annotations

from collections.abc import Callable

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
def settings(settings: Settings, s3_endpoint: str, bucket: str) -> Settings:
    return helpers.lake_settings(settings, s3_endpoint, bucket)


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
