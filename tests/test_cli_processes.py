"""The service's processes: `dpss serve` leaves nothing behind when it is stopped, and
`dpss api --workers N` serves from N processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from scripts.harness import free_port, wait_http

ADMIN = "admin-secret-for-the-process-tests"


def dpss(*args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    """``dpss ARGS`` in its own session: its process group holds everything it starts."""
    return subprocess.Popen(
        [sys.executable, "-m", "service", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def group_members(pgid: int) -> list[int]:
    members = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids among ``pids`` still running after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [pid for pid in pids if _running(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def children_running(pid: int, count: int, timeout: float = 30) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        children = psutil.Process(pid).children(recursive=True)
        if len(children) >= count or time.monotonic() > deadline:
            return children
        time.sleep(0.05)


def spawned_servers(pid: int, count: int, timeout: float = 60) -> list[psutil.Process]:
    """The ``count`` server processes uvicorn spawned under ``pid``, once each has exec'd.

    Counting children is not enough: a spawned child is first a fork of its parent (the
    parent's command line) until it execs ``spawn_main``, and the resource tracker is a child
    too; on a loaded machine the count was reached with a server not yet exec'd."""
    deadline = time.monotonic() + timeout
    while True:
        servers = []
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "spawn_main" in " ".join(child.cmdline()):
                    servers.append(child)
        if len(servers) >= count or time.monotonic() > deadline:
            assert len(servers) == count, [p.cmdline() for p in servers]
            return servers
        time.sleep(0.05)


@pytest.fixture
def serve_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {**os.environ, "DPSS_DATA_DIR": str(tmp_path / "data"), "DPSS_ADMIN_API_KEY": ADMIN}
    env.pop("DPSS_DATABASE_URL", None)
    yield env


def start_serve(env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    """`dpss serve` answering on a free port; returns it, its port and its worker's pid."""
    port = free_port()
    server = dpss("serve", "--port", str(port), env=env, cwd=cwd)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
        workers = children_running(server.pid, 1)
        assert len(workers) == 1, workers
    except BaseException:
        os.killpg(server.pid, signal.SIGKILL)
        raise
    return server, port, workers[0].pid


@pytest.mark.parametrize(
    "signum",
    [
        pytest.param(signal.SIGTERM, id="SIGTERM"),
        # The same path (uvicorn re-raises either); slow only to keep the default run short.
        pytest.param(signal.SIGINT, id="SIGINT", marks=pytest.mark.slow),
    ],
)
def test_serve_stops_its_worker_on_a_signal(
    serve_env: dict[str, str], tmp_path: Path, signum: int
) -> None:
    server, _, worker_pid = start_serve(serve_env, tmp_path)
    try:
        server.send_signal(signum)
        server.wait(timeout=20)
        left = wait_gone([worker_pid], timeout=30) + group_members(server.pid)
        assert left == [], f"processes left after {signum.name}: {left}"
        # It still ends as the signal would have ended it.
        assert server.returncode == -signum
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_serve_leaves_no_worker_behind(serve_env: dict[str, str], tmp_path: Path) -> None:
    """SIGKILL gives serve no chance to clean up: the worker notices its parent is gone."""
    server, _, worker_pid = start_serve(serve_env, tmp_path)
    try:
        server.kill()
        server.wait(timeout=10)
        assert wait_gone([worker_pid], timeout=10) == [], "the worker outlived a killed serve"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)


def test_api_with_two_workers_serves_from_two_processes(
    committed_db: tuple[str, object], tmp_path: Path
) -> None:
    url, _ = committed_db
    env = {
        **os.environ,
        "DPSS_DATA_DIR": str(tmp_path / "data"),
        "DPSS_DATABASE_URL": url,
        "DPSS_ADMIN_API_KEY": ADMIN,
    }
    port = free_port()
    api = dpss("api", "--workers", "2", "--port", str(port), env=env, cwd=tmp_path)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
        # Both processes start, bootstrap nothing twice and stay up.
        servers = spawned_servers(api.pid, 2)
        headers = {"Authorization": f"Bearer {ADMIN}"}
        # A hang guard, not a timing assumption: httpx's 5 s default was near one request's
        # time on a loaded machine.
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60
        ) as client:
            made = [
                client.post("/v1/keys", json={"role": "analyst", "name": f"a{i}"})
                for i in range(10)
            ]
            assert [response.status_code for response in made] == [201] * 10
            keys = client.get("/v1/keys").json()["items"]
            assert len([key for key in keys if key["role"] == "admin"]) == 1
        assert all(process.is_running() for process in servers)
        api.send_signal(signal.SIGTERM)
        api.wait(timeout=30)
        assert wait_gone([process.pid for process in servers], timeout=30) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(api.pid, signal.SIGKILL)


@pytest.mark.parametrize("command", ["serve", "api"])
def test_a_busy_port_is_named_before_anything_starts(
    command: str, serve_env: dict[str, str], tmp_path: Path
) -> None:
    """Another program on the port: one line naming the port and --port, exit 1, no
    traceback, and nothing started (no database, no worker)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "service", command, "--port", str(port)],
            env=serve_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "--port" in done.stderr
    assert "Traceback" not in done.stderr and "Errno" not in done.stderr
    assert not (tmp_path / "data" / "dpss.db").exists()


def test_an_address_not_of_this_host_is_named(serve_env: dict[str, str], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--host", "192.0.2.1", "--port", "8000"],
        env=serve_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "cannot listen on 192.0.2.1: not an address of this machine" in done.stderr
    assert "Traceback" not in done.stderr


def answered(url: str, status: int, timeout: float = 60) -> httpx.Response:
    """The first answer from ``url`` with ``status``, or the last answer (or error) once
    ``timeout`` seconds have passed: a condition the server reaches when it has processed
    what came before, waited on with a hang guard rather than a fixed sleep."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with httpx.Client(timeout=10) as client:
                answer = client.get(url)
            if answer.status_code == status or time.monotonic() > deadline:
                return answer
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def _few_files() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_more_connections_than_open_files_get_503_not_silence(
    committed_db: tuple[str, object], tmp_path: Path
) -> None:
    """Slowloris at the socket level: 300 clients that send a request's head and never its body,
    against an API process allowed 256 open files. Before, the process ran out of descriptors:
    its loop spun on ``accept`` (EMFILE, logged each time: 270,000 lines in 16 s) and every new
    client waited with no answer. Now uvicorn admits connections only up to what the descriptors
    allow (:func:`service.cli.connection_limit`), so a client beyond them is answered 503 with
    ``Retry-After`` at once, and once the slow clients leave it is served again."""
    import socket

    url, _ = committed_db
    env = {**os.environ, "DPSS_DATA_DIR": str(tmp_path / "data"), "DPSS_DATABASE_URL": url}
    env.pop("DPSS_ADMIN_API_KEY", None)
    port = free_port()
    log = tmp_path / "api.log"
    with log.open("wb") as stderr:
        api = subprocess.Popen(
            [sys.executable, "-m", "service", "api", "--port", str(port)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=_few_files,
        )
    slow: list[socket.socket] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
        head = (
            b"POST /v1/datasets HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
            b"boundary=b\r\nContent-Length: 100000\r\n\r\n--b\r\n"
        )
        for _ in range(300):
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
            conn.sendall(head)
            slow.append(conn)
        # Once the process has accepted them (1 s was the assumption; a loaded machine can
        # take longer), a client beyond them is answered 503.
        answer = answered(f"http://127.0.0.1:{port}/healthz", 503)
        assert answer.status_code == 503, answer
        assert int(answer.headers["Retry-After"]) >= 1
        assert api.poll() is None
        for conn in slow:
            conn.close()
        slow.clear()
        assert answered(f"http://127.0.0.1:{port}/healthz", 200).status_code == 200
    finally:
        for conn in slow:
            conn.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(api.pid, signal.SIGKILL)
        api.wait(timeout=30)
    assert log.read_text(errors="replace").count("Too many open files") < 10


@pytest.mark.parametrize("protocol", ["httptools", "h11"])
def test_slow_request_heads_do_not_hold_the_connection_slots(
    committed_db: tuple[str, object], tmp_path: Path, protocol: str
) -> None:
    """Slowloris on the request head: 300 clients that connect and send part of a head (or
    nothing), against an API process whose descriptors admit fewer connections. Before, uvicorn
    timed nothing before a head was whole, so they held every connection slot for as long as
    they stayed, and every other client got 503 (the test above). Now a head not whole within
    ``DPSS_API_HEAD_TIMEOUT_SECONDS`` is answered 408 and its connection closed, so the
    slots come back while the slow clients are still connected, and a client is served.
    (Not timed: the slow clients stay; the service must serve within 60 s, against never.)"""
    import socket

    url, _ = committed_db
    env = {
        **os.environ,
        "DPSS_DATA_DIR": str(tmp_path / "data"),
        "DPSS_DATABASE_URL": url,
        "DPSS_API_HEAD_TIMEOUT_SECONDS": "1",
    }
    env.pop("DPSS_ADMIN_API_KEY", None)
    port = free_port()
    # The h11 protocol is the one `dpss api` runs without httptools; here by its import name.
    code = (
        "import sys, uvicorn; from service.cli import _uvicorn_options; "
        "from service.config import Settings; from service.app import create_app; "
        "s = Settings(); o = _uvicorn_options(s); "
        "o['http'] = 'service.api.h11_json:JsonErrorsH11'; "
        f"uvicorn.run(create_app(s), host='127.0.0.1', port={port}, **o)"
    )
    command = (
        [sys.executable, "-m", "service", "api", "--port", str(port)]
        if protocol == "httptools"
        else [sys.executable, "-c", code]
    )
    api = subprocess.Popen(
        command,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_few_files,
    )
    slow: list[socket.socket] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
        for i in range(300):
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 2:
                conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never ended
            slow.append(conn)
        served = None
        deadline = time.monotonic() + 60
        failures: list[str] = []
        while time.monotonic() < deadline:
            try:
                with httpx.Client(timeout=10) as client:
                    answer = client.get(f"http://127.0.0.1:{port}/healthz")
            except httpx.TransportError as exc:
                # While the slow clients hold every descriptor the process cannot even
                # accept; before, that lasted as long as they stayed (40 of 40 tries dropped).
                failures.append(type(exc).__name__)
            else:
                if answer.status_code == 200:
                    served = answer
                    break
                assert answer.status_code == 503, answer.text
                failures.append("503")
            time.sleep(0.5)
        assert served is not None, f"the slow heads kept every connection slot: {failures}"
        # A slow head itself was told why (and closed), not left hanging.
        slow[1].settimeout(30)
        told = slow[1].recv(4096)
        assert told.startswith(b"HTTP/1.1 408"), told
        assert b"request_timeout" in told
        assert api.poll() is None
    finally:
        for conn in slow:
            conn.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(api.pid, signal.SIGKILL)
        api.wait(timeout=30)
