"""Release throughput with 1 and 2 worker processes on one PostgreSQL.

    python bench/bench_perf_workers.py [--workers 1,2] [--releases 24] [--rows 20000]
                                       [--cols 300]

For each worker count: a fresh database on the local PostgreSQL server, ``dpss api`` and that
many ``dpss worker`` processes (each with one BLAS thread, so that ``N`` workers use ``N`` cores;
wake-ups on), one ``rows x cols`` dataset, then ``--releases`` ``analyze_gauss`` requests sent
at once. Throughput is releases finished per second, from the first request until the client
sees the last one ``succeeded`` (padding off). The baseline is the same count of direct calls
of the mechanism in this process, one after another on one BLAS thread: ``direct/s``.

This machine has 2 cores, shared with other jobs: 2 workers is as many as the cores allow, and
the figures are ratios measured in one run, not absolute capacities.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
from bench_perf_wake import (
    BODY,
    free_port,
    keys,
    postgres_database,
    stop_all,
    upload,
    wait_ready,
)
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from service.mechanisms.analyze_gauss import AnalyzeGauss
from service.mechanisms.base import PublicContext, ReleaseSpec


@contextmanager
def cluster(workers: int, workdir: Path) -> Iterator[tuple[str, str]]:
    """API and ``workers`` worker processes on a fresh database; yields (base URL, admin key)."""
    admin_key = os.urandom(16).hex()
    port = free_port()
    env = {
        **os.environ,
        "DPSS_ADMIN_API_KEY": admin_key,
        "DPSS_DATA_DIR": str(workdir / f"data-{workers}"),
        "DPSS_RELEASE_PADDING_FLOOR_SECONDS": "0",
        "DPSS_RELEASE_PADDING_MULTIPLIER": "0",
        "DPSS_RATE_LIMIT_PER_SECOND": "0",
        "DPSS_MAX_UPLOAD_MB": "2000",
        "DPSS_LOG_LEVEL": "WARNING",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    python = [sys.executable, "-m", "service"]
    started: list[subprocess.Popen[bytes]] = []
    with postgres_database() as url:
        env["DPSS_DATABASE_URL"] = url
        subprocess.run([*python, "migrate"], env=env, check=True, capture_output=True)
        try:
            started.append(subprocess.Popen([*python, "api", "--port", str(port)], env=env))
            started.extend(subprocess.Popen([*python, "worker"], env=env) for _ in range(workers))
            base = f"http://127.0.0.1:{port}"
            wait_ready(base)
            yield base, admin_key
        finally:
            stop_all(started)


def throughput(http: httpx.Client, analyst: str, dataset: str, releases: int) -> float:
    """Releases per second: ``releases`` requests at once, until the last one succeeded."""
    headers = {"Authorization": f"Bearer {analyst}"}
    start = time.perf_counter()
    ids = []
    for _ in range(releases):
        response = http.post(f"/v1/datasets/{dataset}/releases", headers=headers, json=BODY)
        response.raise_for_status()
        ids.append(response.json()["id"])
    pending = set(ids)
    while pending:
        for release in list(pending):
            status = http.get(f"/v1/releases/{release}", headers=headers).json()["status"]
            if status in ("failed", "no_result"):
                raise RuntimeError(f"release ended {status}")
            if status == "succeeded":
                pending.discard(release)
        time.sleep(0.02)
    return releases / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--releases", type=int, default=24)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--cols", type=int, default=300)
    args = parser.parse_args()
    threadpool_limits(limits=1)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        path = workdir / "data.npy"
        rng = np.random.default_rng(0)
        np.save(path, rng.standard_normal((args.rows, args.cols)) / np.sqrt(args.cols))
        data = np.load(path, mmap_mode="r")
        mechanism = AnalyzeGauss()
        ctx = PublicContext(args.rows, args.cols, None)
        params = mechanism.prepare(ctx, 5, 1.0, 1e-6, mechanism.parse_params(BODY["params"]))
        spec = ReleaseSpec(k=5, epsilon=1.0, delta=1e-6, params=params)
        print(
            f"analyze_gauss releases on {args.rows} x {args.cols}, {args.releases} requests "
            "at once; 2 cores shared with other jobs; one BLAS thread per process",
            flush=True,
        )
        figures: dict[int, float] = {}
        for count in (int(w) for w in args.workers.split(",")):
            start = time.perf_counter()
            for _ in range(args.releases):
                mechanism.run(data, spec, np.random.default_rng(1))
            direct = args.releases / (time.perf_counter() - start)
            with (
                cluster(count, workdir) as (base, admin_key),
                httpx.Client(base_url=base, timeout=60) as http,
            ):
                owner, analyst = keys(http, admin_key)
                dataset = upload(http, owner, path)
                throughput(http, analyst, dataset, 2)  # warm-up
                figures[count] = throughput(http, analyst, dataset, args.releases)
            print(
                f"  {count} worker(s): {figures[count]:6.2f} releases/s; direct calls in this "
                f"process {direct:6.2f}/s; ratio {figures[count] / direct:4.2f}x",
                flush=True,
            )
        if 1 in figures and 2 in figures:
            print(f"  2 workers over 1: {figures[2] / figures[1]:4.2f}x", flush=True)


if __name__ == "__main__":
    main()
