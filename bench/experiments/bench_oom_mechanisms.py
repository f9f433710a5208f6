"""Every registered mechanism on a dataset larger than the worker's memory (issue 15 item 4).

    python -m bench.experiments.bench_oom_mechanisms [--rows 500000] [--cols 1000]
        [--memory-mb 1536]
        [--mechanisms analyze_gauss,...] [--data PATH] [--timeout 900] [--out CSV]

For each mechanism, two releases with the same seed, each in a child process reading the
dataset as a read-only memory map (as the worker does), one right after the other so that both
see the same load on the shared machine:

1. **in memory**: no memory limit, the file warm in the page cache (read once just before);
2. **cgroup**: in a memory cgroup of ``--memory-mb`` (see
   ``bench/experiments/bench_perf_oom.py`` for how it is made; page cache is charged to it, so
   the file cannot stay cached), the file's pages dropped first with
   ``posix_fadvise(DONTNEED)`` (cold start).

The release is ``k = 3``, ``epsilon = 1``, ``delta = 1e-6``, the dataset's declared row norm
bound 1 (so ``clip_norm = 1``), every other parameter at its default (``continual_gauss``:
``horizon = 1``), prepared with the
cgroup's size as the worker memory limit (the API refuses a release whose ``memory_bytes``
exceeds it; such a mechanism is reported as refused). One BLAS thread in both children. The
two outputs (basis and extras) are checked equal. Wall-clock seconds of ``Mechanism.run`` only.

The dataset (``--data``, else written to a temporary file): rows near a 3-dimensional subspace
with standard deviations 0.5, 0.4, 0.3 along it and 0.1 spread over the other coordinates, so
``k = 3`` has a clear gap and the mechanisms release (row norms about 0.72).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.experiments.bench_perf_oom import drop_from_cache, make_cgroup

MECHANISMS = (
    "analyze_gauss",
    "gap_perturbation",
    "smooth_sensitivity",
    "spectrum",
    "histogram_aggregate",
    "friendly_aggregate",
    "auto",
    "exact_gapmax",
    "continual_gauss",
)

#: Params other than the defaults: ``continual_gauss`` needs a horizon; 1 is a one-shot release.
PARAMS = {"continual_gauss": {"horizon": 1}}

CHILD = r"""
import json, sys, time
import numpy as np
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism

name, path, limit, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
raw = json.loads(sys.argv[5])
data = np.load(path, mmap_mode="r")
n, d = data.shape
mechanism = get_mechanism(name)
ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0, memory_limit_bytes=limit)
k, epsilon, delta = 3, 1.0, 1e-6
try:
    params = mechanism.prepare(ctx, k, epsilon, delta, mechanism.parse_params(raw))
except InvalidParameter as exc:
    print(json.dumps({"refused": f"{exc.field}: {exc.message}"}))
    sys.exit(0)
spec = ReleaseSpec(k=k, epsilon=epsilon, delta=delta, params=params)
need = mechanism.memory_bytes(ctx, spec)
if need > limit:
    print(json.dumps({"refused": f"memory_bytes {need} > limit {limit}"}))
    sys.exit(0)
start = time.perf_counter()
output = mechanism.run(data, spec, np.random.default_rng(7))
elapsed = time.perf_counter() - start
basis = output.basis if output.basis is not None else np.zeros((0, 0))
np.save(out, basis)
print(json.dumps({
    "seconds": elapsed,
    "memory_bytes": need,
    "no_result": output.no_result_reason,
    "extras": json.dumps(output.extras, sort_keys=True, default=str),
}))
"""


def outcome(result: dict[str, object]) -> str:
    """``succeeded``, or ``no_result: <reason>``."""
    return "succeeded" if result["no_result"] is None else f"no_result: {result['no_result']}"


def run_child(
    name: str, path: Path, limit: int, out: Path, procs: str | None, timeout: float
) -> dict[str, object] | None:
    """One release in a child (in the cgroup when ``procs``); ``None`` on timeout."""
    script = CHILD
    if procs is not None:
        # Join the cgroup first thing, before numpy is imported and before any page is read.
        script = f"open({procs!r}, 'w').write(str(__import__('os').getpid()))\n" + CHILD
    command = ["nice", "-n", "5", sys.executable, "-c", script, name, str(path), str(limit)]
    command += [str(out), json.dumps(PARAMS.get(name, {}))]
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        raise RuntimeError(f"{name}: child failed ({done.returncode}): {done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def write_dataset(path: Path, n: int, d: int) -> None:
    """Rows near a 3-dimensional subspace, written in chunks (never the whole matrix in RAM)."""
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(rng.standard_normal((d, 3)))
    scales = np.array([0.5, 0.4, 0.3])
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, d))
    for start in range(0, n, 8192):
        rows = min(8192, n - start)
        signal = (rng.standard_normal((rows, 3)) * scales) @ basis.T
        out[start : start + rows] = signal + 0.1 * rng.standard_normal((rows, d)) / np.sqrt(d)
    out.flush()
    del out


def warm(path: Path) -> None:
    """Read the whole file once so the in-memory run finds it in the page cache."""
    with path.open("rb") as handle:
        while handle.read(64 << 20):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--cols", type=int, default=1_000)
    parser.add_argument("--memory-mb", type=int, default=1536)
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS))
    parser.add_argument("--data", type=Path, default=None, help="an existing .npy to use")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path, default=None, help="append rows to this CSV")
    parser.add_argument("--label", default="", help="the CSV's run column (code version)")
    args = parser.parse_args()
    limit = args.memory_mb << 20
    try:
        group, procs = make_cgroup(limit)
    except (OSError, RuntimeError) as exc:
        print(f"cannot create a memory cgroup here ({exc}); no measurement", flush=True)
        return
    try:
        with tempfile.TemporaryDirectory(dir=os.environ.get("DPSS_BENCH_DIR")) as tmp:
            path = args.data
            if path is None:
                path = Path(tmp) / "data.npy"
                write_dataset(path, args.rows, args.cols)
            n, d = np.load(path, mmap_mode="r").shape
            size_mb = path.stat().st_size / 2**20
            print(
                f"{n} x {d} ({size_mb:,.0f} MiB) under a {args.memory_mb} MiB memory cgroup "
                f"({size_mb / args.memory_mb:.2f}x); k = 3, eps 1, delta 1e-6, clip 1",
                flush=True,
            )
            for name in args.mechanisms.split(","):
                measure(name, path, n, d, limit, args, group, procs, Path(tmp))
    finally:
        try:
            group.rmdir()
        except OSError as exc:
            print(f"could not remove {group}: {exc}")


def measure(
    name: str,
    path: Path,
    n: int,
    d: int,
    limit: int,
    args: argparse.Namespace,
    group: Path,
    procs: str,
    tmp: Path,
) -> None:
    """The in-memory and the cgroup run of one mechanism; prints and appends to the CSV."""
    warm(path)
    reference = tmp / f"{name}_memory.npy"
    base = run_child(name, path, limit, reference, None, args.timeout)
    if base is None:
        print(f"  {name:<20} in memory: did not finish in {args.timeout:.0f} s", flush=True)
        return
    if "refused" in base:
        print(f"  {name:<20} refused: {base['refused']}", flush=True)
        append_row(
            args, [name, n, d, args.memory_mb, "", "", "", "", f"refused: {base['refused']}"]
        )
        return
    drop_from_cache(path)
    out = tmp / f"{name}_cgroup.npy"
    start = time.perf_counter()
    cold = run_child(name, path, limit, out, procs, args.timeout)
    peak = int((group / "memory.max_usage_in_bytes").read_text()) if procs else 0
    with open(group / "memory.max_usage_in_bytes", "w") as handle:
        handle.write("0")  # reset the peak for the next mechanism
    base_s = float(base["seconds"])  # type: ignore[arg-type]
    if cold is None:
        waited = time.perf_counter() - start
        print(
            f"  {name:<20} in memory {base_s:7.1f} s; cgroup did not finish in {waited:.0f} s",
            flush=True,
        )
        row = [name, n, d, args.memory_mb, f"{base_s:.2f}", "", "", "", outcome(base)]
    else:
        cold_s = float(cold["seconds"])  # type: ignore[arg-type]
        same = bool(np.array_equal(np.load(out), np.load(reference))) and (
            cold["extras"] == base["extras"] and cold["no_result"] == base["no_result"]
        )
        print(
            f"  {name:<20} in memory {base_s:7.1f} s  cgroup {cold_s:7.1f} s  "
            f"ratio {cold_s / base_s:5.2f}x  same output {same}  "
            f"cgroup peak {peak / 2**20:,.0f} MiB  memory_bytes "
            f"{int(base['memory_bytes']) / 2**20:,.0f} MiB  "  # type: ignore[call-overload]
            f"no_result {base['no_result']}  extras {str(base['extras'])[:160]}",
            flush=True,
        )
        row = [
            name,
            n,
            d,
            args.memory_mb,
            f"{base_s:.2f}",
            f"{cold_s:.2f}",
            f"{cold_s / base_s:.2f}",
            same,
            outcome(base),
        ]
    append_row(args, row)


HEADER = [
    "run",
    "mechanism",
    "n",
    "d",
    "memory_limit_mib",
    "in_memory_s",
    "cgroup_s",
    "ratio",
    "same_output",
    "outcome",
]


def append_row(args: argparse.Namespace, row: list[object]) -> None:
    """Append ``row`` (after the ``--label`` column) to ``--out``, with a header if new."""
    if args.out is None:
        return
    new = not args.out.exists()
    with args.out.open("a", newline="") as handle:
        writer = csv.writer(handle)
        if new:
            writer.writerow(HEADER)
        writer.writerow([args.label, *row])


if __name__ == "__main__":
    main()
