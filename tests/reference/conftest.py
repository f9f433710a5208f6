"""Real parts for datasets by reference: an S3 endpoint from moto's server mode (as s3fs's own
tests use it) and a Dask LocalCluster of 2 worker processes, 1 thread each; both session-scoped.

The credentials are fake but distinctive, so tests can check that they appear nowhere."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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
    """A LocalCluster's address (its workers inherit the credentials set above)."""
    from distributed import LocalCluster

    with LocalCluster(
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


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The folder a test's settings allow datasets by reference under (``reference_roots``),
    with an empty ``set`` in it (one fixture for the files that each wrote it again)."""
    path = tmp_path / "shared"
    (path / "set").mkdir(parents=True)
    return path
