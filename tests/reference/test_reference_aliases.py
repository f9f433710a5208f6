"""One live dataset per object, however the object is reached (issue 30, item 7).

The cover rows refused a second live dataset on an object by its resolved path, or by a copy's
content digest; but that digest covered the *chosen* columns, in the order chosen. So the same
file reached by another path that ``realpath`` does not merge (a hard link, a bind mount) with
other columns, or its columns in another order, or a byte copy with its columns reordered,
became a second dataset with its own budget on the same rows. Each ends ``failed`` with
nothing registered now, on both databases; a different file of the same layout is still
accepted."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service import reference as reference_module
from service.config import Settings
from service.db.models import DatasetReferenceObject
from service.reference import inspect
from service.reference import objects as objects_module
from tests.conftest import Keys
from tests.reference import helpers
from tests.reference.test_integrity import plain_parquet


@pytest.fixture
def settings(settings: Settings, root: Path) -> Settings:
    return settings.model_copy(update={"reference_roots": str(root)})


@pytest.fixture
def rows() -> np.ndarray[Any, Any]:
    return np.random.default_rng(8).normal(size=(300, 3)) / 4


def test_the_same_file_by_another_path_or_column_order_is_refused(
    client: TestClient,
    keys: Keys,
    make_key: Callable[[str], str],
    root: Path,
    rows: np.ndarray[Any, Any],
    session_factory: sessionmaker[Session],
) -> None:
    names = plain_parquet(root / "set" / "a.parquet", rows)
    first = helpers.register(client, keys.owner, str(root / "set"), names[:2], helpers.FILE_BUDGET)
    assert first.json()["registration_status"] == "ready", first.text
    with session_factory() as session:
        covers = session.query(DatasetReferenceObject).count()
    other = make_key("owner")
    for folder in ("link1", "link2", "link3", "copy"):
        (root / folder).mkdir()
    os.link(root / "set" / "a.parquet", root / "link1" / "a.parquet")
    os.link(root / "set" / "a.parquet", root / "link2" / "a.parquet")
    os.link(root / "set" / "a.parquet", root / "link3" / "a.parquet")
    shutil.copy(root / "set" / "a.parquet", root / "copy" / "a.parquet")
    outcomes: list[tuple[str, list[str], str]] = []
    for uri, columns in [
        (root / "link1", names[1:]),  # a hard link, an overlapping set of columns
        (root / "link2", names[:2][::-1]),  # a hard link, the same columns reordered
        (root / "copy", names[:2][::-1]),  # a copy of the bytes, the columns reordered
        (root / "link3" / "a.parquet", [names[2]]),  # a hard link, the other column alone
    ]:
        response = helpers.register(client, other, str(uri), columns, helpers.FILE_BUDGET)
        assert response.status_code == 200, (uri, response.text)
        body = response.json()
        outcomes.append((uri.name, columns, body["registration_status"]))
        if body["registration_status"] == "failed":
            assert "another live dataset" in body["registration_reason"], body
    assert all(status == "failed" for *_, status in outcomes), outcomes
    # Nothing was kept by the refusals.
    with session_factory() as session:
        assert session.query(DatasetReferenceObject).count() == covers
    # Another file of the same layout (other values) is its own dataset.
    plain_parquet(root / "set2.parquet", rows[::-1].copy())
    fresh = helpers.register(client, other, str(root / "set2.parquet"), names, helpers.FILE_BUDGET)
    assert fresh.json()["registration_status"] == "ready", fresh.text


def test_a_hard_link_within_one_registration_is_refused(
    tmp_path: Path, root: Path, rows: np.ndarray[Any, Any]
) -> None:
    settings = Settings(data_dir=tmp_path, reference_roots=str(root))
    names = plain_parquet(root / "set" / "a.parquet", rows)
    (root / "set" / "sub").mkdir()
    os.link(root / "set" / "a.parquet", root / "set" / "sub" / "b.parquet")
    with pytest.raises(reference_module.InvalidInput, match="same"):
        inspect(str(root / "set"), names, settings)


def test_a_new_file_on_a_removed_files_inode_is_not_an_alias(
    client: TestClient,
    keys: Keys,
    root: Path,
    rows: np.ndarray[Any, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A file system reuses a deleted file's inode: an owner who removed a registered file
    (its dataset still live) and anyone who then writes another file that gets the same
    device and inode must not be refused as registering "the same file". Every object here is
    made to report one ``st_dev:st_ino``, as a reused inode would; the file alias carries the
    footer's digest too, so only the same file (the same footer) is refused. The suite's
    race tests met this: an object removed in one world, the next world's new file refused."""
    real_init = objects_module._Object.__init__

    def one_inode(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        if self.file_id is not None:
            self.file_id = "7:7"

    monkeypatch.setattr(objects_module._Object, "__init__", one_inode)
    names = plain_parquet(root / "set" / "a.parquet", rows)
    helpers.registered(client, keys.owner, str(root / "set" / "a.parquet"), names)
    (root / "set" / "a.parquet").unlink()
    (root / "new").mkdir()
    plain_parquet(root / "new" / "a.parquet", -rows)
    helpers.registered(client, keys.owner, str(root / "new" / "a.parquet"), names)
    # The same file (same footer) under the same inode is still one object.
    os.link(root / "new" / "a.parquet", root / "new" / "b.parquet")
    again = helpers.register(client, keys.owner, str(root / "new" / "b.parquet"), names[:2])
    assert "another live dataset" in helpers.refusal(again)
