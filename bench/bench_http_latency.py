"""Where an HTTP release's time goes, from the request to the client seeing the result.

    python -m bench.bench_http_latency [--rows 50000] [--cols 400] [--reps 5]
                                       [--backends sqlite,postgresql] [--modes longpoll,poll]

For each backend the script starts ``dpss api`` (uvicorn, its own process) and one worker
process (``bench/traced_worker.py``: ``dpss worker`` with timestamps), on SQLite in a temporary
data directory or on a fresh database of the local PostgreSQL server
(``DPSS_BENCH_POSTGRES_URL``). Padding is off (``DPSS_RELEASE_PADDING_*=0``: a deliberate delay,
with its own figures). It uploads one ``rows x cols`` dataset near a 3-dimensional subspace and
requests ``analyze_gauss`` (k = 3, epsilon 1, delta 1e-6) as an analyst with the Python client,
waiting the way the client waits in each mode:

- ``longpoll``: ``ReleaseHandle.wait_finished()`` (``GET /v1/releases/{id}?wait=...``);
- ``poll``: the same with ``long_poll=0`` (the client's polling: 0.2 s growing x1.5);
- ``tight``: a GET every 5 ms (what the server side alone costs; not how anyone should wait).

Baselines, measured in this process on the same ``.npy`` file (memory-mapped, as the worker
reads it) and interleaved with the releases: the direct ``run`` of the mechanism with the same
resolved parameters, and ``X^T X + eigh``. One BLAS thread everywhere. Medians over ``--reps``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.bench_perf_wake import free_port, postgres_database, stop_all, wait_ready

#: Worker events in order (see bench/traced_worker.py) and the step each one ends.
STEPS = [
    ("accepted", "request committed, 202 received"),
    ("woken", "worker woken"),
    ("claimed", "job claimed"),
    ("forked", "run process forked"),
    ("opened", "data memory-mapped"),
    ("computed", "mechanism run"),
    ("received", "outcome back in worker"),
    ("stored", "result + audit committed"),
    ("seen", "client sees the result"),
]
K, EPSILON, DELTA = 3, 1.0, 1e-6


@contextmanager
def running_service(backend: str, workdir: Path, trace: Path) -> Iterator[tuple[str, str]]:
    """``dpss api`` and a traced worker; yields ``(base URL, admin key)``."""
    admin_key = secrets.token_hex(16)
    port = free_port()
    env = {
        **os.environ,
        "DPSS_ADMIN_API_KEY": admin_key,
        "DPSS_DATA_DIR": str(workdir / f"data-{backend}"),
        "DPSS_RELEASE_PADDING_FLOOR_SECONDS": "0",
        "DPSS_RELEASE_PADDING_MULTIPLIER": "0",
        "DPSS_RATE_LIMIT_PER_SECOND": "0",
        "DPSS_MAX_UPLOAD_MB": "2000",
        "DPSS_LOG_LEVEL": "WARNING",
        "DPSS_TRACE_FILE": str(trace),
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    env.pop("DPSS_DATABASE_URL", None)
    started: list[subprocess.Popen[bytes]] = []
    with postgres_database() if backend == "postgresql" else nullcontext() as url:
        try:
            if url is not None:
                env["DPSS_DATABASE_URL"] = url
            subprocess.run([sys.executable, "-m", "service", "migrate"], env=env, check=True)
            started.append(
                subprocess.Popen(
                    [sys.executable, "-m", "service", "api", "--port", str(port)], env=env
                )
            )
            started.append(subprocess.Popen([sys.executable, "-m", "bench.traced_worker"], env=env))
            base = f"http://127.0.0.1:{port}"
            wait_ready(base)
            yield base, admin_key
        finally:
            stop_all(started)


def events_since(trace: Path, start: float) -> dict[str, float]:
    """The last time of each worker event at or after ``start``."""
    found: dict[str, float] = {}
    if not trace.exists():
        return found
    for line in trace.read_text().splitlines():
        record = json.loads(line)
        if record["t"] >= start:
            if record["event"] == "woken" and "claimed" in found:
                continue  # the worker's next idle wait, after this release
            found[record["event"]] = record["t"]
    return found


def one_release(client: Any, dataset: str, mode: str, trace: Path) -> dict[str, float]:
    """One release; seconds from the request to each step's end."""
    start = time.time()
    handle = client.release(dataset, "analyze_gauss", K, EPSILON, DELTA)
    accepted = time.time()
    if mode == "longpoll":
        handle.wait_finished()
    elif mode == "poll":
        handle.wait_finished(long_poll=0)
    else:
        while not handle.done:
            time.sleep(0.005)
            handle.refresh()
    seen = time.time()
    if handle.status != "succeeded":
        raise RuntimeError(f"release ended {handle.status}")
    time.sleep(0.05)  # the last trace lines are written after the commit
    marks = {"accepted": accepted, **events_since(trace, start), "seen": seen}
    return {name: marks[name] - start for name, _ in STEPS if name in marks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--cols", type=int, default=400)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--modes", default="longpoll,poll,tight")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    from bench.accuracy import seed_of
    from bench.core import near_subspace
    from dpss_client import Client
    from service.mechanisms.analyze_gauss import AnalyzeGauss
    from service.mechanisms.base import PublicContext, ReleaseSpec

    threadpool_limits(limits=1)
    modes = [m for m in args.modes.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="dpss-bench-latency-") as tmp:
        workdir = Path(tmp)
        path = workdir / "data.npy"
        data, _ = near_subspace(args.rows, args.cols, K, 1e-3, seed_of("http", args.rows))
        np.save(path, data)
        del data
        mapped = np.load(path, mmap_mode="r")
        mechanism = AnalyzeGauss()
        ctx = PublicContext(args.rows, args.cols, 1.0)
        params = mechanism.prepare(ctx, K, EPSILON, DELTA, mechanism.parse_params({}))
        spec = ReleaseSpec(k=K, epsilon=EPSILON, delta=DELTA, params=params)
        print(
            f"analyze_gauss, {args.rows} x {args.cols}, k={K}, eps {EPSILON}, delta {DELTA}; "
            f"{args.reps} reps; 1 BLAS thread; seconds from the request (median)",
            flush=True,
        )
        for backend in args.backends.split(","):
            trace = workdir / f"trace-{backend}.jsonl"
            runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
            direct_runs: list[float] = []
            floor_runs: list[float] = []
            with (
                running_service(backend, workdir, trace) as (base, admin_key),
                httpx.Client(base_url=base, timeout=60) as http,
            ):
                made = [
                    http.post(
                        "/v1/keys",
                        headers={"Authorization": f"Bearer {admin_key}"},
                        json={"role": role, "name": f"bench-{role}"},
                    ).json()["key"]
                    for role in ("owner", "analyst")
                ]
                owner = Client(base, made[0], timeout=600)
                analyst = Client(base, made[1], timeout=60)
                dataset = str(
                    owner.upload(
                        path, name="bench", epsilon_budget=1000, delta_budget=0.5,
                        row_norm_bound=1.0, allow_large_delta=True,
                    ).id
                )  # fmt: skip
                one_release(analyst, dataset, "tight", trace)  # warm-up
                for _ in range(args.reps):
                    start = time.perf_counter()
                    mechanism.run(mapped, spec, np.random.default_rng(1))
                    direct_runs.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    x = np.asarray(mapped)
                    np.linalg.eigh(x.T @ x)
                    floor_runs.append(time.perf_counter() - start)
                    for mode in modes:
                        time.sleep(0.2)
                        runs[mode].append(one_release(analyst, dataset, mode, trace))
            direct = statistics.median(direct_runs)
            floor = statistics.median(floor_runs)
            print(f"\n{backend}: direct call {direct:.3f} s, X^T X + eigh {floor:.3f} s")
            header = "  step (ends at)                      " + "".join(
                f"{mode:>18}" for mode in modes
            )
            print(header)
            for name, label in STEPS:
                cells = []
                for mode in modes:
                    points = [run[name] for run in runs[mode] if name in run]
                    cells.append(f"{statistics.median(points):9.3f}" if points else "        -")
                    previous = [run for run in runs[mode] if name in run]
                    steps = [
                        run[name] - max([v for k, v in run.items() if _before(k, name)] or [0.0])
                        for run in previous
                    ]
                    cells[-1] += f" (+{statistics.median(steps):.3f})" if steps else ""
                print(f"  {label:<36}" + "".join(f"{c:>18}" for c in cells))
            totals = {mode: statistics.median(r["seen"] for r in runs[mode]) for mode in modes}
            print(
                "  over the direct call                "
                + "".join(f"{totals[mode] / direct:17.2f}x" for mode in modes)
            )
            print(
                "  over X^T X + eigh                   "
                + "".join(f"{totals[mode] / floor:17.2f}x" for mode in modes),
                flush=True,
            )


def _before(step: str, name: str) -> bool:
    order = [s for s, _ in STEPS]
    return step in order and order.index(step) < order.index(name)


if __name__ == "__main__":
    main()
