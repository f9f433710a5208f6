"""Where the CPU of an authenticated budget read goes, in process.

    .venv/bin/python -m bench.profile_budget_read [--seconds 20] [--cprofile]
    py-spy record -r 400 -f raw -o /tmp/budget.txt -- \
        .venv/bin/python -m bench.profile_budget_read --seconds 20
    .venv/bin/python -m bench.profile_budget_read --summarise /tmp/budget.txt

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
import re
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

#: Layers of a budget read, by a frame (``file:qualified function``, as py-spy names them) on
#: the stack; a sample counts under each layer whose frame it holds (inclusive time).
LAYERS = {
    "httpx client (the bench's own, event loop)": "httpx/_client.py:AsyncClient.request",
    "  the app, through ASGI": "httpx/_transports/asgi.py:ASGITransport.handle_async_request",
    "ObservabilityMiddleware (metrics, span)": "observability.py:ObservabilityMiddleware.__call__",
    "RequestLogMiddleware (request id, access line)": "middleware.py:RequestLogMiddleware.__call__",
    "Starlette's router": "starlette/routing.py:Router.__call__",
    "FastAPI's handler (deps, endpoint, serialisation)": "get_request_handler.<locals>.app",
    "  dependencies": "fastapi/dependencies/utils.py:solve_dependencies",
    "  response serialisation": "fastapi/routing.py:serialize_response",
    "  Database.run on the loop (gate, thread hand-off)": "deps.py:Database.run",
    "database thread": "anyio/_backends/_asyncio.py:WorkerThread.run",
    "  the unit of work (session, key, work, commit)": "deps.py:Database._transaction",
    "  the route's work": "datasets.py:get_budget.<locals>.work",
    "  SQLAlchemy execute": "sqlalchemy/orm/session.py:Session.execute",
    "  psycopg execute": "psycopg/cursor.py:Cursor.execute",
    "  commit": "sqlalchemy/orm/session.py:SessionTransaction.commit",
}
#: Leaves where a thread waits (py-spy samples them too): not CPU.
IDLE = (
    "threading.py:Condition.wait",
    "psycopg/connection.py:Connection.wait",
    "selectors.py:EpollSelector.select",
)
#: Frames of the setup (migrations, imports, the upload), not of the reads.
SETUP = ("upgrade_to_head", "_find_and_load", "upload", "create_key")


def summarise(raw: Path) -> None:
    counts: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        if any(marker in stack for marker in SETUP):
            continue
        frames = []
        for frame in stack.split(";"):
            found = re.match(r"(.*) \((.*):\d+\)$", frame)
            if found:
                frames.append(f"{found.group(2)}:{found.group(1)}")
        if not frames or frames[-1] in IDLE:
            continue
        total += int(number)
        joined = ";".join(frames)
        for layer, marker in LAYERS.items():
            if marker in joined:
                counts[layer] += int(number)
    print(f"{total} busy samples; share of them under each layer (inclusive)")
    for layer in LAYERS:
        print(f"{layer:56s} {counts[layer] / max(total, 1):6.1%}")


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
                data={
                    "name": "b",
                    "epsilon_budget": "5",
                    "delta_budget": "1e-3",
                    "allow_large_delta": "true",
                },
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
