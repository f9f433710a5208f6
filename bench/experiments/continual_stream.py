"""Issue 14's done-when run, through the real HTTP API and a worker process.

A dataset grows by 64 batches of 2,000 rows near a 3-dimensional subspace of R^50 (batch 0 is
the upload); one ``continual_gauss`` release (eps = 1, delta = 1e-6, T = 64, k = 3, C = 1) follows
it. The worker (``dpss worker``, isolated runs) is SIGKILLed, with its process group, while
epochs are being released (a backlog of appended batches is waiting), and a new one started.
Checks: one charge and nothing else in the ledger, 64 epochs, each exactly once, the epochs
stored before the kill unchanged after it, every epoch's ``release_epoch`` event carries its
basis hash, the subspace error falls from the first epoch to the last, and ``dpss audit
verify`` passes. Prints the error per epoch (the table in docs/mechanisms.md) and exits non-zero
if a check fails.

    python bench/experiments/continual_stream.py [--database sqlite|postgres] [--batches 64]
        [--rows 2000]

The client sees only what any analyst sees; the script also reads the database directly, for the
checks only (counts, epoch hashes), never printing a row or the release's private state.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
from sqlalchemy import Executable, func, select

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dpss_client.client import Client  # noqa: E402
from scripts.harness import (  # noqa: E402
    Checks,
    Services,
    create_database,
    drop_database,
    free_port,
    table,
    wait_http,
)
from service.db.engine import make_engine  # noqa: E402
from service.db.models import AuditEvent, LedgerEntry, Release, ReleaseEpoch  # noqa: E402

D, K, EPS, DELTA, CLIP = 50, 3, "1", "1e-6", 1.0


def near_subspace(
    n: int, d: int, k: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of norm <= 1 near a random ``k``-dim subspace (as the estimator bench)."""
    basis, _ = np.linalg.qr(rng.standard_normal((d, k)))
    coords = rng.standard_normal((n, k))
    coords /= np.linalg.norm(coords, axis=1, keepdims=True)
    data = coords @ basis.T + 0.01 * rng.standard_normal((n, d)) / math.sqrt(d)
    data /= np.maximum(1.0, np.linalg.norm(data, axis=1, keepdims=True))
    return data, basis


def sin_theta(estimate: np.ndarray, truth: np.ndarray) -> float:
    """Spectral norm of ``sin Theta`` between two orthonormal bases."""
    residual = estimate - truth @ (truth.T @ estimate)
    return float(np.linalg.norm(residual, 2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--batches", type=int, default=64)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--kill-at", type=int, default=20, help="kill after this many epochs")
    args = parser.parse_args()
    batches, rows = args.batches, args.rows
    work = Path(tempfile.mkdtemp(prefix="dpss-continual-"))
    pg_name = f"dpss_continual_{uuid.uuid4().hex[:8]}"
    if args.database == "postgres":
        database_url = create_database(pg_name)
    else:
        database_url = f"sqlite:///{work / 'dpss.sqlite3'}"
    admin = secrets.token_hex(16)
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DPSS_DATABASE_URL": database_url,
        "DPSS_DATA_DIR": str(work / "data"),
        "DPSS_ADMIN_API_KEY": admin,
        "DPSS_WORKER_LEASE_SECONDS": "3",
        "DPSS_WORKER_HEARTBEAT_SECONDS": "1",
        "DPSS_WORKER_POLL_SECONDS": "0.1",
        "DPSS_LOG_LEVEL": "WARNING",
        "DPSS_RATE_LIMIT_PER_SECOND": "0",
    }
    services = Services(env, work)
    checks = Checks()
    engine = make_engine(database_url)

    def sql(statement: Executable) -> list[tuple[object, ...]]:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(statement)]

    try:
        if services.start("migrate", "migrate").wait(timeout=120) != 0:
            raise RuntimeError(f"dpss migrate failed; see {work / 'migrate.log'}")
        services.processes.pop("migrate")
        services.start("api", "api", "--port", str(port))
        services.start("worker-1", "worker")
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", timeout=120)

        data, truth = near_subspace(batches * rows, D, K, np.random.default_rng(1))
        pieces = np.split(data, batches)
        with Client(base, admin) as root:
            owner_key = root.create_key("owner", "stream owner").key
            analyst_key = root.create_key("analyst", "stream analyst").key
        owner, analyst = Client(base, owner_key), Client(base, analyst_key)
        dataset = owner.upload(
            pieces[0], name="stream", epsilon_budget=EPS, delta_budget=DELTA, row_norm_bound=CLIP
        )
        handle = analyst.release(
            dataset.id, "continual_gauss", k=K, epsilon=EPS, delta=DELTA, horizon=batches
        )
        release = uuid.UUID(str(handle.id))
        bases: list[np.ndarray] = []
        failure: list[BaseException] = []

        def consume() -> None:
            try:
                for basis in handle.epochs(timeout=300, poll_interval=0.05, max_poll_interval=0.5):
                    bases.append(basis)
            except BaseException as exc:  # reported by the checks below
                failure.append(exc)

        consumer = threading.Thread(target=consume)
        consumer.start()

        def epochs_done() -> int:
            return int(str(sql(select(Release.epochs_done).where(Release.id == release))[0][0]))

        def epoch_hashes() -> dict[int, str]:
            rows_ = sql(
                select(ReleaseEpoch.epoch, ReleaseEpoch.basis_sha256).where(
                    ReleaseEpoch.release_id == release
                )
            )
            return {int(str(e)): str(h) for e, h in rows_}

        # A backlog: the first half of the batches at once, then the worker is killed while it
        # works through them.
        half = batches // 2
        for piece in pieces[1:half]:
            owner.append_rows(dataset.id, piece)
        deadline = time.monotonic() + 300
        while epochs_done() < min(args.kill_at, half) and time.monotonic() < deadline:
            time.sleep(0.02)
        services.signal("worker-1", signal.SIGKILL)
        services.processes["worker-1"].wait()
        services.processes.pop("worker-1")
        at_kill = epochs_done()
        before = epoch_hashes()
        lease = sql(select(Release.lease_owner).where(Release.id == release))[0][0]
        print(f"worker SIGKILLed after {at_kill} epochs (lease held: {lease is not None})")
        time.sleep(0.5)
        services.start("worker-2", "worker")
        for piece in pieces[half:]:
            owner.append_rows(dataset.id, piece)
        consumer.join(timeout=600)
        after = epoch_hashes()

        status = analyst.get_release(handle.id).refresh()
        charges = sql(
            select(LedgerEntry.kind, func.count())
            .where(LedgerEntry.release_id == release)
            .group_by(LedgerEntry.kind)
        )
        events = sql(
            select(func.count()).where(
                AuditEvent.release_id == release, AuditEvent.event_type == "release_epoch"
            )
        )[0][0]
        budget = owner.budget(dataset.id)
        errors = [sin_theta(b, truth) for b in bases]

        checks.check("consumer finished", not failure, repr(failure[0]) if failure else "")
        checks.check(
            "charged once", charges == [("charge", 1)], f"ledger {charges}, budget left "
            f"eps {budget.epsilon_remaining} delta {budget.delta_remaining}",
        )  # fmt: skip
        checks.check(
            f"{batches} epochs",
            sorted(after) == list(range(1, batches + 1)) and len(bases) == batches,
            f"stored {len(after)}, received {len(bases)}",
        )  # fmt: skip
        checks.check("release succeeded", status.status == "succeeded", status.status)
        checks.check(
            "epochs before the kill unchanged",
            all(after.get(e) == h for e, h in before.items()),
            f"{len(before)} epochs",
        )
        checks.check("one release_epoch event per epoch", int(str(events)) == batches, str(events))
        checks.check(
            "error falls from the first epoch to the last",
            len(errors) == batches and errors[-1] < errors[0] / 10,
            f"{errors[0]:.4f} -> {errors[-1]:.4f}" if errors else "",
        )
        verify = services.start("verify", "audit", "verify").wait(timeout=300)
        checks.check("dpss audit verify", verify == 0, f"exit {verify}")
        shown = [t for t in (1, 2, 4, 8, 16, 32, 48, 64) if t <= len(errors)]
        print(
            f"\n{batches} batches of {rows} rows near a {K}-dim subspace of R^{D}; eps {EPS}, "
            f"delta {DELTA}, T = {batches}, honaker (default); ||sin Theta|| per epoch:\n"
        )
        print(table([[f"{errors[t - 1]:.4f}" for t in shown]], [str(t) for t in shown]))
        print()
        print(checks.render())
        return 0 if checks.ok else 1
    finally:
        services.stop_all()
        engine.dispose()
        if args.database == "postgres":
            drop_database(pg_name)


if __name__ == "__main__":
    sys.exit(main())
