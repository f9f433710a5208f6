"""A service restarted while a client waits for a release: the release lives in the database, so
the wait asks again (``ReleaseHandle.wait_finished``, ``--wait``, ``PrivatePCA.fit``) instead of
ending at the first refused connection; when it does give up, it says the release goes on and
how to wait for it again. The restart is a transport that refuses the next reads of the release
(``httpx.ConnectError``, what a stopped service gives), in front of the real app."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from dpss_client import cli_common
from dpss_client.client import Client, ServiceUnreachableError
from dpss_client.remote_cli import ExitCode
from service.cli import app as dpss_app
from tests.client.data import low_rank_rows

MakeKey = Callable[[str], str]


class Restarting:
    """The app behind a transport that refuses ``refusals`` reads of a release once armed."""

    def __init__(self, http: TestClient, refusals: int) -> None:
        self._http = http
        self.timeout = http.timeout
        self.refusals = refusals
        self.refused = 0

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        if method == "GET" and "/v1/releases/" in url and self.refused < self.refusals:
            self.refused += 1
            raise httpx.ConnectError("[Errno 111] Connection refused")
        return self._http.request(method, url, **kwargs)

    def close(self) -> None:
        pass


def _dataset(owner: Client) -> str:
    ds = owner.upload(
        low_rank_rows(400, 5, 2, seed=4), name="restart", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1.0,
    )  # fmt: skip
    return str(ds.id)


def _analyst(client: TestClient, key: str, refusals: int) -> tuple[Client, Restarting]:
    flaky = Restarting(client, refusals)
    return Client(str(client.base_url), key, http=flaky), flaky  # type: ignore[arg-type]


def test_a_wait_outlives_a_restart(
    client: TestClient, owner: Client, make_key: MakeKey, worker_sleep: None
) -> None:
    analyst, flaky = _analyst(client, make_key("analyst"), refusals=3)
    handle = analyst.release(_dataset(owner), "analyze_gauss", k=2, epsilon="0.5", delta="1e-6")
    basis = handle.wait()
    assert flaky.refused == 3
    assert basis.shape == (5, 2) and handle.status == "succeeded"


def test_a_wait_that_gives_up_says_the_release_goes_on(
    client: TestClient, owner: Client, make_key: MakeKey, worker_sleep: None
) -> None:
    analyst, _ = _analyst(client, make_key("analyst"), refusals=1000)
    handle = analyst.release(_dataset(owner), "analyze_gauss", k=2, epsilon="0.5", delta="1e-6")
    with pytest.raises(ServiceUnreachableError) as caught:
        handle.wait_finished(reconnect=0)
    assert caught.value.code == "unreachable"
    assert f"release {handle.id} goes on in the service" in caught.value.detail
    assert f"dpss releases show {handle.id} --wait" in caught.value.detail


def test_releases_create_wait_outlives_a_restart(
    client: TestClient,
    owner: Client,
    make_key: MakeKey,
    worker_sleep: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    flaky = Restarting(client, refusals=3)
    monkeypatch.setattr(cli_common, "make_http_client", lambda url, timeout: flaky)
    out = tmp_path / "basis.npy"
    result = CliRunner().invoke(
        dpss_app,
        [
            "releases",
            "create",
            _dataset(owner),
            "--mechanism",
            "analyze_gauss",
            "--k",
            "2",
            "--epsilon",
            "0.5",
            "--delta",
            "1e-6",
            "--out",
            str(out),
        ],
        env={"DPSS_URL": str(client.base_url), "DPSS_API_KEY": make_key("analyst")},
    )
    assert result.exit_code == ExitCode.OK, result.output
    assert flaky.refused == 3
    assert np.load(out).shape == (5, 2)
