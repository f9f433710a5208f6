"""Peer PCA fits, run inside the peer's own virtual environment (a subprocess of the harness).

    python worker.py PEER JOBS.json RESULTS.jsonl

``PEER`` is ``diffprivlib`` or ``opendp``. ``JOBS.json`` is a list of fits
``{"id", "data" (.npy path), "k", "epsilon", "norm", "centered", "seed", "limit", "out"}``; each
fit runs under its own limit of ``limit`` seconds of CPU time (``ITIMER_PROF``: the process's
user + system time, so that the limit means the same on an idle machine and on a shared core
where the fit gets a fraction of it) and appends one JSON line to ``RESULTS.jsonl``
(``{"id", "status", "seconds", "reason"}``, ``seconds`` the fit's CPU time, status
``succeeded``, ``timeout`` or ``failed``) and, when it succeeded, saves the ``d x k`` components
to ``out``. Fits with the same non-empty ``"group"`` (one cell's repetitions) after one that
timed out are not run: ``skipped``, as the harness's ``SlowGuard`` does for the mechanisms. One
process for many fits, so the peer's import time is paid once. Standalone on purpose: it
imports neither the service nor the harness, only numpy and the peer library (the versions the
service pins cannot coexist with diffprivlib's).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from typing import Any

import numpy as np


class FitTimeout(Exception):
    """The fit ran past its limit."""


#: Whether the current fit's limit was reached (a library may wrap the :class:`FitTimeout`).
_fired = False


def _alarm(signum: int, frame: Any) -> None:
    global _fired
    _fired = True
    raise FitTimeout


def fit_diffprivlib(
    data: np.ndarray, k: int, epsilon: float, norm: float, centered: bool, seed: int
) -> np.ndarray:
    from diffprivlib.models import PCA

    d = data.shape[1]
    # centered=True: no budget on a mean, the uncentred second-moment matrix (as our Gram
    # mechanisms without centring); centered=False: diffprivlib spends part of epsilon on a
    # private mean, for which it needs per-feature bounds: [-norm, norm] follows from the row
    # norm bound.
    bounds = None if centered else (np.full(d, -norm), np.full(d, norm))
    model = PCA(
        n_components=k,
        epsilon=epsilon,
        data_norm=norm,
        centered=centered,
        bounds=bounds,
        random_state=seed,
    )
    model.fit(data)
    return np.asarray(model.components_).T


def fit_opendp(
    data: np.ndarray, k: int, epsilon: float, norm: float, centered: bool, seed: int
) -> np.ndarray:
    import opendp.prelude as dp
    from opendp.extras.sklearn.decomposition import PCA

    dp.enable_features("contrib", "floating-point", "honest-but-curious", "idealized-numerics")
    # OpenDP's PCA always centres on a private mean (part of epsilon), so ``centered`` is
    # ignored; its randomness comes from OpenDP's own CSPRNG (``seed`` cannot fix it).
    n, d = data.shape
    model = PCA(epsilon=epsilon, row_norm=norm, n_samples=n, n_features=d, n_components=k)
    model.fit(data)
    return np.asarray(model.components_).T


def main() -> int:
    global _fired
    peer, jobs_path, results_path = sys.argv[1:4]
    fit = {"diffprivlib": fit_diffprivlib, "opendp": fit_opendp}[peer]
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGPROF, _alarm)
    with open(jobs_path) as handle:
        jobs = json.load(handle)
    timed_out: set[str] = set()
    finished: set[int] = set()
    # A restarted worker (the harness kills one stuck inside a library call) resumes: the fits
    # already in the results are not run again, and their time-outs still skip their groups.
    if os.path.exists(results_path):
        groups = {int(job["id"]): str(job.get("group", "")) for job in jobs}
        with open(results_path) as handle:
            for line in handle:
                if line.strip():
                    record = json.loads(line)
                    finished.add(int(record["id"]))
                    if record["status"] == "timeout" and groups.get(int(record["id"])):
                        timed_out.add(groups[int(record["id"])])
    for job in jobs:
        if int(job["id"]) in finished:
            continue
        group = str(job.get("group", ""))
        if group and group in timed_out:
            with open(results_path, "a") as out:
                record = {"id": job["id"], "status": "skipped", "seconds": float("nan"),
                          "reason": "not repeated: an earlier repetition timed out"}  # fmt: skip
                out.write(json.dumps(record) + "\n")
            continue
        data = np.load(job["data"])
        _fired = False
        start = time.process_time()
        status, reason = "succeeded", ""
        signal.setitimer(signal.ITIMER_PROF, float(job["limit"]))
        try:
            basis = fit(data, job["k"], job["epsilon"], job["norm"], job["centered"], job["seed"])
        except FitTimeout:
            status, reason = "timeout", f"no fit within {job['limit']:g} s of CPU"
        except Exception as error:  # reported as such, in the results
            if _fired:
                # The alarm fired inside a library callback, which wrapped it (OpenDP does; the
                # kernel's CPU-time timer may fire ~5% before process_time() reaches the limit).
                status, reason = "timeout", f"no fit within {job['limit']:g} s of CPU"
            else:
                status, reason = "failed", f"{type(error).__name__}: {error}"[:200]
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        seconds = time.process_time() - start
        if status == "timeout" and group:
            timed_out.add(group)
        if status == "succeeded":
            # Orthonormalise (both return orthonormal rows already, up to rounding).
            np.save(job["out"], np.linalg.qr(basis)[0])
        with open(results_path, "a") as out:
            record = {"id": job["id"], "status": status, "seconds": seconds, "reason": reason}
            out.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
