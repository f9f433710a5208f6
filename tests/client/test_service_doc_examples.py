"""The ``dpss`` sessions of docs/service.md run as written: each ``$ dpss ...`` line of its
console blocks, in order, against the real app (the upload's id is ``$DS``). The gaussian
example uploaded without a row norm bound and then asked for a release without ``clip_norm``,
which the service refuses (exit 3): a reader copying it got an error."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from dpss_client import cli_common
from service.cli import app

SERVICE_DOC = Path(__file__).resolve().parents[2] / "docs" / "service.md"


def _sessions() -> list[list[str]]:
    blocks = re.findall(r"```console\n(.*?)```", SERVICE_DOC.read_text(), flags=re.DOTALL)
    sessions = []
    for block in blocks:
        lines = [line[2:] for line in block.splitlines() if line.startswith("$ dpss ")]
        if lines:
            sessions.append(lines)
    return sessions


def test_the_page_has_sessions() -> None:
    assert _sessions()


@pytest.mark.parametrize("session", _sessions(), ids=lambda lines: lines[0][:40])
def test_every_dpss_line_of_service_md_runs(
    session: list[str],
    client: TestClient,
    make_key: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(cli_common, "make_http_client", lambda url, timeout: client)
    monkeypatch.chdir(tmp_path)
    rows = np.random.default_rng(3).normal(size=(3000, 8))
    np.save("patients.npy", rows / np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True)))
    owner, analyst = make_key("owner"), make_key("analyst")
    variables: dict[str, str] = {}
    for line in session:
        words = shlex.split(line.split("  #")[0])[1:]
        words = [variables.get(word.lstrip("$"), word) if word.startswith("$") else word
                 for word in words]  # fmt: skip
        upload = words[:2] == ["datasets", "upload"]
        key = owner if upload or words[0] == "grants" else analyst
        result = CliRunner().invoke(
            app,
            [*words, "--json"] if upload else words,
            env={"DPSS_URL": str(client.base_url), "DPSS_API_KEY": key, "COLUMNS": "200"},
        )
        assert result.exit_code == 0, (line, result.output)
        if upload:
            variables["DS"] = json.loads(result.stdout)["id"]
