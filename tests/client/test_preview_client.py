"""Preview before spending from the client (`Client.preview_release`) and the CLI (`--dry-run`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from click.testing import Result
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from dpss_client import cli_common
from dpss_client.client import Client, InvalidRequestError
from dpss_client.remote_cli import ExitCode
from service.cli import app
from tests.client.data import low_rank_rows

MakeKey = Callable[[str], str]


@pytest.fixture
def clients(client: TestClient, make_key: MakeKey) -> tuple[Client, Client]:
    owner = Client(str(client.base_url), make_key("owner"), http=client)
    analyst = Client(str(client.base_url), make_key("analyst"), http=client)
    return owner, analyst


def test_preview_release_charges_nothing(clients: tuple[Client, Client]) -> None:
    owner, analyst = clients
    ds = owner.upload(
        low_rank_rows(300, 6, 2, seed=3),
        name="p",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    shown = analyst.preview_release(ds.id, "gap_perturbation", 2, "0.5", "1e-6")
    assert shown.dry_run and shown.affordable
    assert shown.params == {"clip_norm": 1.0}
    assert shown.scales["no_result_gap"] > 1.0
    assert any("no_result" in line for line in shown.meaning)
    # dominated: the preview says so and names the better mechanism (issue 16)
    assert [w.better_mechanism for w in shown.warnings] == ["analyze_gauss"]
    too_much = analyst.preview_release(ds.id, "analyze_gauss", 2, "5", "1e-6")
    assert not too_much.affordable and too_much.epsilon_remaining == Decimal(1)
    assert analyst.budget(ds.id).epsilon_spent == 0
    with pytest.raises(InvalidRequestError) as refused:
        analyst.preview_release(ds.id, "analyze_gauss", 2, "0.5", "1e-6", clip_norm=-1.0)
    assert "clip_norm" in str(refused.value)


@pytest.fixture
def dpss(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    monkeypatch.setattr(cli_common, "make_http_client", lambda url, timeout: client)
    runner = CliRunner()

    def run(*args: str, key: str) -> Result:
        env = {"DPSS_URL": str(client.base_url), "DPSS_API_KEY": key, "COLUMNS": "200"}
        return runner.invoke(app, list(args), env=env)

    return run


def test_cli_dry_run(
    dpss: Callable[..., Result], clients: tuple[Client, Client], make_key: MakeKey, tmp_path: Path
) -> None:
    owner, _ = clients
    analyst = make_key("analyst")
    ds = owner.upload(
        low_rank_rows(300, 6, 2, seed=4),
        name="q",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    args = ("releases", "create", str(ds.id), "--mechanism", "analyze_gauss", "--k", "2",
            "--epsilon", "0.5", "--delta", "1e-6", "--dry-run")  # fmt: skip
    table = dpss(*args, key=analyst)
    assert table.exit_code == ExitCode.OK, table.output
    assert "nothing charged" in table.stdout and "sigma" in table.stdout
    assert "Davis-Kahan" in table.stdout
    assert "warning:" not in table.stdout
    dominated = dpss(*[a if a != "analyze_gauss" else "gap_perturbation" for a in args],
                     key=analyst)  # fmt: skip
    assert dominated.exit_code == ExitCode.OK, dominated.output
    assert "warning: gap_perturbation is never more accurate" in dominated.stdout
    assert "Use analyze_gauss" in dominated.stdout
    as_json = dpss(*args, "--json", key=analyst)
    assert as_json.exit_code == ExitCode.OK, as_json.output
    body = json.loads(as_json.stdout)
    assert body["dry_run"] is True and body["affordable"] is True
    refused = dpss(*args, "--wait", key=analyst)
    assert refused.exit_code == ExitCode.USAGE
    invalid = dpss(*args, "--param", "clip_norm=-1", key=analyst)
    assert invalid.exit_code == ExitCode.REFUSED
    assert "clip_norm" in invalid.output
    assert owner.budget(ds.id).epsilon_spent == 0


def test_the_client_and_the_cli_show_the_recommended_accounting(
    dpss: Callable[..., Result], clients: tuple[Client, Client], make_key: MakeKey, tmp_path: Path
) -> None:
    """Issue 31, item 5: the upload's answer recommends for the planned mechanisms, and a dry
    run names the accounting that fits when it is not the dataset's."""
    owner, _ = clients
    ds = owner.upload(
        low_rank_rows(300, 6, 2, seed=5),
        name="r",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
        accounting="basic",
        planned_mechanisms=["analyze_gauss", "spectrum"],
    )
    assert getattr(ds, "recommended_accounting", None) == "gaussian"
    analyst = make_key("analyst")
    args = ("releases", "create", str(ds.id), "--mechanism", "analyze_gauss", "--k", "2",
            "--epsilon", "0.5", "--delta", "1e-6", "--dry-run")  # fmt: skip
    table = dpss(*args, key=analyst)
    assert table.exit_code == ExitCode.OK, table.output
    assert "recommended_accounting" in table.stdout
    assert "- recommended accounting hybrid: analyze_gauss is purely Gaussian" in table.stdout
    path = tmp_path / "rows.npy"
    np.save(path, low_rank_rows(300, 6, 2, seed=6))
    uploaded = dpss("datasets", "upload", str(path), "--epsilon-budget", "1",
                    "--delta-budget", "1e-5", "--accounting", "zcdp",
                    "--planned-mechanisms", "analyze_gauss,exact_gapmax",
                    key=make_key("owner"))  # fmt: skip
    assert uploaded.exit_code == ExitCode.OK, uploaded.output
    assert "recommended_accounting" in uploaded.stdout and "zcdp" in uploaded.stdout
    unknown = dpss("datasets", "upload", str(path), "--epsilon-budget", "1",
                   "--delta-budget", "1e-5", "--planned-mechanisms", "pca",
                   key=make_key("owner"))  # fmt: skip
    assert unknown.exit_code == ExitCode.REFUSED, unknown.output
    # Named as the command's option (dpss_client.spelling), not the form field.
    assert "--planned-mechanisms: unknown mechanism 'pca'" in unknown.output


def test_a_dry_run_shows_a_null_scale_as_null_not_as_a_blank(
    dpss: Callable[..., Result], clients: tuple[Client, Client], make_key: MakeKey
) -> None:
    # An audit: analyze_gauss's forecast_captured_share is null without an earlier release to
    # forecast from, and the table printed it as an empty cell, unlike the release table (and
    # the JSON, and the sentence that says "forecast_captured_share is null").
    owner, _ = clients
    analyst = make_key("analyst")
    ds = owner.upload(
        low_rank_rows(300, 6, 2, seed=5),
        name="nulls",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )
    table = dpss("releases", "create", str(ds.id), "--mechanism", "analyze_gauss", "--k", "2",
                 "--epsilon", "0.5", "--dry-run", key=analyst)  # fmt: skip
    assert table.exit_code == ExitCode.OK, table.output
    row = next(line for line in table.stdout.splitlines() if "forecast_captured_share " in line)
    assert "null" in row, table.stdout


def test_the_cli_dry_run_shows_epsilon_remaining_pure_where_it_differs(
    dpss: Callable[..., Result], clients: tuple[Client, Client], make_key: MakeKey
) -> None:
    # On hybrid (the default) a fresh (1, 1e-5) budget admits a Gaussian release at 0.9973
    # and a pure one at 1: `dpss budget` shows both, and the dry run showed only the first.
    owner, analyst = clients
    ds = owner.upload(
        low_rank_rows(300, 6, 2, seed=5), name="pure", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1.0, accounting="hybrid",
    )  # fmt: skip
    shown = analyst.preview_release(ds.id, k=2, epsilon="0.5")
    assert shown.epsilon_remaining_pure == Decimal(1) != shown.epsilon_remaining
    table = dpss("releases", "create", str(ds.id), "--k", "2", "--epsilon", "0.5",
                 "--dry-run", key=make_key("analyst"))  # fmt: skip
    assert table.exit_code == ExitCode.OK, table.output
    (row,) = [line for line in table.stdout.splitlines() if "epsilon_remaining_pure" in line]
    assert row.split("│")[2].strip() == "1", row
    basic = owner.upload(
        low_rank_rows(300, 6, 2, seed=6), name="basic", epsilon_budget="1",
        delta_budget="1e-5", row_norm_bound=1.0, accounting="basic",
    )  # fmt: skip
    # basic: it is epsilon_remaining itself, so the table does not repeat it.
    plain = dpss("releases", "create", str(basic.id), "--k", "2", "--epsilon", "0.5",
                 "--dry-run", key=make_key("analyst"))  # fmt: skip
    assert plain.exit_code == ExitCode.OK, plain.output
    assert "epsilon_remaining_pure" not in plain.stdout
