"""Is a probe release's padding an oracle for another job's real status (issue 30, item 1)?

    python -m bench.bench_padding_oracle [--interval 0.1] [--seed 3]

The audit's attack, against a real running service on 127.0.0.1: ``dpss api`` (one process)
and one ``dpss worker`` on a new SQLite database in a temporary directory, with the calibrated
padding on (the worker calibrates this machine at its start; the bench waits for it). Then:

1. the victim (one analyst key) requests a slow target release: ``exact_gapmax`` on rows near a
   subspace (a run of a few seconds), and its ``visible_at`` is noted;
2. the attacker (a second analyst key, on a dataset of its own) requests a cheap probe release
   every ``--interval`` seconds and reads its padding, ``visible_at - created_at``, from the
   202 answer, from the target's request until ``--after`` seconds past the target's
   ``visible_at``;
3. the bench (not the attacker) reads the target's real start and finish from the database:
   the ground truth.

The probes are one-shot ``analyze_gauss`` releases on 50 x 4 rows (real, charged). Each
enters the queue term of the probes after it until its own ``visible_at``, so the raw padding
climbs with the attacker's own probe rate; that part is the attacker's own doing and known to
it (its probes' ``created_at`` and ``visible_at``, times one probe's modelled time, public: its
shape and the stored rates through :meth:`service.padding.PaddingModel.queue_seconds`). The
bench subtracts it: what is left is the floor, the probe's shape and everyone else's queue term.
(A ``continual_gauss`` probe would not enter the queue term, but its padding has no calibrated
rate and so no queue term either: it is blind to the queue.)

Printed: the probe padding less the attacker's own term (min / max / mean, rounded to the ms;
the raw padding beside it) in three windows by the probe's ``created_at``: from the target's
request to its real finish, from its real finish to its ``visible_at``, and after
``visible_at``. The verdict is **independent** when the first two hold the same values (the
real finish moved nothing). The negative control is the third window: the padding must change
at ``visible_at`` (the public moment the target leaves the queue term), which shows that the
probe does see the queue term; under the former rule (real status queued or running) the same
change came at the real finish, which the audit read to within 8-186 ms. Bounded: about 30 s
(the worker's calibration, the target's padding and ``--after``; at most 90 s of probing).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.harness import Services, free_port, table, wait_http
from service import auth, calibration
from service.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.db.models import Release
from service.migrate import upgrade_to_head
from service.padding import PaddingModel

#: The target: a data-dependent run of a few seconds (rows near a 2-dimensional subspace, the
#: slower kind for exact_gapmax).
TARGET = {"mechanism": "exact_gapmax", "k": 2, "epsilon": "1", "delta": "1e-6"}
#: The probe: a one-shot release on a tiny dataset of the attacker's own.
PROBE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.01", "delta": "1e-9"}
PROBE_SHAPE = (50, 4)
TARGET_D = 20


def _npy(rows: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, rows)
    return buffer.getvalue()


def _rows(n: int, d: int, rng: np.random.Generator, near: bool) -> np.ndarray:
    if near:
        basis, _ = np.linalg.qr(rng.standard_normal((d, 2)))
        rows = rng.standard_normal((n, 2)) @ basis.T + rng.standard_normal((n, d)) * 1e-3
    else:
        rows = rng.standard_normal((n, d))
    scaled: np.ndarray = rows / np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
    return scaled


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _summary(values: list[float]) -> list[str]:
    if not values:
        return ["0", "-", "-", "-"]
    return [
        str(len(values)),
        f"{min(values):.4f}",
        f"{max(values):.4f}",
        f"{statistics.fmean(values):.4f}",
    ]


def _own_probes(probes: list[tuple[datetime, datetime, float]], index: int) -> int:
    """How many of the attacker's own earlier probes were in probe ``index``'s queue term:
    requested before it and not yet past their own ``visible_at`` (the attacker knows both)."""
    created = probes[index][0]
    return sum(1 for c, v, _ in probes[:index] if c <= created < v)


def run(target_rows: int, sample_rows: int, interval: float, after: float, seed: int) -> int:
    rng = np.random.default_rng(seed)
    target_body = {**TARGET, "params": {"sample_rows": sample_rows}}
    with tempfile.TemporaryDirectory(prefix="dpss-oracle-") as tmp:
        work = Path(tmp)
        url = f"sqlite:///{work / 'dpss.sqlite3'}"
        upgrade_to_head(url)
        engine = make_engine(url)
        factory = make_session_factory(engine)
        with factory.begin() as session:
            _, owner = auth.create_key(session, "owner", "bench", None)
            _, victim = auth.create_key(session, "analyst", "victim", None)
            _, attacker = auth.create_key(session, "analyst", "attacker", None)
        port = free_port()
        env = {
            **os.environ,
            "DPSS_DATABASE_URL": url,
            "DPSS_DATA_DIR": str(work / "data"),
            "DPSS_LOG_LEVEL": "WARNING",
            "DPSS_RATE_LIMIT_PER_SECOND": "0",
            "DPSS_RELEASE_PADDING_CALIBRATED": "true",
            "OPENBLAS_NUM_THREADS": "1",
        }
        services = Services(env, work)
        base = f"http://127.0.0.1:{port}"
        try:
            services.start(
                "api", "api", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"
            )
            services.start("worker", "worker")
            wait_http(f"{base}/healthz", timeout=60)
            started = time.monotonic()
            while True:  # the worker calibrates at its start (the overhead probe is its last step)
                with factory() as session:
                    rates = calibration.current_rates(session)
                if rates.rates and rates.overhead_seconds is not None:
                    break
                if time.monotonic() - started > 90 or not services.alive("worker"):
                    raise RuntimeError(f"the worker did not calibrate; see {work}/worker.log")
                time.sleep(0.5)
            print(f"worker calibrated after {time.monotonic() - started:.1f} s")
            with httpx.Client(base_url=base, timeout=30) as http:

                def dataset(name: str, shape: tuple[int, int], near: bool) -> str:
                    made = http.post(
                        "/v1/datasets",
                        headers={"Authorization": f"Bearer {owner}"},
                        files={
                            "file": (
                                "d.npy",
                                _npy(_rows(*shape, rng, near)),
                                "application/octet-stream",
                            )
                        },
                        data={
                            "name": name,
                            "epsilon_budget": "1000",
                            "delta_budget": "0.5",
                            "row_norm_bound": "1",
                            "allow_large_delta": "true",
                        },
                    )
                    made.raise_for_status()
                    return str(made.json()["id"])

                target_data = dataset("target", (target_rows, TARGET_D), near=True)
                probe_data = dataset("probe", PROBE_SHAPE, near=False)

                def request(key: str, data: str, body: dict[str, Any]) -> dict[str, Any]:
                    answer = http.post(
                        f"/v1/datasets/{data}/releases",
                        headers={"Authorization": f"Bearer {key}"},
                        json=body,
                    )
                    if answer.status_code != 202:
                        raise RuntimeError(f"{answer.status_code} {answer.text[:300]}")
                    shown: dict[str, Any] = answer.json()
                    return shown

                def padding(shown: dict[str, Any]) -> float:
                    return (_when(shown["visible_at"]) - _when(shown["created_at"])).total_seconds()

                # One probe alone: the padding with an empty queue (and its own modelled time).
                alone = request(attacker, probe_data, PROBE)
                time.sleep(padding(alone) + 0.2)  # out of the queue term before the target
                target = request(victim, target_data, target_body)
                target_created = _when(target["created_at"])
                target_visible = _when(target["visible_at"])
                probes: list[tuple[datetime, datetime, float]] = []
                deadline = time.monotonic() + min(90.0, padding(target) + after)
                while time.monotonic() < deadline:
                    shown = request(attacker, probe_data, PROBE)
                    probes.append(
                        (_when(shown["created_at"]), _when(shown["visible_at"]), padding(shown))
                    )
                    time.sleep(interval)
            finished = time.monotonic() + 60
            while True:  # ground truth, which the attacker never sees
                with factory() as session:
                    row = session.get(Release, uuid.UUID(target["id"]))
                    assert row is not None
                    if row.finished_at is not None or time.monotonic() > finished:
                        status, started_at = row.status, row.started_at
                        real_finish = row.finished_at
                        break
                time.sleep(0.2)
            with factory() as session:
                probe_row = session.get(Release, uuid.UUID(alone["id"]))
                assert probe_row is not None
                # One probe's own term in a later probe's queue: public (its shape, its
                # resolved params and the stored rates), the model the service uses.
                model = PaddingModel.from_settings(
                    Settings(database_url=url, data_dir=work / "data"),
                    calibration.current_rates(session),
                )
                own = model.queue_seconds(
                    [("analyze_gauss", *PROBE_SHAPE, 1, probe_row.params or {})]
                )
        finally:
            services.stop_all()
            engine.dispose()
    if real_finish is None or started_at is None:
        print(f"the target did not finish (status {status}); no verdict")
        return 1
    real_finish = real_finish.replace(tzinfo=target_visible.tzinfo)
    started_at = started_at.replace(tzinfo=target_visible.tzinfo)
    print(
        f"target exact_gapmax {target_rows}x{TARGET_D} sample_rows={sample_rows}: {status}, "
        f"ran {(real_finish - started_at).total_seconds():.2f} s; real finish "
        f"{(real_finish - target_created).total_seconds():.2f} s and visible_at "
        f"{(target_visible - target_created).total_seconds():.2f} s after its request"
    )
    print(
        f"probe padding alone: {padding(alone):.4f} s; one probe's own term in a later "
        f"probe's queue: {own:.4f} s"
    )
    # Each probe's padding less its own earlier probes' term (a public function of its own
    # requests): what is left is the floor, the probe's shape and everyone else's queue term.
    rows = [
        (created, pad, round(pad - own * _own_probes(probes, i), 3))
        for i, (created, _, pad) in enumerate(probes)
    ]
    windows = {
        "request -> real finish": [r for r in rows if r[0] < real_finish],
        "real finish -> visible_at": [r for r in rows if real_finish <= r[0] < target_visible],
        "after visible_at (control)": [r for r in rows if r[0] >= target_visible],
    }
    print(f"{len(probes)} probes, one every {interval * 1e3:.0f} ms (+ the request's time)")
    print(
        table(
            [
                [name, *_summary([r[2] for r in values]), *_summary([r[1] for r in values])[1:]]
                for name, values in windows.items()
            ],
            [
                "window",
                "probes",
                "min s",
                "max s",
                "mean s",
                "raw min s",
                "raw max s",
                "raw mean s",
            ],
        )
    )
    before, between, control = ({r[2] for r in values} for values in windows.values())
    independent = bool(before) and bool(between) and before == between
    sensitive = bool(control) and bool(between) and control.isdisjoint(between)
    print(
        "verdict: "
        + ("independent" if independent else "DEPENDENT")
        + " of the target's real finish (the padding, less the attacker's own probes' term, is "
        "identical before and after it); control: "
        + ("the padding changes" if sensitive else "NO CHANGE")
        + " at the target's visible_at"
    )
    return 0 if independent and sensitive else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between probes")
    parser.add_argument("--after", type=float, default=3.0, help="seconds past visible_at")
    parser.add_argument("--rows", type=int, default=1500, help="the target's n")
    parser.add_argument("--sample-rows", type=int, default=500, help="the target's sample_rows")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    return run(args.rows, args.sample_rows, args.interval, args.after, args.seed)


if __name__ == "__main__":
    sys.exit(main())
