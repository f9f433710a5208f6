"""Each optional extra carries what its command imports: after ``pip install -e '.[bench]'``,
``python -m bench`` runs (it failed on ``No module named 'psutil'``), and ``.[test]`` runs the
suite. Checked by parsing every import of ``bench/`` and ``tests/`` and mapping it to the
distribution that provides it in this environment."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = {"service", "api_schemas", "dpss_client", "tests", "bench", "scripts"}
#: Code that runs in an environment of its own (bench/peers builds one per peer with pip).
OWN_ENVIRONMENT = {ROOT / "bench" / "peers" / "worker.py"}


def requirement_names(requirements: list[str]) -> set[str]:
    return {
        re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements
    }


def imported_modules(folder: Path) -> dict[str, Path]:
    """Top-level modules imported by the files under ``folder`` (absolute imports only)."""
    local = {path.stem for path in folder.rglob("*.py")}
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*.py")):
        if path in OWN_ENVIRONMENT:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in FIRST_PARTY or top in local:
                    continue
                found.setdefault(top, path)
    return found


def missing_from(extra: str, folder: str) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    allowed = requirement_names(project["dependencies"])
    allowed |= requirement_names(project["optional-dependencies"][extra])
    # What the runtime dependencies bring (pydantic-core with pydantic, ...) counts too.
    for name in list(allowed):
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        allowed |= requirement_names([r for r in requires if "extra ==" not in r])
    providers = importlib.metadata.packages_distributions()
    missing = []
    for module, path in sorted(imported_modules(ROOT / folder).items()):
        distributions = {d.lower().replace("_", "-") for d in providers.get(module, [module])}
        if not distributions & allowed:
            missing.append(
                f"{module} ({', '.join(sorted(distributions))}; {path.relative_to(ROOT)})"
            )
    return missing


@pytest.mark.parametrize(("extra", "folder"), [("bench", "bench"), ("test", "tests")])
def test_each_extra_carries_what_its_code_imports(extra: str, folder: str) -> None:
    assert missing_from(extra, folder) == []
