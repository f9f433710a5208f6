"""Benchmarks of the service's own hot paths, each against a baseline run in the same process.

    python bench/bench_service.py [--rows 200000] [--cols 50]

1. Ingestion: an upload converted to the store's float64 ``.npy`` (streamed, bounded memory)
   against the naive in-memory load of the same file (``np.loadtxt`` for CSV, ``np.load`` for
   NPY) that the store must not do.
2. ``X^T X`` of clipped rows accumulated in chunks from a memory map against one in-memory
   ``X.T @ X`` of unclipped rows (the floor: same FLOPs, no clipping, no chunking).
3. Release requests through the ASGI app on SQLite (validate, lock, budget check, charge,
   audit event: one transaction) against ``GET /healthz`` through the same app.

These machines are noisy: read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def timed(function: Callable[[], Any], repeat: int = 3) -> float:
    """Best of ``repeat`` wall-clock runs, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def bench_ingestion(workdir: Path, rows: int, cols: int) -> None:
    from service.store import DatasetStore

    rng = np.random.default_rng(0)
    matrix = rng.normal(size=(rows, cols))
    csv_path = workdir / "data.csv"
    npy_path = workdir / "data.npy"
    np.savetxt(csv_path, matrix, delimiter=",", fmt="%.17g")
    np.save(npy_path, matrix)
    store = DatasetStore(workdir / "store")
    store.ensure()

    def ingest(source: Path) -> Callable[[], None]:
        def run() -> None:
            upload = store.new_incoming_path()
            shutil.copyfile(source, upload)
            stored = store.ingest(upload, source.suffix)
            store.purge(stored.file_name)

        return run

    size_mb = csv_path.stat().st_size / 2**20
    ours = timed(ingest(csv_path), repeat=2)
    naive = timed(lambda: np.loadtxt(csv_path, delimiter=","), repeat=1)
    print(
        f"ingest CSV  {rows}x{cols} ({size_mb:.0f} MiB): {ours:6.2f} s "
        f"({size_mb / ours:5.1f} MiB/s); np.loadtxt baseline {naive:6.2f} s; "
        f"ratio baseline/ours = {naive / ours:4.1f}x"
    )
    size_mb = npy_path.stat().st_size / 2**20
    ours = timed(ingest(npy_path))
    copy_only = timed(lambda: shutil.copyfile(npy_path, workdir / "copy.npy"))
    print(
        f"ingest NPY  {rows}x{cols} ({size_mb:.0f} MiB): {ours:6.2f} s "
        f"({size_mb / ours:5.1f} MiB/s); plain file copy baseline {copy_only:6.2f} s; "
        f"ratio ours/copy = {ours / copy_only:4.1f}x"
    )


def bench_gram(workdir: Path, rows: int, cols: int) -> None:
    from service.mechanisms.linalg import clipped_gram

    rng = np.random.default_rng(1)
    matrix = rng.normal(size=(rows, cols)) / np.sqrt(cols)
    path = workdir / "gram.npy"
    np.save(path, matrix)
    mapped = np.load(path, mmap_mode="r")
    ours = timed(lambda: clipped_gram(mapped, 1.0))
    floor = timed(lambda: matrix.T @ matrix)
    print(
        f"X^T X       {rows}x{cols}: chunked+clipped from memmap {ours:6.3f} s; "
        f"in-memory X.T @ X {floor:6.3f} s; ratio ours/floor = {ours / floor:4.2f}x "
        f"(memory: O(d^2 + chunk d) against O(n d))"
    )


def bench_requests(workdir: Path, count: int) -> None:
    from fastapi.testclient import TestClient

    from service import auth
    from service.app import create_app
    from service.config import Settings
    from service.db.engine import make_engine, make_session_factory
    from service.migrate import upgrade_to_head

    settings = Settings(data_dir=workdir / "svc")
    settings.data_dir.mkdir()
    upgrade_to_head(settings.resolved_database_url)
    factory = make_session_factory(make_engine(settings.resolved_database_url))
    with factory.begin() as session:
        _, owner = auth.create_key(session, "owner", "bench", None)
        _, analyst = auth.create_key(session, "analyst", "bench", None)
    with TestClient(create_app(settings, session_factory=factory)) as client:
        upload = workdir / "small.npy"
        np.save(upload, np.random.default_rng(2).normal(size=(1000, 20)) * 0.1)
        dataset = client.post(
            "/v1/datasets",
            headers={"Authorization": f"Bearer {owner}"},
            files={"file": ("small.npy", upload.read_bytes())},
            data={
                "name": "b",
                "epsilon_budget": "1000000",
                "delta_budget": "0.5",
                "row_norm_bound": "1",
            },
        ).json()
        body = {"mechanism": "analyze_gauss", "k": 3, "epsilon": "0.01", "delta": "1e-9"}
        headers = {"Authorization": f"Bearer {analyst}"}

        def releases() -> None:
            for _ in range(count):
                client.post(f"/v1/datasets/{dataset['id']}/releases", headers=headers, json=body)

        def health() -> None:
            for _ in range(count):
                client.get("/healthz")

        ours = timed(releases, repeat=1)
        floor = timed(health, repeat=1)
    print(
        f"requests    {count} release requests on SQLite: {count / ours:6.0f}/s; "
        f"GET /healthz {count / floor:6.0f}/s; ratio = {ours / floor:4.1f}x the cost of a no-op"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--cols", type=int, default=50)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        bench_ingestion(workdir, args.rows, args.cols)
        bench_gram(workdir, args.rows, 500)
        bench_requests(workdir, args.requests)


if __name__ == "__main__":
    main()
