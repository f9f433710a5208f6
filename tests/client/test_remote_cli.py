"""The remote ``dpss`` commands against the real ASGI app, through typer's CliRunner."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import Result
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from dpss_client import cli_common, remote_cli
from dpss_client.remote_cli import ExitCode
from service.cli import app
from tests.client.conftest import Refusable
from tests.client.data import isotropic_rows, low_rank_rows

MakeKey = Callable[[str], str]
Dpss = Callable[..., Result]


@pytest.fixture
def dpss(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Dpss:
    """Run ``dpss ARGS`` with the given key, talking to the in-process app."""
    monkeypatch.setattr(cli_common, "make_http_client", lambda url, timeout: client)
    runner = CliRunner()

    def run(*args: str, key: str | None, columns: int = 200) -> Result:
        # A fixed wide terminal: pytest-xdist workers inherit COLUMNS=80 otherwise.
        env = {"DPSS_URL": str(client.base_url), "DPSS_API_KEY": key, "COLUMNS": str(columns)}
        return runner.invoke(app, list(args), env=env)

    return run


UUID_PATTERN = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def _json(result: Result) -> Any:
    assert result.stdout, result.output
    return json.loads(result.stdout)


def _upload(dpss: Dpss, key: str, path: Path, *extra: str) -> dict[str, Any]:
    result = dpss(
        "datasets", "upload", str(path), "--epsilon-budget", "1", "--delta-budget", "1e-5",
        "--row-norm-bound", "1", "--json", *extra, key=key,
    )  # fmt: skip
    assert result.exit_code == ExitCode.OK, result.output
    return _json(result)  # type: ignore[no-any-return]


def test_upload_list_show_budget(dpss: Dpss, make_key: MakeKey, tmp_path: Path) -> None:
    owner, analyst = make_key("owner"), make_key("analyst")
    path = tmp_path / "cohort.csv"
    np.savetxt(path, low_rank_rows(150, 5, 2, seed=20), delimiter=",", fmt="%.17g")
    ds = _upload(dpss, owner, path, "--name", "cohort-2024")
    assert (ds["name"], ds["n_rows"], ds["n_cols"]) == ("cohort-2024", 150, 5)

    listed = dpss("datasets", "list", "--json", key=analyst)
    assert listed.exit_code == 0, listed.output
    assert ds["id"] in {item["id"] for item in _json(listed)["items"]}

    table = dpss("datasets", "list", key=analyst)
    assert table.exit_code == 0 and ds["id"] in table.stdout and "cohort-2024" in table.stdout

    shown = dpss("datasets", "show", ds["id"], key=analyst)
    assert shown.exit_code == 0 and "150 x 5" in shown.stdout

    budget = dpss("budget", ds["id"], "--json", key=analyst)
    assert budget.exit_code == 0
    assert Decimal(_json(budget)["epsilon_remaining"]) == Decimal(1)
    human = dpss("budget", ds["id"], key=analyst)
    assert human.exit_code == 0 and "epsilon" in human.stdout and "0.00001" in human.stdout


def test_create_wait_out_writes_the_basis(
    dpss: Dpss, make_key: MakeKey, tmp_path: Path, worker_sleep: None
) -> None:
    owner, analyst = make_key("owner"), make_key("analyst")
    np.save(tmp_path / "x.npy", low_rank_rows(1000, 6, 2, seed=21))
    ds = _upload(dpss, owner, tmp_path / "x.npy")
    out = tmp_path / "basis.npy"
    result = dpss(
        "releases", "create", ds["id"], "--mechanism", "analyze_gauss", "--k", "2",
        "--epsilon", "0.5", "--delta", "1e-6", "--param", "clip_norm=1.0",
        "--wait", "--out", str(out), key=analyst,
    )  # fmt: skip
    assert result.exit_code == ExitCode.OK, result.output
    assert "succeeded" in result.stdout
    assert f"written to {out}" in result.stderr
    basis = np.load(out)
    assert basis.shape == (6, 2)
    np.testing.assert_allclose(basis.T @ basis, np.eye(2), atol=1e-8)

    budget = _json(dpss("budget", ds["id"], "--json", key=analyst))
    assert Decimal(budget["epsilon_spent"]) == Decimal("0.5")


def test_create_then_show_json(
    dpss: Dpss, make_key: MakeKey, tmp_path: Path, run_worker: Callable[[], int]
) -> None:
    owner, analyst = make_key("owner"), make_key("analyst")
    np.save(tmp_path / "x.npy", low_rank_rows(400, 5, 1, seed=22))
    ds = _upload(dpss, owner, tmp_path / "x.npy")
    created = dpss(
        "releases", "create", ds["id"], "--mechanism", "analyze_gauss", "--k", "1",
        "--epsilon", "0.5", "--delta", "1e-6", "--json", key=analyst,
    )  # fmt: skip
    assert created.exit_code == ExitCode.OK, created.output
    release = _json(created)
    assert release["status"] == "queued"
    assert (release["epsilon"], release["params"]["clip_norm"]) == ("0.5", 1.0)

    queued = dpss("releases", "show", release["id"], key=analyst)
    assert queued.exit_code == 0 and "queued" in queued.stdout

    run_worker()
    out = tmp_path / "later.npy"
    shown = dpss("releases", "show", release["id"], "--json", "--out", str(out), key=analyst)
    assert shown.exit_code == ExitCode.OK, shown.output
    assert _json(shown)["status"] == "succeeded"
    assert np.load(out).shape == (5, 1)


def test_exit_codes(dpss: Dpss, make_key: MakeKey, tmp_path: Path) -> None:
    owner, analyst = make_key("owner"), make_key("analyst")
    np.save(tmp_path / "x.npy", low_rank_rows(100, 4, 1, seed=23))
    ds = _upload(dpss, owner, tmp_path / "x.npy")

    too_much = dpss(
        "releases", "create", ds["id"], "--mechanism", "analyze_gauss", "--k", "1",
        "--epsilon", "2", "--delta", "1e-6", "--json", key=analyst,
    )  # fmt: skip
    assert too_much.exit_code == ExitCode.REFUSED
    body = _json(too_much)
    assert body["error"] == "budget_exceeded"
    assert Decimal(body["epsilon_remaining"]) == 1
    assert "budget_exceeded" in too_much.stderr

    invalid = dpss(
        "releases", "create", ds["id"], "--mechanism", "analyze_gauss", "--k", "9",
        "--epsilon", "0.5", "--delta", "1e-6", key=analyst,
    )  # fmt: skip
    assert invalid.exit_code == ExitCode.REFUSED, invalid.output

    assert dpss("budget", ds["id"], key="wrong-key").exit_code == ExitCode.REFUSED
    missing = dpss("budget", "00000000-0000-0000-0000-000000000000", key=analyst)
    assert missing.exit_code == ExitCode.REFUSED
    assert "not_found" in missing.stderr

    assert dpss("budget", ds["id"], key=None).exit_code == ExitCode.USAGE
    bad_param = dpss(
        "releases", "create", ds["id"], "--mechanism", "analyze_gauss", "--k", "1",
        "--epsilon", "0.5", "--delta", "1e-6", "--param", "novalue", key=analyst,
    )  # fmt: skip
    assert bad_param.exit_code == ExitCode.USAGE
    # Nothing above was charged.
    assert Decimal(_json(dpss("budget", ds["id"], "--json", key=analyst))["epsilon_spent"]) == 0


def test_unreachable_service(monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(
        app, ["mechanisms", "--url", "http://127.0.0.1:9", "--api-key", "k"]
    )
    assert result.exit_code == ExitCode.UNREACHABLE
    assert "cannot reach" in result.stderr


def test_no_result_exit_code(
    dpss: Dpss, make_key: MakeKey, tmp_path: Path, worker_sleep: None
) -> None:
    owner, analyst = make_key("owner"), make_key("analyst")
    names = {m["name"] for m in _json(dpss("mechanisms", "--json", key=analyst))["items"]}
    if "gap_perturbation" not in names:
        pytest.skip("gap_perturbation is not registered yet: no mechanism to force no_result")
    np.save(tmp_path / "iso.npy", isotropic_rows(500, 6, seed=24))
    ds = _upload(dpss, owner, tmp_path / "iso.npy")
    out = tmp_path / "none.npy"
    result = dpss(
        "releases", "create", ds["id"], "--mechanism", "gap_perturbation", "--k", "2",
        "--epsilon", "0.5", "--delta", "1e-6", "--out", str(out), "--json", key=analyst,
    )  # fmt: skip
    assert result.exit_code == ExitCode.NO_RESULT, result.output
    assert _json(result)["status"] == "no_result"
    assert not out.exists()


def test_mechanisms_and_audit_list(dpss: Dpss, make_key: MakeKey, tmp_path: Path) -> None:
    analyst, auditor = make_key("analyst"), make_key("auditor")
    table = dpss("mechanisms", key=analyst)
    assert table.exit_code == 0 and "analyze_gauss" in table.stdout
    listed = _json(dpss("mechanisms", "--json", key=analyst))
    assert any(m["name"] == "analyze_gauss" for m in listed["items"])

    np.save(tmp_path / "x.npy", low_rank_rows(50, 3, 1, seed=25))
    _upload(dpss, make_key("owner"), tmp_path / "x.npy")
    events = dpss("audit", "list", "--json", key=auditor)
    assert events.exit_code == 0, events.output
    assert "dataset_created" in {e["event_type"] for e in _json(events)["items"]}
    page = _json(dpss("audit", "list", "--limit", "1", "--json", key=auditor))
    assert len(page["items"]) == 1
    human = dpss("audit", "list", key=auditor)
    assert human.exit_code == 0 and "dataset_created" in human.stdout
    assert dpss("audit", "list", key=analyst).exit_code == ExitCode.REFUSED


def test_failed_exit_code(
    dpss: Dpss, make_key: MakeKey, tmp_path: Path, run_worker: Callable[[], int]
) -> None:
    owner, analyst = make_key("owner"), make_key("analyst")
    np.save(tmp_path / "x.npy", low_rank_rows(100, 4, 1, seed=26))
    ds = _upload(dpss, owner, tmp_path / "x.npy")
    created = dpss(
        "releases", "create", ds["id"], "--mechanism", "analyze_gauss", "--k", "1",
        "--epsilon", "0.5", "--delta", "1e-6", "--json", key=analyst,
    )  # fmt: skip
    release_id = _json(created)["id"]
    # Without --yes it asks; no answer (EOF) aborts and deletes nothing.
    assert dpss("datasets", "delete", ds["id"], key=owner).exit_code != ExitCode.OK
    assert dpss("datasets", "show", ds["id"], key=owner).exit_code == ExitCode.OK
    deleted = dpss("datasets", "delete", ds["id"], "--yes", key=owner)
    assert deleted.exit_code == ExitCode.OK, deleted.output
    run_worker()
    shown = dpss("releases", "show", release_id, "--wait", key=analyst)
    assert shown.exit_code == ExitCode.FAILED, shown.output
    assert "failed" in shown.stdout and "refunded" in shown.stdout


def test_out_for_a_mechanism_without_basis_is_refused_before_charging(
    dpss: Dpss, refusable: Callable[..., Refusable], tmp_path: Path
) -> None:
    world = refusable(low_rank_rows(100, 4, 1, seed=27))
    analyst, ds_id = world.analyst_key, world.dataset_id
    names = {m["name"]: m for m in _json(dpss("mechanisms", "--json", key=analyst))["items"]}
    no_basis = [name for name, m in names.items() if not m["releases_basis"]]
    if not no_basis:
        pytest.skip("no registered mechanism releases without a basis (e.g. spectrum)")
    result = dpss(
        "releases", "create", ds_id, "--mechanism", no_basis[0], "--k", "2",
        "--epsilon", "0.5", "--delta", "1e-6", "--out", str(tmp_path / "b.npy"), key=analyst,
    )  # fmt: skip
    assert result.exit_code == ExitCode.USAGE, result.output
    assert Decimal(_json(dpss("budget", ds_id, "--json", key=analyst))["epsilon_spent"]) == 0


def test_out_in_a_missing_directory_is_refused_before_charging(
    dpss: Dpss, refusable: Callable[..., Refusable], tmp_path: Path, worker_sleep: None
) -> None:
    # A new user's typo in --out used to be found after the release was paid for, as a
    # traceback (FileNotFoundError) with exit 1.
    world = refusable(low_rank_rows(100, 4, 1, seed=27))
    analyst, ds_id = world.analyst_key, world.dataset_id
    for command in (
        [
            "releases",
            "create",
            ds_id,
            "--mechanism",
            "analyze_gauss",
            "--k",
            "2",
            "--epsilon",
            "0.5",
            "--delta",
            "1e-6",
        ],
        ["releases", "show", "00000000-0000-0000-0000-000000000000"],
    ):
        result = dpss(*command, "--out", str(tmp_path / "no-such-dir" / "b.npy"), key=analyst)
        assert result.exit_code == ExitCode.USAGE, result.output
        assert "no-such-dir" in result.output and "does not exist" in result.output
        assert "Traceback" not in result.output
    assert Decimal(_json(dpss("budget", ds_id, "--json", key=analyst))["epsilon_spent"]) == 0


def test_a_timeout_with_json_prints_one_document_naming_the_release(
    dpss: Dpss, make_key: MakeKey, tmp_path: Path
) -> None:
    # docs/cli.md: with --json stdout carries exactly one JSON document, also for errors. A
    # --wait --timeout used to print the release and then the error: two documents, no jq.
    owner, analyst = make_key("owner"), make_key("analyst")
    np.save(tmp_path / "x.npy", low_rank_rows(100, 4, 1, seed=27))
    ds = _upload(dpss, owner, tmp_path / "x.npy")
    result = dpss(
        "releases", "create", ds["id"], "--mechanism", "analyze_gauss", "--k", "2",
        "--epsilon", "0.5", "--delta", "1e-6", "--wait", "--timeout", "0.01", "--json",
        key=analyst,
    )  # fmt: skip
    assert result.exit_code == ExitCode.TIMEOUT, result.output
    body = _json(result)
    assert body["error"] == "timeout" and body["release"]["status"] in ("queued", "running")
    release_id = body["release"]["id"]
    assert f"dpss releases show {release_id} --wait" in body["detail"]
    shown = dpss("releases", "show", release_id, "--wait", "--timeout", "0.01", key=analyst)
    assert shown.exit_code == ExitCode.TIMEOUT
    assert f"dpss releases show {release_id} --wait" in shown.stderr


@pytest.mark.parametrize("columns", [50, 130])
def test_tables_fold_on_a_narrow_terminal_and_write_budgets_as_the_json_does(
    dpss: Dpss, make_key: MakeKey, tmp_path: Path, worker_sleep: None, columns: int
) -> None:
    """No cell is cut short ("..."), whatever the width, and a delta is "0.0000001" in every
    table as in the JSON, never "1E-7"."""
    owner, analyst, auditor = make_key("owner"), make_key("analyst"), make_key("auditor")
    np.save(tmp_path / "x.npy", low_rank_rows(120, 4, 1, seed=24))
    uploaded = dpss(
        "datasets", "upload", str(tmp_path / "x.npy"), "--epsilon-budget", "1",
        "--delta-budget", "1e-7", "--row-norm-bound", "1", "--name", "a-rather-long-name-" * 3,
        "--json", key=owner,
    )  # fmt: skip
    dataset = _json(uploaded)["id"]
    created = dpss(
        "releases", "create", dataset, "--mechanism", "analyze_gauss", "--k", "1",
        "--epsilon", "0.5", "--delta", "1e-8", "--wait", "--json", key=analyst,
    )  # fmt: skip
    release = _json(created)["id"]
    commands = [
        (("datasets", "list"), owner),
        (("datasets", "show", dataset), owner),
        (("budget", dataset), analyst),
        (("releases", "list"), analyst),
        (("releases", "show", release), analyst),
        (("mechanisms",), analyst),
        (("audit", "list"), auditor),
    ]
    outputs = [dpss(*args, key=key, columns=columns) for args, key in commands]
    # The ids the tables show (their JSON's): a random id may hold "e-0" ("...ae-06d..." about
    # once in 128 ids), and folded on a narrow terminal its pieces are no longer whole ids.
    ids = " ".join(
        " ".join(re.findall(UUID_PATTERN, dpss(*args, "--json", key=key).stdout))
        for args, key in commands
    )
    for result in outputs:
        assert result.exit_code == 0, result.output
        assert "\u2026" not in result.stdout and "..." not in result.stdout, result.stdout
        # Ids aside, no number in exponent notation ("1E-7" from a Decimal, "1e-07" a float).
        assert "E-" not in result.stdout, result.stdout
        for piece in re.findall(r"[0-9a-f-]*e-0[0-9a-f-]*", result.stdout):
            assert piece in ids, (piece, result.stdout)  # (a piece of an id, whole or folded)
        assert max(map(len, result.stdout.splitlines())) <= columns
    assert "0.0000001" in outputs[2].stdout  # the delta budget
    assert "0.00000001" in outputs[4].stdout  # the release's delta
    # Folded on a narrow terminal (line by line in its column), whole on a wide one.
    assert (dataset if columns > 100 else dataset[:4]) in outputs[0].stdout


def test_upload_with_a_privacy_unit_column(dpss: Dpss, make_key: MakeKey, tmp_path: Path) -> None:
    # Issue 34: the CLI passes the column; the answer and `show` state the unit, never an id.
    owner = make_key("owner")
    path = tmp_path / "visits.csv"
    rows = low_rank_rows(30, 3, 2, seed=21)
    lines = ["patient,a,b,c"] + [
        f"id-qx{i % 7},{','.join(repr(float(v)) for v in row)}" for i, row in enumerate(rows)
    ]
    path.write_text("\n".join(lines) + "\n")
    args = ("--privacy-unit-column", "patient")
    ds = _upload(dpss, owner, path, *args)
    assert (ds["n_cols"], ds["privacy_unit"], ds["n_units"]) == (3, "person", 7)
    human = dpss(
        "datasets", "upload", str(path), "--epsilon-budget", "1", "--delta-budget", "1e-5",
        *args, key=owner,
    )  # fmt: skip
    assert human.exit_code == ExitCode.OK, human.output
    assert "person (7 people)" in human.stdout and "7 with 2-5" in human.stdout
    shown = dpss("datasets", "show", ds["id"], key=owner)
    assert shown.exit_code == 0 and "person (7 people)" in shown.stdout
    assert "id-qx" not in human.stdout + shown.stdout


def test_priors_upload_list_and_a_release_that_names_one(
    dpss: Dpss, make_key: MakeKey, tmp_path: Path
) -> None:
    owner, analyst = make_key("owner"), make_key("analyst")
    data = tmp_path / "rows.csv"
    np.savetxt(data, low_rank_rows(300, 5, 2, seed=21), delimiter=",", fmt="%.17g")
    ds = _upload(dpss, owner, data)
    prior = tmp_path / "prior.npy"
    np.save(prior, np.eye(5)[:, :3])
    made = dpss("priors", "upload", str(prior), "--name", "axes", "--json", key=analyst)
    assert made.exit_code == 0, made.output
    stored = _json(made)
    assert (stored["d"], stored["m"], stored["name"]) == (5, 3, "axes")
    listed = dpss("priors", "list", key=owner)
    assert listed.exit_code == 0 and stored["id"] in listed.stdout
    bad = tmp_path / "bad.npy"
    np.save(bad, 2 * np.eye(5)[:, :3])
    refused = dpss("priors", "upload", str(bad), key=analyst)
    assert refused.exit_code != 0 and "orthonormal" in refused.output
    release = dpss(
        "releases", "create", ds["id"], "--mechanism", "analyze_gauss", "--k", "2",
        "--epsilon", "0.5", "--delta", "1e-6", "--param", f"prior_id={stored['id']}",
        "--json", key=analyst,
    )  # fmt: skip
    assert release.exit_code == 0, release.output
    assert _json(release)["params"]["prior_sha256"] == stored["sha256"]


def test_a_refusal_shows_the_delta_the_request_is_admitted_at(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import typer

    from dpss_client.client import BudgetExceededError

    error = BudgetExceededError(
        "budget_exceeded",
        "costs more",
        409,
        Decimal("0.8"),
        Decimal("0.00000003"),
        delta_admissible=Decimal("1e-8"),
        delta_admissible_epsilon=Decimal("0.662"),
    )
    with pytest.raises(typer.Exit), remote_cli._service_errors(as_json=True):
        raise error
    shown = capsys.readouterr()
    body = json.loads(shown.out)
    assert (body["delta_admissible"], body["delta_admissible_epsilon"]) == ("0.00000001", "0.662")
    assert "delta_admissible: 0.00000001" in shown.err
    assert "delta_admissible_epsilon: 0.662" in shown.err


def test_an_upload_without_a_bound_says_what_releases_then_need(
    dpss: Dpss, make_key: MakeKey, tmp_path: Path
) -> None:
    # An audit of the default path: `datasets upload` without --row-norm-bound printed an empty
    # row_norm_bound cell, and every later release was refused for want of params.clip_norm.
    owner = make_key("owner")
    path = tmp_path / "unbounded.csv"
    np.savetxt(path, low_rank_rows(150, 5, 2, seed=21), delimiter=",", fmt="%.17g")
    upload = dpss("datasets", "upload", str(path), "--epsilon-budget", "1",
                  "--delta-budget", "1e-5", key=owner)  # fmt: skip
    assert upload.exit_code == ExitCode.OK, upload.output
    row = next(line for line in upload.stdout.splitlines() if "row_norm_bound" in line)
    assert "none" in row and "--param clip_norm=C" in row, upload.stdout
    bounded = dpss("datasets", "upload", str(path), "--epsilon-budget", "1",
                   "--delta-budget", "1e-5", "--row-norm-bound", "1", key=owner)  # fmt: skip
    row = next(line for line in bounded.stdout.splitlines() if "row_norm_bound" in line)
    assert "│ 1 " in row and "none" not in row, bounded.stdout


def test_create_without_mechanism_sends_auto_and_says_so(
    dpss: Dpss, refusable: Callable[..., Refusable]
) -> None:
    # An audit of the default path: `releases create` had no default mechanism ("Missing
    # option '--mechanism'") where the API advises `auto` when unsure and PrivatePCA sends it.
    world = refusable(low_rank_rows(200, 5, 2, seed=31))
    analyst, ds_id = world.analyst_key, world.dataset_id
    created = dpss(
        "releases", "create", ds_id, "--k", "2", "--epsilon", "0.5", "--json", key=analyst
    )
    assert created.exit_code == ExitCode.OK, created.output
    assert _json(created)["mechanism"] == "auto"
    # The preview says how to ask for PCA in the command's spelling, not the API's JSON.
    preview = dpss(
        "releases", "create", ds_id, "--k", "2", "--epsilon", "0.5", "--dry-run", key=analyst
    )
    assert preview.exit_code == ExitCode.OK, preview.output
    assert "for PCA send --param center=private" in " ".join(preview.stdout.split())
    helped = dpss("releases", "create", "--help", key=None, columns=300)
    assert "[default: auto]" in helped.stdout, helped.stdout
    # A param auto does not take, with no --mechanism: the refusal says auto was the default
    # and how to set the param; with --mechanism auto it is the service's message as it is.
    refused = dpss(
        "releases", "create", ds_id, "--k", "2", "--epsilon", "0.5",
        "--param", "clip_quantile=0.3", key=analyst,
    )  # fmt: skip
    assert refused.exit_code == ExitCode.REFUSED, refused.output
    assert "auto, the default, was sent" in refused.stderr
    assert "--mechanism analyze_gauss" in refused.stderr
    named = dpss(
        "releases", "create", ds_id, "--k", "2", "--epsilon", "0.5", "--mechanism", "auto",
        "--param", "clip_quantile=0.3", key=analyst,
    )  # fmt: skip
    assert named.exit_code == ExitCode.REFUSED and "the default" not in named.stderr


def test_a_refusal_names_the_command_options_not_the_json_fields(
    dpss: Dpss, refusable: Callable[..., Refusable], tmp_path: Path
) -> None:
    # An audit of the default path: the CLI printed the API's spelling ('e.g. "epsilon": 0.5',
    # 'k: ...', 'params.x', '`dry_run=true`', 'allow_large_delta=true') to someone who types
    # options. The code and the figures stay the API's.
    rows = low_rank_rows(200, 5, 2, seed=32)
    world = refusable(rows)
    owner, analyst, ds_id = world.owner_key, world.analyst_key, world.dataset_id
    np.save(tmp_path / "x.npy", rows)  # for the refused upload below

    def refusal(*args: str, key: str = analyst) -> str:
        result = dpss(*args, key=key)
        assert result.exit_code == ExitCode.REFUSED, result.output
        return " ".join(result.stderr.split())  # unwrapped

    no_cost = refusal("releases", "create", ds_id, "--k", "2")
    # (The test settings' accounting asks for epsilon alone; hybrid adds ", --mu or --rho".)
    assert "[invalid_input] --epsilon: required: --epsilon" in no_cost, no_cost
    assert "e.g. --epsilon 0.5; --delta is optional" in no_cost, no_cost
    assert '"epsilon"' not in no_cost
    too_wide = refusal("releases", "create", ds_id, "--k", "9", "--epsilon", "0.5")
    assert "--k: must be <= the number of columns (5)" in too_wide, too_wide
    both = refusal("releases", "create", ds_id, "--k", "2", "--epsilon", "0.5", "--mu", "1")
    assert "--mu: give --mu or --epsilon, not both" in both, both
    unknown = refusal(
        "releases", "create", ds_id, "--k", "2", "--epsilon", "0.5",
        "--mechanism", "analyze_gauss", "--param", "clip_quantil=0.3",
    )  # fmt: skip
    assert unknown.startswith("error [invalid_input] --param clip_quantil:"), unknown
    broke = refusal("releases", "create", ds_id, "--k", "2", "--epsilon", "2")
    assert "`--dry-run`" in broke and "dry_run" not in broke, broke
    as_json = dpss("releases", "create", ds_id, "--k", "2", "--json", key=analyst)
    assert _json(as_json)["detail"].startswith("--epsilon: required"), as_json.stdout
    large = refusal(
        "datasets", "upload", str(tmp_path / "x.npy"), "--epsilon-budget", "1",
        "--delta-budget", "0.1", key=owner,
    )  # fmt: skip
    assert "--delta-budget: 0.1 is above 1/n" in large and "`--allow-large-delta`" in large
    assert Decimal(_json(dpss("budget", ds_id, "--json", key=analyst))["epsilon_spent"]) == 0


def test_a_release_table_shows_text_extras_as_text() -> None:
    # An audit of the default path: `releases create` (auto by default) printed its reason as
    # a JSON string, `auto_choice │ "analyze_gauss"`, beside `mechanism │ auto`.
    from datetime import UTC, datetime

    from api_schemas.releases import Release
    from dpss_client.cli_format import _release_rows

    now = datetime.now(UTC).isoformat()
    release = Release.model_validate(
        {
            "id": "00000000-0000-0000-0000-000000000001",
            "dataset_id": "00000000-0000-0000-0000-000000000002",
            "mechanism": "auto", "k": 2, "epsilon": "0.5", "delta": "0.0000001",
            "params": {}, "status": "succeeded", "created_at": now, "visible_at": now,
            "result": {"extras": {"auto_choice": "analyze_gauss", "auto_reason": 'a "b" c',
                                  "auto_details": ["x"], "trace": 2.5}},
        }
    )  # fmt: skip
    rows = dict(_release_rows(release))
    assert rows["auto_choice"] == "analyze_gauss"
    assert rows["auto_reason"] == 'a "b" c'
    assert rows["auto_details"] == '["x"]' and rows["trace"] == "2.5"


def test_table_cells_write_booleans_as_the_json_does() -> None:
    # An audit of the default path: a dry run printed `structure_test │ False` and
    # `forecast_depends_on_spectrum │ True` beside `null`, and a release `refunded │ False`
    # beside its extras' `explained_variance_hidden_by_noise │ false`.
    from dpss_client.cli_format import _text

    assert (_text(True), _text(False), _text(None), _text(1)) == ("true", "false", "", "1")


def test_a_refusal_states_epsilon_remaining_pure_where_it_is_its_own_figure(
    dpss: Dpss, make_key: MakeKey, tmp_path: Path
) -> None:
    # The 409 carries epsilon_remaining_pure and its message names it; the CLI printed every
    # figure but this one (and dropped it from --json). basic: it is epsilon_remaining, so
    # stderr does not repeat it.
    owner, analyst = make_key("owner"), make_key("analyst")
    np.save(tmp_path / "x.npy", low_rank_rows(100, 4, 1, seed=24))
    for accounting, pure_line in (("hybrid", True), ("basic", False)):
        ds = _upload(dpss, owner, tmp_path / "x.npy", "--accounting", accounting)
        refused = dpss(
            "releases", "create", ds["id"], "--k", "1", "--epsilon", "2", "--json", key=analyst
        )
        assert refused.exit_code == ExitCode.REFUSED, refused.output
        assert _json(refused)["epsilon_remaining_pure"] == "1", refused.stdout
        assert ("  epsilon_remaining_pure: 1\n" in refused.stderr) is pure_line, refused.stderr


def test_a_missing_clip_norm_is_named_once_in_the_commands_spelling(
    dpss: Dpss, make_key: MakeKey, tmp_path: Path
) -> None:
    # A newcomer's first release on a dataset without a row_norm_bound printed
    # "--param clip_norm=C (the CLI: --param clip_norm=C; PrivatePCA: clip_norm=C)".
    owner, analyst = make_key("owner"), make_key("analyst")
    np.save(tmp_path / "x.npy", low_rank_rows(100, 4, 1, seed=25))
    made = dpss(
        "datasets", "upload", str(tmp_path / "x.npy"), "--epsilon-budget", "1",
        "--delta-budget", "1e-5", "--json", key=owner,
    )  # fmt: skip
    assert made.exit_code == ExitCode.OK, made.output
    refused = dpss(
        "releases", "create", _json(made)["id"], "--k", "1", "--epsilon", "0.5", key=analyst
    )
    assert refused.exit_code == ExitCode.REFUSED, refused.output
    detail = " ".join(refused.stderr.split())
    assert "send a public bound C on the rows' norms, --param clip_norm=C, chosen" in detail
    assert detail.count("clip_norm") == 2, detail


def test_an_id_argument_is_named_as_the_command_names_it(dpss: Dpss, make_key: MakeKey) -> None:
    # A malformed id answered "path.release_id: not an id ...", the API's location, which no
    # command shows; `dpss budget --dataset ID` answered click's bare "No such option".
    analyst, owner = make_key("analyst"), make_key("owner")
    cases = {
        ("releases", "show", "nope"): "the release id (argument RELEASE_ID): not an id",
        ("datasets", "show", "nope"): "the dataset id (argument DATASET_ID): not an id",
        ("budget", "nope"): "the dataset id (argument DATASET_ID): not an id",
        ("releases", "create", "nope", "--k", "1", "--epsilon", "1"): "(argument DATASET_ID)",
        ("releases", "list", "--dataset", "nope"): "] --dataset: not an id in canonical form",
    }
    for args, expected in cases.items():
        result = dpss(*args, key=analyst)
        assert result.exit_code == ExitCode.REFUSED, result.output
        assert expected in result.stderr and "path." not in result.stderr, result.stderr
        as_json = _json(dpss(*args, "--json", key=analyst))
        assert expected.removeprefix("] ") in as_json["detail"], as_json
    revoked = dpss("grants", "revoke", "nope", "nope2", key=owner)
    assert "(argument DATASET_ID): not an id" in revoked.stderr, revoked.stderr
    assert "; the grant id (argument GRANT_ID): not an id" in revoked.stderr, revoked.stderr
    for args in (("budget", "--dataset", "x"), ("datasets", "show", "--dataset-id", "x")):
        result = dpss(*args, key=analyst)
        assert result.exit_code == ExitCode.USAGE, result.output
        assert "No such option" not in result.output
        said = " ".join(result.output.replace("│", " ").split())
        command = " ".join(args[:-2])
        assert f"the dataset id is positional: root {command} DATASET_ID" in said, said
    shown = dpss("releases", "show", "--release", "x", key=analyst)
    assert shown.exit_code == ExitCode.USAGE
    assert "the release id is positional: root releases show RELEASE_ID" in " ".join(
        shown.output.replace("│", " ").split()
    ), shown.output


@pytest.mark.release_seed(500)
def test_a_whole_space_split_the_noise_hides_is_shown_null_and_flagged(
    dpss: Dpss, make_key: MakeKey, tmp_path: Path, run_worker: Callable[[], int]
) -> None:
    # k = d on isotropic rows: the share is 1, but fewer components stand out of the noise than
    # were released. The table printed the service's split by debiased eigenvalues (e.g.
    # [1, 0, 0, 0, 0]) as if measured, and no flag.
    owner, analyst = make_key("owner"), make_key("analyst")
    np.save(tmp_path / "x.npy", isotropic_rows(200, 5, seed=7))
    ds = _upload(dpss, owner, tmp_path / "x.npy")
    created = dpss(
        "releases", "create", ds["id"], "--mechanism", "analyze_gauss", "--k", "5",
        "--epsilon", "0.3", "--delta", "1e-7", "--param", "center=private", "--json",
        key=analyst,
    )  # fmt: skip
    assert created.exit_code == ExitCode.OK, created.output
    run_worker()
    shown = dpss("releases", "show", _json(created)["id"], key=analyst)
    assert shown.exit_code == ExitCode.OK, shown.output
    table = shown.stdout
    assert re.search(r"explained_variance_split_hidden_by_noise\s*│\s*true", table), table
    assert re.search(r"explained_variance_ratio\s*│\s*null", table), table
    assert re.search(r"explained_sum_of_squares\s*│\s*null", table), table
    assert re.search(r"explained_variance_ratio_interval\s*│\s*\[1, 1\]", table), table
