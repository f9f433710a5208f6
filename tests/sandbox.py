"""The suite's sandbox: no test writes outside its temporary directories.

Loaded by ``tests/conftest.py`` (``pytest_plugins``). For the whole run, in the controller and
(inherited through the environment) in every xdist worker and every subprocess a test starts:

- ``HOME`` and the XDG base directories point into a temporary directory of the run, so a
  default path derived from the user's home (state, data, config, cache) lands there;
- ``DPSS_DATA_DIR`` points there too, so a command run with only a database URL set writes its
  anchors and files there, not into ``./dpss-data`` of whoever runs the suite;
- ``DPSS_BENCH_PEERS_DIR`` too (the benchmark peers' environments, ``~/.cache/dpss-bench-peers``
  in CI's bench step).

And the guard: the controller snapshots the repository tree (and ``./dpss-data`` of the
working directory, and every ``dpss`` entry of the *real* home's state, data, config and cache
directories) when the run starts, compares at the end, and fails the run naming every path
created, changed or removed. A snapshot is path -> (size, mtime): cheap, and a write that keeps
both is not a case this has to catch (the paths are written by mistake, not to hide).

Tool caches that pytest and its plugins keep on purpose (``.hypothesis``, ``.pytest_cache``,
``__pycache__``) and the wheel cache of ``tests/client/test_slim_install.py`` are not counted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest

#: Directory names never compared (caches the tools keep on purpose, and version control).
IGNORED_NAMES = frozenset(
    {
        ".git",
        ".hypothesis",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        "__pycache__",
        ".venv",
        "client-venv",
        "node_modules",
    }
)
#: The environment variable naming the run's sandbox (set by the controller, inherited).
SANDBOX_VARIABLE = "DPSS_TEST_SANDBOX"
#: The wheel cache that tests/client/test_slim_install.py keeps between runs, on purpose.
WHEELHOUSE_VARIABLE = "DPSS_WHEELHOUSE"
#: Where bench/peers builds the peers' environments.
PEERS_VARIABLE = "DPSS_BENCH_PEERS_DIR"
#: Subdirectories of a home where programs keep state by default.
HOME_STATE_DIRS = (".local/state", ".local/share", ".config", ".cache")

Snapshot = dict[str, tuple[int, int]]

_WRITTEN = pytest.StashKey[list[str]]()
_BEFORE = pytest.StashKey[Snapshot]()
_CREATED = pytest.StashKey[Path]()


def snapshot(roots: Iterable[Path], ignored: Iterable[Path] = ()) -> Snapshot:
    """Every file, directory and link under ``roots``: path -> (size, mtime in ns); for a
    directory (0, 0), as its mtime moves whenever an ignored cache in it changes."""
    skip = {str(path) for path in ignored}
    found: Snapshot = {}
    for root in roots:
        if not os.path.lexists(root):
            continue
        if str(root) in skip:
            continue
        found[str(root)] = _entry(str(root))
        if not root.is_dir() or root.is_symlink():
            continue
        for directory, subdirectories, files in os.walk(root):
            subdirectories[:] = [
                name
                for name in subdirectories
                if name not in IGNORED_NAMES
                and not name.endswith(".egg-info")
                and os.path.join(directory, name) not in skip
            ]
            for name in [*subdirectories, *files]:
                path = os.path.join(directory, name)
                if path in skip:
                    continue
                try:
                    found[path] = _entry(path)
                except FileNotFoundError:  # removed while walking
                    continue
    return found


def _entry(path: str) -> tuple[int, int]:
    status = os.lstat(path)
    if os.path.isdir(path) and not os.path.islink(path):
        return (0, 0)
    return (status.st_size, status.st_mtime_ns)


def differences(before: Snapshot, after: Snapshot) -> list[str]:
    """``created|changed|removed <path>`` for every path that differs, sorted by path."""
    lines = []
    for path in sorted(before.keys() | after.keys()):
        if path not in before:
            lines.append(f"created {path}")
        elif path not in after:
            lines.append(f"removed {path}")
        elif before[path] != after[path]:
            lines.append(f"changed {path}")
    return lines


def _home_roots(home: Path) -> list[Path]:
    """Every ``dpss`` entry directly in the home or in its state/data/config/cache
    directories: where a service or CLI keeps state when nothing names a directory. (The whole
    of those directories would also see other programs of the user that run meanwhile.)"""
    roots = []
    for parent in [home, *(home / part for part in HOME_STATE_DIRS)]:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        roots += [parent / name for name in names if "dpss" in name.lower()]
    return roots


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def _sandbox_environment() -> Path | None:
    """Point every default location of the service and the CLIs into the run's sandbox; the
    sandbox if this process made it."""
    if os.environ.get(SANDBOX_VARIABLE):  # a worker: the controller's, inherited
        return None
    real_home = Path(os.path.expanduser("~"))
    sandbox = Path(tempfile.mkdtemp(prefix="dpss-test-sandbox-"))
    os.environ.setdefault(WHEELHOUSE_VARIABLE, str(real_home / ".cache" / "dpss-client-wheels"))
    os.environ["DPSS_TEST_REAL_HOME"] = str(real_home)
    home = sandbox / "home"
    os.environ["HOME"] = str(home)
    for variable, part in (
        ("XDG_STATE_HOME", ".local/state"),
        ("XDG_DATA_HOME", ".local/share"),
        ("XDG_CONFIG_HOME", ".config"),
        ("XDG_CACHE_HOME", ".cache"),
    ):
        (home / part).mkdir(parents=True, exist_ok=True)
        os.environ[variable] = str(home / part)
    (sandbox / "dpss-data").mkdir()
    os.environ["DPSS_DATA_DIR"] = str(sandbox / "dpss-data")
    # The benchmark peers' environments (bench/peers): CI points this variable at
    # ~/.cache/dpss-bench-peers for its bench step; a test that builds one builds it here, even
    # when the variable is exported to the suite too.
    os.environ[PEERS_VARIABLE] = str(sandbox / "bench-peers")
    os.environ[SANDBOX_VARIABLE] = str(sandbox)
    return sandbox


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Before xdist starts its workers (pytest_sessionstart), so that they inherit it.
    created = _sandbox_environment()
    if created is not None:
        config.stash[_CREATED] = created
    if _is_controller(config):
        config.stash[_BEFORE] = _watched_snapshot(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    created = config.stash.get(_CREATED, None)
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)


def _watched_snapshot(config: pytest.Config) -> Snapshot:
    real_home = Path(os.environ["DPSS_TEST_REAL_HOME"])
    roots = [config.rootpath, Path.cwd() / "dpss-data", *_home_roots(real_home)]
    ignored = [Path(os.environ[WHEELHOUSE_VARIABLE])]
    if os.environ.get(SANDBOX_VARIABLE):
        ignored.append(Path(os.environ[SANDBOX_VARIABLE]))
    if config.option.basetemp:  # pytest's own temporary directories, wherever they were put
        ignored.append(Path(config.option.basetemp).resolve())
    return snapshot(dict.fromkeys(roots), ignored)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if not _is_controller(config) or _BEFORE not in config.stash:
        return
    written = differences(config.stash[_BEFORE], _watched_snapshot(config))
    config.stash[_WRITTEN] = written
    if written:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    config = terminalreporter.config
    skipped = _skip_reasons(terminalreporter.stats.get("skipped", []))
    if skipped:
        terminalreporter.section("skipped: these checks did not run", sep="!", yellow=True)
        for reason, count in skipped.items():
            terminalreporter.line(f"SKIPPED {count} test(s): {reason}", yellow=True, bold=True)
    written = config.stash.get(_WRITTEN, [])
    if written:
        terminalreporter.section(
            "tests wrote outside their temporary directories", sep="!", red=True
        )
        for line in written:
            terminalreporter.line(line, red=True, bold=True)
        terminalreporter.line(
            f"{len(written)} path(s) written outside the tests' temporary directories: "
            "a test must use tmp_path (or the sandbox's DPSS_DATA_DIR / HOME); this run fails. "
            "(Files you edited yourself while the suite ran count too.)",
            red=True,
            bold=True,
        )


def _skip_reasons(reports: Iterable[object]) -> dict[str, int]:
    """``reason -> count`` of the skipped tests (not those deselected by a marker)."""
    reasons: dict[str, int] = {}
    for report in reports:
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            reason = str(longrepr[2]).removeprefix("Skipped: ")
        else:
            reason = str(longrepr)
        reasons[reason] = reasons.get(reason, 0) + 1
    return reasons
