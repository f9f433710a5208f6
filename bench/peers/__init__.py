"""The peers a user would pick instead: IBM diffprivlib's PCA and OpenDP's PCA.

Each runs in its own virtual environment under ``bench/.peers/<peer>`` (gitignored), which the
harness creates on first use with pip (diffprivlib 0.6.6 imports only with scikit-learn 1.6,
which the service's environment does not have). Fits run in a subprocess
(``bench/peers/worker.py``) with a per-fit limit on CPU time (not wall time: on a shared core a
wall-clock limit would time out fits that only waited for the CPU); a time-out or an error is a
result (``timeout``, ``failed``), and an environment that cannot be built (no network) makes the
peer ``unavailable`` rather than failing the run.

Privacy of the peers at equal epsilon: both are **pure** epsilon-DP (delta = 0), where the
service's mechanisms run at ``delta = 1e-6``. diffprivlib's PCA samples eigenvectors with
Amin et al.'s Bingham sampler (rejection sampling; its run time grows quickly with the
spectrum's concentration and with d); OpenDP's is the same algorithm, and always centres on a
private mean that takes part of the budget.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.core import ROOT, Outcome

#: Where the environments are cached (``DPSS_BENCH_PEERS_DIR`` moves them, e.g. out of a clone).
PEER_DIR = Path(os.environ.get("DPSS_BENCH_PEERS_DIR", ROOT / "bench" / ".peers"))
WORKER = Path(__file__).resolve().parent / "worker.py"

#: pip requirements of each peer's environment (pinned: the figures are for these versions).
REQUIREMENTS: dict[str, list[str]] = {
    "diffprivlib": ["diffprivlib==0.6.6", "scikit-learn==1.6.*"],
    "opendp": ["opendp[scikit-learn]==0.16.0"],
}
#: How each peer's privacy differs from the service's at the same epsilon.
PRIVACY = {
    "diffprivlib": "pure epsilon-DP (delta = 0); Bingham sampler (Amin et al. 2019)",
    "opendp": "pure epsilon-DP (delta = 0); Amin et al. 2019, always centred on a private mean",
}


@dataclass
class Env:
    """A peer's environment: its python, or why it is unavailable."""

    python: Path | None
    reason: str = ""


class PeerEnvs:
    """Builds the peers' environments in background threads (they install while the service's
    mechanisms run) and hands each out when it is needed."""

    def __init__(self, build_timeout: float) -> None:
        self.build_timeout = build_timeout
        self._envs: dict[str, Env] = {}
        #: The build commands running now (each the leader of a process group of its own).
        self._running: set[subprocess.Popen[str]] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._threads = {
            peer: threading.Thread(target=self._build, args=(peer,), daemon=True)
            for peer in REQUIREMENTS
        }
        for thread in self._threads.values():
            thread.start()

    def _build(self, peer: str) -> None:
        target = PEER_DIR / peer
        python = target / "bin" / "python"
        marker = target / "requirements.txt"
        wanted = "\n".join(REQUIREMENTS[peer]) + "\n"
        if python.exists() and marker.exists() and marker.read_text() == wanted:
            self._envs[peer] = Env(python)
            return
        try:
            shutil.rmtree(target, ignore_errors=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            self._run([sys.executable, "-m", "venv", "--clear", str(target)])
            self._run(
                [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 *REQUIREMENTS[peer]],
            )  # fmt: skip
            marker.write_text(wanted)
            self._envs[peer] = Env(python)
        except subprocess.TimeoutExpired:
            self._envs[peer] = Env(None, f"environment not built in {self.build_timeout:.0f} s")
        except subprocess.CalledProcessError as error:
            stderr = error.stderr if isinstance(error.stderr, str) else ""
            tail = stderr.strip().splitlines()[-1:] or ["pip failed"]
            self._envs[peer] = Env(None, f"environment could not be built: {tail[0][:150]}")
        except OSError as error:
            self._envs[peer] = Env(None, f"environment could not be built: {error}")

    def _run(self, command: list[str]) -> None:
        """``command`` in a process group of its own, killed with every process it started if it
        outlives the build's time-out or the harness closes: a time-out killed only the
        direct child, and ``venv``'s ``ensurepip`` or pip's build of a source package went on
        writing into the environment's directory after the harness had ended (CI builds them
        under ``~/.cache/dpss-bench-peers`` just before the test suite, whose sandbox then saw
        that directory change)."""
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        with self._lock:
            if self._closed:
                _kill_group(process)
            self._running.add(process)
        try:
            stdout, stderr = process.communicate(timeout=self.build_timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.communicate()
            raise
        finally:
            with self._lock:
                self._running.discard(process)
        if process.returncode:
            raise subprocess.CalledProcessError(process.returncode, command, stdout, stderr)

    def get(self, peer: str) -> Env:
        self._threads[peer].join()
        return self._envs[peer]

    def close(self) -> None:
        """Stop the builds still running (a peer no section asked for) with all their
        processes, and wait for the build threads: nothing of the harness writes after it."""
        with self._lock:
            self._closed = True
            for process in self._running:
                _kill_group(process)
        for thread in self._threads.values():
            thread.join()


def _kill_group(process: subprocess.Popen[str]) -> None:
    """Kill ``process`` and every process of its group (it leads one: ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError):  # the group has ended
        os.killpg(process.pid, signal.SIGKILL)


@dataclass
class Fit:
    """One peer fit to run."""

    data: np.ndarray
    k: int
    epsilon: float
    norm: float
    centered: bool
    seed: int
    #: Fits of one cell (its repetitions) share a group: after a time-out the rest are skipped.
    group: str = ""


def fit_all(env: Env, peer: str, fits: list[Fit], limit: float) -> list[Outcome]:
    """Run ``fits`` with ``peer`` in one subprocess, each with ``limit`` seconds."""
    if env.python is None:
        return [Outcome("unavailable", reason=env.reason) for _ in fits]
    with tempfile.TemporaryDirectory(prefix="dpss-peer-") as tmp:
        work = Path(tmp)
        jobs = []
        saved: dict[int, str] = {}
        for i, fit in enumerate(fits):
            key = id(fit.data)
            if key not in saved:
                saved[key] = str(work / f"data{len(saved)}.npy")
                np.save(saved[key], fit.data)
            jobs.append(
                {"id": i, "data": saved[key], "k": fit.k, "epsilon": fit.epsilon,
                 "norm": fit.norm, "centered": fit.centered, "seed": fit.seed,
                 "limit": limit, "out": str(work / f"out{i}.npy"), "group": fit.group}
            )  # fmt: skip
        (work / "jobs.json").write_text(json.dumps(jobs))
        results = work / "results.jsonl"
        command = [str(env.python), str(WORKER), peer, str(work / "jobs.json"), str(results)]
        # Outer wall-clock limit of the whole batch (import time and slack included; 4x: the
        # fits may get a quarter of a shared core).
        deadline = time.monotonic() + 60 + 4 * limit * len(fits)
        reason = ""
        while True:
            done = _read_results(results)
            if len(done) == len(fits):
                break
            if time.monotonic() > deadline:
                reason = "killed past the outer time limit"
                break
            stuck = _run_worker(command, results, len(done), 2 * limit + 30, deadline)
            if stuck is None:
                break  # ended (or died) on its own: fits without a record are reported below
            # The per-fit CPU-time alarm only interrupts Python code: this fit sat inside one
            # library call past twice its limit. It is a time-out; the worker is restarted on
            # the fits after it (it resumes from the results file).
            missing = min(set(range(len(fits))) - set(_read_results(results)))
            with results.open("a") as out:
                record = {"id": missing, "status": "timeout", "seconds": stuck,
                          "reason": f"no fit within {limit:g} s of CPU (stuck inside one "
                          "library call, worker restarted)"}  # fmt: skip
                out.write(json.dumps(record) + "\n")
        records = _read_results(results)
        outcomes = []
        for i in range(len(fits)):
            if i not in records:
                outcomes.append(Outcome("timeout", reason=reason or "worker ended early"))
                continue
            record = records[i]
            outcome = Outcome(
                str(record["status"]), seconds=float(str(record["seconds"])),
                reason=str(record["reason"]),
            )  # fmt: skip
            if outcome.status == "succeeded":
                outcome.basis = np.load(work / f"out{i}.npy")
            outcomes.append(outcome)
        return outcomes


def _read_results(path: Path) -> dict[int, dict[str, object]]:
    records: dict[int, dict[str, object]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                records[int(record["id"])] = record
    return records


def _run_worker(
    command: list[str], results: Path, done: int, stuck_cpu: float, deadline: float
) -> float | None:
    """Run the worker until it ends (``None``) or spends ``stuck_cpu`` seconds of CPU without
    writing a result (killed; returns that CPU time). Past ``deadline`` it is killed too."""
    import psutil

    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watched = psutil.Process(process.pid)
    try:
        since, seen = 0.0, done
        while process.poll() is None:
            time.sleep(0.5)
            try:
                times = watched.cpu_times()
            except psutil.Error:
                continue
            cpu = times.user + times.system
            now = len(_read_results(results))
            if now != seen:
                since, seen = cpu, now
            elif cpu - since > stuck_cpu:
                process.kill()
                process.wait()
                return cpu - since
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                return None
        return None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
