"""Release history and key commands: ``Client.list_releases``, ``dpss releases list`` against
the live app, ``dpss keys list|revoke`` on the local database, and the one-line message of the
local-database commands when the database cannot be opened."""

from __future__ import annotations

import functools
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import Result
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from dpss_client import cli_common, cli_datasets
from dpss_client.client import Client
from dpss_client.remote_cli import ExitCode
from service.app import create_app
from service.cli import app
from tests.client.data import low_rank_rows

MakeKey = Callable[[str], str]
GAUSS: dict[str, Any] = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.05", "delta": "1e-8"}
SPECTRUM: dict[str, Any] = {"mechanism": "spectrum", "k": 2, "epsilon": "0.05", "delta": "1e-8"}


@pytest.fixture
def dpss(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    monkeypatch.setattr(cli_common, "make_http_client", lambda url, timeout: client)
    runner = CliRunner()

    def run(*args: str, key: str | None) -> Result:
        env = {"DPSS_URL": str(client.base_url), "DPSS_API_KEY": key, "COLUMNS": "200"}
        return runner.invoke(app, list(args), env=env)

    return run


@pytest.fixture
def history(client: TestClient, make_key: MakeKey) -> dict[str, Any]:
    """An owner's two datasets and an analyst's five releases of them (three of the first)."""
    owner, analyst = make_key("owner"), make_key("analyst")
    uploader = Client(str(client.base_url), owner, http=client)
    rows = low_rank_rows(80, 4, 2, seed=3)
    first = uploader.upload(
        rows, name="first", epsilon_budget=5, delta_budget="1e-5", row_norm_bound=10.0
    )
    second = uploader.upload(
        rows, name="second", epsilon_budget=5, delta_budget="1e-5", row_norm_bound=10.0
    )
    requester = Client(str(client.base_url), analyst, http=client)
    made = [requester.release(first.id, **GAUSS).id for _ in range(3)]
    made += [requester.release(second.id, **SPECTRUM).id for _ in range(2)]
    return {"owner": owner, "analyst": analyst, "first": first.id, "second": second.id,
            "made": made, "client": requester}  # fmt: skip


def test_client_list_releases_follows_every_page(history: dict[str, Any]) -> None:
    client: Client = history["client"]
    listed = [release.id for release in client.list_releases(page_size=2)]
    assert listed == history["made"][::-1]
    assert [r.id for r in client.list_releases(dataset_id=history["first"], page_size=1)] == (
        history["made"][:3][::-1]
    )
    assert {r.mechanism for r in client.list_releases(mechanism="spectrum")} == {"spectrum"}
    assert list(client.list_releases(status="failed")) == []
    later = datetime.now(UTC) + timedelta(hours=1)
    assert list(client.list_releases(created_after=later)) == []
    assert len(list(client.list_releases(created_before=later))) == 5
    page = client.releases_page(limit=2)
    assert page.total == 5 and len(page.items) == 2 and page.next is not None
    with pytest.raises(ValueError, match="timezone"):
        client.releases_page(created_after=datetime(2030, 1, 1))


def test_dpss_releases_list(dpss: Callable[..., Result], history: dict[str, Any]) -> None:
    analyst, owner = history["analyst"], history["owner"]
    table = dpss("releases", "list", key=analyst)
    assert table.exit_code == ExitCode.OK, table.output
    assert "5 of 5 release(s)" in table.stdout
    assert all(str(release_id) in table.stdout for release_id in history["made"])

    filtered = dpss("releases", "list", "--dataset", str(history["second"]), "--json", key=owner)
    assert filtered.exit_code == ExitCode.OK, filtered.output
    body = json.loads(filtered.stdout)
    assert body["total"] == 2 and {item["mechanism"] for item in body["items"]} == {"spectrum"}

    first = json.loads(dpss("releases", "list", "--limit", "3", "--json", key=analyst).stdout)
    assert first["total"] == 5 and len(first["items"]) == 3 and first["next"]
    rest = dpss("releases", "list", "--cursor", first["next"], "--limit", "3", key=analyst)
    assert rest.exit_code == ExitCode.OK and "2 of 5 release(s)" in rest.stdout
    paged = dpss("releases", "list", "--limit", "3", key=analyst)
    assert f"more: --cursor {first['next']}" in paged.stdout

    for args in (
        ("--mechanism", "spectrum"),
        ("--status", "queued"),
        ("--since", "2000-01-01"),
        ("--until", (datetime.now(UTC) + timedelta(days=1)).isoformat()),
    ):
        result = dpss("releases", "list", *args, "--json", key=analyst)
        assert result.exit_code == ExitCode.OK, (args, result.output)
        expected = 2 if args[0] == "--mechanism" else 5
        assert json.loads(result.stdout)["total"] == expected, args
    assert json.loads(dpss("releases", "list", "--until", "2000-01-01", "--json", key=analyst)
                      .stdout)["total"] == 0  # fmt: skip

    assert dpss("releases", "list", "--status", "done", key=analyst).exit_code == ExitCode.USAGE
    assert dpss("releases", "list", "--since", "soon", key=analyst).exit_code == ExitCode.USAGE
    bad = dpss("releases", "list", "--cursor", "bm9wZQ", key=analyst)
    assert bad.exit_code == ExitCode.REFUSED and "cursor" in bad.stderr
    assert dpss("releases", "list", key=history["owner"] + "x").exit_code == ExitCode.REFUSED


def _local_in(database_url: str, *args: str, data_dir: Path) -> Result:
    # A wide terminal whatever the one running the tests (the tables fold cells to fit it; how
    # they fold is tests/client/test_remote_cli.py's). The data directory is the test's own: a
    # revocation anchors the audit head there (with only the database URL set it went to
    # ./dpss-data of whoever ran the suite, the README's own service among them).
    env = {"DPSS_DATABASE_URL": database_url, "DPSS_DATA_DIR": str(data_dir), "COLUMNS": "200"}
    return CliRunner().invoke(app, list(args), env=env)


@pytest.fixture
def committed_client(settings: Any, committed_db: Any) -> Iterator[tuple[str, TestClient]]:
    """The app on a database whose commits are real, so the CLI's own connection sees them."""
    url, factory = committed_db
    with TestClient(create_app(settings, session_factory=factory)) as test_client:
        yield url, test_client


def test_dpss_keys_list_and_revoke_on_the_local_database(
    committed_client: tuple[str, TestClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, client = committed_client
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data"
    _local = functools.partial(_local_in, data_dir=data)
    created = _local(url, "keys", "create", "--role", "owner", "--name", "team-a")
    assert created.exit_code == 0, created.output
    key_id = created.stdout.split()[1]
    secret = created.stdout.split()[-1]
    assert client.get("/v1/datasets", headers={"Authorization": f"Bearer {secret}"}).is_success

    listed = json.loads(_local(url, "keys", "list", "--json").stdout)["items"]
    [mine] = [key for key in listed if key["id"] == key_id]
    assert (mine["role"], mine["name"], mine["revoked_at"]) == ("owner", "team-a", None)
    assert secret not in _local(url, "keys", "list").stdout
    assert key_id in _local(url, "keys", "list").stdout

    revoked = _local(url, "keys", "revoke", key_id)
    assert revoked.exit_code == 0 and key_id in revoked.stdout
    # Revoked outside this API process: its reads may reuse their key check for
    # DPSS_AUTH_CACHE_SECONDS (documented); forgetting it stands for that time passing.
    client.app.state.database.verified_keys.clear()
    assert (
        client.get("/v1/datasets", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    )
    listed = json.loads(_local(url, "keys", "list", "--json").stdout)["items"]
    assert [key["revoked_at"] for key in listed if key["id"] == key_id] != [None]
    assert _local(url, "keys", "revoke", key_id).exit_code == 0  # idempotent
    missing = _local(url, "keys", "revoke", "00000000-0000-0000-0000-000000000000")
    assert missing.exit_code == 3 and "no API key" in missing.stderr
    assert _local(url, "keys", "revoke", "not-an-id").exit_code == 2
    # What the commands wrote is beside the data directory they were given (the anchors live
    # in its state directory, which a backup of the data directory does not carry), nothing in
    # the cwd.
    assert (tmp_path / "data-state" / "audit-anchors.jsonl").is_file()
    assert {path.name for path in tmp_path.iterdir()} <= {"data", "data-state"}


@pytest.mark.parametrize(
    "args",
    [
        ("keys", "create", "--role", "admin"),
        ("keys", "list"),
        ("keys", "revoke", "00000000-0000-0000-0000-000000000000"),
        ("audit", "verify"),
    ],
)
def test_local_database_commands_say_where_they_looked_in_one_line(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    url = f"sqlite:///{tmp_path / 'nowhere' / 'dpss.sqlite3'}"
    result = _local_in(url, *args, data_dir=tmp_path / "data")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert str(tmp_path / "nowhere" / "dpss.sqlite3") in lines[0]
    assert "DPSS_DATABASE_URL" in lines[0] or args[0] == "audit"
    assert not (tmp_path / "nowhere").exists()


def test_migrate_says_where_it_looked_when_the_database_is_unreachable(tmp_path: Path) -> None:
    result = _local_in(
        "postgresql+psycopg://nobody@127.0.0.1:1/none", "migrate", data_dir=tmp_path / "data"
    )
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert "postgresql+psycopg://nobody@127.0.0.1:1/none" in line and "DPSS_DATABASE_URL" in line


def test_every_list_command_prints_items_total_and_next(
    dpss: Callable[..., Result], history: dict[str, Any], make_key: MakeKey
) -> None:
    datasets = json.loads(dpss("datasets", "list", "--json", key=history["owner"]).stdout)
    assert datasets["total"] == len(datasets["items"]) == 2 and datasets["next"] is None
    auditor = make_key("auditor")
    page = json.loads(dpss("audit", "list", "--limit", "2", "--json", key=auditor).stdout)
    assert len(page["items"]) == 2 and page["next"] and page["next_after"] == 2
    everything = json.loads(dpss("audit", "list", "--json", key=auditor).stdout)
    assert everything["total"] == page["total"] == len(everything["items"]) > 2
    after = json.loads(dpss("audit", "list", "--after", "2", "--json", key=auditor).stdout)
    assert after["total"] == page["total"] and len(after["items"]) == page["total"] - 2


def test_upload_reports_bytes_sent_up_to_the_file_size(
    client: TestClient, make_key: MakeKey, tmp_path: Path
) -> None:
    owner = Client(str(client.base_url), make_key("owner"), http=client)
    rows = low_rank_rows(3000, 6, 2, seed=5)
    path = tmp_path / "rows.csv"
    path.write_text("\n".join(",".join(f"{v:.17g}" for v in row) for row in rows))
    for data in (path, rows):
        calls: list[tuple[int, int]] = []
        ds = owner.upload(
            data,
            name="rows",
            epsilon_budget=1,
            delta_budget="1e-6",
            progress=lambda sent, total, calls=calls: calls.append((sent, total)),
        )
        assert ds.n_rows == 3000
        size = path.stat().st_size if isinstance(data, Path) else 128 + rows.nbytes
        assert calls and calls[-1] == (size, size), (calls[-3:], size)
        assert all(a[0] <= b[0] for a, b in itertools.pairwise(calls))


def test_dpss_upload_shows_progress_on_a_terminal_only(
    dpss: Callable[..., Result], make_key: MakeKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rows.npy"
    np.save(path, low_rank_rows(500, 4, 2, seed=6))
    owner = make_key("owner")
    args = ("datasets", "upload", str(path), "--epsilon-budget", "1", "--delta-budget", "1e-6")
    piped = dpss(*args, key=owner)
    assert piped.exit_code == 0 and "uploading" not in piped.stderr
    monkeypatch.setattr(  # where the upload's progress bar looks its console up
        cli_datasets,
        "_stderr",
        lambda: cli_common.Console(file=sys.stderr, force_terminal=True, width=120),
    )
    shown = dpss(*args, key=owner)
    assert shown.exit_code == 0, shown.output
    assert "uploading" in shown.stderr
