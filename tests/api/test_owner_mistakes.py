"""Owner mistakes the service used to accept silently or answer misleadingly (issue 30, item 16):
a delta budget above 1/n, a CSV written with semicolons and decimal commas, and (in the CLI) an
upload whose rows are nearly all above the declared bound."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import Result
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from dpss_client import cli_common
from service.cli import app as cli_app
from tests.conftest import Keys, bearer, npy_bytes


def _upload(client: TestClient, key: str, content: bytes, suffix: str = ".npy", **form: Any) -> Any:
    fields = {"name": "d", "epsilon_budget": "1", "delta_budget": "1e-6", **form}
    return client.post(
        "/v1/datasets",
        headers=bearer(key),
        files={"file": (f"data{suffix}", content, "application/octet-stream")},
        data={name: str(value) for name, value in fields.items()},
    )


def _csv(rows: np.ndarray[Any, Any], separator: str = ",", decimal: str = ".") -> bytes:
    lines = [separator.join(f"{value:.6f}".replace(".", decimal) for value in row) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def _nothing_stored(client: TestClient, keys: Keys, settings: Any) -> None:
    listed = client.get("/v1/datasets", headers=bearer(keys.owner)).json()
    assert listed["total"] == 0
    files = [p for p in settings.datasets_dir.glob("*") if p.is_file()]
    assert files == []


@pytest.mark.parametrize("suffix", [".npy", ".csv"])
@pytest.mark.parametrize("delta", ["0.5", "2.0001e-4", "1e-3"])
def test_a_delta_above_one_over_n_is_refused_naming_the_field_and_the_bound(
    client: TestClient, keys: Keys, settings: Any, suffix: str, delta: str
) -> None:
    rows = np.random.default_rng(1).normal(size=(5000, 3))
    content = npy_bytes(rows) if suffix == ".npy" else _csv(rows)
    response = _upload(client, keys.owner, content, suffix, delta_budget=delta)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert "delta_budget" in detail and "1/5000" in detail and "allow_large_delta" in detail
    _nothing_stored(client, keys, settings)


def test_a_delta_at_one_over_n_or_below_or_overridden_is_accepted(
    client: TestClient, keys: Keys, make_key: Callable[..., str]
) -> None:
    rows = npy_bytes(np.random.default_rng(1).normal(size=(5000, 3)))
    assert _upload(client, keys.owner, rows, delta_budget="2e-4").status_code == 201
    assert _upload(client, keys.owner, rows, delta_budget="1e-8").status_code == 201
    assert _upload(client, keys.owner, rows, delta_budget="0").status_code == 201
    for spelled in ("true", "True", "TRUE"):
        forced = _upload(client, keys.owner, rows, delta_budget="0.5", allow_large_delta=spelled)
        assert forced.status_code == 201, forced.text
    assert _upload(client, keys.owner, rows, allow_large_delta="false").status_code == 201
    for bad in ("yes", "1", "on", ""):
        refused = _upload(client, keys.owner, rows, delta_budget="0.5", allow_large_delta=bad)
        assert refused.status_code == 422 and "allow_large_delta" in refused.json()["detail"]
    # The override is on the audit record of the budget.
    auditor = make_key("auditor")
    events = client.get("/v1/audit", headers=bearer(auditor), params={"limit": 1000}).json()
    budgets = [e for e in events["items"] if e["event_type"] == "budget_set"]
    overridden = [e for e in budgets if e["details"].get("allow_large_delta") is True]
    assert len(budgets) == 7 and len(overridden) == 3


def test_an_append_growing_n_is_not_rechecked(client: TestClient, keys: Keys) -> None:
    """The bound is on the n at upload: 1e-3 is within 1/1,000; the appends that take n to
    3,000 do not make the dataset's delta refused after the fact."""
    rng = np.random.default_rng(2)
    created = _upload(
        client, keys.owner, npy_bytes(rng.normal(size=(1000, 3))), delta_budget="1e-3"
    )
    assert created.status_code == 201, created.text
    for _ in range(2):
        appended = client.post(
            f"/v1/datasets/{created.json()['id']}/rows",
            headers=bearer(keys.owner),
            files={"file": ("more.npy", npy_bytes(rng.normal(size=(1000, 3))), "x")},
        )
        assert appended.status_code == 201, appended.text
    assert appended.json()["n_rows_total"] == 3000


@pytest.mark.parametrize(
    ("separator", "decimal", "expected"),
    [
        (";", ",", "semicolon-separated with decimal commas"),
        (";", ".", "semicolon-separated;"),
        ("\t", ",", "tab-separated with decimal commas"),
        ("|", ".", "pipe-separated;"),
    ],
)
def test_a_csv_with_another_separator_is_named(
    client: TestClient, keys: Keys, settings: Any, separator: str, decimal: str, expected: str
) -> None:
    rows = np.random.default_rng(3).normal(size=(50, 4))
    content = _csv(rows, separator, decimal)
    with_header = separator.join(["a", "b", "c", "d"]).encode() + b"\n" + content
    for body in (content, with_header):
        response = _upload(client, keys.owner, body, ".csv")
        assert response.status_code == 422, response.text
        detail = response.json()["detail"]
        assert "file" in detail and expected in detail, detail
        assert "',' as the separator and '.' as the decimal point" in detail
        assert "inconsistent widths" not in detail
        # No value of the file in the message.
        assert f"{rows[0, 0]:.6f}".replace(".", decimal) not in detail
    _nothing_stored(client, keys, settings)


def test_an_append_with_another_separator_is_named(client: TestClient, keys: Keys) -> None:
    rows = np.random.default_rng(4).normal(size=(20, 3))
    created = _upload(client, keys.owner, _csv(rows), ".csv")
    assert created.status_code == 201, created.text
    appended = client.post(
        f"/v1/datasets/{created.json()['id']}/rows",
        headers=bearer(keys.owner),
        files={"file": ("more.csv", _csv(rows, ";", ","), "text/csv")},
    )
    assert appended.status_code == 422
    assert "semicolon-separated with decimal commas" in appended.json()["detail"]


def test_a_comma_separated_csv_that_fails_keeps_its_own_message(
    client: TestClient, keys: Keys
) -> None:
    response = _upload(client, keys.owner, b"1,2,3\n4,5\n6,7,8\n", ".csv")
    assert response.status_code == 422
    assert "inconsistent widths" in response.json()["detail"]
    assert "separated" not in response.json()["detail"]


@pytest.fixture
def dpss(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    monkeypatch.setattr(cli_common, "make_http_client", lambda url, timeout: client)

    def run(*args: str, key: str) -> Result:
        env = {"DPSS_URL": str(client.base_url), "DPSS_API_KEY": key, "COLUMNS": "200"}
        return CliRunner().invoke(cli_app, list(args), env=env)

    return run


@pytest.mark.parametrize("as_json", [False, True])
def test_the_cli_upload_shows_rows_above_bound_and_warns_when_most_are(
    dpss: Callable[..., Result], keys: Keys, tmp_path: Path, as_json: bool
) -> None:
    """300 rows in raw units (norms about 17) against a bound of 1: all clipped, said so."""
    raw = np.random.default_rng(5).normal(10.0, 1.0, size=(300, 3))
    path = tmp_path / "raw.npy"
    np.save(path, raw)
    flags = ["--json"] if as_json else []
    result = dpss(
        "datasets", "upload", str(path), "--epsilon-budget", "1", "--delta-budget", "1e-6",
        "--row-norm-bound", "1", *flags, key=keys.owner,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    if as_json:
        import json

        assert json.loads(result.stdout)["rows_above_bound"] == 300
    else:
        assert "rows_above_bound" in result.stdout and "300 of 300 (100%)" in result.stdout
    assert "warning: 300 of 300 rows (100%) have a norm above row_norm_bound 1" in result.stderr

    # A few rows above (5 of 300): shown, no warning.
    scaled = raw / np.linalg.norm(raw, axis=1, keepdims=True) * 0.5
    scaled[:5] *= 4.0
    np.save(path, scaled)
    quiet = dpss(
        "datasets", "upload", str(path), "--epsilon-budget", "1", "--delta-budget", "1e-6",
        "--row-norm-bound", "1", key=keys.owner,
    )  # fmt: skip
    assert quiet.exit_code == 0, quiet.output
    assert "5 of 300 (2%)" in quiet.stdout and "warning" not in quiet.stderr


def test_the_cli_upload_passes_the_override(
    dpss: Callable[..., Result], keys: Keys, tmp_path: Path
) -> None:
    path = tmp_path / "rows.npy"
    np.save(path, np.random.default_rng(6).normal(size=(100, 2)))
    args = ["datasets", "upload", str(path), "--epsilon-budget", "1", "--delta-budget", "0.5"]
    refused = dpss(*args, key=keys.owner)
    assert refused.exit_code != 0 and "--delta-budget" in refused.stderr
    # The way out in the command's spelling, not the form field's (dpss_client.spelling).
    shown = " ".join(refused.stderr.split())
    assert "1/100" in shown and "`--allow-large-delta`" in shown and "=true" not in shown
    accepted = dpss(*args, "--allow-large-delta", key=keys.owner)
    assert accepted.exit_code == 0, accepted.output
