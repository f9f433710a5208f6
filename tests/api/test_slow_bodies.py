"""A slow client holds no database connection while its body trickles in, and is cut by the body
timeout (408) with nothing left in ``incoming/``. Real uvicorn, raw sockets, a pool of one."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from service import auth
from service.app import create_app
from service.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.store import DatasetStore
from tests.api.live import serving
from tests.conftest import bearer

BOUNDARY = "dpss-test-boundary"
TIMEOUT = 1.5


def _open(
    base: str, path: str, headers: dict[str, str], first_bytes: bytes, length: int = 1_000_000
) -> socket.socket:
    """Send a request's head and the first bytes of a body declared ``length`` bytes long."""
    address = urlsplit(base)
    sock = socket.create_connection((address.hostname, address.port), timeout=10)
    lines = [f"POST {path} HTTP/1.1", f"Host: {address.netloc}", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + first_bytes)
    return sock


def _trickle_until_answered(sock: socket.socket, chunk: bytes, seconds: float) -> bytes:
    """Send ``chunk`` every 0.1 s until the server answers (its answer) or ``seconds`` pass."""
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        readable, _, _ = select.select([sock], [], [], 0.1)
        if readable:
            answer = b""
            while b"\r\n\r\n" not in answer or not _complete(answer):
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
            return answer
        with contextlib.suppress(OSError):
            sock.sendall(chunk)
    return b""


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return True


def _status_and_body(answer: bytes) -> tuple[int, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def _upload_start() -> bytes:
    fields = {"name": "slow", "epsilon_budget": "1", "delta_budget": "0"}
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    parts.append(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="x.csv"\r\n'
        "Content-Type: text/csv\r\n\r\n1,2\r\n"
    )
    return "".join(parts).encode()


def _app(committed_db: Any, settings: Settings) -> tuple[Any, Any, Any]:
    url, factory = committed_db
    small = Settings(
        data_dir=settings.data_dir,
        database_url=url,
        db_pool_size=1,
        db_max_overflow=0,
        db_pool_timeout_seconds=2,
        body_timeout_seconds=TIMEOUT,
    )
    # One connection, made here so that the same test runs any version of the app.
    engine = make_engine(url, pool_size=1, max_overflow=0, pool_timeout=2)
    return create_app(small, session_factory=make_session_factory(engine)), engine, factory


def _incoming_files(store: DatasetStore) -> list[Path]:
    """Files in ``incoming/`` but the lock file of this process's own upload directory."""
    return [p for p in store.incoming.rglob("*") if p.is_file() and p.name != ".lock"]


def test_a_slow_upload_holds_no_connection_and_is_cut_by_the_body_timeout(committed_db, settings):
    app, engine, factory = _app(committed_db, settings)
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "o", None)
    store = DatasetStore(settings.datasets_dir)
    headers = {**bearer(owner), "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    try:
        with serving(app) as base:
            upload = _open(base, "/v1/datasets", headers, _upload_start())
            # However long the machine takes to start it, the upload streams into incoming/.
            ends = time.monotonic() + 30
            while not _incoming_files(store) and time.monotonic() < ends:
                time.sleep(0.02)
            assert _incoming_files(store), "the upload is streaming into incoming/"
            # The pool's only connection is free while the upload streams (checked on the pool,
            # not by timing another request: a busy machine is slow either way).
            assert engine.pool.checkedout() == 0
            fast = httpx.get(f"{base}/v1/datasets", headers=bearer(owner), timeout=10)
            assert fast.status_code == 200, fast.text
            answer = _trickle_until_answered(upload, b"3,4\r\n", seconds=TIMEOUT + 30)
            upload.close()
            assert answer, "the slow upload was never cut"
            status, body = _status_and_body(answer)
            assert status == 408
            assert body["error"] == "request_timeout"
            assert "DPSS_BODY_TIMEOUT_SECONDS" in body["detail"]
            assert _incoming_files(store) == []
            assert httpx.get(f"{base}/v1/datasets", headers=bearer(owner)).json()["items"] == []
    finally:
        engine.dispose()


def test_a_slow_json_body_is_cut_by_the_body_timeout(committed_db, settings):
    app, engine, factory = _app(committed_db, settings)
    with factory.begin() as session:
        _, admin = auth.create_key(session, "admin", "a", None)
    headers = {**bearer(admin), "Content-Type": "application/json"}
    try:
        with serving(app) as base:
            request = _open(base, "/v1/keys", headers, b'{"role": "owner", "name": "', length=1000)
            # The trickle never completes the body: only the body timeout can answer it.
            answer = _trickle_until_answered(request, b"x", seconds=TIMEOUT + 30)
            request.close()
            assert answer, "the slow body was never cut"
            assert _status_and_body(answer)[0] == 408
    finally:
        engine.dispose()
