"""The slim client distribution (clients/python, ``dpss-client``) installs alone into an empty
venv, pulls in none of the server's dependencies, and does the whole client flow against a live
service: upload, preview, release, wait, history, ``PrivatePCA`` fit/transform, and the
``dpss-remote`` command.

Slow (about 20 s on idle cores, 40-55 s of venv and install on this project's busy 2-core
machines, more on a first run that fills the wheel cache), so it is marked ``slow``, and .ci/run
runs it as a step of its own. The default suite keeps the cheap half: the client's modules
import with the server's packages blocked.

The venv is made with ``python -m venv --without-pip`` (nothing in it but the interpreter) and
filled by this interpreter's pip (``pip --python``), from a wheel cache that is downloaded from
the package index once and reused (``DPSS_WHEELHOUSE``, default ``~/.cache/dpss-client-wheels``):
only the first run needs the registry. The client itself is built from the local path, by the
build backend its pyproject.toml names, in pip's isolated build environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import LiveService

ROOT = Path(__file__).resolve().parents[2]
CLIENT_DIR = ROOT / "clients" / "python"

#: Imported by the server, never needed to talk HTTP: none may be installed with the client.
SERVER_ONLY = (
    "fastapi",
    "starlette",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "scipy",
    "pyarrow",
    "uvicorn",
    "randomgen",
    "flint",
    "service",
)

#: The client flow, run by the slim venv's interpreter (``-I``: nothing from this checkout or
#: the environment on its path). Prints one JSON document for the test to check.
FLOW = r"""
import importlib.util, json, os, sys
import numpy as np
from dpss_client import Client, PrivatePCA

url = os.environ["DPSS_URL"]
rng = np.random.default_rng(0)
# Two strong directions (the first two axes) over weak noise; rows clipped to norm 1, the
# public bound declared at upload.
x = rng.normal(size=(3000, 8)) * np.r_[0.5, 0.35, np.full(6, 0.03)]
x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
out = {}
with Client(url, os.environ["OWNER_KEY"]) as owner:
    ds = owner.upload(x, name="slim", epsilon_budget="5", delta_budget="1e-4", row_norm_bound=1.0)
with Client(url, os.environ["ANALYST_KEY"]) as dpss:
    out["datasets"] = [str(d.id) for d in dpss.datasets()]
    preview = dpss.preview_release(ds.id, "analyze_gauss", 2, "0.5", "1e-6")
    out["preview"] = [preview.affordable, str(preview.epsilon_remaining)]
    out["budget_after_preview"] = str(dpss.budget(ds.id).epsilon_spent)
    handle = dpss.release(ds.id, "analyze_gauss", 2, "0.5", "1e-6")
    basis = handle.wait(timeout=120)
    out["release"] = [str(handle.id), handle.status, list(basis.shape)]
    pca = PrivatePCA(dpss, ds.id, n_components=2, epsilon="1", delta="1e-6",
                     center="private", timeout=120).fit()
    z = pca.transform(x[:5])
    out["pca"] = {
        "release": str(pca.release_id_),
        "components": list(pca.components_.shape),
        "z": list(z.shape),
        "ratio": pca.explained_variance_ratio_.tolist(),
        # The released plane against the true one (the first two axes): 2 when equal.
        "captured": float(np.sum(pca.components_[:, :2] ** 2)),
    }
    out["history"] = [str(r.id) for r in dpss.list_releases(dataset_id=ds.id)]
out["spent"] = str(Client(url, os.environ["OWNER_KEY"]).budget(ds.id).epsilon_spent)
out["dataset"] = str(ds.id)
out["loaded"] = sorted({name.split(".")[0] for name in sys.modules})
out["installed"] = {name: importlib.util.find_spec(name) is not None for name in sys.argv[1:]}
print(json.dumps(out))
"""


def _client_requirements() -> list[str]:
    project = tomllib.loads((CLIENT_DIR / "pyproject.toml").read_text())
    build: list[str] = project["build-system"]["requires"]
    runtime: list[str] = project["project"]["dependencies"]
    return [*build, *runtime]


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def wheelhouse() -> Path:
    """A directory of wheels for the client's build and runtime requirements, downloaded once
    per requirement list (a stamp file names it) and reused by later runs."""
    default = Path.home() / ".cache" / "dpss-client-wheels"
    where = Path(os.environ.get("DPSS_WHEELHOUSE", default))
    requirements = _client_requirements()
    listed = "\n".join(requirements) + "\n"
    stamp = where / f"requirements-{hashlib.sha256(listed.encode()).hexdigest()[:16]}"
    if not stamp.exists():
        where.mkdir(parents=True, exist_ok=True)
        _pip("download", "--quiet", "--dest", str(where), *requirements)
        stamp.write_text(listed)
    return where


@pytest.fixture(scope="module")
def slim_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty venv with only clients/python (and its requirements) installed; its bin/."""
    where = tmp_path_factory.mktemp("slim")
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources, and a
    # stale build/lib in the checkout would ship modules since deleted.
    source = shutil.copytree(
        CLIENT_DIR,
        where / "src",
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.pyc"),
    )
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    _pip(
        "--python",
        str(python),
        "install",
        "--quiet",
        "--no-index",
        "--find-links",
        str(wheelhouse()),
        str(source),
    )
    return venv / "bin"


def _run(command: list[str], live: LiveService, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Nothing of this checkout or of the test's venv reaches the slim interpreter.
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(cwd),
        "DPSS_URL": live.url,
        "OWNER_KEY": live.owner_key,
        "ANALYST_KEY": live.analyst_key,
    }
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


#: Imports every module of the distribution with the server's top-level packages made
#: unimportable, then names any of them that got loaded anyway.
BLOCKED_IMPORTS = r"""
import importlib, pkgutil, sys
blocked = set(sys.argv[1:])

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"the slim client imported {name}")
        return None

sys.meta_path.insert(0, Block())
import api_schemas, dpss_client
for package in (api_schemas, dpss_client):
    for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
print(sorted(blocked & {name.split(".")[0] for name in sys.modules}))
"""


def test_the_client_imports_nothing_of_the_server() -> None:
    """The default suite's guard (the slow test below installs the package for real)."""
    env = {**os.environ, "PYTHONPATH": str(CLIENT_DIR)}
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORTS, *SERVER_ONLY],
        env=env,
        cwd=CLIENT_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"])  # the client's packaging, not the database's
def test_the_client_installs_alone_and_runs_the_flow(
    slim_venv: Path, live_service: LiveService, tmp_path: Path
) -> None:
    result = _run(
        [str(slim_venv / "python"), "-I", "-c", FLOW, *SERVER_ONLY], live_service, tmp_path
    )
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)

    # Not installed, and not imported by anything the flow used.
    assert out["installed"] == dict.fromkeys(SERVER_ONLY, False)
    assert not set(out["loaded"]) & set(SERVER_ONLY)

    assert out["dataset"] in out["datasets"]
    assert out["preview"] == [True, "5"]
    assert out["budget_after_preview"] == "0"  # a preview charges nothing
    release_id, status, shape = out["release"]
    assert (status, shape) == ("succeeded", [8, 2])
    pca = out["pca"]
    assert pca["components"] == [2, 8] and pca["z"] == [5, 2]
    assert len(pca["ratio"]) == 2
    # The noise's spectral norm (~40 at this budget) is a tenth of the eigengap below the plane
    # (~360): sin(angle) <= ~0.1, so the plane is found.
    assert pca["captured"] > 1.9
    assert set(out["history"]) == {release_id, pca["release"]}
    assert out["spent"] == "1.5"

    # The console script of the slim package: the same remote commands as `dpss`.
    listed = _run(
        [
            str(slim_venv / "dpss-remote"),
            "releases",
            "list",
            "--url",
            live_service.url,
            "--api-key",
            live_service.analyst_key,
            "--json",
        ],
        live_service,
        tmp_path,
    )
    assert listed.returncode == 0, listed.stderr
    page = json.loads(listed.stdout)
    assert page["total"] == 2
    assert {item["id"] for item in page["items"]} == {release_id, pca["release"]}

    # Without the server, `dpss-remote` has no operator commands.
    serve = _run([str(slim_venv / "dpss-remote"), "serve"], live_service, tmp_path)
    assert serve.returncode == 2 and "No such command" in serve.stderr
