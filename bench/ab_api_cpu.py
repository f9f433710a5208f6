"""CPU per authenticated read: this tree's code against another checkout's (the old path).

    git archive <old commit> | tar -x -C /tmp/old
    .venv/bin/python -m bench.ab_api_cpu --baseline /tmp/old [--rounds 6] \
        [--candidate /tmp/new]

Two child processes, one importing ``service`` from ``--baseline`` and one from this tree,
each with its own app and PostgreSQL database (``dpss_ab_<pid>``, dropped at the end) holding
one dataset and one finished release, with the defaults (``Settings()``, rate limits off).
The driver then asks them in turn, ``--rounds`` times, for the CPU (``time.process_time``:
every thread) of ``--requests`` reads through an in-process ASGI client, and prints the
median of each and the ratio. Alternating rounds share whatever else the machine is doing.

The code of two versions of the service cannot share one interpreter (one ``service``
package), hence two processes: compare the ratio, not the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASES = ("GET /healthz", "GET /v1/datasets/{id}/budget", "GET /v1/releases/{id}")


def child(requests: int) -> None:  # pragma: no cover - run in a subprocess
    import httpx
    import numpy as np

    from scripts.harness import LOCAL_SERVER, create_database, drop_database
    from scripts.workload import RELEASE
    from service import auth
    from service.app import create_app
    from service.config import Settings
    from service.migrate import upgrade_to_head
    from service.store import DatasetStore
    from service.worker import Worker

    name = f"dpss_ab_{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix="dpss-ab-"))
    url = create_database(name, LOCAL_SERVER)
    try:
        upgrade_to_head(url)
        settings = Settings(
            data_dir=work,
            database_url=url,
            log_level="WARNING",
            rate_limit_per_second=0,
            release_padding_floor_seconds=0,
            release_padding_multiplier=0,
        )
        app = create_app(settings)
        app.state.store.ensure()
        factory = app.state.session_factory
        with factory.begin() as session:
            _, owner = auth.create_key(session, "owner", "o", None)
            _, analyst = auth.create_key(session, "analyst", "a", None)
        buffer = io.BytesIO()
        np.save(buffer, np.random.default_rng(0).normal(size=(200, 8)) * 0.1)

        async def prepare() -> tuple[str, str]:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://ab") as http:
                made = await http.post(
                    "/v1/datasets",
                    headers={"Authorization": f"Bearer {owner}"},
                    files={"file": ("d.npy", buffer.getvalue(), "application/octet-stream")},
                    data={
                        "name": "b",
                        "epsilon_budget": "5",
                        "delta_budget": "1e-3",
                        "row_norm_bound": "1",
                        "allow_large_delta": "true",
                    },
                )
                dataset = str(made.raise_for_status().json()["id"])
                release = await http.post(
                    f"/v1/datasets/{dataset}/releases",
                    headers={"Authorization": f"Bearer {analyst}"},
                    json=RELEASE,
                )
                return dataset, str(release.raise_for_status().json()["id"])

        dataset, release = asyncio.run(prepare())
        Worker(factory, DatasetStore(work / "datasets"), settings, "ab").run_pending()
        paths = ["/healthz", f"/v1/datasets/{dataset}/budget", f"/v1/releases/{release}"]
        headers = {"Authorization": f"Bearer {analyst}"}

        async def measure(path: str) -> float:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://ab") as http:
                for _ in range(30):
                    assert (await http.get(path, headers=headers)).status_code == 200
                started = time.process_time()
                for _ in range(requests):
                    await http.get(path, headers=headers)
                return (time.process_time() - started) / requests * 1000

        print("ready", flush=True)
        for line in sys.stdin:
            case = int(line)
            print(json.dumps(asyncio.run(measure(paths[case]))), flush=True)
        factory.kw["bind"].dispose()
    finally:
        drop_database(name, LOCAL_SERVER)
        shutil.rmtree(work, ignore_errors=True)


class Child:
    def __init__(self, src: Path, requests: int) -> None:
        env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{src / 'clients' / 'python'}"}
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--child", "--requests", str(requests)],
            cwd=src,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        ready = self.process.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"child for {src} failed to start")

    def measure(self, case: int) -> float:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{case}\n")
        self.process.stdin.flush()
        value: Any = json.loads(self.process.stdout.readline())
        return float(value)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path)
    parser.add_argument(
        "--candidate", type=Path, default=ROOT, help="the new code (default: this tree)"
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.requests)
        return 0
    if args.baseline is None:
        parser.error("--baseline is required")
    old, new = (
        Child(args.baseline.resolve(), args.requests),
        Child(args.candidate.resolve(), args.requests),
    )
    try:
        rows = []
        for case, name in enumerate(CASES):
            olds, news = [], []
            for _ in range(args.rounds):
                olds.append(old.measure(case))
                news.append(new.measure(case))
            a, b = statistics.median(olds), statistics.median(news)
            ratios = sorted(n / o for o, n in zip(olds, news, strict=True))
            rows.append(
                f"| {name:28s} | {a:7.2f} | {b:7.2f} | {b / a:5.2f} "
                f"| {ratios[0]:.2f}-{ratios[-1]:.2f} |"
            )
    finally:
        old.close()
        new.close()
    print(
        f"CPU ms per request (in-process ASGI client included), median of {args.rounds} "
        f"alternating rounds of {args.requests}"
    )
    print("| request                      | old ms  | new ms  | new/old | range of ratios |")
    print("|------------------------------|---------|---------|---------|-----------------|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
