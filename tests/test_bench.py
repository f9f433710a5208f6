"""The benchmark harness's own pieces: data, one call, results, statistics (fast; CI also runs
``python -m bench --quick``)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bench import core
from bench.accuracy import gaussian_mean
from bench.core import (
    Outcome,
    Row,
    SlowGuard,
    basis_mechanisms,
    call,
    near_subspace,
    read_csv,
    reference,
    score,
    show,
    skipped_mechanisms,
    spread,
    write_csv,
)
from bench.speed import exponents
from service.mechanisms.linalg import subspace_distance
from service.mechanisms.noise import analytic_gaussian_sigma
from service.mechanisms.registry import MECHANISMS


def test_near_subspace_rows_are_at_the_stated_distance_and_within_the_bound() -> None:
    data, basis = near_subspace(500, 20, 3, 1e-3, seed=1)
    residual = data - (data @ basis) @ basis.T
    assert np.allclose(np.linalg.norm(residual, axis=1), 1e-3, rtol=1e-9)
    assert np.linalg.norm(data, axis=1).max() <= 1.0
    assert np.allclose(basis.T @ basis, np.eye(3), atol=1e-12)
    ref = reference(data, 3)
    assert subspace_distance(ref.top, basis) < 1e-2
    assert 0 < ref.gamma < 0.05
    shifted, basis = near_subspace(2_000, 20, 3, 1e-3, seed=1, mean_norm=0.5)
    assert np.linalg.norm(shifted.mean(axis=0)) > 0.4
    assert np.linalg.norm(shifted, axis=1).max() <= 1.0


def test_every_registered_mechanism_is_benchmarked_or_explained() -> None:
    scored, noted = set(basis_mechanisms()), set(skipped_mechanisms())
    assert scored | noted == set(MECHANISMS)
    assert not scored & noted
    assert "analyze_gauss" in scored and "spectrum" in noted


def test_call_runs_through_the_public_interface_and_scores() -> None:
    data, basis = near_subspace(4_000, 10, 2, 1e-2, seed=2)
    ref = reference(data, 2)
    outcome = call("analyze_gauss", data, 2, 1.0, 1e-6, seed=3, ref=ref)
    assert outcome.status == "succeeded" and outcome.basis is not None
    row = score(Row("t", "analyze_gauss", "x", 10, 4_000, 1e-2, 1.0, 1e-6, 2, 0, ""),
                outcome, data, ref, basis)  # fmt: skip
    assert row.error_planted < 0.5 and row.error_nonprivate < 0.5
    assert 0.5 < row.captured <= 1.0 + 1e-12


def test_a_refusal_is_recorded_as_refused_without_running() -> None:
    data, _ = near_subspace(100, 5, 2, 1e-2, seed=4)
    outcome = call("analyze_gauss", data, 6, 1.0, 1e-6, seed=5)  # k > d: the service's 422
    assert outcome.status == "refused" and outcome.reason.startswith("k:")
    assert outcome.basis is None


def test_histogram_runs_without_the_oracle_gap_and_old_oracle_rows_are_labelled() -> None:
    from bench.report import label_oracle

    data, _ = near_subspace(20_000, 5, 2, 1e-6, seed=6)
    ref = reference(data, 2)
    outcome = call("histogram_aggregate", data, 2, 1.0, 1e-6, seed=7, ref=ref)
    assert outcome.params == "defaults"  # no gamma passed, even with the true gap at hand
    assert outcome.status in ("succeeded", "no_result")
    old = Row("synthetic", "histogram_aggregate", "x", 5, 1, 0.0, 1.0, 1e-6, 2, 0, "succeeded",
              params="oracle gamma")  # fmt: skip
    new = Row("synthetic", "histogram_aggregate", "x", 5, 1, 0.0, 1.0, 1e-6, 2, 0, "succeeded",
              params="defaults")  # fmt: skip
    labelled = label_oracle(label_oracle([old, new]))  # idempotent: read twice, labelled once
    assert [r.mechanism for r in labelled] == [
        "histogram_aggregate (oracle gamma)", "histogram_aggregate",
    ]  # fmt: skip


def test_slow_guard_skips_only_slow_fruitless_cells() -> None:
    guard = SlowGuard(limit=1.0)
    guard.record("m", ("a",), Outcome("no_result", seconds=2.0))
    guard.record("m", ("b",), Outcome("succeeded", seconds=5.0))
    guard.record("m", ("c",), Outcome("no_result", seconds=0.5))
    assert "not repeated" in guard.skip("m", ("a",))
    assert guard.skip("m", ("b",)) == "" and guard.skip("m", ("c",)) == ""
    assert guard.skip("other", ("a",)) == ""


def test_spread_is_the_median_with_iqr_or_min_max() -> None:
    assert spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    median, q1, q3 = spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (median, q1, q3) == (3.0, 2.0, 4.0)
    assert math.isnan(spread([math.nan])[0])
    assert show([0.5]) == "0.5" and show([]) == "—"


def test_csv_round_trip(tmp_path: Path) -> None:
    row = Row("s", "m", "d", 10, 100, 1e-5, 0.1, 1e-6, 3, 1, "no_result", reason="why, exactly")
    write_csv(tmp_path / "r.csv", [row])
    (back,) = read_csv(tmp_path / "r.csv")
    assert back.status == "no_result" and back.d == 10 and back.distance == 1e-5
    assert math.isnan(back.error_planted) and back.reason == "why, exactly"


def test_exponents_recover_a_power_law() -> None:
    rows = []
    for n in (1_000, 2_000, 4_000):
        for d in (10, 20, 40):
            r = Row("speed", "m", "x", d, n, 0, 1, 1e-6, 3, 0, "succeeded")
            r.seconds = 1e-9 * n * d**2
            rows.append(r)
    in_n, in_d = exponents(rows, n=4_000, d_fixed=20)["m"]
    assert in_n == pytest.approx(1.0, abs=1e-9) and in_d == pytest.approx(2.0, abs=1e-9)


def test_gaussian_mean_noise_has_the_calibrated_scale() -> None:
    n, dim = 1_000, 400
    points = np.zeros((n, dim))
    noisy = gaussian_mean(points, 1.0, 1.0, 1e-6, np.random.default_rng(6))
    sigma = analytic_gaussian_sigma(2.0 / n, 1.0, 1e-6)
    assert np.std(noisy) == pytest.approx(sigma, rel=0.15)


def test_peers_only_runs_neither_the_floor_nor_the_mechanisms() -> None:
    from bench.accuracy import SyntheticGrid, synthetic

    grid = SyntheticGrid(
        ds=(10,), distances=(1e-3,), ns=(500,), epsilons=(1.0,), reps=1, peers_only=True
    )
    assert synthetic(grid, None) == []  # no peer environments: nothing at all


def test_a_closed_peer_build_leaves_no_process_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer environment's build still running when the harness ends is killed with every
    process it started. The harness killed (at a time-out) only its direct child, and a daemon
    thread's build outlived the harness: venv's ensurepip, or pip building a source package,
    went on writing into ``~/.cache/dpss-bench-peers`` while CI's test suite ran next."""
    import subprocess
    import sys
    import threading
    import time

    import psutil

    from bench import peers

    monkeypatch.setattr(peers, "REQUIREMENTS", {})  # no build of a real peer
    monkeypatch.setattr(peers, "PEER_DIR", tmp_path / "peers")
    pid_file = tmp_path / "grandchild.pid"
    # A stand-in for `python -m venv`: it starts a child of its own (its ensurepip) that
    # would write into the environment long after, and waits for it.
    script = (
        "import subprocess, sys, pathlib; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid)); child.wait()"
    )
    envs = peers.PeerEnvs(build_timeout=600.0)
    failures: list[BaseException] = []

    def build() -> None:
        try:
            envs._run([sys.executable, "-c", script])
        except BaseException as error:  # the killed build's error, read below
            failures.append(error)

    thread = threading.Thread(target=build)
    thread.start()
    deadline = time.monotonic() + 60  # a hang guard, not a speed requirement
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and thread.is_alive(), failures
        time.sleep(0.02)
    grandchild = int(pid_file.read_text())
    envs.close()
    thread.join(60)
    assert not thread.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], subprocess.CalledProcessError)

    def gone() -> bool:
        try:
            return psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    while not gone():
        assert time.monotonic() < deadline, "the build's own child outlived the harness"
        time.sleep(0.02)


def test_haar_basis_is_orthonormal_seeded_and_uniform() -> None:
    from bench.accuracy import haar_basis

    basis = haar_basis(20, 3, 7)
    assert np.allclose(basis.T @ basis, np.eye(3))
    assert np.array_equal(basis, haar_basis(20, 3, 7))
    # Uniform on the Grassmannian: E ||P x||^2 = k/d for a fixed unit x.
    e1 = np.eye(20)[0]
    share = np.mean([np.sum((haar_basis(20, 3, s).T @ e1) ** 2) for s in range(2000)])
    assert share == pytest.approx(3 / 20, abs=0.02)


def test_real_section_has_a_random_baseline_row_per_epsilon_and_repetition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench import accuracy

    monkeypatch.setattr(accuracy, "basis_mechanisms", lambda: {})  # the baseline alone
    rows = accuracy.real(("wine",), (0.5, 1.0), 2, None, (), 15.0)
    random_rows = [r for r in rows if r.mechanism == accuracy.RANDOM]
    assert len(random_rows) == 2 * 2 * 2  # centred or not, 2 epsilons, 2 repetitions
    assert all(r.status == "succeeded" and 0 < r.captured < 1 for r in random_rows)


def test_no_peers_builds_no_peer_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.__main__ as harness
    from bench.accuracy import SyntheticGrid

    def refuse(*args: object) -> None:
        raise AssertionError("PeerEnvs built with --no-peers")

    monkeypatch.setattr(harness, "PeerEnvs", refuse)
    # One mechanism is enough to run the section (all of them took 20 s, asserting nothing more).
    monkeypatch.setattr(core, "ONLY_MECHANISMS", frozenset({"analyze_gauss"}))
    grid = SyntheticGrid(ds=(10,), distances=(1e-3,), ns=(500,), epsilons=(1.0,), reps=1)
    config = harness.Config(**{
        **harness.QUICK.__dict__, "synthetic": grid, "sections": ("synthetic",),
        "real_peer_epsilons": (),
    })  # fmt: skip
    assert harness.run(config, None)["synthetic"]


def _run_peer_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, behaviour: dict[int, str], done: str = ""
) -> dict[int, dict[str, object]]:
    """The peer worker on three fits (groups a, a, b) with a fake library: ``behaviour`` says
    per fit whether it ``succeeds``, hits its ``alarm``, or has the alarm ``wrapped``."""
    import json
    import sys

    from bench.peers import _read_results, worker

    np.save(tmp_path / "x.npy", np.eye(4))
    jobs = [
        {"id": i, "data": str(tmp_path / "x.npy"), "k": 1, "epsilon": 1.0, "norm": 1.0,
         "centered": True, "seed": i, "limit": 30.0, "out": str(tmp_path / f"o{i}.npy"),
         "group": group}
        for i, group in enumerate("aab")
    ]  # fmt: skip
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    results = tmp_path / "results.jsonl"
    results.write_text(done)

    def fake(
        data: np.ndarray, k: int, eps: float, norm: float, centred: bool, seed: int
    ) -> np.ndarray:
        if behaviour[seed] == "alarm":
            raise worker.FitTimeout
        if behaviour[seed] == "wrapped":  # the library caught the alarm and raised its own
            worker._fired = True
            raise RuntimeError("Exception in user-defined function")
        return np.eye(4)[:, :1]

    monkeypatch.setattr(worker, "fit_diffprivlib", fake)
    args = ["worker.py", "diffprivlib", str(tmp_path / "jobs.json"), str(results)]
    monkeypatch.setattr(sys, "argv", args)
    worker.main()
    return _read_results(results)


def test_peer_worker_skips_a_cells_later_repetitions_after_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = _run_peer_worker(tmp_path, monkeypatch, {0: "wrapped", 1: "ok", 2: "ok"})
    assert [got[i]["status"] for i in range(3)] == ["timeout", "skipped", "succeeded"]


def test_peer_worker_resumes_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The harness killed the worker stuck in fit 0 and wrote its time-out: fit 0 is not run
    # again, fit 1 (same cell) is skipped, fit 2 runs.
    done = '{"id": 0, "status": "timeout", "seconds": 61.0, "reason": "stuck"}\n'
    got = _run_peer_worker(tmp_path, monkeypatch, {0: "ok", 1: "ok", 2: "alarm"}, done)
    assert got[0]["reason"] == "stuck"
    assert [got[i]["status"] for i in range(3)] == ["timeout", "skipped", "timeout"]


def test_a_peer_worker_stuck_without_results_is_killed_after_its_cpu_allowance(
    tmp_path: Path,
) -> None:
    import sys
    import time

    from bench.peers import _run_worker

    spin = [sys.executable, "-c", "while True: pass"]
    stuck = _run_worker(spin, tmp_path / "none.jsonl", 0, 0.5, time.monotonic() + 60)
    assert stuck is not None and stuck > 0.5
    quiet = [sys.executable, "-c", "pass"]
    assert _run_worker(quiet, tmp_path / "none.jsonl", 0, 0.5, time.monotonic() + 60) is None


def test_every_bench_script_is_described_and_every_cited_one_exists() -> None:
    """bench/README.md names each script of bench/, and every ``bench/...py`` path (or
    ``python -m bench....`` module) the docs, the README and CI cite is there, or is marked as
    removed with the commit that still has it (issue 33: one-off experiments leave the tree once
    the docs record their figures; where git has that commit, the file must be in it)."""
    root = Path(__file__).resolve().parents[1]
    readme = (root / "bench" / "README.md").read_text()
    scripts = [p for p in (root / "bench").rglob("*.py") if p.name != "__init__.py"]
    scripts = [p for p in scripts if not {"peers", "results"} & set(p.parts)]
    assert [p.name for p in scripts if f"`{p.name}`" not in readme] == []
    pages = [
        root / "README.md",
        root / ".ci" / "run",
        *(root / "docs").glob("*.md"),
        root / "bench" / "README.md",
    ]
    cite = re.compile(r"bench/[\w/]+\.py|(?<=-m )bench(?:\.\w+)+")
    # After the citation: the rest of its code span, if any, then the marker.
    removed = re.compile(
        r"(?:[^`]{0,200}?`)?\s*\(removed; in git history at commit ([0-9a-f]{7,40})\)"
    )
    missing, unproven = [], []
    for page in pages:
        text = page.read_text()
        for match in cite.finditer(text):
            path = match.group(0)
            if not path.endswith(".py"):
                path = path.replace(".", "/") + ".py"
            if (root / path).is_file():
                continue
            marker = removed.match(text, match.end())
            if marker is None:
                missing.append((page.name, path))
            elif not _in_commit(root, marker.group(1), path):
                unproven.append((page.name, path, marker.group(1)))
    assert missing == []
    assert unproven == []


def _in_commit(root: Path, commit: str, path: str) -> bool:
    """Whether ``commit`` has ``path``; true when this checkout cannot tell (no git, or a shallow
    clone without that commit), so that a commit without the file, or one a full clone does not
    have, fails."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (root / ".git").exists():
        return True
    has = subprocess.run(
        ["git", "-C", str(root), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    if has.returncode != 0:
        shallow = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-shallow-repository"],
            capture_output=True,
            text=True,
        )
        return shallow.stdout.strip() == "true"
    found = subprocess.run(
        ["git", "-C", str(root), "cat-file", "-e", f"{commit}:{path}"], capture_output=True
    )
    return found.returncode == 0


#: A generated block of docs/benchmarks.md, markers included.
_BLOCK = re.compile(
    r"^<!-- generated:([\w-]+):start -->$.*?^<!-- generated:\1:end -->$", flags=re.M | re.S
)


def _stub_plots(doc: str) -> Callable[[object], list[tuple[str, str]]]:
    """``report.plots`` without drawing: the images the page links (the text is under test)."""
    images = [
        (name, caption) for caption, name in re.findall(r"^!\[(.*)\]\(img/(.*)\)$", doc, re.M)
    ]
    return lambda results: images


def test_report_keeps_every_hand_written_line_of_the_page_and_a_second_run_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m bench --report`` on the repo's CSVs, into a copy of docs/benchmarks.md: every
    line outside the ``generated:NAME`` blocks (the conclusions, the measurement sections
    written by hand, the standing benches' sections) comes back as it was, in order; every
    block is still there, the machine's as it was (the CSVs were measured there); a second run
    gives the same bytes. (Before: the rebuild dropped about 2,200 hand-written lines.)"""
    from bench import report
    from bench.__main__ import SECTIONS

    page = (core.DOCS / "benchmarks.md").read_text()
    (tmp_path / "benchmarks.md").write_text(page)
    monkeypatch.setattr(report, "DOCS", tmp_path)
    monkeypatch.setattr(report, "IMG", tmp_path / "img")
    monkeypatch.setattr(report, "plots", _stub_plots(page))
    loaded: dict[str, list[Row]] = {}
    for section in SECTIONS:
        for path in sorted(core.RESULTS.glob(f"{section}*.csv")):
            loaded.setdefault(section, []).extend(report.label_oracle(read_csv(path)))
    load_test = core.RESULTS / "load_test.txt"
    load_text = load_test.read_text() if load_test.exists() else ""

    report.write(loaded, load_text, None, measured=False)
    once = (tmp_path / "benchmarks.md").read_text()
    hand = _BLOCK.sub("", page).splitlines()
    assert len(hand) > 2_000
    assert _BLOCK.sub("", once).splitlines() == hand
    blocks = {m.group(1): m.group(0) for m in _BLOCK.finditer(page)}
    assert {m.group(1) for m in _BLOCK.finditer(once)} == set(blocks)
    assert blocks["machine"] in once
    report.write(loaded, load_text, None, measured=False)
    assert (tmp_path / "benchmarks.md").read_text() == once


def test_report_rewrites_only_its_blocks_and_adds_a_missing_one_before_the_raw_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block is replaced in place; a standing bench's section (its own markers), a hand-written
    section, a line quoting a marker in prose and a block this run has no rows for are kept as
    they are; a block the page lacks goes before the raw results; an unclosed marker is an
    error that leaves the page alone."""
    from bench import report

    page = (
        "# Benchmarks\n\nhand intro\n\n"
        "<!-- generated:speed:start -->\n## Speed\n\nold speed\n<!-- generated:speed:end -->\n\n"
        "Prose quoting the marker `<!-- generated:raw-results:start -->` inline.\n\n"
        "<!-- prior:start -->\n## A public prior\n\n| a | b |\n<!-- prior:end -->\n\n"
        "## High dimension\n\nfigures\n\n"
        "<!-- generated:raw-results:start -->\n## Raw results\n\nold\n"
        "<!-- generated:raw-results:end -->\n\nhand tail\n"
    )
    (tmp_path / "benchmarks.md").write_text(page)
    (tmp_path / "results").mkdir()
    monkeypatch.setattr(report, "DOCS", tmp_path)
    monkeypatch.setattr(report, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(report, "plots", lambda results: [])
    report.write({}, "", None, measured=False)
    once = (tmp_path / "benchmarks.md").read_text()
    kept = [
        "# Benchmarks\n\nhand intro\n\n",
        "<!-- generated:speed:start -->\n## Speed\n\nold speed\n<!-- generated:speed:end -->",
        "Prose quoting the marker `<!-- generated:raw-results:start -->` inline.\n\n",
        "<!-- prior:start -->\n## A public prior\n\n| a | b |\n<!-- prior:end -->\n\n",
        "## High dimension\n\nfigures\n\n",
        "<!-- generated:raw-results:end -->\n\nhand tail\n",
    ]
    assert all(piece in once for piece in kept)
    assert "\nold\n" not in once and "one row per run" in once
    assert once.index("## High dimension") < once.index("<!-- generated:machine:start -->")
    assert once.index("<!-- generated:machine:end -->") < once.index("\n## Raw results")
    report.write({}, "", None, measured=False)
    assert (tmp_path / "benchmarks.md").read_text() == once

    broken = "# B\n\n<!-- generated:speed:start -->\n## Speed\n\nhand text after it\n"
    (tmp_path / "benchmarks.md").write_text(broken)
    with pytest.raises(ValueError, match="generated:speed:end"):
        report.write({}, "", None, measured=False)
    assert (tmp_path / "benchmarks.md").read_text() == broken


def _fake_sorted_sample(directory: Path) -> None:
    """A cached sample laid out as the real file is (500 of each digit, sorted by label), each
    image carrying its label in pixel ``label`` so a split's labels can be read off its rows."""
    labels = np.repeat(np.arange(10), 500)
    images = np.ones((5000, 784))
    images[np.arange(5000), labels] = 255.0
    np.savez(directory / "mnist_5k.npz", images=images, labels=labels)


def _digit_counts(labels: np.ndarray) -> np.ndarray:
    return np.bincount(labels, minlength=10)


@pytest.mark.parametrize("real", [False, True], ids=["sorted-stand-in", "cached-sample"])
def test_no_mnist_prefix_or_split_is_a_run_of_a_few_digits(
    real: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bench_highdim took load_mnist()'s first 4,000 rows, the digits 0-7 only (the file is sorted
    # by label): load_mnist() returned that order, and every count of 8s and 9s here was 0.
    from bench import mnist

    if real:
        # The sandbox moves HOME; the benches' cache is under the real one (read, not written).
        home = Path(os.environ.get("DPSS_TEST_REAL_HOME", str(Path.home())))
        default = home / ".cache" / "dpss-bench-data"
        cache = Path(os.environ.get("DPSS_BENCH_DATA_DIR", str(default))) / "mnist_5k.npz"
        if not cache.exists():
            pytest.skip("the MNIST sample is not cached (no network in the tests)")
        monkeypatch.setenv("DPSS_BENCH_DATA_DIR", str(cache.parent))
    else:
        monkeypatch.setenv("DPSS_BENCH_DATA_DIR", str(tmp_path))
        _fake_sorted_sample(tmp_path)
    loaded = mnist.load_mnist()
    assert loaded is not None
    images, labels = loaded
    # 4,000 of 5,000 drawn at random: each digit's count has sd about 9 around 400.
    assert np.all(np.abs(_digit_counts(labels[:4000]) - 400) < 60)
    assert np.all(np.abs(_digit_counts(labels[:1000]) - 100) < 40)
    if not real:
        assert np.array_equal(np.argmax(images, axis=1), labels)
        for seed in (0, 1000, 2000, 2009):
            split = mnist.mnist_split(seed, unit=False)
            assert split is not None
            private, rest = split
            assert private.shape == (4000, 784) and rest.shape == (1000, 784)
            assert np.all(np.abs(_digit_counts(np.argmax(private, axis=1)) - 400) < 60)
            unit = mnist.mnist_split(seed)
            assert unit is not None
            assert np.allclose(np.linalg.norm(unit[0], axis=1), 1.0)
            assert np.allclose(unit[0], mnist.unit_rows(private))


def test_no_bench_reads_the_mnist_sample_but_through_its_module() -> None:
    # The label-sorted file is read only inside bench/mnist.py; a bench draws rows with
    # mnist_split (a public seed) or takes load_mnist()'s public random order whole.
    bench = Path(__file__).resolve().parent.parent / "bench"
    for path in sorted(bench.rglob("*.py")):
        if path.name == "mnist.py":
            continue
        text = path.read_text()
        assert "_label_sorted_sample" not in text, path
        assert "mnist_5k" not in text, path
        for match in re.finditer(r"load_mnist\(\)[^\n]*", text):
            assert "[:" not in match.group(0), (path, match.group(0))


def test_forecast_coverage_binomial_reading_rejects_only_what_20_runs_can_show() -> None:
    from bench.bench_forecast_coverage import binomial_reading, cover_test, holm

    # 17 of 20 (0.85) happens with chance 0.32 under exactly 90% coverage: no evidence.
    assert cover_test(17, 20) == pytest.approx(0.3231, abs=1e-4)
    assert cover_test(12, 20) < 0.001
    # Holm: the smallest p against alpha / 3, the next against alpha / 2, stops at the first keep.
    assert holm([0.001, 0.02, 0.03]) == [True, True, True]
    assert holm([0.001, 0.04, 0.03]) == [True, False, False]
    table = [
        {"data": "a", "k": 1, "source": 1.0, "target": 0.1, "runs": 20, "cover": 0.85},
        {"data": "a", "k": 2, "source": 1.0, "target": 0.1, "runs": 20, "cover": 0.5},
        {"data": "b", "k": 1, "source": 1.0, "target": 0.1, "runs": 20, "cover": 1.0},
    ]
    lines = binomial_reading(table)
    assert any(line.startswith("low: a k 2") and "rejects after Holm" in line for line in lines)
    assert not any(line.startswith("low: a k 1") for line in lines)
    assert "| a | 2 | 1 | 1 | 0.675 | 40 |" in "\n".join(lines)
