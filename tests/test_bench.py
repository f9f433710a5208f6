"""The benchmark harness's own pieces: data, one call, results, statistics (fast; CI also runs
``python -m bench --quick``)."""

from __future__ import annotations

import math
import re
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


def test_a_full_run_keeps_the_sections_standing_benches_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m bench`` rewrites docs/benchmarks.md: a section a standing bench wrote there
    itself (bench_prior.py, bench_highdim.py, ...) is carried as it is, markers included,
    and a section the run produces again is not doubled."""
    from bench import report

    page = (
        "# Benchmarks\n\n## Speed\n\nold speed\n\n"
        "<!-- prior:start -->\n## A public prior\n\n| a | b |\n<!-- prior:end -->\n\n"
        "## High dimension\n\nfigures\n\n## Raw results\n\ncsv\n"
    )
    (tmp_path / "benchmarks.md").write_text(page)
    monkeypatch.setattr(report, "DOCS", tmp_path)
    kept = "\n".join(report.carried_sections("## Speed\n\nnew speed"))
    assert "<!-- prior:start -->\n## A public prior\n\n| a | b |\n<!-- prior:end -->" in kept
    assert "## High dimension\n\nfigures" in kept
    assert "old speed" not in kept and "Raw results" not in kept
