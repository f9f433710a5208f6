"""Real parts for datasets by reference: an S3 endpoint from moto's server mode (as s3fs's own
tests use it) and a Dask LocalCluster of 2 worker processes, 1 thread each, with the service's
Dask configuration; both session-scoped.

The credentials are fake but distinctive, so tests can check that they appear nowhere.

And the set-up the registration tests that compare worlds share (:class:`Registrations`:
``test_registration_padding``, ``test_registration_overlap_hidden``,
``test_registration_behind_later_releases``, ``test_probe_behind_a_registration``)."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.worker import Worker
from tests.conftest import Keys
from tests.reference import helpers

ACCESS_KEY = "AKIADPSSTESTACCESSKEY"
SECRET_KEY = "dpss-secret-Zq8vXw3R-never-in-a-log"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    os.environ.update(
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_DEFAULT_REGION="us-east-1",
    )
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session")
def dask_scheduler(s3_endpoint: str) -> Iterator[str]:
    """A LocalCluster's address (its workers inherit the credentials set above), built with
    the service's Dask configuration as a deployment's cluster runs."""
    from service.reference.cluster import local_cluster

    with local_cluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        memory_limit="1GiB",
    ) as cluster:
        yield cluster.scheduler_address


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    import s3fs

    name = f"dpss-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True).mkdir(name)
    return name


def s3fs_for(endpoint: str) -> Any:
    import s3fs

    return s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)


def write_parquet(
    fs: Any, path: str, rows: np.ndarray[Any, Any], row_group_rows: int, prefix: str = "c"
) -> list[str]:
    """``rows`` as one Parquet object at ``path`` (columns ``c0..``), row groups of the given
    size; the column names."""
    names = [f"{prefix}{i}" for i in range(rows.shape[1])]
    table = pa.table({name: rows[:, i] for i, name in enumerate(names)})
    with fs.open(path, "wb") as handle:
        pq.write_table(table, handle, row_group_size=row_group_rows)
    return names


def rows_table(rows: np.ndarray[Any, Any], dtype: Any = None, prefix: str = "c") -> pa.Table:
    """``rows`` as an Arrow table, one column per column of ``rows`` (``c0..``), of ``dtype``
    (an Arrow type; else inferred: float64 for float rows)."""
    return pa.table(
        {f"{prefix}{i}": pa.array(rows[:, i], type=dtype) for i in range(rows.shape[1])}
    )


def write_local(path: Path, table: pa.Table, **options: Any) -> str:
    """``table`` as one local Parquet file at ``path`` (its folders made; ``options`` go to
    ``pq.write_table``); the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **options)
    return str(path)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The folder a test's settings allow datasets by reference under (``reference_roots``),
    with an empty ``set`` in it (one fixture for the files that each wrote it again)."""
    path = tmp_path / "shared"
    (path / "set").mkdir(parents=True)
    return path


def padded(settings: Settings, root: Path, floor: float, **update: Any) -> Settings:
    """``settings`` with ``root`` the one reference root, the release padding's ``floor`` (a
    registration's padding too: nothing of its objects is known before the read) and any
    further ``update``."""
    return settings.model_copy(
        update={"reference_roots": str(root), "release_padding_floor_seconds": floor, **update}
    )


class Posted(NamedTuple):
    """A registration (or batch) by reference answered 202: its dataset and its columns."""

    id: str
    names: list[str]


@dataclass
class Registrations:
    """One test's registrations by reference, each world's objects under ``root / world``:
    its client, keys, worker and database."""

    client: TestClient
    keys: Keys
    make_key: Callable[[str], str]
    upload_dataset: Any
    worker: Worker
    root: Path
    session_factory: sessionmaker[Session]

    def other(self, n_rows: int, n_cols: int) -> dict[str, Any]:
        """Another owner's uploaded dataset (seed 0, rows inside the unit ball, budget 100),
        whose releases the worlds queue beside the registrations."""
        rows = np.random.default_rng(0).normal(size=(n_rows, n_cols)) / 4
        return dict(
            self.upload_dataset(
                self.client,
                self.make_key("owner"),
                rows,
                row_norm_bound=1.0,
                epsilon_budget="100",
            )
        )

    def post(
        self,
        key: str,
        kind: str,
        folder: Path,
        seed: int,
        dataset_id: str | None = None,
        shape: tuple[int, int] = (200, 3),
    ) -> Posted:
        """``folder`` made (:func:`helpers.seeded_parquet` of ``seed``, ``shape``) and posted
        by reference by ``key`` (:func:`helpers.post_data`: with ``kind`` "registration" a new
        dataset, else a batch appended to ``dataset_id``), answered 202."""
        names = helpers.seeded_parquet(folder, seed, *shape)
        posted = helpers.post_data(self.client, key, kind, folder, names, dataset_id)
        assert posted.status_code == 202, posted.text
        return Posted(str(posted.json()["id"]), names)

    def registered(self, key: str, world: str, seed: int) -> str:
        """The world's first dataset (``b0``, 200 x 3) registered by ``key`` and run by a worker
        at once: the dataset a batch is appended to; its id."""
        ready = self.post(key, "registration", self.root / world / "b0", seed).id
        assert helpers.run_registrations(self.client) == 1
        return ready

    def registered_first(
        self, key: str, seeds: dict[str, int], shape: tuple[int, int]
    ) -> dict[str, str]:
        """Each world's first dataset (``b0``, of its seed) registered by ``key`` before any
        world begins, the registrations run by the worker (no release waits); their ids."""
        ready = {
            world: self.post(key, "registration", self.root / world / "b0", seed, shape=shape).id
            for world, seed in seeds.items()
        }
        assert self.worker.run_pending() == 0
        return ready


@pytest.fixture
def registrations(
    client: TestClient,
    keys: Keys,
    make_key: Callable[[str], str],
    upload_dataset: Any,
    worker: Worker,
    root: Path,
    session_factory: sessionmaker[Session],
) -> Registrations:
    return Registrations(client, keys, make_key, upload_dataset, worker, root, session_factory)
