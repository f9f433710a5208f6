"""Aggregators on a dataset larger than the worker's memory: sequential passes vs random gathers.

    python bench/experiments/bench_perf_oom.py [--rows 100000] [--cols 1000] [--memory-mb 320]
                                   [--pass-mb 128] [--t 1000] [--timeout 600]

Each run is a child process reading the dataset as a memory map (as the worker does):

1. **in memory**: no memory limit, the file warm in the page cache (read once before);
2. **passes**: in a memory cgroup of ``--memory-mb`` (the file 2.5 times that by default), the
   file's pages dropped from the cache first (``posix_fadvise(DONTNEED)`` on this file only),
   ``PASS_BYTES = --pass-mb``: the subsets' rows gathered in ascending sweeps;
3. **random gathers**: the same cgroup and cold file, one group of subsets per pass, which is how
   the rows were read before (each group's rows scattered over the whole file).

The cgroup is a child of this process's own memory cgroup (cgroup v1:
``/sys/fs/cgroup/memory/<own>/dpss-bench-oom-<pid>``, ``memory.limit_in_bytes``; cgroup v2:
``memory.max``), created and removed here; if none can be created, the script says so and stops.
Page cache used by the child is charged to the cgroup, so the file cannot stay cached.
Wall-clock seconds; the ratio is each run over the in-memory run of the same release (same
seed: the results are checked equal).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CHILD = r"""
import sys, time, numpy as np
from service.mechanisms import sample_aggregate as sa
from service.mechanisms.friendly_aggregate import friendly_aggregate
path, pass_bytes, t, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if pass_bytes:
    sa.PASS_BYTES = pass_bytes
data = np.load(path, mmap_mode="r")
start = time.perf_counter()
result = friendly_aggregate(data, 5, 4.0, 1e-6, np.random.default_rng(7), t=t)
elapsed = time.perf_counter() - start
np.save(out, result.basis if result.basis is not None else np.zeros((1, 1)))
print(f"{elapsed:.3f}")
"""


def own_memory_cgroup() -> Path | None:
    """This process's memory cgroup directory (v1 memory controller, or v2 unified)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return Path("/sys/fs/cgroup") / line[3:].lstrip("/")
    return None


def make_cgroup(limit_bytes: int) -> tuple[Path, str]:
    """A child memory cgroup with ``limit_bytes``; returns its directory and the procs file."""
    parent = own_memory_cgroup()
    if parent is None or not parent.is_dir():
        raise RuntimeError("no memory cgroup found for this process")
    # One group per benchmark process: two runs at once must not share (and remove) one group.
    group = parent / f"dpss-bench-oom-{os.getpid()}"
    group.mkdir(exist_ok=True)
    if (group / "memory.limit_in_bytes").exists():  # cgroup v1
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
        swap = group / "memory.memsw.limit_in_bytes"
        if swap.exists():
            with contextlib.suppress(OSError):
                swap.write_text(str(limit_bytes))
    else:
        (group / "memory.max").write_text(str(limit_bytes))
    return group, str(group / "cgroup.procs")


def drop_from_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_child(
    path: Path, pass_bytes: int, t: int, out: Path, procs: str | None, timeout: float
) -> float | None:
    """Seconds of one release in a child (in the cgroup when ``procs``), ``None`` on timeout."""
    script = CHILD
    if procs is not None:
        # Join the cgroup first thing, before numpy is imported and before any page is read.
        script = f"open({procs!r}, 'w').write(str(__import__('os').getpid()))\n" + CHILD
    command = [sys.executable, "-c", script, str(path), str(pass_bytes), str(t), str(out)]
    # One BLAS thread: on a shared machine spinning BLAS threads slowed these runs many times.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}): {done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def write_dataset(path: Path, n: int, d: int, k: int = 5) -> None:
    """Rows near a k-dimensional subspace, written in chunks (never the whole matrix in RAM)."""
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(rng.standard_normal((d, k)))
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, d))
    for start in range(0, n, 8192):
        rows = min(8192, n - start)
        block = rng.standard_normal((rows, k)) @ basis.T
        out[start : start + rows] = block + 1e-4 * rng.standard_normal((rows, d)) / np.sqrt(d)
    out.flush()
    del out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--cols", type=int, default=1_000)
    parser.add_argument("--memory-mb", type=int, default=320)
    parser.add_argument("--pass-mb", type=int, default=128)
    parser.add_argument("--t", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--skip-random", action="store_true", help="skip the random-gather run")
    args = parser.parse_args()
    try:
        group, procs = make_cgroup(args.memory_mb << 20)
    except (OSError, RuntimeError) as exc:
        print(f"cannot create a memory cgroup here ({exc}); no measurement", flush=True)
        return
    try:
        with tempfile.TemporaryDirectory(dir=os.environ.get("DPSS_BENCH_DIR")) as tmp:
            path = Path(tmp) / "data.npy"
            write_dataset(path, args.rows, args.cols)
            size_mb = path.stat().st_size / 2**20
            print(
                f"friendly_aggregate, k = 5, t = {args.t}, {args.rows} x {args.cols} "
                f"({size_mb:,.0f} MiB) under a {args.memory_mb} MiB memory cgroup "
                f"({size_mb / args.memory_mb:.1f}x); passes of {args.pass_mb} MiB; "
                f"cgroup {group}",
                flush=True,
            )
            np.asarray(np.load(path, mmap_mode="r")).sum()  # warm the page cache
            reference = Path(tmp) / "in_memory.npy"
            base = run_child(path, 0, args.t, reference, None, args.timeout)
            if base is None:
                print(f"  in memory: did not finish in {args.timeout:.0f} s; stopping", flush=True)
                return
            print(f"  in memory (warm cache, no limit)     {base:8.1f} s", flush=True)
            runs = [("sequential passes (cgroup, cold)", args.pass_mb << 20)]
            if not args.skip_random:
                runs.append(("random gathers (cgroup, cold)", 1))
            for label, pass_bytes in runs:
                drop_from_cache(path)
                out = Path(tmp) / "out.npy"
                start = time.perf_counter()
                seconds = run_child(path, pass_bytes, args.t, out, procs, args.timeout)
                if seconds is None:
                    waited = time.perf_counter() - start
                    print(f"  {label:<36} did not finish in {waited:.0f} s", flush=True)
                    continue
                same = np.array_equal(np.load(out), np.load(reference))
                print(
                    f"  {label:<36} {seconds:8.1f} s  ratio {seconds / base:5.2f}x  "
                    f"same basis as in memory: {same}",
                    flush=True,
                )
    finally:
        try:
            group.rmdir()
        except OSError as exc:
            print(f"could not remove {group}: {exc}")


if __name__ == "__main__":
    main()
