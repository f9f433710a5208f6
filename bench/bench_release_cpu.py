"""CPU of one release through HTTP (API + worker) against the direct mechanism call (issue 35).

    python -m bench.bench_release_cpu [--reps 5] [--backend sqlite|postgresql] [--profile]

In this process: the app driven through ASGI by an httpx client, and a :class:`Worker` that
isolates its runs as ``dpss worker`` does (a forked child per run), on a fresh SQLite file or a
fresh database of the local PostgreSQL server (whose own CPU is not counted). Per release:

- *API*, the path the Python client (``PrivatePCA``) now takes: one
  ``POST /v1/datasets/{id}/releases?wait=30&basis_format=base64`` answered with the finished
  release and its basis (the worker runs while it waits; woken as a separate process's worker
  wakes it: the wake file on SQLite, ``NOTIFY`` on PostgreSQL), read by the client's own
  parsing into the array ``basis()`` gives; ``time.process_time`` of this process (every
  thread: the long poll's watcher too);
- *API, two requests* (as before that long poll, and as a checkout without it is measured):
  ``POST /v1/datasets/{id}/releases`` and ``GET /v1/releases/{id}`` after the run;
- *worker*: ``Worker.run_pending`` (claim, isolated run, store) in a separate process started
  as ``dpss worker`` starts (``python -m bench.bench_release_cpu --serve``: the worker's imports
  only, its own connection pool), told over a pipe to run; that process's CPU plus its
  children's (the run process, or the forked child of each run before it; ``/proc`` and
  ``RUSAGE_CHILDREN``);
- *direct*: ``mechanism.run`` on the matrix already in memory, in this process, with the same
  spec and one BLAS thread (as the worker's ``DPSS_WORKER_BLAS_THREADS=1``).

Printed per shape: the medians and the ratios (API + worker) / direct for either path,
measured in this run (interleaved: direct, two requests, one request, direct, ...).

What the API figure counts: everything in this process during the request, the in-process
client included (httpx building the request, the ASGI transport, and the client's parsing of
the answer into the basis array). Issue 35's figure is the service's CPU (API + worker); a
real client runs elsewhere, but a real server also parses HTTP (uvicorn), which the ASGI
transport skips, so the client's request side stands in for it. The client's parsing of the
answer has no such counterpart: it is shown apart (``thread_time`` of that synchronous step),
with the one-request ratio without it.
``--profile`` prints the API's (and client's) top functions by CPU, and the worker process its
own on stderr (cProfile with ``time.process_time``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import logging.config
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import event
from sqlalchemy.orm import Session
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

if __package__ in (None, ""):
    # Run as a file: the checkout named by DPSS_BENCH_CHECKOUT (to measure another one's
    # service), else this one.
    sys.path.insert(
        0, os.environ.get("DPSS_BENCH_CHECKOUT", str(Path(__file__).resolve().parents[1]))
    )

import dpss_client.client as dpss_client  # this checkout's client: the path it takes
from api_schemas.releases import Release
from scripts.harness import create_database, drop_database, table
from service import auth, oneshot
from service.app import create_app
from service.config import Settings
from service.db import models
from service.db.engine import make_engine, make_session_factory
from service.jobs import ClaimedJob, RunContext
from service.logs import log_config
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.noise import secure_generator
from service.mechanisms.registry import get_mechanism
from service.migrate import upgrade_to_head
from service.store import DatasetStore
from service.worker import Worker

SHAPES = [(3_500, 784), (50_000, 100)]
RELEASE: dict[str, Any] = {"mechanism": "analyze_gauss", "k": 5, "epsilon": "0.01", "delta": "1e-9"}
RELEASE_PARAMS: dict[str, Any] = {}


def children_cpu() -> float:
    """CPU seconds of this process's children: those reaped (``RUSAGE_CHILDREN``) and those
    still running (the worker's long-lived run process), from ``/proc``.

    A running child's own CPU is read from each of its threads' ``schedstat`` (nanoseconds),
    not from ``stat``'s ``utime + stime``: those count clock ticks (10 ms here), and the
    median of per-release differences of a tick counter is biased up to a tick (a run of
    0.077 s read as 0.08 s seven times in ten)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    total, tick = usage.ru_utime + usage.ru_stime, os.sysconf("SC_CLK_TCK")
    pid = os.getpid()
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            threads = list(Path(f"/proc/{child}/task").iterdir())
            own = sum(int((task / "schedstat").read_text().split()[0]) for task in threads)
        except FileNotFoundError:
            continue
        # cutime, cstime (clock ticks): the child's own reaped children, if any
        total += own / 1e9 + sum(int(value) for value in fields[13:15]) / tick
    return total


@contextmanager
def database(backend: str, work: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{work / 'bench.db'}"
        return
    name = f"dpss_release_cpu_{os.getpid()}"
    url = create_database(name)
    try:
        yield url
    finally:
        drop_database(name)


def rows_of(n: int, d: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    rng = np.random.default_rng(n + d)
    rows = rng.normal(size=(n, d)) / np.sqrt(d)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1.0)  # row norms <= 1, the public bound


def direct_cpu(rows: np.ndarray[Any, Any], n: int, d: int) -> float:
    """CPU seconds of the mechanism's own run on rows in memory (the floor)."""
    mechanism = get_mechanism(RELEASE["mechanism"])
    assert mechanism is not None
    context = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    epsilon, delta = float(RELEASE["epsilon"]), float(RELEASE["delta"])
    params = mechanism.prepare(context, RELEASE["k"], epsilon, delta, mechanism.parse_params({}))
    spec = ReleaseSpec(k=RELEASE["k"], epsilon=epsilon, delta=delta, params=params)
    with threadpool_limits(limits=1, user_api="blas"):
        started = time.process_time()
        mechanism.run(rows, spec, secure_generator())
        return time.process_time() - started


def count_statements(engine: Any) -> list[int]:
    """A one-element list counting the SQL statements ``engine`` runs from now on (an
    ``after_cursor_execute`` listener; ``BEGIN`` and ``COMMIT`` are not statements here)."""
    counter = [0]

    def executed(_connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not statement.startswith("BEGIN"):  # SQLite's BEGIN IMMEDIATE
            counter[0] += 1

    event.listen(engine, "after_cursor_execute", executed)
    return counter


def direct_job_cpu(job: ClaimedJob, context: RunContext, n: int, d: int) -> float:
    """CPU seconds of the same work as a release without HTTP or a database, in this process:
    the mechanism's preparation from the public facts (as the API prepares a request: params
    parsed, calibrated) and the run process's work (:func:`service.oneshot.execute`: the stored
    params parsed, the stored ``.npy`` opened with its fault checks and mapped, the run, its
    :class:`Outcome`), one BLAS thread. The fair floor for a release through the service;
    :func:`direct_cpu` is the mechanism's bare run on rows already in memory."""
    mechanism = get_mechanism(job.mechanism)
    assert mechanism is not None
    public = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    with threadpool_limits(limits=1, user_api="blas"):
        started = time.process_time()
        mechanism.prepare(
            public, job.k, job.epsilon, job.delta, mechanism.parse_params(RELEASE_PARAMS)
        )
        outcome = oneshot.execute(job, context)
        spent = time.process_time() - started
    assert outcome.status == "succeeded", outcome.reason
    return spent


def settings_for(url: str, data_dir: Path) -> Settings:
    return Settings(
        data_dir=data_dir,
        database_url=url,
        log_level="ERROR",
        rate_limit_per_second=0,
        release_padding_floor_seconds=0,
        release_padding_multiplier=0,
        release_padding_calibrated=False,
        worker_blas_threads=1,
    )


def serve(url: str, data_dir: str, profile: bool) -> None:
    """The worker process: one ``run_pending`` per line read, answering with its CPU seconds
    (this process and its reaped children)."""
    settings = settings_for(url, Path(data_dir))
    # Logging as ``dpss worker`` sets it up (the settings' level): without it Python's last
    # resort printed every warning (each release "late" against a padding of 0) to stderr.
    logging.config.dictConfig(log_config(settings.log_level))
    factory = make_session_factory(make_engine(settings.resolved_database_url))
    worker = Worker(factory, DatasetStore(settings.data_dir / "datasets"), settings, isolate=True)
    statements = count_statements(factory.kw["bind"])
    profiler = cProfile.Profile(time.process_time) if profile else None
    for line in sys.stdin:
        if line.strip() != "run":
            break
        # The children's CPU read first: the harness's own reading of /proc is not the
        # worker's (read after ``started`` it was counted as the worker's, 0.2-0.4 ms).
        children = children_cpu()
        counted, started = statements[0], time.process_time()
        if profiler is not None:
            profiler.enable()
        ran = worker.run_pending()
        if profiler is not None:
            profiler.disable()
        own = time.process_time() - started
        child = children_cpu() - children
        print(f"{ran} {own + child} {child} {statements[0] - counted}", flush=True)
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(30)


def _shape(text: str) -> tuple[int, int]:
    """``"50000x100"`` -> ``(50000, 100)``."""
    n, d = text.split("x")
    return int(n), int(d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--shapes", default="3500x784,50000x100", help="n x d, comma separated (default: both)"
    )
    parser.add_argument("--serve", nargs=2, metavar=("URL", "DATA_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve, args.profile)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with database(args.backend, work) as url:
            shapes = [_shape(text) for text in args.shapes.split(",")]
            run(url, work, args.reps, args.profile, args.backend, shapes)


def run(
    url: str,
    work: Path,
    reps: int,
    profile: bool,
    backend: str,
    shapes: list[tuple[int, int]] = SHAPES,
) -> None:
    upgrade_to_head(url)
    settings = settings_for(url, work / "data")
    app = create_app(settings)
    app.state.store.ensure()
    factory = app.state.session_factory
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "bench owner", None)
        _, analyst = auth.create_key(session, "analyst", "bench analyst", None)
    # The file itself (not -m): run against another checkout's service (PYTHONPATH), it
    # measures that checkout's worker.
    command = [sys.executable, str(Path(__file__).resolve()), "--serve", url, str(work / "data")]
    worker = subprocess.Popen(
        command + (["--profile"] if profile else []),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdin is not None and worker.stdout is not None
    analyst_headers = {"Authorization": f"Bearer {analyst}"}
    table_rows = []
    children: list[float] = []
    worker_statements: list[int] = []
    api_statements = count_statements(factory.kw["bind"])
    api_profiler = cProfile.Profile(time.process_time) if profile else None

    def work_once() -> float:
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write("run\n")
        worker.stdin.flush()
        ran, seconds, child, statements = worker.stdout.readline().split()
        assert ran == "1", ran
        children.append(float(child))
        worker_statements.append(int(statements))
        return float(seconds)

    def work_once_timed() -> tuple[float, float]:
        """:func:`work_once` from a thread of this process, and that thread's own CPU: the
        harness's (the pipe to the worker), not the API's, so taken out of the API's figure."""
        started = time.thread_time()
        seconds = work_once()
        return seconds, time.thread_time() - started

    def stored_job(dataset: str, release: str) -> tuple[ClaimedJob, RunContext]:
        """The job the worker ran for ``release`` (its stored params, the dataset's file),
        for :func:`direct_job_cpu`, run here with the worker's store and settings."""
        with factory() as session:
            found = session.get(models.Release, uuid.UUID(release))
            stored = session.get(models.Dataset, uuid.UUID(dataset))
            assert found is not None and stored is not None
            job = ClaimedJob(
                release_id=found.id,
                dataset_id=stored.id,
                mechanism=found.mechanism,
                k=found.k,
                epsilon=float(found.epsilon),
                delta=float(found.delta),
                params=dict(found.params),
                file_name=stored.file_name,
                attempt=1,
                n_rows=found.n_rows_read,
            )
        store = DatasetStore(settings.data_dir / "datasets")
        return job, RunContext(store=store, settings=settings, label="direct")

    async def upload(rows: np.ndarray[Any, Any], http: httpx.AsyncClient) -> str:
        buffer = io.BytesIO()
        np.save(buffer, rows)
        made = await http.post(
            "/v1/datasets",
            headers={"Authorization": f"Bearer {owner}"},
            files={"file": ("d.npy", buffer.getvalue(), "application/octet-stream")},
            data={
                "name": "bench",
                "epsilon_budget": "100",
                "delta_budget": "1e-3",
                "row_norm_bound": "1",
                "allow_large_delta": "true",  # a bench: many releases, not protection
            },
        )
        return str(made.raise_for_status().json()["id"])

    async def request(http: httpx.AsyncClient, dataset: str) -> tuple[str, float]:
        started = time.process_time()
        if api_profiler is not None:
            api_profiler.enable()
        answer = await http.post(
            f"/v1/datasets/{dataset}/releases", headers=analyst_headers, json=RELEASE
        )
        if api_profiler is not None:
            api_profiler.disable()
        return str(answer.raise_for_status().json()["id"]), time.process_time() - started

    async def read(http: httpx.AsyncClient, release: str) -> float:
        started = time.process_time()
        if api_profiler is not None:
            api_profiler.enable()
        answer = (await http.get(f"/v1/releases/{release}", headers=analyst_headers)).json()
        if api_profiler is not None:
            api_profiler.disable()
        assert answer["status"] == "succeeded", answer
        return time.process_time() - started

    # The one-request path: the worker is told to run once the creating transaction has
    # committed a release (the worker of a deployment is woken then too).
    loop_box: list[asyncio.AbstractEventLoop] = []
    api_counts: list[int] = []
    #: The client's own parsing of each one-request answer (in the API figure, shown apart:
    #: the issue's figure is the service's CPU, API + worker; see the module docstring).
    client_parse: list[float] = []
    queued = asyncio.Event()

    def created(session: Session, instance: object) -> None:
        if isinstance(instance, models.Release):
            session.info["bench_created"] = True

    def committed(session: Session) -> None:
        if session.info.pop("bench_created", False):
            loop_box[0].call_soon_threadsafe(queued.set)

    # A new release is flushed (the ORM's insert: pending) or written at once and added as
    # read (service.release_rows: detached): either way it becomes persistent in the session.
    event.listen(factory, "pending_to_persistent", created)
    event.listen(factory, "detached_to_persistent", created)
    event.listen(factory, "after_commit", committed)

    async def waited(http: httpx.AsyncClient, dataset: str) -> tuple[float, float]:
        """One ``POST ...?wait=``: its CPU in this process (less the harness thread's that
        drives the worker) and the worker's."""
        queued.clear()
        counted = api_statements[0]
        started = time.process_time()
        if api_profiler is not None:
            api_profiler.enable()
        answer = asyncio.create_task(
            http.post(
                f"/v1/datasets/{dataset}/releases",
                headers=analyst_headers,
                json=RELEASE,
                params={"wait": "30", **dpss_client.RELEASE_READ},
            )
        )
        await queued.wait()
        worker_s, harness_s = await asyncio.to_thread(work_once_timed)
        # Read as the Python client reads it (its parsing, then the array ``basis()`` gives).
        response = (await answer).raise_for_status()
        parsing = time.thread_time()  # this thread alone: the client's parsing, synchronous
        done = dpss_client._parse(response, Release)
        assert done.status == "succeeded" and done.result is not None, done.status
        np.asarray(done.result.basis, dtype=np.float64)
        client_parse.append(time.thread_time() - parsing)
        if api_profiler is not None:
            api_profiler.disable()
        spent = time.process_time() - started - harness_s
        api_counts.append(api_statements[0] - counted)
        return spent, worker_s

    async def drive() -> None:
        loop_box.append(asyncio.get_running_loop())
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            post = (await http.get("/openapi.json")).json()["paths"]
            parameters = post["/v1/datasets/{dataset_id}/releases"]["post"]["parameters"]
            one_request = any(p["name"] == "wait" for p in parameters)
            for n, d in shapes:
                rows = rows_of(n, d)
                dataset = await upload(rows, http)
                # Warm-up: first imports, first queries, the mechanism's first call.
                release, _ = await request(http, dataset)
                work_once()
                await read(http, release)
                if one_request:
                    await waited(http, dataset)
                direct_cpu(rows, n, d)
                job, context = stored_job(dataset, release)
                direct_job_cpu(job, context, n, d)
                directs, apis, workers, apis_1, workers_1 = [], [], [], [], []
                directs_job: list[float] = []
                children.clear()
                worker_statements.clear()
                api_counts.clear()
                client_parse.clear()
                for _ in range(reps):
                    directs.append(direct_cpu(rows, n, d))
                    directs_job.append(direct_job_cpu(job, context, n, d))
                    release, api = await request(http, dataset)
                    workers.append(work_once())
                    apis.append(api + await read(http, release))
                    if one_request:
                        api_1, worker_1 = await waited(http, dataset)
                        apis_1.append(api_1)
                        workers_1.append(worker_1)
                floor = statistics.median(directs)
                floor_job = statistics.median(directs_job)
                api_s, worker_s = statistics.median(apis), statistics.median(workers)
                one = one_job = one_service = "n/a (no POST ?wait)"
                api_1s = worker_1s = None
                parse_s = statistics.median(client_parse) if client_parse else 0.0
                if one_request:
                    api_1s, worker_1s = statistics.median(apis_1), statistics.median(workers_1)
                    one = f"{(api_1s + worker_1s) / floor:.2f}"
                    one_job = f"{(api_1s + worker_1s) / floor_job:.2f}"
                    one_service = f"{(api_1s - parse_s + worker_1s) / floor:.2f}"
                table_rows.append(
                    [
                        f"{n:,} x {d}",
                        f"{floor:.4f}",
                        f"{floor_job:.4f}",
                        f"{api_1s:.4f}" if api_1s is not None else "n/a",
                        f"{parse_s:.4f}",
                        f"{api_s:.4f}",
                        f"{worker_1s:.4f}" if worker_1s is not None else "n/a",
                        f"{worker_s:.4f}",
                        f"{statistics.median(children):.4f}",
                        one,
                        one_service,
                        f"{(api_s + worker_s) / floor:.2f}",
                        one_job,
                        f"{(api_s + worker_s) / floor_job:.2f}",
                        f"{statistics.median(api_counts) if api_counts else 'n/a'}"
                        f" / {statistics.median(worker_statements)}",
                    ]
                )

    try:
        asyncio.run(drive())
    finally:
        worker.stdin.close()
        worker.wait(timeout=60)
    print(
        f"CPU seconds per release, medians of {reps} ({backend}; {RELEASE['mechanism']} "
        f"k={RELEASE['k']}; one BLAS thread; API includes the in-process client)"
    )
    headers = ["shape", "direct s", "direct with file s", "API s (one request)"]
    headers += ["of which the client's parsing s", "API s (two requests)"]
    headers += ["worker s (one)", "worker s (two)", "of which run s"]
    headers += ["(API + worker) / direct, one request"]
    headers += ["the same without the client's parsing", "the same, two requests"]
    headers += ["/ direct with file, one request", "the same, two requests"]
    headers += ["SQL statements per release: API (one request) / worker"]
    print(table(table_rows, headers))
    if api_profiler is not None:
        print("API (and client) CPU by function:")
        pstats.Stats(api_profiler).sort_stats("cumulative").print_stats(40)
    factory.kw["bind"].dispose()


if __name__ == "__main__":
    main()
