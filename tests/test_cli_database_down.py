"""``dpss serve``, ``dpss api`` and ``dpss worker`` with the database down at start.

``serve`` (which migrates first) and ``api`` with ``DPSS_ADMIN_API_KEY`` (which bootstraps the
key first) printed an uncaught ``OperationalError``: now one line on stderr naming the URL tried
without its password, and exit 2. The worker must outlive a database outage (DESIGN.md): it
retries with backoff and does not exit.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from service.cli import app as cli_app

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sekret-password"
ADMIN_KEY = "dpss_" + "a" * 43


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _down_urls(tmp_path: Path) -> dict[str, str]:
    return {
        # Nothing listens on port 1.
        "postgresql": f"postgresql+psycopg://dpss:{SECRET}@127.0.0.1:1/dpss",
        # A file in a directory that does not exist: SQLite cannot open it.
        "sqlite": f"sqlite:///{tmp_path}/missing/dir/dpss.sqlite3",
    }


def _run(args: list[str], url: str, tmp_path: Path, **env: str) -> Result:
    environment = {
        "DPSS_DATABASE_URL": url,
        "DPSS_DATA_DIR": str(tmp_path / "data"),
        "DPSS_AUDIT_ANCHOR": "",
        "DPSS_AUDIT_HMAC_KEY": "",
        "DPSS_ADMIN_API_KEY": "",
        **env,
    }
    return CliRunner().invoke(cli_app, args, env=environment)


def _one_line_exit_2(result: Result, url_shown: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output and "OperationalError" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: cannot open the database at {url_shown}"), lines[0]
    assert SECRET not in result.output


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_serve_with_the_database_down_exits_2_in_one_line(tmp_path, database):
    url = _down_urls(tmp_path)[database]
    shown = url.replace(SECRET, "***")
    _one_line_exit_2(_run(["serve", "--port", str(_free_port())], url, tmp_path), shown)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_api_bootstrapping_its_admin_key_with_the_database_down_exits_2_in_one_line(
    tmp_path, database
):
    url = _down_urls(tmp_path)[database]
    shown = url.replace(SECRET, "***")
    result = _run(["api", "--port", str(_free_port())], url, tmp_path, DPSS_ADMIN_API_KEY=ADMIN_KEY)
    _one_line_exit_2(result, shown)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_worker_outlives_a_database_that_is_down_at_start(tmp_path, database):
    url = _down_urls(tmp_path)[database]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")]),
        "DPSS_DATABASE_URL": url,
        "DPSS_DATA_DIR": str(tmp_path / "data"),
        "DPSS_AUDIT_ANCHOR": "",
        "DPSS_AUDIT_HMAC_KEY": "",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "service", "worker"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 90
        output = b""
        assert process.stdout is not None
        while b"retrying with backoff" not in output:
            assert process.poll() is None, output.decode()
            assert time.monotonic() < deadline, output.decode()
            output += process.stdout.readline()
        time.sleep(2)
        assert process.poll() is None, output.decode()  # still running, not exited
    finally:
        process.send_signal(signal.SIGTERM)
        rest = process.communicate(timeout=60)[0]
    assert b"Traceback" not in output + rest
    assert SECRET.encode() not in output + rest


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("nonsense", "ArgumentError"),
        (f"mysql://dpss:{SECRET}@127.0.0.1/dpss", "its driver is not installed (MySQLdb)"),
    ],
)
@pytest.mark.parametrize("command", ["api", "worker"])
def test_a_database_url_that_cannot_work_is_one_line_and_exit_2(tmp_path, url, reason, command):
    # Not an outage to wait out: the worker printed an uncaught ArgumentError or
    # ModuleNotFoundError (and, retrying nothing, exited 1), as did dpss api.
    args = [command] if command == "worker" else [command, "--port", str(_free_port())]
    result = _run(args, url, tmp_path)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output and SECRET not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: cannot open the database at ") and reason in line, line
