"""The mixed client workload of the load and fault scripts, its figures and the ledger check.

Every client is one asyncio task that sends one request at a time until its deadline: budget
reads, dataset reads, reads of its own releases and release requests, across several datasets.
Each response is recorded as (time, endpoint, status, latency); a request that times out or
cannot connect is recorded as ``timeout`` or ``conn-error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import ssl
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from sqlalchemy import create_engine, text

from scripts.harness import Checks, percentile, table

#: Operation -> weight in the mix.
MIX = {"budget": 30, "dataset": 20, "datasets": 10, "release_read": 25, "release_request": 15}
ENDPOINTS = {
    "budget": "GET /v1/datasets/{id}/budget",
    "dataset": "GET /v1/datasets/{id}",
    "datasets": "GET /v1/datasets",
    "release_read": "GET /v1/releases/{id}",
    "release_request": "POST /v1/datasets/{id}/releases",
}
READS = [ENDPOINTS[op] for op in ("budget", "dataset", "datasets", "release_read")]
RELEASE = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.01", "delta": "1e-8"}


@dataclass(frozen=True)
class Sample:
    t: float
    endpoint: str
    status: str
    latency: float


@dataclass
class Seeded:
    base_url: str
    admin_key: str
    owner_key: str
    analyst_keys: list[str]
    dataset_ids: list[str]


@dataclass
class Recorder:
    samples: list[Sample] = field(default_factory=list)
    #: Release ids answered 202.
    accepted: set[str] = field(default_factory=set)
    #: Release requests whose outcome the client never learnt (timeout, dropped connection).
    unknown: int = 0
    origin: float = field(default_factory=time.monotonic)

    def add(self, endpoint: str, status: str, started: float) -> None:
        now = time.monotonic()
        self.samples.append(Sample(started - self.origin, endpoint, status, now - started))


def npy(array: np.ndarray[Any, Any]) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def seed(
    base_url: str,
    admin_key: str,
    datasets: int = 4,
    analysts: int = 4,
    rows: int = 300,
    cols: int = 8,
    epsilon_budget: str = "5",
    delta_budget: str = "0.001",
) -> Seeded:
    """Keys (one owner, several analysts) and ``datasets`` small datasets, over HTTP."""
    admin = {"Authorization": f"Bearer {admin_key}"}
    with httpx.Client(base_url=base_url, timeout=60) as client:

        def key(role: str, name: str) -> str:
            made = client.post("/v1/keys", headers=admin, json={"role": role, "name": name})
            while made.status_code == 429:
                # The admin key is rate limited like any other: wait as told, then go on.
                time.sleep(float(made.headers.get("retry-after", "1")))
                made = client.post("/v1/keys", headers=admin, json={"role": role, "name": name})
            made.raise_for_status()
            return str(made.json()["key"])

        owner = key("owner", "load owner")
        analyst_keys = [key("analyst", f"load analyst {i}") for i in range(analysts)]
        rng = np.random.default_rng(0)
        ids = []
        for i in range(datasets):
            data = rng.normal(size=(rows, cols)) / np.sqrt(cols)
            data /= np.maximum(1, np.linalg.norm(data, axis=1, keepdims=True))
            made = client.post(
                "/v1/datasets",
                headers={"Authorization": f"Bearer {owner}"},
                files={"file": (f"d{i}.npy", npy(data), "application/octet-stream")},
                data={
                    "name": f"load {i}",
                    "epsilon_budget": epsilon_budget,
                    "delta_budget": delta_budget,
                    "row_norm_bound": "1",
                    # A load test spends many small deltas; not a budget that protects anyone.
                    "allow_large_delta": "true",
                },
            )
            made.raise_for_status()
            ids.append(str(made.json()["id"]))
    return Seeded(base_url, admin_key, owner, analyst_keys, ids)


async def _client(
    index: int,
    http: httpx.AsyncClient,
    seeded: Seeded,
    deadline: float,
    recorder: Recorder,
    mix: dict[str, int],
) -> None:
    rng = random.Random(index)
    headers = {"Authorization": f"Bearer {seeded.analyst_keys[index % len(seeded.analyst_keys)]}"}
    mine: list[str] = []
    ops, weights = list(mix), list(mix.values())
    while time.monotonic() < deadline:
        op = rng.choices(ops, weights)[0]
        if op == "release_read" and not mine:
            op = "release_request"
        dataset = rng.choice(seeded.dataset_ids)
        if op == "budget":
            request = http.build_request("GET", f"/v1/datasets/{dataset}/budget", headers=headers)
        elif op == "dataset":
            request = http.build_request("GET", f"/v1/datasets/{dataset}", headers=headers)
        elif op == "datasets":
            request = http.build_request("GET", "/v1/datasets?limit=20", headers=headers)
        elif op == "release_read":
            request = http.build_request("GET", f"/v1/releases/{rng.choice(mine)}", headers=headers)
        else:
            request = http.build_request(
                "POST",
                f"/v1/datasets/{dataset}/releases",
                headers={**headers, "Idempotency-Key": uuid.uuid4().hex},
                json=RELEASE,
            )
        started = time.monotonic()
        try:
            response = await http.send(request)
            status = str(response.status_code)
        except httpx.TimeoutException:
            status = "timeout"
        except httpx.TransportError:
            status = "conn-error"
            await asyncio.sleep(0.05)  # a refused connection answers at once: do not spin
        recorder.add(ENDPOINTS[op], status, started)
        if status in ("503", "429"):
            # A well-behaved client waits as told (the header is whole seconds), not past the end.
            wait = float(response.headers.get("retry-after", "1"))
            await asyncio.sleep(max(0.0, min(wait, deadline - time.monotonic())))
        if op == "release_request":
            if status == "202":
                release_id = str(response.json()["id"])
                mine.append(release_id)
                recorder.accepted.add(release_id)
            elif not status.isdigit():
                recorder.unknown += 1


async def run_clients(
    seeded: Seeded,
    clients: int,
    duration: float,
    request_timeout: float = 10,
    mix: dict[str, int] | None = None,
    recorder: Recorder | None = None,
) -> Recorder:
    """``clients`` concurrent clients for ``duration`` seconds, one keep-alive connection each.

    Each client has its own ``httpx.AsyncClient`` limited to one connection, as a real user's
    client would be. One pool shared by all clients is quadratic: httpcore scans every pooled
    connection (with a ``getpeername`` system call each) on every request and every response, so
    at 200 clients the generator alone saturated a core and its own queueing was measured as the
    service's latency.
    """
    recorder = recorder or Recorder()
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    # httpx loads the CA bundle into a new SSL context for every client unless given one (50 ms
    # each: 10 s for 200 clients, during which the first clients ran alone). Plain HTTP never
    # uses it.
    tls = ssl.create_default_context()
    async with contextlib.AsyncExitStack() as stack:
        https = [
            await stack.enter_async_context(
                httpx.AsyncClient(
                    base_url=seeded.base_url, timeout=request_timeout, limits=limits, verify=tls
                )
            )
            for _ in range(clients)
        ]
        deadline = time.monotonic() + duration
        await asyncio.gather(
            *(_client(i, https[i], seeded, deadline, recorder, mix or MIX) for i in range(clients))
        )
    return recorder


def endpoint_table(samples: Iterable[Sample], seconds: float) -> str:
    """Per endpoint: count, throughput, p50/p99 latency, statuses."""
    by_endpoint: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_endpoint[sample.endpoint].append(sample)
    rows = []
    every: list[Sample] = []
    for endpoint in sorted(by_endpoint):
        group = by_endpoint[endpoint]
        every += group
        rows.append(_row(endpoint, group, seconds))
    rows.append(_row("all", every, seconds))
    return table(rows, ["endpoint", "requests", "req/s", "p50 ms", "p99 ms", "statuses"])


def _row(name: str, group: list[Sample], seconds: float) -> list[object]:
    latencies = [s.latency * 1000 for s in group]
    statuses = Counter(s.status for s in group)
    return [
        name,
        len(group),
        f"{len(group) / seconds:.1f}",
        f"{percentile(latencies, 50):.0f}",
        f"{percentile(latencies, 99):.0f}",
        " ".join(f"{status}:{count}" for status, count in sorted(statuses.items())),
    ]


def p99_ms(samples: Iterable[Sample], endpoints: Iterable[str]) -> float:
    wanted = set(endpoints)
    return percentile([s.latency * 1000 for s in samples if s.endpoint in wanted], 99)


def wait_drained(database_url: str, timeout: float) -> tuple[int, float]:
    """Waits until no release is queued or running; returns (left, seconds waited)."""
    engine = create_engine(database_url)
    started = time.monotonic()
    try:
        while True:
            with engine.connect() as connection:
                left = int(
                    connection.scalar(
                        text("SELECT count(*) FROM releases WHERE status IN ('queued', 'running')")
                    )
                    or 0
                )
            if left == 0 or time.monotonic() - started > timeout:
                return left, time.monotonic() - started
            time.sleep(0.5)
    finally:
        engine.dispose()


def ledger_check(database_url: str, recorder: Recorder | None, checks: Checks) -> None:
    """In SQL: one charge per release, every 202 (of ``recorder``) is a stored release, no
    dataset above its budget, no release queued or running."""
    engine = create_engine(database_url)
    with engine.connect() as connection:
        releases = int(connection.scalar(text("SELECT count(*) FROM releases")) or 0)
        charges = int(
            connection.scalar(text("SELECT count(*) FROM ledger_entries WHERE kind = 'charge'"))
            or 0
        )
        not_one = int(
            connection.scalar(
                text(
                    "SELECT count(*) FROM releases r WHERE (SELECT count(*) FROM ledger_entries l"
                    " WHERE l.release_id = r.id AND l.kind = 'charge') <> 1"
                )
            )
            or 0
        )
        stored = {str(row[0]) for row in connection.execute(text("SELECT id FROM releases"))}
        over = connection.execute(
            text(
                "SELECT d.id FROM datasets d LEFT JOIN ledger_entries l ON l.dataset_id = d.id"
                " GROUP BY d.id, d.epsilon_total, d.delta_total, d.rho_total HAVING"
                " COALESCE(SUM(CASE WHEN l.kind = 'charge' THEN l.epsilon ELSE -l.epsilon END), 0)"
                " > d.epsilon_total OR"
                " COALESCE(SUM(CASE WHEN l.kind = 'charge' THEN l.delta ELSE -l.delta END), 0)"
                " > d.delta_total OR"
                # gaussian and zcdp datasets (the default) are charged in rho.
                " (d.rho_total IS NOT NULL AND"
                " COALESCE(SUM(CASE WHEN l.kind = 'charge' THEN l.rho ELSE -l.rho END), 0)"
                " > d.rho_total)"
            )
        ).all()
        stuck = int(
            connection.scalar(
                text("SELECT count(*) FROM releases WHERE status IN ('queued', 'running')")
            )
            or 0
        )
        statuses: dict[str, int] = dict(
            connection.execute(text("SELECT status, count(*) FROM releases GROUP BY status")).all()
        )
    engine.dispose()
    checks.check(
        "ledger: one charge per release",
        not_one == 0 and charges == releases,
        f"{releases} releases, {charges} charges, {not_one} without exactly one",
    )
    if recorder is not None:
        missing = recorder.accepted - stored
        extra = len(stored - recorder.accepted)
        checks.check(
            "ledger: every 202 is stored",
            not missing and extra <= recorder.unknown,
            f"{len(recorder.accepted)} accepted, {len(missing)} missing, {extra} stored without "
            f"a known answer (<= {recorder.unknown} requests with no answer)",
        )
    checks.check("ledger: nothing above budget", not over, f"{len(over)} datasets overspent")
    checks.check(
        "ledger: no release queued or running",
        stuck == 0,
        f"{stuck} left; " + " ".join(f"{k}:{v}" for k, v in sorted(statuses.items())),
    )
