"""Requests per second and p50/p99 of the real API under a fixed concurrency, with baselines.

    .venv/bin/python bench/bench_api_requests.py [--clients 64] [--seconds 5] [--releases 300]

Starts ``dpss api`` (one process) on a new database of the local PostgreSQL server (the load
script's harness: ``dpss_bench_<pid>``, dropped at the end), seeds one dataset, then measures with
``--clients`` closed-loop clients, one keep-alive connection each:

1. ``GET /healthz`` (no database: HTTP, middleware, routing): the baseline;
2. ``GET /v1/datasets/{id}/budget`` with one release in the ledger, then again after
   ``--releases`` more: the budget read must cost the same (its sum is done by PostgreSQL, one
   row back whatever the ledger's size; it used to fetch and sum every ledger row);
3. the load generator itself: ``GET /healthz`` with the clients sharing one httpx pool (as
   ``scripts/workload.py`` did) against one connection per client (as it does now); with a
   shared pool httpcore scans every pooled connection on every request.

These machines are noisy: read the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import ssl
import sys
import tempfile
import time
from pathlib import Path

import httpx

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.harness import (
    LOCAL_SERVER,
    Services,
    create_database,
    drop_database,
    free_port,
    percentile,
    table,
    wait_http,
)
from scripts.workload import RELEASE, seed


async def measure(
    base_url: str, path: str, headers: dict[str, str], clients: int, seconds: float, shared: bool
) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms) of ``clients`` closed-loop clients GETting ``path``."""
    latencies: list[float] = []
    tls = ssl.create_default_context()  # one for all clients (see scripts/workload.py)

    async def client(http: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            started = time.monotonic()
            response = await http.get(path, headers=headers)
            latencies.append(time.monotonic() - started)
            response.raise_for_status()

    async with contextlib.AsyncExitStack() as stack:

        async def new_client(connections: int) -> httpx.AsyncClient:
            limits = httpx.Limits(max_connections=connections)
            made = httpx.AsyncClient(base_url=base_url, timeout=30, limits=limits, verify=tls)
            return await stack.enter_async_context(made)

        if shared:
            one = await new_client(clients)
            https = [one] * clients
        else:
            https = [await new_client(1) for _ in range(clients)]
        started = time.monotonic()
        deadline = started + seconds
        await asyncio.gather(*(client(http) for http in https))
        elapsed = time.monotonic() - started
    ms = [latency * 1000 for latency in latencies]
    return len(ms) / elapsed, percentile(ms, 50), percentile(ms, 99)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--releases", type=int, default=300)
    parser.add_argument("--server", default=LOCAL_SERVER)
    args = parser.parse_args()
    name = f"dpss_bench_{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix="dpss-bench-"))
    database_url = create_database(name, args.server)
    admin_key = secrets.token_hex(16)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DPSS_DATABASE_URL": database_url,
        "DPSS_DATA_DIR": str(work / "data"),
        "DPSS_ADMIN_API_KEY": admin_key,
        "DPSS_LOG_LEVEL": "WARNING",
        # The bench measures the request path, not the per-key rate limit.
        "DPSS_RATE_LIMIT_PER_SECOND": "0",
    }
    services = Services(env, work)
    try:
        if services.start("migrate", "migrate").wait(timeout=120) != 0:
            raise RuntimeError("dpss migrate failed")
        services.processes.pop("migrate")
        services.start("api", "api", "--port", str(port))
        wait_http(f"{base_url}/healthz", timeout=120)
        seeded = seed(base_url, admin_key, datasets=1, analysts=1)
        analyst = {"Authorization": f"Bearer {seeded.analyst_keys[0]}"}
        budget = f"/v1/datasets/{seeded.dataset_ids[0]}/budget"
        release = f"/v1/datasets/{seeded.dataset_ids[0]}/releases"

        def add_releases(count: int) -> None:
            with httpx.Client(base_url=base_url, headers=analyst, timeout=30) as http:
                for _ in range(count):
                    http.post(release, json=RELEASE).raise_for_status()

        def run(path: str, headers: dict[str, str], shared: bool) -> tuple[float, float, float]:
            return asyncio.run(measure(base_url, path, headers, args.clients, args.seconds, shared))

        add_releases(1)
        health = run("/healthz", {}, shared=False)
        small = run(budget, analyst, shared=False)
        add_releases(args.releases)
        large = run(budget, analyst, shared=False)
        shared_pool = run("/healthz", {}, shared=True)

        rows = [
            ["GET /healthz (baseline)", *health, 1.0],
            ["GET budget, 1 ledger row", *small, small[0] / health[0]],
            [f"GET budget, {args.releases + 1} ledger rows", *large, large[0] / health[0]],
            ["GET /healthz, shared client pool", *shared_pool, shared_pool[0] / health[0]],
        ]
        print(
            f"{args.clients} clients, {args.seconds:g} s each, one API process on PostgreSQL\n"
            + table(
                [[r[0], f"{r[1]:.0f}", f"{r[2]:.1f}", f"{r[3]:.1f}", f"{r[4]:.2f}"] for r in rows],
                ["case", "req/s", "p50 ms", "p99 ms", "req/s vs healthz"],
            )
        )
        print(
            f"budget read, {args.releases + 1} vs 1 ledger rows: {large[0] / small[0]:.2f}x "
            f"the throughput (1.00 = independent of the ledger)"
        )
        return 0
    finally:
        services.stop_all()
        drop_database(name, args.server)
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
