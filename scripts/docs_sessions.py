"""The recorded sessions of docs/cli.md, produced by running them against a live service.

Every ```console block of docs/cli.md's "Walkthrough" section is one shell session, run in order
in one ``bash`` (variables carry over from block to block): each ``$ command`` line is run and
what it prints (stdout and stderr, in order, and ``(exit N)`` when it fails) is its recorded
output. The Python flow under "The same flow from Python" is run too, and its output block
compared. ``tests/test_docs_sessions.py`` runs the whole page against ``dpss serve`` and fails
when a recorded output no longer matches what the service prints; this script rewrites the page
from a run:

    python -m scripts.docs_sessions docs/cli.md --write    # starts its own dpss serve

**Normalisation (the one rule, :func:`normalise`).** Outputs are compared up to ids and noise:
UUIDs, API keys, SHA-256 digests, cursors and times are replaced by placeholders; on a line that
shows a noisy output (:data:`NOISY`: eigenvalues, a basis, an orthogonality error, the clip norm a
private quantile chose) every number
is masked; runs of spaces and of table-rule characters count as one (a table's width follows
its widest cell). Budgets, costs, refusals, exit codes and table contents are compared as
printed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLI_DOC = ROOT / "docs" / "cli.md"
WALKTHROUGH = ("## Walkthrough", "\n## The same flow from Python")
PYTHON_FLOW = ("## The same flow from Python", "\n### PCA, scikit-learn style")
ADMIN = "docs-admin-key"
#: The service's URL as the page shows it.
DOC_URL = "http://127.0.0.1:8765"

_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_KEY = re.compile(r"dpss_[A-Za-z0-9_-]{20,}")
_SHA = re.compile(r"\b[0-9a-f]{64}\b")
_CURSOR = re.compile(r"\bWy[A-Za-z0-9_-]{20,}")
_TIME = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:\d\d)?")
_NUMBER = re.compile(r"-?\d+\.?\d*([eE][-+]?\d+)?")
_URL = re.compile(r"http://127\.0\.0\.1:\d+")
_RULE = re.compile(r"[─━═┄╌-]{2,}")
#: A line showing a noisy output: every number on it is masked.
NOISY = re.compile(
    r"eigenvalues|trace|_std\b|sum_of_squares|variance|components_above|sigma|row_clip_norm|\[\["
    r"|\de-1\d\b"
)
#: A short id (the first 8 hex digits of a UUID), or a piece of one a table folded: a run of
#: hex digits and dashes, 8 long or more, with a digit in it, standing alone (not part of a word
#: or of a decimal number). About 2% of short ids are all digits, so a letter is not required;
#: the price is that a bare integer of 8 digits or more is masked too, which only loses a check.
_SHORT_ID = re.compile(r"(?<![\w.-])(?=[0-9a-f-]*\d)[0-9a-f][0-9a-f-]{7,}(?![\w.-])")


def normalise(text: str) -> str:
    """``text`` up to ids and noise (the module docstring's rule)."""
    lines = []
    for line in text.splitlines():
        line = _URL.sub("<url>", line)
        line = _KEY.sub("<key>", line)
        line = _ID.sub("<id>", line)
        line = _SHA.sub("<sha256>", line)
        line = _CURSOR.sub("<cursor>", line)
        line = _TIME.sub("<time>", line)
        if NOISY.search(line):
            line = _NUMBER.sub("<n>", line)
        line = _SHORT_ID.sub("<id8>", line)
        line = _RULE.sub("─", line)
        line = re.sub(r"[ \t]+", " ", line).strip()
        # NumPy pads array elements to one width ("0.02 ]" beside "0.023]"): brackets hug.
        line = re.sub(r"\[ | \]", lambda m: m.group(0).strip(), line)
        lines.append(line)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


# -- the page -----------------------------------------------------------------------------------


@dataclass
class Command:
    """One ``$ command`` of a console block and the output recorded under it."""

    command: str
    recorded: str
    #: (start, end) of the recorded output in the page's text.
    span: tuple[int, int] = (0, 0)
    actual: str = ""


@dataclass
class Page:
    text: str
    commands: list[Command] = field(default_factory=list)
    python_code: str = ""
    python_output: tuple[int, int] = (0, 0)


def _section(text: str, bounds: tuple[str, str]) -> tuple[int, int]:
    start = text.index(bounds[0])
    return start, text.index(bounds[1], start)


def parse(text: str) -> Page:
    """The walkthrough's commands with their recorded outputs, and the Python flow."""
    page = Page(text)
    start, end = _section(text, WALKTHROUGH)
    page.commands = _collect(text, start, end)
    flow_start, flow_end = _section(text, PYTHON_FLOW)
    flow = text[flow_start:flow_end]
    code = re.search(r"```python\n(.*?)```", flow, flags=re.DOTALL)
    output = re.search(r"Output of that run[^\n]*\n\n```\n(.*?)```", flow, flags=re.DOTALL)
    if code is None or output is None:
        raise ValueError("docs/cli.md: the Python flow or its output block is missing")
    page.python_code = code.group(1)
    page.python_output = (flow_start + output.start(1), flow_start + output.end(1))
    return page


def _collect(text: str, start: int, end: int) -> list[Command]:
    commands: list[Command] = []
    for block in re.finditer(r"```console\n(.*?)```", text[start:end], flags=re.DOTALL):
        offset = start + block.start(1)
        position = 0
        current: Command | None = None
        for line in block.group(1).splitlines(keepends=True):
            if line.startswith("$ "):
                if current is not None:
                    current.span = (current.span[0], offset + position)
                    commands.append(current)
                current = Command(line[2:].rstrip("\n"), "", (offset + position + len(line), 0))
            elif current is not None:
                current.recorded += line
            position += len(line)
        if current is not None:
            current.span = (current.span[0], offset + position)
            commands.append(current)
    return commands


# -- running it ---------------------------------------------------------------------------------

MARK = "@@docs-session-command@@"


def make_data(directory: Path) -> None:
    """The session's files: ``patients.csv``/``.npy`` (5000 x 10, norms at most 1, most of the
    variance in 3 directions) and ``isotropic.npy`` (2000 x 6, no preferred direction)."""
    rng = np.random.default_rng(20261122)
    basis, _ = np.linalg.qr(rng.normal(size=(10, 3)))
    rows = (
        rng.normal(size=(5000, 3)) * [0.5, 0.4, 0.3] @ basis.T + rng.normal(size=(5000, 10)) * 0.03
    )
    rows /= np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
    header = ",".join(f"x{i}" for i in range(10))
    np.savetxt(directory / "patients.csv", rows, delimiter=",", header=header, comments="")
    np.save(directory / "patients.npy", rows)
    iso = rng.normal(size=(2000, 6))
    np.save(directory / "isotropic.npy", iso / np.linalg.norm(iso, axis=1, keepdims=True))


PRELUDE = """
set +e
export DPSS_URL={url}
export DPSS_ADMIN_API_KEY={admin}
key() {{ curl -s -X POST $DPSS_URL/v1/keys -H "Authorization: Bearer $DPSS_ADMIN_API_KEY" \\
  -H "Content-Type: application/json" -d "{{\\"role\\": \\"$1\\", \\"name\\": \\"$2\\"}}"; }}
OWNER=$(key owner alice | jq -r .key)
made=$(key analyst bob); ANALYST=$(echo "$made" | jq -r .key)
ANALYST_KEY_ID=$(echo "$made" | jq -r .id)
AUDITOR=$(key auditor carol | jq -r .key)
"""


def run_session(page: Page, url: str, workdir: Path) -> None:
    """Run every command of ``page`` in one bash against ``url``; fill each ``actual``."""
    script = [PRELUDE.format(url=url, admin=ADMIN)]
    for index, command in enumerate(page.commands):
        script.append(f"echo {MARK}{index}")
        line = command.command.replace(DOC_URL, url)
        script.append(f'{{ {line}\n}} 2>&1; rc=$?; [ $rc -ne 0 ] && echo "(exit $rc)"')
    env = {
        **os.environ,
        "COLUMNS": "100",
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("DPSS_API_KEY", None)
    result = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    parts = result.stdout.split(MARK)[1:]
    if len(parts) != len(page.commands):
        raise RuntimeError(f"the session stopped early: {result.stdout[-2000:]}{result.stderr}")
    for command, part in zip(page.commands, parts, strict=True):
        printed = part.split("\n", 1)[1] if "\n" in part else ""
        # The page shows the documented port (ports are normalised away when comparing).
        command.actual = printed.replace(url, DOC_URL)


def run_python_flow(page: Page, url: str, workdir: Path) -> str:
    """The Python flow's output, with the session's owner and analyst keys."""
    owner, analyst = (
        _new_key(url, role, name) for role, name in (("owner", "dan"), ("analyst", "eve"))
    )
    code = page.python_code.replace(DOC_URL, url)
    prelude = f"OWNER = {owner!r}\nANALYST = {analyst!r}\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if result.returncode != 0:
        raise RuntimeError(result.stdout + result.stderr)
    return result.stdout.replace(url, DOC_URL)


def _new_key(url: str, role: str, name: str) -> str:
    response = httpx.post(
        f"{url}/v1/keys",
        headers={"Authorization": f"Bearer {ADMIN}"},
        json={"role": role, "name": name},
        timeout=30,
    )
    response.raise_for_status()
    return str(response.json()["key"])


def differences(page: Page, python_output: str) -> list[str]:
    """Each command (and the Python flow) whose recorded output does not match the run."""
    found = []
    for command in page.commands:
        if normalise(command.recorded) != normalise(command.actual):
            found.append(
                f"$ {command.command}\n--- recorded (normalised)\n{normalise(command.recorded)}"
                f"\n--- printed now (normalised)\n{normalise(command.actual)}"
            )
    start, end = page.python_output
    if normalise(page.text[start:end]) != normalise(python_output):
        found.append(
            f"the Python flow\n--- recorded\n{normalise(page.text[start:end])}"
            f"\n--- printed now\n{normalise(python_output)}"
        )
    return found


def rewritten(page: Page, python_output: str) -> str:
    """The page with every recorded output replaced by the run's (a blank line between one
    command's output and the next command)."""
    edits = [
        (c.span, "\n".join(line.rstrip() for line in c.actual.rstrip("\n").splitlines()))
        for c in page.commands
    ]
    text = page.text
    start, end = page.python_output
    text = text[:start] + python_output + text[end:]
    for (start, end), output in sorted(edits, key=lambda edit: edit[0][0], reverse=True):
        new = output + "\n" if output else ""
        if text[end : end + 2] == "$ ":
            new += "\n"
        text = text[:start] + new + text[end:]
    return text


# -- a server to run against --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``dpss serve`` on a free port with an empty data directory and the product's defaults
    (no DPSS_DEFAULT_ACCOUNTING: the documented default)."""
    port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("DPSS_") or key == "DPSS_TEST_POSTGRES_URL"
    }
    env.update(
        DPSS_ADMIN_API_KEY=ADMIN,
        DPSS_DATA_DIR=str(workdir / "dpss-data"),
        DPSS_WORKER_POLL_SECONDS="0.2",
        # The outcome shows after its padding: a short floor keeps the run quick (times are
        # normalised away).
        DPSS_RELEASE_PADDING_FLOOR_SECONDS="0.5",
    )
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "dpss"), "serve", "--port", str(port)],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    # Generous: on a loaded 2-core machine `dpss serve` (API, a worker and its calibration)
    # took about 52 s to become ready; a slow start is not what this page checks.
    deadline = time.monotonic() + 240
    while True:
        try:
            if httpx.get(f"{url}/readyz").status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.terminate()
            raise RuntimeError("dpss serve did not become ready")
        time.sleep(0.2)


def record(path: Path = CLI_DOC) -> tuple[Page, str]:
    """Run the page's sessions against a fresh ``dpss serve``; the page and the Python output."""
    page = parse(path.read_text())
    workdir = Path(tempfile.mkdtemp(prefix="dpss-docs-"))
    server, url = serve(workdir)
    try:
        make_data(workdir)
        run_session(page, url, workdir)
        python_output = run_python_flow(page, url, workdir)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    return page, python_output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path, nargs="?", default=CLI_DOC)
    parser.add_argument("--write", action="store_true", help="rewrite the page from the run")
    args = parser.parse_args()
    page, python_output = record(args.page)
    if args.write:
        args.page.write_text(rewritten(page, python_output))
        return 0
    found = differences(page, python_output)
    for difference in found:
        print(difference, end="\n\n")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
