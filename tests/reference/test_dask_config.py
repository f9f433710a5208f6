"""The service's Dask configuration (``service/reference/dask.yaml``) reaches the processes that
run a pass: a ``dask worker`` started as the image starts it (the file in a directory Dask reads
at import, as ``{sys.prefix}/etc/dask`` is in the image), and every part of a
:func:`~service.reference.cluster.local_cluster` (scheduler, and worker processes started by
their nannies). Dask's defaults run a statistical profiler in each worker every 10 ms and an
event-loop check every 20 ms; the service's settings have neither."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.reference.cluster import CONFIG_FILE, dask_config, local_cluster


def _worker_state(dask_worker: Any) -> dict[str, Any]:
    """What a worker runs besides its tasks (run inside the worker by ``client.run``)."""
    return {
        "profiler": "profile" in dask_worker.periodic_callbacks,
        "tick": dask_worker.periodic_callbacks["tick"].callback_time,
        "monitor": dask_worker.periodic_callbacks["monitor"].callback_time,
    }


def _scheduler_state(dask_scheduler: Any) -> dict[str, Any]:
    return {
        "tick": dask_scheduler.periodic_callbacks["tick"].callback_time,
        "monitor": dask_scheduler.periodic_callbacks["monitor"].callback_time,
    }


SERVICE_WORKER = {"profiler": False, "tick": 500.0, "monitor": 2000.0}


def test_the_file_sets_what_it_documents_and_nothing_else() -> None:
    """By dotted key: a nested mapping given to ``dask.config.set`` would replace the whole
    ``distributed`` subtree (every other default gone)."""
    assert dask_config() == {
        "distributed.worker.profile.enabled": False,
        "distributed.admin.tick.interval": "500ms",
        "distributed.admin.system-monitor.interval": "2s",
    }


def test_a_local_cluster_of_worker_processes_runs_with_the_service_config() -> None:
    """A LocalCluster of worker processes under nannies, built as the reference tests' session
    cluster is: no profiler in either worker, the slower checks in the scheduler too. Its own
    cluster, not the session's: a session worker killed by a test (``test_api``'s killed worker)
    is started again by a nanny re-created after :func:`local_cluster` returned, on Dask's
    defaults (a limit of ``local_cluster`` only: the image's processes read the file at import,
    restarts included)."""
    from distributed import Client

    with (
        local_cluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster.scheduler_address, set_as_default=False) as client,
    ):
        states = client.run(_worker_state)
        assert len(states) == 2
        assert all(state == SERVICE_WORKER for state in states.values())
        assert client.run_on_scheduler(_scheduler_state) == {"tick": 500.0, "monitor": 2000.0}


def test_a_local_cluster_has_the_settings_and_dask_defaults_do_not() -> None:
    """The control: the same in-process cluster on Dask's defaults profiles its worker, so the
    assertions above can fail."""
    from distributed import Client, LocalCluster

    options: dict[str, Any] = {
        "n_workers": 1,
        "threads_per_worker": 1,
        "processes": False,
        "dashboard_address": None,
    }
    for build, expected in ((LocalCluster, True), (local_cluster, False)):
        with build(**options) as cluster, Client(cluster, set_as_default=False) as client:
            (state,) = client.run(_worker_state).values()
            assert state["profiler"] is expected
            assert (state["tick"] == 500.0) is not expected


@pytest.fixture
def bare_scheduler() -> Iterator[str]:
    """A scheduler with no worker, on Dask's defaults (the workers are what is checked)."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=0,
        processes=False,
        protocol="tcp://",
        host="127.0.0.1",
        dashboard_address=None,
        scheduler_port=0,
    ) as cluster:
        yield cluster.scheduler_address


def test_a_dask_worker_started_as_the_image_starts_it_reads_the_file(
    tmp_path: Path, bare_scheduler: str
) -> None:
    """``dask worker`` (nanny and all, as compose's ``dask-worker`` runs it) with the file
    copied into a directory Dask reads at import, as the Dockerfile copies it into
    ``/opt/dpss/etc/dask``: the worker process its nanny started has no profiler."""
    from distributed import Client

    etc = tmp_path / "etc-dask"
    etc.mkdir()
    shutil.copy(CONFIG_FILE, etc / "dpss.yaml")
    env = {**os.environ, "DASK_ROOT_CONFIG": str(etc)}
    command = [sys.executable, "-m", "distributed.cli.dask_worker", bare_scheduler]
    options = ["--nthreads", "1", "--memory-limit", "1GiB", "--no-dashboard"]
    worker = subprocess.Popen(
        [*command, *options],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with Client(bare_scheduler, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=120)
            (state,) = client.run(_worker_state).values()
            assert state == SERVICE_WORKER
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
