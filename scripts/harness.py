"""Shared pieces of the load and fault scripts (and of the outage tests): a private PostgreSQL
cluster that can be stopped and started at will, service processes on 127.0.0.1, free ports,
latency tables.

Nothing here touches the shared PostgreSQL server except :func:`create_database` /
:func:`drop_database`, which create and drop one database whose name the caller chose.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import create_engine, make_url, text

ROOT = Path(__file__).resolve().parents[1]
PG_BIN = Path(os.environ.get("DPSS_PG_BIN", "/usr/lib/postgresql/15/bin"))
LOCAL_SERVER = os.environ.get(
    "DPSS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def have_private_postgres() -> bool:
    return (PG_BIN / "initdb").is_file() and (PG_BIN / "pg_ctl").is_file()


class PrivatePostgres:
    """A throw-away PostgreSQL cluster on its own port under a temporary directory, owned by
    this process: :meth:`stop` and :meth:`start` simulate an outage and a restart.

    initdb refuses to run as root; as root the cluster's commands run as the ``postgres`` user.
    """

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        # Under /tmp itself: the postgres user cannot enter root's private temp directories.
        self.root = Path(tempfile.mkdtemp(prefix="dpss-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.running = False
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            str(PG_BIN / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
        )

    def _run(self, *argv: str) -> None:
        command = ["runuser", "-u", "postgres", "--", *argv] if self._as_postgres else list(argv)
        subprocess.run(command, check=True, capture_output=True, cwd=self.root)

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            " -c max_connections=200"
        )
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options,
            "-w", "-t", "60", "start",
        )  # fmt: skip
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; ``fast`` ends every session (clients see their connections drop)."""
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")
        self.running = False

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        engine = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        with engine.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        engine.dispose()
        return self.url(name)

    def destroy(self) -> None:
        if self.running:
            with contextlib.suppress(subprocess.CalledProcessError):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.destroy()


def create_database(name: str, server: str = LOCAL_SERVER) -> str:
    """Create database ``name`` on the local server; returns its URL."""
    admin = create_engine(
        make_url(server).render_as_string(hide_password=False), isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(server).set(database=name).render_as_string(hide_password=False)


def drop_database(name: str, server: str = LOCAL_SERVER) -> None:
    admin = create_engine(
        make_url(server).render_as_string(hide_password=False), isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def dpss_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "service", *args]


@dataclass
class Services:
    """``dpss`` processes started by a script, each in its own process group (so that stopping
    one also stops the processes it started), all stopped at the end."""

    env: dict[str, str]
    log_dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            dpss_command(*args),
            env=self.env,
            cwd=self.log_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = process
        return process

    def signal(self, name: str, signum: int) -> None:
        """Send ``signum`` to the process group of ``name``."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.processes[name].pid, signum)

    def stop(self, name: str, timeout: float = 15) -> None:
        process = self.processes.pop(name)
        if process.poll() is None:
            self.signal_pid(process, signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.signal_pid(process, signal.SIGKILL)
                process.wait()
        # Whatever the process left in its group (it was the group's leader).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    @staticmethod
    def signal_pid(process: subprocess.Popen[bytes], signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)

    def alive(self, name: str) -> bool:
        return self.processes[name].poll() is None

    def stop_all(self) -> None:
        for name in list(self.processes):
            self.stop(name)


def wait_http(url: str, timeout: float = 60) -> float:
    """Seconds until ``url`` answers 200; raises ``TimeoutError`` after ``timeout``."""
    start = time.monotonic()
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{url} did not answer 200 within {timeout:.0f} s")
        time.sleep(0.1)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; NaN if empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def cpu_slowdown(seconds: float = 1.0) -> float:
    """How many times slower than alone a CPU-bound process runs on this host now (at least 1):
    the wall time of a busy loop over its CPU time. The latency bounds of the load and fault
    scripts are written for an otherwise idle host; each is scaled by this factor, measured just
    before its load starts, so that a check fails on the service and not on other work sharing
    the machine (with ``L`` other runnable processes on ``c`` cores the factor is about
    ``(L + 1)/c``; on an idle host it is 1 and the bound is as written)."""
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    total = 0
    while time.perf_counter() - wall_start < seconds:
        total += sum(range(10_000))
    wall = time.perf_counter() - wall_start
    cpu = time.process_time() - cpu_start
    return max(1.0, wall / cpu) if cpu > 0 else 1.0


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """A plain text table (also valid Markdown)."""
    cells = [[str(cell) for cell in header], *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in cells]  # fmt: skip
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


@dataclass
class Checks:
    """Named pass/fail checks; a script exits non-zero if any failed."""

    results: list[tuple[str, bool, str]] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.results.append((name, ok, detail))
        return ok

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.results)

    def render(self) -> str:
        return table(
            [(name, "PASS" if ok else "FAIL", detail) for name, ok, detail in self.results],
            ["check", "result", "detail"],
        )


@contextlib.contextmanager
def timer() -> Iterator[list[float]]:
    box: list[float] = []
    start = time.monotonic()
    try:
        yield box
    finally:
        box.append(time.monotonic() - start)
