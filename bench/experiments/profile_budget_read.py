"""Where the CPU of an authenticated budget read goes, in process.

    .venv/bin/python -m bench.experiments.profile_budget_read [--seconds 20] [--cprofile]
    py-spy record -r 400 -f raw -o /tmp/budget.txt -- \
        .venv/bin/python -m bench.experiments.profile_budget_read --seconds 20
    .venv/bin/python -m bench.experiments.profile_budget_read --summarise /tmp/budget.txt

One app with the defaults on a new PostgreSQL database (``dpss_prof_<pid>``, dropped at the
end), driven through ASGI by an httpx client in the same process, reading one dataset's budget
as its analyst in a loop for ``--seconds``. ``--cprofile`` profiles the event loop's thread
only (the database thread's work does not show); py-spy samples every thread. ``--summarise``
reads py-spy's collapsed stacks and prints the share of samples under each layer.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

from scripts.harness import LOCAL_SERVER, create_database, drop_database
from service import auth
from service.app import create_app
from service.config import Settings
from service.migrate import upgrade_to_head

#: Layers of a budget read, by a function (``file:function`` substring) on the stack; a sample
#: counts under each layer whose marker it holds (inclusive time).
LAYERS = {
    "httpx client (the bench's own)": "httpx/_client.py:send",
    "ObservabilityMiddleware (metrics, span)": "observability.py:__call__",
    "  metrics.observe_request": "metrics.py:observe_request",
    "  tracing span": "opentelemetry",
    "RequestLogMiddleware": "middleware.py:__call__",
    "  access log line": "logging/__init__.py:info",
    "starlette routing": "starlette/routing.py:app",
    "fastapi request handler (deps, validation, serialisation)": "fastapi/routing.py:app",
    "  dependencies": "fastapi/dependencies/utils.py:solve_dependencies",
    "  response serialisation": "fastapi/routing.py:serialize_response",
    "Database.run (gate, thread hop)": "deps.py:run",
    "  the transaction (database thread)": "deps.py:_transaction",
    "  authenticate_cached": "auth.py:authenticate_cached",
    "  get_dataset": "datasets.py:get_dataset",
    "  budget_of": "ledger.py:budgets_of",
    "  Budget model": "presenters.py:_budget",
    "  session begin/commit/close": "orm/session.py:commit",
    "  psycopg": "psycopg/",
    "  sqlalchemy compile": "sql/compiler.py",
}


def summarise(raw: Path) -> None:
    counts: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        n = int(number)
        # py-spy's idle threads (waiting in a selector or a queue) are not CPU.
        if "select (selectors.py" in stack or "wait (threading.py" in stack:
            continue
        total += n
        frames = stack.split(";")
        keys = [f"{f.split('(')[1].split(':')[0]}:{f.split(' (')[0]}" for f in frames if "(" in f]
        joined = ";".join(keys) + ";" + stack
        for layer, marker in LAYERS.items():
            if marker in joined:
                counts[layer] += n
    print(f"{total} busy samples")
    for layer in LAYERS:
        print(f"{layer:60s} {counts[layer] / total:6.1%}")


async def _loop(app: object, path: str, headers: dict[str, str], seconds: float) -> int:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
        for _ in range(50):
            assert (await http.get(path, headers=headers)).status_code == 200
        done, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            await http.get(path, headers=headers)
            done += 1
        return done


def run(url: str, work: Path, seconds: float, profile: bool) -> None:
    upgrade_to_head(url)
    settings = Settings(
        data_dir=work, database_url=url, log_level="WARNING", rate_limit_per_second=0
    )
    app = create_app(settings)
    app.state.store.ensure()
    with app.state.session_factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
        _, analyst = auth.create_key(session, "analyst", "a", None)
    buffer = io.BytesIO()
    np.save(buffer, np.random.default_rng(0).normal(size=(50, 4)) * 0.1)

    async def upload() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            made = await http.post(
                "/v1/datasets",
                headers={"Authorization": f"Bearer {owner}"},
                files={"file": ("d.npy", buffer.getvalue(), "application/octet-stream")},
                data={"name": "b", "epsilon_budget": "5", "delta_budget": "1e-3"},
            )
            return str(made.raise_for_status().json()["id"])

    dataset = asyncio.run(upload())
    path, headers = f"/v1/datasets/{dataset}/budget", {"Authorization": f"Bearer {analyst}"}
    profiler = cProfile.Profile() if profile else None
    started = time.process_time()
    if profiler is not None:
        profiler.enable()
    done = asyncio.run(_loop(app, path, headers, seconds))
    if profiler is not None:
        profiler.disable()
    cpu = time.process_time() - started
    print(f"{done} budget reads, {cpu / done * 1000:.2f} ms CPU each (client included)")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(60)
    app.state.session_factory.kw["bind"].dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--summarise", type=Path)
    parser.add_argument("--server", default=LOCAL_SERVER)
    args = parser.parse_args()
    if args.summarise is not None:
        summarise(args.summarise)
        return 0
    name = f"dpss_prof_{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix="dpss-prof-"))
    url = create_database(name, args.server)
    try:
        run(url, work, args.seconds, args.cprofile)
        return 0
    finally:
        drop_database(name, args.server)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
