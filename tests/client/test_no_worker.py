"""A service started without a worker (``dpss api`` alone, or a worker that died): a release
stays unfinished, and before this a client's wait (``PrivatePCA.fit()``'s default has no
timeout) went on in silence, and a timed-out wait said "still running". ``/readyz`` now says
how many workers are alive, and a wait unfinished for ``NO_WORKER_CHECK_SECONDS`` asks it and
warns once, naming what starts a worker; a timed-out wait says why."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from dpss_client import client as client_module
from dpss_client import handles as handles_module
from dpss_client.client import Client, NoWorkerWarning, WaitTimeoutError
from service import operations
from service.db.models import utcnow
from tests.client.data import low_rank_rows

MakeKey = Callable[[str], str]


def _release(owner: Client, analyst: Client) -> client_module.ReleaseHandle:
    ds = owner.upload(
        low_rank_rows(200, 4, 2, seed=5), name="idle", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1.0,
    )  # fmt: skip
    return analyst.release(ds.id, "analyze_gauss", k=2, epsilon="0.5", delta="1e-6")


def test_a_wait_with_no_worker_says_why_and_what_starts_one(
    client: TestClient,
    owner: Client,
    analyst: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert client.get("/readyz").json() == {"status": "ok", "workers_alive": 0}
    assert analyst.workers_alive() == 0
    monkeypatch.setattr(handles_module, "NO_WORKER_CHECK_SECONDS", 0.0)
    handle = _release(owner, analyst)
    with (
        pytest.warns(NoWorkerWarning, match="reports no live worker") as warned,
        pytest.raises(WaitTimeoutError) as caught,
    ):
        handle.wait_finished(timeout=1.0, long_poll=0.2)
    ours = [str(w.message) for w in warned if issubclass(w.category, NoWorkerWarning)]
    assert len(ours) == 1  # said once, however many polls
    assert "`dpss worker`" in ours[0] and "`dpss serve`" in ours[0]
    assert "no live worker" in caught.value.detail


def test_a_live_worker_is_counted_and_no_warning_is_given(
    client: TestClient,
    owner: Client,
    analyst: Client,
    session_factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
    recwarn: pytest.WarningsRecorder,
) -> None:
    now = utcnow()
    with session_factory.begin() as session:
        operations.note_worker_alive(session, "alive-1", now)
        # One silent for longer than the lease: a worker that died without saying so.
        operations.note_worker_alive(session, "dead-1", now - timedelta(hours=2))
    assert client.get("/readyz").json() == {"status": "ok", "workers_alive": 1}
    monkeypatch.setattr(handles_module, "NO_WORKER_CHECK_SECONDS", 0.0)
    handle = _release(owner, analyst)
    with pytest.raises(WaitTimeoutError) as caught:
        handle.wait_finished(timeout=0.6, long_poll=0.2)
    assert "no live worker" not in caught.value.detail
    assert not [w for w in recwarn if issubclass(w.category, NoWorkerWarning)]


def test_private_pca_with_no_worker_states_its_whole_wait_and_why(
    client: TestClient,
    owner: Client,
    analyst: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``fit(timeout=T)`` timed out said "still running after <the handle's share of T> s"
    (44.9 s from timeout=70, live); now the fit's whole wait, its timeout and the reason."""
    from dpss_client import PrivatePCA

    ds = owner.upload(
        low_rank_rows(200, 4, 2, seed=6), name="idle-pca", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1.0,
    )  # fmt: skip
    monkeypatch.setattr(handles_module, "NO_WORKER_CHECK_SECONDS", 0.0)
    monkeypatch.setattr(handles_module, "LONG_POLL_SECONDS", 0.2)
    pca = PrivatePCA(analyst, ds.id, n_components=2, epsilon=0.5, timeout=1.5)
    with pytest.warns(NoWorkerWarning), pytest.raises(WaitTimeoutError) as caught:
        pca.fit()
    detail = caught.value.detail
    seconds = float(detail.split(" after ")[1].split(" s")[0])
    assert seconds >= 1.5, detail
    assert "(timeout=1.5)" in detail and "no live worker" in detail


def test_the_cli_says_no_worker_as_a_line_of_its_own(
    client: TestClient,
    owner: Client,
    make_key: MakeKey,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``dpss releases create --wait`` prints the reason as ``warning: ...`` while it waits
    (before: Python's warning format, with the command module's path, line and source line) and its
    timeout error names it too."""
    from typer.testing import CliRunner

    from dpss_client import cli_common
    from dpss_client.remote_cli import ExitCode
    from service.cli import app as dpss_app

    ds = owner.upload(
        low_rank_rows(200, 4, 2, seed=7), name="idle-cli", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1.0,
    )  # fmt: skip
    monkeypatch.setattr(handles_module, "NO_WORKER_CHECK_SECONDS", 0.0)
    monkeypatch.setattr(handles_module, "LONG_POLL_SECONDS", 0.2)
    monkeypatch.setattr(cli_common, "make_http_client", lambda url, timeout: client)
    result = CliRunner().invoke(
        dpss_app,
        [
            "releases", "create", str(ds.id), "--mechanism", "analyze_gauss", "--k", "2",
            "--epsilon", "0.5", "--wait", "--timeout", "1",
        ],
        env={"DPSS_URL": str(client.base_url), "DPSS_API_KEY": make_key("analyst")},
    )  # fmt: skip
    assert result.exit_code == ExitCode.TIMEOUT, result.output
    assert "warning: the service at" in result.stderr
    assert "reports no live worker" in result.stderr
    assert "NoWorkerWarning" not in result.stderr and "cli_releases.py" not in result.stderr
