"""End-to-end HTTP release time over a direct call of the mechanism, with and without wake-ups.

    python bench/bench_perf_wake.py [--rows 50000] [--cols 400] [--releases 5]
                                    [--backends sqlite,postgresql]

For each backend (embedded ``dpss serve`` on SQLite; ``dpss api`` plus one ``dpss worker`` on a
fresh database of the local PostgreSQL server) and each setting of ``DPSS_WORKER_WAKE``, the
script starts the service, uploads one ``rows x cols`` dataset and times ``analyze_gauss``
releases from the request to the moment the client sees ``succeeded`` (the client asks every
10 ms; padding is off, ``DPSS_RELEASE_PADDING_*=0``, as the padding is a deliberate delay and has
its own figures). Between releases it waits a random 0-1 s, so a polling worker is met at a
random phase of its 1 s interval, as a user would meet it.

Baselines, measured in this process on the same ``.npy`` file (memory-mapped, as the worker
reads it) and interleaved with the releases: the direct call ``AnalyzeGauss().run`` and the
floor ``X^T X + eigh``. Wall-clock seconds (a latency); medians with min and max.

The client here asks every 10 ms, to isolate the worker's side. How a user waits (the Python
client's long poll, ``GET /v1/releases/{id}?wait=``) and where each step's time goes:
``python -m bench.bench_http_latency``.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from service.mechanisms.analyze_gauss import AnalyzeGauss
from service.mechanisms.base import PublicContext, ReleaseSpec

POSTGRES_SERVER = os.environ.get(
    "DPSS_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_all(processes: list[subprocess.Popen[bytes]], timeout: float = 30) -> None:
    """SIGTERM every process, then wait for each (killed after ``timeout`` seconds)."""
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_ready(base: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{base} not ready after {timeout} s")


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh database on the local server, dropped afterwards; yields its SQLAlchemy URL."""
    import psycopg
    from sqlalchemy import make_url

    server = make_url(POSTGRES_SERVER)
    name = f"dpss_bench_wake_{os.getpid()}"
    admin = server.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def service(backend: str, wake: bool, workdir: Path) -> Iterator[tuple[str, str]]:
    """Start the service; yields ``(base URL, admin key)``; stops the processes it started."""
    admin_key = secrets.token_hex(16)
    port = free_port()
    env = {
        **os.environ,
        "DPSS_ADMIN_API_KEY": admin_key,
        "DPSS_DATA_DIR": str(workdir / f"data-{backend}-{wake}"),
        "DPSS_WORKER_WAKE": "true" if wake else "false",
        "DPSS_RELEASE_PADDING_FLOOR_SECONDS": "0",
        "DPSS_RELEASE_PADDING_MULTIPLIER": "0",
        "DPSS_RATE_LIMIT_PER_SECOND": "0",
        "DPSS_MAX_UPLOAD_MB": "2000",
        "DPSS_LOG_LEVEL": "WARNING",
    }
    env.pop("DPSS_DATABASE_URL", None)
    python = [sys.executable, "-m", "service"]
    started: list[subprocess.Popen[bytes]] = []
    with postgres_database() if backend == "postgresql" else nullcontext() as url:
        try:
            if url is None:
                started.append(subprocess.Popen([*python, "serve", "--port", str(port)], env=env))
            else:
                env["DPSS_DATABASE_URL"] = url
                subprocess.run([*python, "migrate"], env=env, check=True)
                started.append(subprocess.Popen([*python, "api", "--port", str(port)], env=env))
                started.append(subprocess.Popen([*python, "worker"], env=env))
            base = f"http://127.0.0.1:{port}"
            wait_ready(base)
            yield base, admin_key
        finally:
            stop_all(started)


def keys(http: httpx.Client, admin_key: str) -> tuple[str, str]:
    made = []
    for role in ("owner", "analyst"):
        response = http.post(
            "/v1/keys",
            headers={"Authorization": f"Bearer {admin_key}"},
            json={"role": role, "name": f"bench-{role}"},
        )
        response.raise_for_status()
        made.append(response.json()["key"])
    return made[0], made[1]


def upload(http: httpx.Client, owner: str, path: Path) -> str:
    with path.open("rb") as handle:
        response = http.post(
            "/v1/datasets",
            headers={"Authorization": f"Bearer {owner}"},
            files={"file": ("data.npy", handle, "application/octet-stream")},
            data={
                "name": "bench",
                "epsilon_budget": "1000",
                "delta_budget": "0.5",
                "allow_large_delta": "true",  # a bench: many releases, not protection
            },
            timeout=600,
        )
    response.raise_for_status()
    return str(response.json()["id"])


BODY: dict[str, Any] = {
    "mechanism": "analyze_gauss",
    "k": 5,
    "epsilon": "1",
    "delta": "1e-6",
    "params": {"clip_norm": 10.0},
}


def http_release(http: httpx.Client, analyst: str, dataset: str) -> float:
    """Seconds from the request to the client seeing ``succeeded``."""
    headers = {"Authorization": f"Bearer {analyst}"}
    start = time.perf_counter()
    response = http.post(f"/v1/datasets/{dataset}/releases", headers=headers, json=BODY)
    response.raise_for_status()
    release = response.json()["id"]
    while True:
        status = http.get(f"/v1/releases/{release}", headers=headers).json()["status"]
        if status == "succeeded":
            return time.perf_counter() - start
        if status in ("failed", "no_result"):
            raise RuntimeError(f"release ended {status}")
        time.sleep(0.01)


def timed(function: Callable[[], Any]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def summary(runs: list[float]) -> str:
    return f"{statistics.median(runs):6.3f} s ({min(runs):.3f}-{max(runs):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--cols", type=int, default=400)
    parser.add_argument("--releases", type=int, default=5)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="BLAS threads of this process and the service's (default 1: on a shared machine "
        "spinning BLAS threads made the same call vary 3x in wall time)",
    )
    args = parser.parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(args.blas_threads)
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    threadpool_limits(limits=args.blas_threads)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        path = workdir / "data.npy"
        np.save(path, rng.standard_normal((args.rows, args.cols)) / np.sqrt(args.cols))
        data = np.load(path, mmap_mode="r")
        mechanism = AnalyzeGauss()
        ctx = PublicContext(args.rows, args.cols, None)
        params = mechanism.prepare(ctx, 5, 1.0, 1e-6, mechanism.parse_params(BODY["params"]))
        spec = ReleaseSpec(k=5, epsilon=1.0, delta=1e-6, params=params)

        def direct() -> None:
            mechanism.run(data, spec, np.random.default_rng(1))

        def floor() -> None:
            x = np.asarray(data)
            np.linalg.eigh(x.T @ x)

        print(
            f"analyze_gauss, {args.rows} x {args.cols}, k = 5; {args.releases} releases per "
            f"setting; {args.blas_threads} BLAS thread(s); wall-clock seconds, median (min-max)",
            flush=True,
        )
        for backend in args.backends.split(","):
            for wake in (False, True):
                direct_runs: list[float] = []
                floor_runs: list[float] = []
                http_runs: list[float] = []
                with (
                    service(backend, wake, workdir) as (base, admin_key),
                    httpx.Client(base_url=base, timeout=60) as http,
                ):
                    owner, analyst = keys(http, admin_key)
                    dataset = upload(http, owner, path)
                    http_release(http, analyst, dataset)  # warm-up (page cache, imports)
                    for _ in range(args.releases):
                        direct_runs.append(timed(direct))
                        floor_runs.append(timed(floor))
                        time.sleep(random.uniform(0.0, 1.0))
                        http_runs.append(http_release(http, analyst, dataset))
                ratio = statistics.median(http_runs) / statistics.median(direct_runs)
                over_floor = statistics.median(http_runs) / statistics.median(floor_runs)
                label = f"{backend:<10} wake={'on ' if wake else 'off'}"
                print(
                    f"  {label}  HTTP {summary(http_runs)}  direct {summary(direct_runs)}  "
                    f"floor {summary(floor_runs)}  HTTP/direct {ratio:4.2f}x  "
                    f"HTTP/floor {over_floor:4.2f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main()
