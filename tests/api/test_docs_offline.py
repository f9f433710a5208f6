"""The API manual works without internet: /docs rendered by headless Chromium (Debian's
``chromium``) against a real uvicorn on 127.0.0.1, with every other host unreachable, shows
every documented operation and the Authorize button; /redoc renders too."""

from __future__ import annotations

import html
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.api.live import serving

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")

#: Any host but 127.0.0.1 resolves to nothing, and any request that still reaches the network
#: stack goes to a proxy on a closed port: the page gets only what the service serves.
NETWORK_OFF = [
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=127.0.0.1",
]


def chromium(tmp_path: Path, url: str, *output: str) -> str:
    assert CHROMIUM is not None
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        f"--user-data-dir={tmp_path / 'profile'}",
        *NETWORK_OFF,
        # Virtual time runs the page's scripts (and its fetch of /openapi.json) to quiet.
        "--virtual-time-budget=15000",
        "--window-size=1280,4000",
        *output,
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def operations(document: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (method, path, operation.get("summary", ""))
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    ]


# What this checks does not depend on the database (the ledger paths run on both elsewhere):
# one backend halves its time.
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_docs_render_every_operation_offline(app: Any, tmp_path: Path) -> None:
    document = app.openapi()
    release = document["paths"]["/v1/datasets/{dataset_id}/releases"]["post"]
    with serving(app) as base:
        dom = chromium(tmp_path, f"{base}/docs", "--dump-dom")
        chromium(tmp_path, f"{base}/docs", f"--screenshot={tmp_path / 'docs.png'}")
        # A deep link opens one operation: its examples render too.
        opened = chromium(tmp_path, f"{base}/docs#/releases/{release['operationId']}", "--dump-dom")
        redoc = chromium(tmp_path, f"{base}/redoc", "--dump-dom")
    # Rendered by Swagger UI's JS (the served HTML has none of this).
    assert "Failed to load API definition" not in dom
    assert 'class="btn authorize' in dom
    listed = operations(document)
    assert len(listed) >= 15
    for method, path, summary in listed:
        assert f'data-path="{path}"' in dom, (method, path)
        assert html.escape(summary, quote=False) in dom, (method, path, summary)
    assert dom.count('class="opblock-summary-method"') == len(listed)
    for tag in document["tags"]:
        assert f'data-tag="{tag["name"]}"' in dom, tag
    assert (tmp_path / "docs.png").stat().st_size > 10_000
    assert "analyze_gauss" not in dom  # collapsed: no example shown yet
    assert "budget_exceeded" in opened and "clip_norm" in opened and "affordable" in opened
    # ReDoc's JS renders the operation list too.
    assert all(html.escape(summary, quote=False) in redoc for _, _, summary in listed)
