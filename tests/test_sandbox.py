"""The suite's sandbox and guard (tests/sandbox.py), run on inner pytest sessions: a test that
writes into the repository, ``./dpss-data`` or a ``dpss`` directory of the home fails the run
(also under xdist, reported once by the controller); the CLIs' defaults land in the sandbox;
every skip is named at the end of the run."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest_plugins = ["pytester"]


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An inner run's environment: this checkout importable, a home of its own to watch."""
    paths = [str(ROOT), str(ROOT / "clients" / "python"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path for path in paths if path))
    home = tmp_path / "real-home"
    (home / ".local" / "state").mkdir(parents=True)
    monkeypatch.setenv("DPSS_TEST_REAL_HOME", str(home))
    # Only the plugins the inner runs are about (the guard, xdist: ``_run``): the installed
    # ones (schemathesis, hypothesis, anyio) cost ~1.4 s of imports in every inner process, 3
    # of them per ``-n 2`` run, and none of these checks is about them. That they write nothing
    # into the repository is checked by the guard of this very run, which loads them all.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return home


def _write(pytester: pytest.Pytester, name: str, source: str) -> Path:
    """A test file in the inner run's repository, ``repo/`` (pytester keeps its own files,
    the run's output among them, beside it)."""
    repo = pytester.path / "repo"
    repo.mkdir(exist_ok=True)
    (repo / name).write_text(textwrap.dedent(source))
    return repo


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-p",
        "xdist.plugin",
        "-p",
        "tests.sandbox",
        "-p",
        "no:cacheprovider",
        "--rootdir=repo",
        "repo",
        *args,
    )


def test_a_test_that_writes_into_the_repository_fails_the_run(
    pytester: pytest.Pytester, inner: Path
) -> None:
    repo = _write(
        pytester,
        "test_writes.py",
        """
        from pathlib import Path

        def test_strays(request):
            (request.config.rootpath / "dpss-data").mkdir()
            (request.config.rootpath / "dpss-data" / "audit-anchors.jsonl").write_text("{}")

        def test_clean(tmp_path):
            (tmp_path / "fine.txt").write_text("x")
        """,
    )
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    output = result.stdout.str()
    assert "2 passed" in output
    assert f"created {repo / 'dpss-data' / 'audit-anchors.jsonl'}" in output
    assert "written outside the tests' temporary directories" in output
    assert "fine.txt" not in output


def test_a_changed_file_and_a_dpss_directory_of_the_home_fail_the_run(
    pytester: pytest.Pytester, inner: Path
) -> None:
    repo = _write(
        pytester,
        "test_writes.py",
        f"""
        from pathlib import Path

        def test_home():
            state = Path({str(inner)!r}) / ".local" / "state" / "dpss"
            state.mkdir()
            (state / "audit-anchors.jsonl").write_text("{{}}")

        def test_changes(request):
            (request.config.rootpath / "kept.txt").write_text("after, longer")
        """,
    )
    (repo / "kept.txt").write_text("before")
    output = _run(pytester).stdout.str()
    assert f"created {inner / '.local' / 'state' / 'dpss'}" in output
    assert f"changed {repo / 'kept.txt'}" in output


def test_under_xdist_the_controller_reports_once(pytester: pytest.Pytester, inner: Path) -> None:
    repo = _write(
        pytester,
        "test_writes.py",
        """
        import pytest

        @pytest.mark.parametrize("n", range(4))
        def test_strays(request, n):
            (request.config.rootpath / f"stray-{n}.txt").write_text("x")
        """,
    )
    result = _run(pytester, "-n", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    output = result.stdout.str()
    assert all(output.count(f"created {repo / f'stray-{n}.txt'}") == 1 for n in range(4))


def test_default_locations_are_in_the_sandbox(pytester: pytest.Pytester, inner: Path) -> None:
    """The service's defaults (``DPSS_DATA_DIR``, anything under HOME or XDG) point into the
    run's sandbox, in the workers too; a clean run passes."""
    _write(
        pytester,
        "test_defaults.py",
        f"""
        import os
        from pathlib import Path

        def test_defaults():
            sandbox = Path(os.environ["DPSS_TEST_SANDBOX"])
            assert Path(os.environ["DPSS_DATA_DIR"]).is_relative_to(sandbox)
            assert Path(os.environ["XDG_STATE_HOME"]).is_relative_to(sandbox)
            assert Path(os.environ["XDG_CONFIG_HOME"]).is_relative_to(sandbox)
            assert not Path(os.environ["XDG_STATE_HOME"]).is_relative_to(Path({str(inner)!r}))
        """,
    )
    for args in ((), ("-n", "2")):
        result = _run(pytester, *args)
        assert result.ret == pytest.ExitCode.OK, result.stdout.str()


def test_this_run_is_in_the_sandbox() -> None:
    sandbox = Path(os.environ["DPSS_TEST_SANDBOX"])
    assert Path(os.environ["DPSS_DATA_DIR"]).is_relative_to(sandbox)
    assert Path.home().is_relative_to(sandbox)
    # The benchmark peers' environments too, as bench/peers read the variable at import.
    from bench import peers

    assert peers.PEER_DIR.is_relative_to(sandbox)
    assert sys.prefix  # the interpreter is untouched: only where things are written moved


def test_every_skip_is_named_at_the_end(pytester: pytest.Pytester, inner: Path) -> None:
    _write(
        pytester,
        "test_skips.py",
        """
        import pytest

        @pytest.mark.skipif(True, reason="chromium is not installed")
        @pytest.mark.parametrize("n", range(3))
        def test_browser(n):
            pass

        def test_other():
            pytest.skip("no GPU")
        """,
    )
    result = _run(pytester, "-n", "2")
    assert result.ret == pytest.ExitCode.OK
    lines = result.stdout.lines
    assert "SKIPPED 3 test(s): chromium is not installed" in lines
    assert "SKIPPED 1 test(s): no GPU" in lines
    # After the short summary, at the very end, next to the totals.
    assert lines.index("SKIPPED 1 test(s): no GPU") > len(lines) - 6
