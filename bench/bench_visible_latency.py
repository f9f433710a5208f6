"""Time to a visible result, and how often a run ends after its padding under load.

    .venv/bin/python -m bench.bench_visible_latency [--runs 20] [--load-factor 2]

One app and one isolated worker (as ``dpss worker``: each run in a forked child) on a new
SQLite database in a temporary directory. The worker calibrates this machine first
(:mod:`service.calibration`, public random data), as it does at start; then:

1. **Time to visible** (no added load): for the audit's shapes (``analyze_gauss`` and ``auto``
   at n = 3,500, d = 784, and an ``exact_gapmax`` of a few seconds), each requested once through
   the API and run by the worker: its run time (worker start to finish), its padding
   (``visible_at - created_at``) against the bound ``3 x run + 2 s``, and the padding the former
   uncalibrated defaults would have given (the baseline, same process).
2. **Exceedances under load**: ``--load-factor`` x cores busy processes (pure-Python loops)
   start; the worker keeps its quiet calibration (workers calibrate only at start since issue
   30: the worst case, a load arriving after the start; ``--recalibrate`` restarts the worker
   under the load, as an operator would), and every one-shot mechanism is requested ``--runs``
   times at a moderate shape, one at a time, with ``exact_gapmax`` on two kinds of rows whose
   run times differ (near a subspace and isotropic) and ``analyze_gauss`` with the recommended
   PCA settings (private centre, clip quantile 0.9). A run is late when
   ``finished_at > visible_at``; its outcome shows at step ``j`` of the public schedule
   (:func:`service.padding.late_schedule`), reported as the largest ``j``.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi.testclient import TestClient

from scripts.harness import table
from service import auth, calibration
from service.app import create_app
from service.config import Settings
from service.db.models import Release
from service.migrate import upgrade_to_head
from service.padding import DATA_DEPENDENT_FACTOR, PaddingModel, late_schedule
from service.worker import Worker

#: (mechanism, n, d, k, params) for the time to visible: the audit's cases.
VISIBLE: list[tuple[str, int, int, int, dict[str, Any]]] = [
    ("analyze_gauss", 3500, 784, 5, {}),
    ("auto", 3500, 784, 5, {}),
    ("exact_gapmax", 400, 20, 2, {"sample_rows": 250}),
]
#: Moderate shapes for the exceedance count, one per one-shot mechanism, and the kind of rows
#: (``iso``: isotropic; ``near``: near a k-dimensional subspace, exact_gapmax's slow neighbour).
LOADED: list[tuple[str, int, int, int, dict[str, Any], str]] = [
    ("analyze_gauss", 3000, 200, 3, {}, "iso"),
    ("analyze_gauss", 3000, 200, 3, {"center": "private", "clip_quantile": 0.9}, "iso"),
    ("spectrum", 3000, 200, 3, {}, "iso"),
    ("smooth_sensitivity", 3000, 200, 3, {}, "iso"),
    ("gap_perturbation", 3000, 200, 3, {}, "iso"),
    ("auto", 2000, 100, 2, {}, "iso"),
    ("friendly_aggregate", 4000, 50, 2, {}, "iso"),
    ("histogram_aggregate", 4000, 50, 2, {"cell_width": 0.1}, "iso"),
    ("exact_gapmax", 300, 20, 2, {"sample_rows": 150}, "iso"),
    ("exact_gapmax", 300, 20, 2, {"sample_rows": 150}, "near"),
]


def _npy(rows: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, rows)
    return buffer.getvalue()


def _rows(n: int, d: int, rng: np.random.Generator, kind: str = "iso") -> np.ndarray:
    rows = rng.standard_normal((n, d))
    if kind == "near":
        basis, _ = np.linalg.qr(rng.standard_normal((d, 2)))
        rows = rng.standard_normal((n, 2)) @ basis.T + rng.standard_normal((n, d)) * 1e-3
    scaled: np.ndarray = rows / np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
    return scaled


class Bench:
    def __init__(self, work: Path) -> None:
        url = f"sqlite:///{work / 'dpss.sqlite3'}"
        upgrade_to_head(url)
        self.settings = Settings(
            data_dir=work,
            database_url=url,
            rate_limit_per_second=0,
            log_level="WARNING",
            # smooth_sensitivity has no zCDP profile: the basic accounting admits every mechanism.
            default_accounting="basic",
        )
        self.app = create_app(self.settings)
        self.client = TestClient(self.app).__enter__()
        factory = self.app.state.session_factory
        self.factory = factory
        with factory.begin() as session:
            _, self.owner = auth.create_key(session, "owner", "bench", None)
            _, self.analyst = auth.create_key(session, "analyst", "bench", None)
        self.worker = Worker(factory, self.app.state.store, self.settings, "bench", isolate=True)
        self.datasets: dict[tuple[int, int, str], str] = {}
        self.rng = np.random.default_rng(7)

    def probed(self) -> str:
        """The calibrated per-job overhead and read rate, as stored (for the printout)."""
        with self.factory() as session:
            rates = calibration.current_rates(session)
        overhead, read = rates.overhead_seconds, rates.read_rate
        if overhead is None or read is None:
            return "overhead not probed"
        return f"per-job overhead {overhead:.3f} s, read {read / 1e9:.2f} GB/s"

    def dataset(self, n: int, d: int, kind: str = "iso") -> str:
        if (n, d, kind) not in self.datasets:
            made = self.client.post(
                "/v1/datasets",
                headers={"Authorization": f"Bearer {self.owner}"},
                files={
                    "file": ("d.npy", _npy(_rows(n, d, self.rng, kind)), "application/octet-stream")
                },
                data={
                    "name": f"{n}x{d} {kind}",
                    "epsilon_budget": "100000",
                    "delta_budget": "0.5",
                    "row_norm_bound": "1",
                    "allow_large_delta": "true",  # a bench: many releases, not protection
                },
            )
            made.raise_for_status()
            self.datasets[(n, d, kind)] = str(made.json()["id"])
        return self.datasets[(n, d, kind)]

    def run(
        self, mechanism: str, n: int, d: int, k: int, params: dict[str, Any], kind: str = "iso"
    ) -> Release:
        """Request one release, let the worker run it; the stored row."""
        response = self.client.post(
            f"/v1/datasets/{self.dataset(n, d, kind)}/releases",
            headers={"Authorization": f"Bearer {self.analyst}"},
            json={
                "mechanism": mechanism,
                "k": k,
                "epsilon": "1",
                "delta": "1e-6",
                "params": params,
            },
        )
        if response.status_code != 202:
            raise RuntimeError(f"{mechanism}: {response.status_code} {response.text[:500]}")
        assert self.worker.run_pending() == 1
        with self.factory() as session:
            release: Release | None = session.get(Release, uuid.UUID(response.json()["id"]))
            assert release is not None and release.finished_at is not None, mechanism
            return release


def _seconds(later: Any, earlier: Any) -> float:
    return float((later - earlier).total_seconds())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per mechanism under load")
    parser.add_argument("--load-factor", type=float, default=2, help="busy processes per core")
    parser.add_argument(
        "--recalibrate",
        action="store_true",
        help="restart the worker under the load (it calibrates at start); default: keep the "
        "quiet calibration, as a worker started before the load does",
    )
    parser.add_argument("--visible-runs", type=int, default=1, help="runs per no-load case")
    parser.add_argument("--csv", help="write every loaded run to this CSV file")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="dpss-visible-") as tmp:
        bench = Bench(Path(tmp))
        started = time.monotonic()
        bench.worker.calibrate_if_due()
        print(f"calibrated in {time.monotonic() - started:.1f} s; {bench.probed()}")
        default = PaddingModel.from_settings(bench.settings)
        # The padding a fresh service gives before its worker has calibrated (public defaults).
        for mechanism, n, d, k, params in VISIBLE:
            seconds = default.padding(mechanism, n, d, k, params).total_seconds()
            print(f"uncalibrated padding {mechanism} {n}x{d} k={k}: {seconds:.1f} s")

        rows = []
        for mechanism, n, d, k, params in VISIBLE * args.visible_runs:
            release = bench.run(mechanism, n, d, k, params)
            assert release.started_at is not None and release.visible_at is not None
            run = _seconds(release.finished_at, release.started_at)
            padding = _seconds(release.visible_at, release.created_at)
            bound = 3 * run + 2
            before = default.padding(mechanism, n, d, k, release.params or {}).total_seconds()
            rows.append(
                [
                    f"{mechanism} {n}x{d} k={k}",
                    f"{run:.2f}",
                    f"{padding:.1f}",
                    f"{bound:.1f}",
                    "yes" if padding <= bound else "NO",
                    "no" if release.finished_at <= release.visible_at else "LATE",
                    "yes" if mechanism in DATA_DEPENDENT_FACTOR else "no",
                    f"{before:.1f}",
                ]
            )
        print("time to a visible result (no added load)")
        print(
            table(
                rows,
                [
                    "case",
                    "run s",
                    "padding s",
                    "3 run + 2 s",
                    "within",
                    "ended after visible_at",
                    "data-dependent (bound n/a)",
                    "uncalibrated padding s",
                ],
            )
        )

        burners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(round(args.load_factor * cores))
        ]
        late = dict.fromkeys(range(len(LOADED)), 0)
        worst = dict.fromkeys(range(len(LOADED)), 0.0)
        done = dict.fromkeys(range(len(LOADED)), 0)
        step = dict.fromkeys(range(len(LOADED)), 0)
        csv = open(args.csv, "w") if args.csv else None  # noqa: SIM115 (closed below)
        if csv is not None:
            csv.write("round,mechanism,n,d,k,used_s,padding_s,ratio,late,overhead_s\n")
        try:
            if args.recalibrate:
                time.sleep(2)
                bench.worker = Worker(
                    bench.factory, bench.app.state.store, bench.settings, "bench", isolate=True
                )  # a restart: it calibrates at start
                bench.worker.calibrate_if_due()
                print(f"re-calibrated under load; {bench.probed()}")
            # Round-robin over the mechanisms, so that a run cut short still covers all of them.
            for round_ in range(args.runs):
                with bench.factory() as session:
                    overhead = calibration.current_rates(session).overhead_seconds or 0.0
                for index, (mechanism, n, d, k, params, kind) in enumerate(LOADED):
                    release = bench.run(mechanism, n, d, k, params, kind)
                    assert release.visible_at is not None and release.finished_at is not None
                    used = _seconds(release.finished_at, release.created_at)
                    padding = _seconds(release.visible_at, release.created_at)
                    is_late = release.finished_at > release.visible_at
                    late[index] += is_late
                    worst[index] = max(worst[index], used / padding)
                    step[index] = max(
                        step[index],
                        late_schedule(release.created_at, release.visible_at, release.finished_at)[
                            1
                        ],
                    )
                    done[index] += 1
                    if csv is not None:
                        csv.write(
                            f"{round_},{mechanism},{n},{d},{k},{used:.4f},{padding:.4f},"
                            f"{used / padding:.4f},{int(is_late)},{overhead:.4f}\n"
                        )
                        csv.flush()
        finally:
            if csv is not None:
                csv.close()
            for burner in burners:
                burner.kill()
                burner.wait()
        loaded = [
            [
                f"{m} {n}x{d} k={k}{' PCA' if 'center' in p else ''} {kind}",
                str(done[i]),
                str(late[i]),
                f"{worst[i]:.2f}",
                str(step[i]),
            ]
            for i, (m, n, d, k, p, kind) in enumerate(LOADED)
        ]
        print(f"under load: {len(burners)} busy processes on {cores} cores")
        print(
            table(
                loaded,
                [
                    "case",
                    "runs",
                    "after padding",
                    "worst (finish - request) / padding",
                    "largest schedule step j",
                ],
            )
        )
        bench.client.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
