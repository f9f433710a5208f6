"""``dpss --help`` starts without the heavy parts of the service or the client.

Every ``dpss`` call pays its imports (the docs replay and the subprocess tests ~50 times):
numpy, SQLAlchemy, FastAPI, scipy and the mechanisms are imported by the commands that use them,
not by ``service.cli``; the client module leaves numpy to the calls that handle an array;
``service.metrics`` does not bring the accounting with it. Figures:
bench/bench_cli_startup.py. One fresh interpreter, so what an earlier test imported does not
count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Neither `dpss --help` nor importing the metrics needs any of these.
HEAVY = ("numpy", "scipy", "sqlalchemy", "fastapi", "uvicorn", "httpx", "dask", "pandas")

PROGRAM = """
import json, sys
sys.argv = ["dpss", "--help"]
from service.cli import main
try:
    main()
except SystemExit as exit:
    code = exit.code
after_help = sorted(sys.modules)
import dpss_client.client
after_client = sorted(sys.modules)
from service import metrics
after_metrics = sorted(sys.modules)
found = {"help": after_help, "client": after_client, "metrics": after_metrics}
print(json.dumps({"code": code, **found}))
"""


def test_help_and_metrics_import_no_heavy_module() -> None:
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'clients' / 'python'}", "COLUMNS": "100"}
    run = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    *help_lines, last = run.stdout.strip().splitlines()
    found = json.loads(last)
    assert found["code"] == 0
    assert "datasets" in "\n".join(help_lines)  # the remote commands are registered
    after_help = set(found["help"])
    assert {"service.cli", "dpss_client.remote_cli"} <= after_help
    assert sorted(after_help & set(HEAVY)) == []
    assert "service.config" not in after_help  # pydantic-settings: the commands read it
    assert "dpss_client.client" not in after_help
    # What a command that lists, shows or grants loads: numpy only where a basis is handled.
    after_client = set(found["client"])
    assert sorted(after_client & {"numpy", "scipy", "sqlalchemy", "fastapi"}) == []
    after_metrics = set(found["metrics"])
    assert "service.metrics" in after_metrics
    assert sorted(after_metrics & {"numpy", "scipy", "sqlalchemy", "service.accounting"}) == []
