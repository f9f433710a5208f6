"""No HTTP answer, told apart: a connection that could not be made, one that was made but whose
answer was too slow (the service is busy, not down: say so and how to allow longer), and one
lost before the answer. Real sockets, no service: a listening socket that never answers, one
that closes every connection at once, and a closed port."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import typer.main
from typer.testing import CliRunner

from dpss_client.client import (
    Client,
    ServiceTimeoutError,
    ServiceUnreachableError,
)
from dpss_client.remote_cli import ExitCode, make_app
from service.cli import app as dpss_app

#: Short enough to keep the tests quick; the silent socket never answers, whatever the wait.
SHORT = "0.3"
SOME_ID = "00000000-0000-0000-0000-000000000001"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def hanging_up_url() -> Iterator[str]:
    """A socket that accepts each connection, reads the request and closes without answering
    (what a client sees of a service restarted while it waited)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        sock.close()
        thread.join(5)


@pytest.fixture
def closed_url() -> str:
    """A port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_a_slow_answer_is_not_called_unreachable(silent_url: str) -> None:
    with (
        Client(silent_url, "k", timeout=float(SHORT)) as client,
        pytest.raises(ServiceTimeoutError) as caught,
    ):
        client.mechanisms()
    error = caught.value
    assert error.code == "read_timeout"
    assert "cannot reach" not in error.detail
    assert f"connected to {silent_url}" in error.detail
    assert "0.3 s" in error.detail and "slow or busy" in error.detail
    assert "timeout=" in error.detail  # how a Python caller allows longer
    # Still a ServiceUnreachableError for code that catches that (no answer came).
    assert isinstance(error, ServiceUnreachableError)


def test_a_refused_connection_is_unreachable(closed_url: str) -> None:
    with (
        Client(closed_url, "k", timeout=5) as client,
        pytest.raises(ServiceUnreachableError) as caught,
    ):
        client.mechanisms()
    assert not isinstance(caught.value, ServiceTimeoutError)
    assert caught.value.code == "unreachable"
    assert f"cannot reach {closed_url}" in caught.value.detail


def test_a_connection_lost_before_the_answer_says_so(hanging_up_url: str) -> None:
    with (
        Client(hanging_up_url, "k", timeout=5) as client,
        pytest.raises(ServiceUnreachableError) as caught,
    ):
        client.mechanisms()
    assert caught.value.code == "connection_lost"
    assert "cannot reach" not in caught.value.detail
    assert "restarted" in caught.value.detail


def _invocations(tmp_path: Path) -> dict[str, list[str]]:
    """One invocation of every remote command, each sending at least one request."""
    npy = tmp_path / "rows.npy"
    np.save(npy, np.eye(3))
    return {
        "budget": ["budget", SOME_ID],
        "mechanisms": ["mechanisms"],
        "audit list": ["audit", "list"],
        "datasets upload": [
            "datasets", "upload", str(npy), "--epsilon-budget", "1", "--delta-budget", "1e-5",
        ],
        "datasets register": [
            "datasets", "register", "s3://bucket/x.parquet", "--columns", "a,b",
            "--epsilon-budget", "1", "--delta-budget", "1e-5", "--name", "x",
        ],
        "datasets append": ["datasets", "append", SOME_ID, str(npy)],
        "datasets list": ["datasets", "list"],
        "datasets show": ["datasets", "show", SOME_ID],
        "datasets delete": ["datasets", "delete", SOME_ID, "--yes"],
        "grants create": ["grants", "create", SOME_ID],
        "grants list": ["grants", "list", SOME_ID],
        "grants revoke": ["grants", "revoke", SOME_ID, SOME_ID],
        "releases create": [
            "releases", "create", SOME_ID, "--mechanism", "analyze_gauss", "--k", "1",
            "--epsilon", "0.1", "--delta", "1e-7",
        ],
        "releases show": ["releases", "show", SOME_ID],
        "releases list": ["releases", "list"],
        "priors upload": ["priors", "upload", str(npy)],
        "priors list": ["priors", "list"],
    }  # fmt: skip


def _remote_commands() -> set[str]:
    found: set[str] = set()

    def walk(command: object, prefix: list[str]) -> None:
        children = getattr(command, "commands", None)
        if children is None:
            found.add(" ".join(prefix))
            return
        for name, sub in children.items():
            walk(sub, [*prefix, name])

    walk(typer.main.get_command(make_app()), [])
    return found


def test_every_remote_command_is_probed(tmp_path: Path) -> None:
    assert set(_invocations(tmp_path)) == _remote_commands()


@pytest.mark.parametrize("as_json", [False, True])
def test_every_command_tells_a_slow_service_from_an_absent_one(
    silent_url: str, tmp_path: Path, as_json: bool
) -> None:
    runner = CliRunner()
    for name, args in _invocations(tmp_path).items():
        extra = ["--json"] if as_json else []
        result = runner.invoke(
            dpss_app,
            [*args, *extra],
            env={"DPSS_URL": silent_url, "DPSS_API_KEY": "k", "DPSS_HTTP_TIMEOUT": SHORT},
        )
        assert result.exit_code == ExitCode.UNREACHABLE, (name, result.output)
        assert "cannot reach" not in result.output, name
        assert "read_timeout" in result.stderr and "slow or busy" in result.stderr, name
        # The command line's way to allow longer, not the Python keyword.
        assert "--http-timeout" in result.stderr and "timeout=" not in result.stderr, name
        assert "Traceback" not in result.output, name
        if as_json:
            assert '"error": "read_timeout"' in result.stdout, name


def test_http_timeout_before_the_command(silent_url: str) -> None:
    for application in (dpss_app, make_app()):
        result = CliRunner().invoke(
            application,
            ["--http-timeout", SHORT, "mechanisms", "--url", silent_url, "--api-key", "k"],
        )
        assert result.exit_code == ExitCode.UNREACHABLE, result.output
        assert "no answer within 0.3 s" in result.stderr


def test_a_bad_http_timeout_is_a_usage_error(silent_url: str) -> None:
    result = CliRunner().invoke(
        dpss_app,
        ["mechanisms", "--url", silent_url, "--api-key", "k"],
        env={"DPSS_HTTP_TIMEOUT": "soon"},
    )
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "DPSS_HTTP_TIMEOUT" in result.output


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_a_bad_http_timeout_option_names_the_option_and_what_it_takes(
    silent_url: str, value: str
) -> None:
    # nan was told "greater than or equal to 0.001"; inf passed the option and was then refused
    # as DPSS_HTTP_TIMEOUT, a variable the user never set.
    for application in (dpss_app, make_app()):
        result = CliRunner().invoke(
            application,
            ["--http-timeout", value, "mechanisms", "--url", silent_url, "--api-key", "k"],
            env={"COLUMNS": "200"},
        )
        assert result.exit_code == ExitCode.USAGE, result.output
        assert "'--http-timeout'" in result.output and "DPSS_HTTP_TIMEOUT" not in result.output
        assert "is not a positive, finite number of seconds" in result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize("value", ["nan", "-1", "-inf"])
def test_a_bad_wait_timeout_names_the_option_and_what_it_takes(silent_url: str, value: str) -> None:
    # nan was told "greater than or equal to 0", which it is not less than either.
    result = CliRunner().invoke(
        dpss_app,
        ["releases", "show", SOME_ID, "--wait", "--timeout", value, "--url", silent_url],
        env={"COLUMNS": "200", "DPSS_API_KEY": "k"},
    )
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "'--timeout'" in result.output
    assert "is not a number of seconds, 0 or more (inf: no limit)" in result.output


def test_the_command_line_says_when_the_connection_is_lost(hanging_up_url: str) -> None:
    result = CliRunner().invoke(dpss_app, ["mechanisms", "--url", hanging_up_url, "--api-key", "k"])
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    assert "[connection_lost]" in result.stderr and "cannot reach" not in result.stderr


def test_a_refused_connection_says_nothing_was_sent_and_what_to_check(closed_url: str) -> None:
    """A beginner whose service is not running is told so, and that nothing was charged: a
    refused connection sends no byte of the request. Before, the message was the bare socket
    error and ``PrivatePCA.fit`` added "the release may have been made and its cost charged"."""
    from dpss_client import PrivatePCA

    with Client(closed_url, "k", timeout=5) as client:
        with pytest.raises(ServiceUnreachableError) as caught:
            client.mechanisms()
        assert caught.value.sent is False
        assert "Nothing was sent" in caught.value.detail
        assert "dpss serve" in caught.value.detail
        pca = PrivatePCA(client, SOME_ID, n_components=2, epsilon=1)
        with pytest.raises(ServiceUnreachableError) as fitted:
            pca.fit()
    assert "charged" not in fitted.value.detail
    assert "Nothing was sent" in fitted.value.detail
    # Nothing to resume: the next fit makes a new request (a fresh Idempotency-Key).
    assert pca._unanswered is None


def test_a_lost_connection_may_have_been_charged(hanging_up_url: str) -> None:
    """The request reached the service: ``fit`` keeps saying it may have been charged and
    resumes with the same Idempotency-Key."""
    from dpss_client import PrivatePCA

    with Client(hanging_up_url, "k", timeout=5) as client:
        pca = PrivatePCA(client, SOME_ID, n_components=2, epsilon=1)
        with pytest.raises(ServiceUnreachableError) as fitted:
            pca.fit()
    assert fitted.value.sent is True
    assert "may have been made and its cost charged" in fitted.value.detail
    assert pca._unanswered is not None
