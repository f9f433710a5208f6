"""How the store maps a dataset file for a run: populated at once up to ``POPULATE_BYTES``
(a read-only array over the mapping), lazily beyond (a read-only ``np.memmap``); the same rows
either way, the prefix the database names."""

from __future__ import annotations

import fcntl
import gc
import os
from pathlib import Path

import numpy as np
import pytest

from service import store as store_module
from service.store import DatasetFileFault, DatasetStore


@pytest.fixture
def stored(tmp_path: Path) -> tuple[DatasetStore, str, np.ndarray]:
    store = DatasetStore(tmp_path / "datasets")
    store.ensure()
    rows = np.random.default_rng(3).normal(size=(40, 7))
    upload = store.new_incoming_path()
    with open(upload, "wb") as out:
        np.save(out, rows)
    return store, store.ingest(upload, ".npy").file_name, rows


def test_a_small_file_is_mapped_populated_read_only(
    stored: tuple[DatasetStore, str, np.ndarray],
) -> None:
    store, name, rows = stored
    data = store.open(name, 25)
    assert not isinstance(data, np.memmap)
    assert data.shape == (25, 7) and data.dtype == np.float64
    assert np.array_equal(data, rows[:25])
    assert not data.flags.writeable
    with pytest.raises(ValueError):
        data[0, 0] = 1.0


def test_a_large_file_keeps_the_lazy_map(
    stored: tuple[DatasetStore, str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, name, rows = stored
    monkeypatch.setattr(store_module, "POPULATE_BYTES", 8 * 7 * 10)
    data = store.open(name, 25)
    assert isinstance(data, np.memmap)
    assert np.array_equal(data, rows[:25])
    assert np.array_equal(store.open(name, 10), rows[:10])  # at the bound: populated
    assert not isinstance(store.open(name, 10), np.memmap)


def test_a_file_shorter_than_the_rows_asked_is_a_fault_before_any_mapping(
    stored: tuple[DatasetStore, str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same words as the fault check (the release's log), and no mapping attempted: before,
    # the populated path raised mmap's own ValueError and the lazy path numpy's.
    store, name, _ = stored
    for populate in (store_module.POPULATE_BYTES, 8):
        monkeypatch.setattr(store_module, "POPULATE_BYTES", populate)
        with pytest.raises(DatasetFileFault, match=r"holds fewer rows than the database says"):
            store.open(name, 41)
        assert store.fault(name, 41) == "holds fewer rows than the database says (41)"


def test_a_fifo_or_a_directory_in_place_of_the_file_is_missing_without_blocking(
    stored: tuple[DatasetStore, str, np.ndarray],
) -> None:
    store, name, _ = stored
    path = store.path_of(name)
    os.remove(path)
    os.mkfifo(path)  # a plain open for reading would wait for a writer
    with pytest.raises(DatasetFileFault, match="is missing"):
        store.open(name)
    assert store.fault(name, None) == "is missing"
    os.remove(path)
    os.mkdir(path)
    with pytest.raises(DatasetFileFault, match="is missing"):
        store.open(name)
    assert store.fault(name, None) == "is missing"


def test_a_store_gives_its_session_lock_back_when_dropped(tmp_path: Path) -> None:
    def lock_is_free(session: Path) -> bool:
        # flock locks belong to open file descriptions: a new one gets the lock only once the
        # store's descriptor is closed (counting /proc/self/fd races other threads' files).
        descriptor = os.open(session / ".lock", os.O_RDWR)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(descriptor)
        return True

    dropped = DatasetStore(tmp_path / "b")
    dropped.ensure()
    session = dropped.new_incoming_path().parent
    assert not lock_is_free(session)
    del dropped
    gc.collect()
    assert lock_is_free(session)
