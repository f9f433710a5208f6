"""Speed sections: release time over the linear-algebra floor, exponents, memory, HTTP, load.

Every timing is a ratio to a baseline measured in the same process, on the same data, in the
same repetition (interleaved, so that a burst of load from the rest of the machine hits both):

- Gram mechanisms (and any mechanism without subsets): ``X^T X`` then ``eigh``, in memory;
- aggregators (a ``t`` in their resolved params): the ``t`` SVDs of the random partition's
  subsets (``n/t`` rows each), the decompositions any sample-and-aggregate must do.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.accuracy import seed_of
from bench.core import (
    FALLBACK_PARAMS,
    ROOT,
    FloatArray,
    Outcome,
    Progress,
    Reference,
    Row,
    SlowGuard,
    call,
    near_subspace,
    prepare,
    spread,
)
from service.mechanisms.base import PublicContext
from service.mechanisms.registry import MECHANISMS

K, EPSILON, DELTA, DISTANCE = 3, 1.0, 1e-6, 1e-3
#: What a mechanism that needs the gap (histogram_aggregate) is given in the timing sections:
#: the planted distance as gamma (its run time hardly depends on the cell width).
GIVEN_GAP = Reference(top=np.empty((0, 0)), captured_top=0.0, gamma=DISTANCE)


def gram_floor(data: FloatArray) -> float:
    """Seconds of the bare ``X^T X`` and its full ``eigh``: what every Gram mechanism must do."""
    start = time.perf_counter()
    gram = data.T @ data
    np.linalg.eigh(gram)
    return time.perf_counter() - start


def subsets_floor(data: FloatArray, t: int, rng: np.random.Generator) -> float:
    """Seconds of the ``t`` thin SVDs of a random partition into ``t`` subsets of ``n/t`` rows."""
    n = data.shape[0]
    m = n // t
    order = rng.permutation(n)[: t * m]
    start = time.perf_counter()
    for j in range(t):
        np.linalg.svd(data[order[j * m : (j + 1) * m]], full_matrices=False)
    return time.perf_counter() - start


def subsets_of(name: str, n: int, d: int) -> int | None:
    """The ``t`` a mechanism resolves for this shape (public facts), if it partitions."""
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    spec, _ = prepare(MECHANISMS[name], ctx, K, EPSILON, DELTA, {})
    if spec is None and name in FALLBACK_PARAMS:  # as call() does (histogram_aggregate)
        spec, _ = prepare(
            MECHANISMS[name], ctx, K, EPSILON, DELTA, FALLBACK_PARAMS[name](GIVEN_GAP)
        )
    t = getattr(spec.params, "t", None) if spec is not None else None
    return int(t) if t else None


@dataclass(frozen=True)
class SpeedGrid:
    n: int
    ds: tuple[int, ...]
    reps: int
    #: n values for the exponent in n, at d = ``n_sweep_d``.
    n_sweep: tuple[int, ...]
    n_sweep_d: int


def speed(grid: SpeedGrid) -> list[Row]:
    """Release time over the floor per mechanism, on the d grid and the n sweep."""
    shapes = [(grid.n, d) for d in grid.ds]
    shapes += [(n, grid.n_sweep_d) for n in grid.n_sweep if (n, grid.n_sweep_d) not in shapes]
    rows: list[Row] = []
    progress = Progress(len(shapes) * grid.reps, "speed")
    guard = SlowGuard.for_section(5.0)
    for n, d in shapes:
        data, _ = near_subspace(n, d, K, DISTANCE, seed_of("speed", n, d))
        for rep in range(grid.reps):
            rng = np.random.default_rng(seed_of("floor", n, d, rep))
            floor = gram_floor(data)
            rows.append(_row("floor_gram", n, d, rep, "succeeded", floor, 1.0, "X^T X + eigh"))
            for name, mech in MECHANISMS.items():
                if getattr(mech, "continual", False):
                    rows.append(_row(name, n, d, rep, "skipped", reason="continual release"))
                    continue
                t = subsets_of(name, n, d)
                outcome = guard.call(
                    name,
                    (n, d),
                    data,
                    K,
                    EPSILON,
                    DELTA,
                    seed_of("speed", name, n, d, rep),
                    GIVEN_GAP,
                )
                if outcome.status == "skipped":
                    rows.append(_row(name, n, d, rep, "skipped", reason=outcome.reason))
                    continue
                if t is not None:
                    base = subsets_floor(data, t, rng)
                    label = f"{t} subset SVDs"
                    rows.append(_row(f"floor_subsets_t{t}", n, d, rep, "succeeded", base, 1.0,
                                     label))  # fmt: skip
                else:
                    base, label = floor, "X^T X + eigh"
                row = _row(name, n, d, rep, outcome.status, outcome.seconds,
                           outcome.seconds / base, label, outcome.reason)  # fmt: skip
                rows.append(row)
            progress.step(f"n={n} d={d} rep={rep}")
    return rows


def _row(
    mechanism: str, n: int, d: int, rep: int, status: str, seconds: float = math.nan,
    ratio: float = math.nan, params: str = "", reason: str = "",
) -> Row:  # fmt: skip
    row = Row("speed", mechanism, "near_subspace", d, n, DISTANCE, EPSILON, DELTA, K, rep, status)
    row.seconds, row.ratio, row.params, row.reason = seconds, ratio, params, reason[:200]
    return row


def exponents(rows: list[Row], n: int, d_fixed: int) -> dict[str, tuple[float, float]]:
    """Least-squares slopes of log(median seconds) in log d (at ``n``) and in log n (at
    ``d_fixed``), per mechanism: ``(in n, in d)``; NaN where fewer than two points ran."""
    names = sorted({r.mechanism for r in rows if r.status == "succeeded"})
    out: dict[str, tuple[float, float]] = {}
    for name in names:
        mine = [r for r in rows if r.mechanism == name and r.status == "succeeded"]

        def slope(points: dict[int, list[float]]) -> float:
            xs = sorted(points)
            if len(xs) < 2:
                return math.nan
            ys = [math.log(spread(points[x])[0]) for x in xs]
            return float(np.polyfit(np.log(xs), ys, 1)[0])

        by_d: dict[int, list[float]] = {}
        by_n: dict[int, list[float]] = {}
        for r in mine:
            if r.n == n:
                by_d.setdefault(r.d, []).append(r.seconds)
            if r.d == d_fixed:
                by_n.setdefault(r.n, []).append(r.seconds)
        out[name] = (slope(by_n), slope(by_d))
    return out


def memory(n: int, d: int) -> list[Row]:
    """Peak memory of each mechanism's run (tracemalloc sees numpy's allocations) over the
    data's size, next to the mechanism's own public estimate (``memory_bytes``) over it."""
    data, _ = near_subspace(n, d, K, DISTANCE, seed_of("memory", n, d))
    size = data.nbytes
    rows: list[Row] = []
    progress = Progress(len(MECHANISMS), "memory")
    guard = SlowGuard.for_section(5.0)
    for name, mech in MECHANISMS.items():
        if getattr(mech, "continual", False):
            rows.append(_row(name, n, d, 0, "skipped", reason="continual release"))
            progress.step(name)
            continue
        tracemalloc.start()
        outcome: Outcome = guard.call(
            name, (n, d), data, K, EPSILON, DELTA, seed_of("mem", name), GIVEN_GAP
        )
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        row = _row(name, n, d, 0, outcome.status, outcome.seconds, reason=outcome.reason)
        row.section = "memory"
        row.memory_ratio = peak / size
        if outcome.memory_bytes is not None:
            row.ratio = outcome.memory_bytes / size
            row.params = "ratio = memory_bytes estimate / data size"
        rows.append(row)
        progress.step(name)
    return rows


# ---------------------------------------------------------------------------------------------
# End to end: one release through the HTTP API (in process, SQLite, one in-process worker)


def http_release(n: int, d: int, reps: int) -> list[Row]:
    """``analyze_gauss`` from ``POST .../releases`` to the result in the analyst's hands, over
    the direct call.

    The ASGI app runs in process (``TestClient``, an httpx client over ASGI) on SQLite with one
    worker thread (woken through the wake file, as ``dpss serve``'s worker is). The analyst
    waits the way a user does, with the Python client: ``http_release`` is
    ``Client.release(...).wait()``, whose long poll (``GET /v1/releases/{id}?wait=``) answers
    when the worker has stored the outcome; ``http_release_polled`` is the same wait with
    ``long_poll=0`` (the client's polling, 0.2 s growing x1.5: what an older service gets). The
    privacy padding (``visible_at``) is off: a deliberate delay with figures of its own.
    Baselines in the same process on the same data: the bare ``X^T X + eigh`` and the direct
    mechanism call.
    """
    from fastapi.testclient import TestClient

    from dpss_client import Client
    from service import auth
    from service.app import create_app
    from service.config import Settings
    from service.db.engine import make_engine, make_session_factory
    from service.migrate import upgrade_to_head
    from service.store import DatasetStore
    from service.worker import Worker

    rows: list[Row] = []
    progress = Progress(reps, "http")
    with tempfile.TemporaryDirectory(prefix="dpss-bench-http-") as tmp:
        work = Path(tmp)
        settings = Settings(
            data_dir=work / "svc", log_level="WARNING", release_padding_floor_seconds=0,
            release_padding_multiplier=0,
        )  # fmt: skip
        settings.data_dir.mkdir()
        upgrade_to_head(settings.resolved_database_url)
        factory = make_session_factory(make_engine(settings.resolved_database_url))
        with factory.begin() as session:
            _, owner = auth.create_key(session, "owner", "bench", None)
            _, analyst = auth.create_key(session, "analyst", "bench", None)
        data, _ = near_subspace(n, d, K, DISTANCE, seed_of("http", n, d))
        upload = work / "data.npy"
        np.save(upload, data)
        stop = threading.Event()
        worker = Worker(factory, DatasetStore(settings.datasets_dir), settings, stop=stop)
        thread = threading.Thread(target=worker.run_forever, daemon=True)
        with TestClient(create_app(settings, session_factory=factory)) as client:
            owner_h = {"Authorization": f"Bearer {owner}"}
            # Ingestion (was bench/bench_service.py): the upload through the API (streamed
            # into the store's float64 .npy) over reading and writing the same file directly.
            start = time.perf_counter()
            np.save(work / "copy.npy", np.load(upload))
            copy_seconds = time.perf_counter() - start
            start = time.perf_counter()
            with upload.open("rb") as handle:
                response = client.post(
                    "/v1/datasets", headers=owner_h, files={"file": ("data.npy", handle)},
                    data={"name": "bench", "epsilon_budget": "1000", "delta_budget": "0.5",
                          "row_norm_bound": "1", "allow_large_delta": "true"},
                )  # fmt: skip
            response.raise_for_status()
            upload_seconds = time.perf_counter() - start
            row = _row("http_upload", n, d, 0, "succeeded", upload_seconds,
                       upload_seconds / copy_seconds, "over np.load + np.save")  # fmt: skip
            row.section = "http"
            rows.append(row)
            dataset = response.json()["id"]
            thread.start()
            analyst_client = Client(str(client.base_url), analyst, http=client)
            for rep in range(reps):
                floor = gram_floor(data)
                direct = call("analyze_gauss", data, K, EPSILON, DELTA, seed_of("http", rep))
                waited: dict[str, tuple[float, str]] = {}
                for name, long_poll in (("http_release", None), ("http_release_polled", 0.0)):
                    start = time.perf_counter()
                    handle = analyst_client.release(dataset, "analyze_gauss", K, "1", "1e-6")
                    handle.wait_finished(timeout=600, long_poll=long_poll)
                    waited[name] = (time.perf_counter() - start, handle.status)
                waited["direct_call"] = (direct.seconds, direct.status)
                seconds, status = waited["http_release"]
                for name, (value, shown) in waited.items():
                    row = _row(name, n, d, rep, shown, value, value / floor, "over X^T X + eigh")
                    row.section = "http"
                    rows.append(row)
                row = _row("http_over_direct", n, d, rep, status, seconds,
                           seconds / direct.seconds, "over the direct call")  # fmt: skip
                row.section = "http"
                rows.append(row)
                progress.step(f"{n} x {d} rep={rep}: {status} in {seconds:.2f} s")
        stop.set()
        thread.join(timeout=30)
    return rows


def load_test(clients: int, duration: float) -> str:
    """``scripts/load_test.py`` (API + two workers on the local PostgreSQL), its output as is;
    an empty string when it cannot run here (no PostgreSQL)."""
    command = [sys.executable, "-m", "scripts.load_test", "--clients", str(clients),
               "--duration", str(duration)]  # fmt: skip
    # Requests per second depend on the cores the API, the workers, PostgreSQL and the clients
    # share (all on this machine), and on what else runs there: both go with the figures.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    header = (
        f"machine: {os.cpu_count()} cores, {cores} usable by the run (API, workers, clients "
        f"and PostgreSQL share them); load average {load} at the start\n"
    )
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=duration + 300,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return ""
    print("[load] scripts/load_test.py exit", done.returncode, file=sys.stderr, flush=True)
    return header + done.stdout if done.returncode == 0 else ""


__all__: list[Any] = ["SpeedGrid", "exponents", "http_release", "load_test", "memory", "speed"]
