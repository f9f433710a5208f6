"""The README's quickstart server and curl walkthrough work as written."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import httpx
import pytest

from service.config import Settings
from tests import browser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_configuration_table_lists_every_setting() -> None:
    """docs/configuration.md (linked from the README) has a table row for every setting."""
    text = (DOCS / "configuration.md").read_text()
    rows = {m for m in re.findall(r"^\| `(DPSS_\w+)` \|", text, flags=re.M)}
    for name in Settings.model_fields:
        assert f"DPSS_{name.upper()}" in rows, f"DPSS_{name.upper()} missing from the table"


def _stated_default_matches(stated: str, default: object) -> bool:
    """Whether a table's backticked default states ``default`` (a number, a bool, a path, a
    string, or a JSON value for a list or object)."""
    if isinstance(default, bool):
        return stated == str(default).lower()
    if isinstance(default, (int, float)):
        return float(stated) == float(default)
    if isinstance(default, Path):
        return Path(stated) == default
    if isinstance(default, (list, dict)):
        return bool(json.loads(stated) == default)
    return stated == default


def test_configuration_table_states_every_default_as_the_code_has_it():
    """The table's default column is each setting's default in ``Settings``: a changed default
    must not leave the docs describing the old one. A default written as a literal
    (`` `1024` ``, `` `hybrid` ``, `` `{}` ``) is compared; one described in words or with a
    placeholder (``unset``, ``empty``, `` `<data dir>-state/...` ``) must be a default the code
    computes (``None``) or leaves empty."""
    text = (DOCS / "configuration.md").read_text()
    rows = dict(re.findall(r"^\| `(DPSS_\w+)` \| ([^|]*) \|", text, flags=re.M))
    wrong = []
    for name, field in Settings.model_fields.items():
        cell = rows[f"DPSS_{name.upper()}"].strip()
        default = field.get_default(call_default_factory=True)
        literal = re.fullmatch(r"`([^`<]*)`", cell)
        if literal is None:
            if default not in (None, ""):
                wrong.append((name, cell, default))
        elif not _stated_default_matches(literal.group(1), default):
            wrong.append((name, cell, default))
    assert wrong == []


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _outside_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_the_readme_is_a_quickstart_that_links_every_docs_page() -> None:
    """The README stays short (issue 33: at most about 250 lines) and its "Documentation"
    section links every page of docs/, so the reference moved there can be found."""
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    section = text.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    for page in sorted(DOCS.glob("*.md")):
        assert f"](docs/{page.name})" in section, page.name


def test_the_readme_shows_commands_not_recorded_outputs() -> None:
    """Issue 31, item 4: the README records no output that could drift from the service's.
    Its code blocks are commands only (``bash``: run by
    :func:`test_walkthrough_runs_against_dpss_serve`, whose assertions check the outcomes its
    comments state); recorded sessions live in docs/cli.md, written and compared against a live
    service by scripts/docs_sessions.py, and the README links there."""
    text = README.read_text()
    fences = re.findall(r"^```(\w*)$", text, flags=re.M)
    openings = fences[0::2]
    assert openings and set(openings) == {"bash"}, openings
    for block in bash_blocks():
        # no shell prompt followed by a printed answer, no pasted JSON answer
        assert not re.search(r"^\$ ", block, flags=re.M), block
        assert not re.search(r'^\s*[{\[]"', block, flags=re.M), block
    assert "](docs/cli.md#recorded-sessions)" in text or "](docs/cli.md)" in text


def test_every_relative_link_of_the_readme_and_docs_resolves() -> None:
    """Every relative link (file and ``#anchor``) of the README and docs/*.md points at a file
    that exists and, for a Markdown page, at one of its headings: moving a section must not
    leave a link to where it was."""
    broken = []
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", _outside_code(page.read_text())):
            if re.match(r"(https?:|mailto:|<)", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append((page.name, target))
            elif anchor and dest.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", _outside_code(dest.read_text()), flags=re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append((page.name, target))
    assert broken == []


def test_walkthrough_runs_against_dpss_serve(tmp_path):
    walkthrough = next(block for block in bash_blocks() if "export DPSS=" in block)
    port = free_port()
    script = walkthrough.replace("http://127.0.0.1:8000", f"http://127.0.0.1:{port}")
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "DPSS_ADMIN_API_KEY": "change-me",
        "DPSS_WORKER_POLL_SECONDS": "0.2",
        # Each release's outcome shows after its padding (5 s at least by default): the
        # walkthrough asserts outcomes, not the padding, so a short floor halves its time.
        "DPSS_RELEASE_PADDING_FLOOR_SECONDS": "0.5",
    }
    env.pop("DPSS_DATABASE_URL", None)
    env.pop("DPSS_DATA_DIR", None)
    # The product's default accounting (hybrid), as a reader's `dpss serve` has it, not the
    # suite's basic (tests/conftest.py): step 3's comment states what hybrid would charge.
    env.pop("DPSS_DEFAULT_ACCOUNTING", None)
    server = subprocess.Popen(
        [str(bin_dir / "dpss"), "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                pytest.fail("dpss serve did not become ready")
            time.sleep(0.2)
        # The keys, for the dashboard check and the slim client's line below (on stderr: stdout
        # is the walkthrough's, checked whole).
        script += '\necho "DASHBOARD_KEYS $OWNER $AUDITOR" >&2\n'
        script += '\necho "$ANALYST" >&2\n'
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        out = result.stdout
        assert "succeeded" in out
        assert '"epsilon_spent":"0.6"' in out
        assert '"error":"budget_exceeded"' in out
        assert out.strip().endswith("release_succeeded")
        # The slim client's line, as written (its venv's bin is this venv's: on PATH).
        client_line = next(
            line for block in bash_blocks() for line in block.splitlines() if "dpss-remote" in line
        )
        remote = subprocess.run(
            [
                "bash",
                "-euo",
                "pipefail",
                "-c",
                client_line.replace("client-venv/bin/", "").replace(":8000", f":{port}"),
            ],
            cwd=tmp_path,
            env={**env, "ANALYST": result.stderr.strip().splitlines()[-1]},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert remote.returncode == 0, remote.stdout + remote.stderr
        assert "demo" in remote.stdout and "1 dataset" in remote.stdout
        verify = subprocess.run(
            [str(bin_dir / "dpss"), "audit", "verify"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert verify.returncode == 0 and "audit chain OK" in verify.stdout
        if browser.available():
            keys = re.search(r"DASHBOARD_KEYS (\S+) (\S+)", result.stderr)
            assert keys is not None
            browser.check_walkthrough_dashboard(
                f"http://127.0.0.1:{port}", keys.group(1), keys.group(2), "change-me"
            )
        else:  # said, not silent: the summary's warnings name it
            warnings.warn(
                "chromium or Playwright is not installed: the README walkthrough's dashboard "
                "check did not run",
                stacklevel=1,
            )
        # After the checks of the walkthrough's single dataset: this uploads a second one.
        check_step_comments(f"http://127.0.0.1:{port}", tmp_path, result.stderr)
        # No file the service wrote outside its data directory and its state directory beside it
        # (the audit anchors, which a backup of the data directory must not carry), and no raw
        # rows in them but the store.
        written = {p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*") if p.is_file()}
        assert written <= {"data.csv", "dpss-data", "dpss-data-state"}
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_mechanism_table_states_the_accountings_each_mechanism_runs_under():
    """The README's mechanism table says which accountings admit each mechanism, as the
    registry (and ``GET /v1/mechanisms``) does today: a change to either fails here."""
    from service.mechanisms.registry import MECHANISMS

    text = README.read_text()
    head = "| mechanism | use it when | paper | accountings it runs under (today) |"
    assert head in text
    rows = text.split(head, 1)[1].split("\n\n", 1)[0].strip().splitlines()[1:]
    stated = {
        re.match(r"\| `(\w+)` \|", row).group(1): set(  # type: ignore[union-attr]
            re.findall(r"`(\w+)`", row.rsplit("|", 2)[1])
        )
        for row in rows
    }
    # hybrid (the default, issue 31 item 5) admits every mechanism, as GET /v1/mechanisms says
    listed = {name: set(m.accountings) | {"hybrid"} for name, m in MECHANISMS.items()}
    assert stated == {name: accountings for name, accountings in listed.items() if name in stated}
    assert set(stated) == set(MECHANISMS) - {"continual_gauss"}


def test_the_readme_names_every_accounting_under_which_smooth_sensitivity_is_pure_by_default():
    """The README's smooth_sensitivity row says under which accountings its pure Cauchy variant
    is the default (``for_accounting``). It once named only ``zcdp``, the default before
    ``hybrid``: a reader on the default accounting was told a ``delta > 0`` request would run
    the Gaussian variant (refused above epsilon 1), when it runs the Cauchy one."""
    from service.mechanisms.registry import get_mechanism

    mechanism = get_mechanism("smooth_sensitivity")
    assert mechanism is not None
    kinds = ("hybrid", "basic", "zcdp")
    pure = {k for k in kinds if mechanism.for_accounting(k, mechanism.parse_params({})).noise}
    row = next(r for r in README.read_text().splitlines() if r.startswith("| `smooth_sensitivity`"))
    found = re.search(r"under (.+?) its pure Cauchy variant runs by default", row)
    assert found is not None, row
    assert set(re.findall(r"`(\w+)`", found.group(1))) & set(kinds) == pure


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_mechanisms_page_describes_every_mechanism_with_its_accountings():
    """docs/mechanisms.md has, for every registered mechanism, its own section, a row of the
    accounting table whose `gaussian` and `zcdp` columns say what ``GET /v1/mechanisms``
    admits, and a row of the preview table (spatial_sign, shipped, had neither row)."""
    from service.mechanisms.registry import MECHANISMS

    text = (DOCS / "mechanisms.md").read_text()
    headings = set(re.findall(r"^## (\w+)$", text, flags=re.M))
    accounting = _section(text, "Accounting across releases")
    preview = _section(text, "Preview before spending")
    wrong = []
    for name, mechanism in MECHANISMS.items():
        if name not in headings:
            wrong.append((name, "no section"))
        row = re.search(rf"^\| `{name}` \|[^|]*\| ([^|]*) \| ([^|]*) \|", accounting, flags=re.M)
        if row is None:
            wrong.append((name, "no accounting row"))
        else:
            for cell, kind in zip(row.groups(), ("gaussian", "zcdp"), strict=True):
                if cell.strip().startswith("yes") != (kind in mechanism.accountings):
                    wrong.append((name, kind, cell))
        if not re.search(rf"^\| `{name}` \|", preview, flags=re.M):
            wrong.append((name, "no preview row"))
    assert wrong == []


def check_step_comments(url: str, cwd: Path, stderr: str) -> None:
    """The walkthrough's comments that its own output does not show. Step 3: without
    ``accounting=basic`` the default, hybrid, charges step 4's two releases 0.44 and admits step
    7's request. Step 5: ``/readyz`` says whether a worker runs (``dpss serve`` runs one)."""
    keys = re.search(r"DASHBOARD_KEYS (\S+) (\S+)", stderr)
    assert keys is not None
    owner, analyst = keys.group(1), stderr.strip().splitlines()[-1]
    assert httpx.get(f"{url}/readyz").json()["workers_alive"] >= 1
    with (cwd / "data.csv").open("rb") as data:
        uploaded = httpx.post(
            f"{url}/v1/datasets",
            headers={"Authorization": f"Bearer {owner}"},
            files={"file": ("data.csv", data)},
            data={
                "name": "demo-hybrid",
                "epsilon_budget": "1.0",
                "delta_budget": "1e-5",
                "row_norm_bound": "1.0",
            },
            timeout=60,
        )
    assert uploaded.status_code == 201, uploaded.text
    dataset = uploaded.json()
    assert dataset["budget"]["accounting"] == "hybrid"
    analyst_auth = {"Authorization": f"Bearer {analyst}"}

    def request(mechanism: str, k: int, epsilon: float) -> httpx.Response:
        return httpx.post(
            f"{url}/v1/datasets/{dataset['id']}/releases",
            headers=analyst_auth,
            json={"mechanism": mechanism, "k": k, "epsilon": epsilon, "delta": 1e-6},
            timeout=60,
        )

    assert request("spectrum", 6, 0.1).status_code == 202
    assert request("analyze_gauss", 3, 0.5).status_code == 202
    budget = httpx.get(f"{url}/v1/datasets/{dataset['id']}/budget", headers=analyst_auth).json()
    assert f"{float(budget['epsilon_spent']):.2f}" == "0.44", budget
    assert request("analyze_gauss", 3, 0.5).status_code == 202
