"""Load test: many concurrent clients against the API and two workers on PostgreSQL.

    .venv/bin/python -m scripts.load_test                 # 200 clients, 60 s
    .venv/bin/python -m scripts.load_test --quick         # 20 clients, 5 s
    .venv/bin/python -m scripts.load_test --clients 60 --duration 10

It creates a new database on the local PostgreSQL server (``DPSS_TEST_POSTGRES_URL``, default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``; only a database named
``dpss_load_<pid>`` is created, and it is dropped at the end), migrates it, starts
``dpss api --workers 2`` and two ``dpss worker`` on 127.0.0.1, seeds keys and datasets, then
runs the clients (budget reads, dataset reads, release reads, release requests across the
datasets; see ``scripts/workload.py``). It prints per-endpoint figures and the checks, then the
ledger check in SQL once the workers have drained the queue. Exit status 1 if a check failed.

With ``--base-url``, ``--database-url`` and ``--admin-key`` it targets a running service
instead (nothing is started or dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.harness import (
    LOCAL_SERVER,
    Checks,
    Services,
    cpu_slowdown,
    create_database,
    drop_database,
    free_port,
    percentile,
    wait_http,
)
from scripts.workload import (
    READS,
    endpoint_table,
    ledger_check,
    p99_ms,
    run_clients,
    seed,
    wait_drained,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60, help="seconds of load")
    parser.add_argument("--quick", action="store_true", help="20 clients for 5 s")
    parser.add_argument("--datasets", type=int, default=4)
    parser.add_argument("--api-workers", type=int, default=2, help="API processes")
    parser.add_argument("--workers", type=int, default=2, help="dpss worker processes")
    parser.add_argument("--request-timeout", type=float, default=10)
    parser.add_argument("--drain-timeout", type=float, default=120)
    parser.add_argument("--p99-read-ms", type=float, default=2000, help="the reads' p99 bound")
    parser.add_argument(
        "--overload",
        action="store_true",
        help="more clients than the service can serve: 503 is expected, but must come fast",
    )
    parser.add_argument(
        "--p99-shed-ms", type=float, default=1000, help="with --overload: the 503s' p99 bound"
    )
    parser.add_argument("--server", default=LOCAL_SERVER, help="PostgreSQL server to create on")
    parser.add_argument("--base-url", help="target a running service (with the two below)")
    parser.add_argument("--database-url")
    parser.add_argument("--admin-key")
    parser.add_argument("--keep", action="store_true", help="keep the database and logs")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.duration, args.drain_timeout = 20, 5, 60
    if args.base_url and not (args.database_url and args.admin_key):
        parser.error("--base-url needs --database-url and --admin-key")
    if args.clients > 1000 or args.duration > 600:
        parser.error("bounded: at most 1000 clients and 600 s")
    return args


def _server_ms_of_503(log: Path) -> list[float]:
    """``duration_ms`` of every 503 in the API's JSON access log."""
    durations = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("status") == 503 and "duration_ms" in entry:
            durations.append(float(entry["duration_ms"]))
    return durations


def main() -> int:
    args = parse_args()
    checks = Checks()
    work = Path(tempfile.mkdtemp(prefix="dpss-load-"))
    services: Services | None = None
    name = f"dpss_load_{os.getpid()}"
    try:
        if args.base_url:
            base_url, database_url, admin_key = args.base_url, args.database_url, args.admin_key
        else:
            database_url = create_database(name, args.server)
            admin_key = secrets.token_hex(16)
            port = free_port()
            base_url = f"http://127.0.0.1:{port}"
            env = {
                **os.environ,
                "DPSS_DATABASE_URL": database_url,
                "DPSS_DATA_DIR": str(work / "data"),
                "DPSS_ADMIN_API_KEY": admin_key,
                "DPSS_WORKER_POLL_SECONDS": "0.2",
                # With --overload the access log is kept: the server-side time of each 503.
                "DPSS_LOG_LEVEL": "INFO" if args.overload else "WARNING",
            }
            services = Services(env, work)
            migrate = services.start("migrate", "migrate")
            if migrate.wait(timeout=120) != 0:
                raise RuntimeError("dpss migrate failed; see " + str(work / "migrate.log"))
            services.processes.pop("migrate")
            services.start("api", "api", "--port", str(port), "--workers", str(args.api_workers))
            for i in range(args.workers):
                services.start(f"worker-{i}", "worker")
            wait_http(f"{base_url}/healthz", timeout=120)
        # One analyst key per client, as real users have: the per-key rate limit then applies to
        # each client, not to the whole load.
        seeded = seed(base_url, admin_key, datasets=args.datasets, analysts=args.clients)
        print(
            f"load: {args.clients} clients for {args.duration:.0f} s against {base_url} "
            f"({args.api_workers} API processes, {args.workers} workers, "
            f"{args.datasets} datasets)",
            flush=True,
        )
        # The p99 bounds are for an idle host; scaled by how busy it is before the load starts.
        slowdown = cpu_slowdown()
        print(f"host slowdown before the load: {slowdown:.2f}x (latency bounds scaled by it)")
        started = time.monotonic()
        recorder = asyncio.run(
            run_clients(seeded, args.clients, args.duration, args.request_timeout)
        )
        elapsed = time.monotonic() - started
        print(endpoint_table(recorder.samples, elapsed))
        statuses = [s.status for s in recorder.samples]
        shed = [s.latency * 1000 for s in recorder.samples if s.status == "503"]
        if shed:
            print(
                f"503 (shed): {len(shed)} responses, p50 {percentile(shed, 50):.0f} ms, "
                f"p99 {percentile(shed, 99):.0f} ms"
            )
        if args.overload and services is not None:
            served = _server_ms_of_503(work / "api.log")
            if served:
                print(
                    f"503 (shed), server side (access log, from the request reaching the app): "
                    f"p50 {percentile(served, 50):.1f} ms, p99 {percentile(served, 99):.1f} ms"
                )
        if args.overload:
            # Shedding is the point: 503 is allowed, but at once (not after DPSS_DB_WAIT_SECONDS).
            server_errors = [s for s in statuses if s.startswith("5") and s != "503"]
            checks.check(
                f"503s p99 < {args.p99_shed_ms:.0f} ms x {slowdown:.2f}",
                not shed or percentile(shed, 99) < args.p99_shed_ms * slowdown,
                f"{percentile(shed, 99):.0f} ms" if shed else "none",
            )
        else:
            server_errors = [s for s in statuses if s.startswith("5")]
        failed = [s for s in statuses if not s.isdigit()]
        checks.check("no 5xx", not server_errors, f"{len(server_errors)} responses 5xx")
        checks.check("no timeout or dropped connection", not failed, f"{len(failed)} requests")
        reads_p99 = p99_ms(recorder.samples, READS)
        checks.check(
            f"reads p99 < {args.p99_read_ms:.0f} ms x {slowdown:.2f}",
            reads_p99 < args.p99_read_ms * slowdown,
            f"{reads_p99:.0f} ms",
        )  # fmt: skip
        if services is not None:
            for process in services.processes:
                checks.check(f"{process} still running", services.alive(process))
        left, waited = wait_drained(database_url, args.drain_timeout)
        print(f"queue drained in {waited:.1f} s ({left} left)")
        ledger_check(database_url, recorder, checks)
        print(checks.render())
        return 0 if checks.ok else 1
    finally:
        if services is not None:
            services.stop_all()
            if not args.keep:
                drop_database(name, args.server)
        if args.keep:
            print(f"kept: logs in {work}, database {name}")
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
