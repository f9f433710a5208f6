"""Time of ``dpss audit verify`` (chain + reconciliation of the money) as the log grows.

Builds a database with ``--releases`` releases over ten datasets through the service's own
code paths (``create_dataset``, ``request_release``, the worker's ``claim``/``finish``; every
fifth release ends ``no_result``, every seventh is refunded), then times ``audit.verify``.
Baseline in the same process: the chain-only check that verify did before reconciliation
(re-hash every event and compare links), on the same snapshot. A benchmark, not a test.

Run: ``.venv/bin/python bench/bench_audit_verify.py [--releases 2000] [--url URL]``
(default: a fresh SQLite file in a temporary directory; a PostgreSQL URL must name an empty
database, which this migrates and fills).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from api_schemas.datasets import DatasetCreate
from api_schemas.releases import ReleaseRequest
from service import audit, auth, datasets, releases
from service.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.jobs import Outcome
from service.mechanisms.base import MechanismOutput
from service.migrate import upgrade_to_head
from service.store import DatasetStore
from service.worker import Worker


def populate(factory: sessionmaker[Session], settings: Settings, count: int) -> None:
    store = DatasetStore(settings.datasets_dir)
    store.ensure()
    with factory.begin() as session:
        owner_key, _ = auth.create_key(session, "owner", "bench", actor_key_id=None)
        analyst_key, _ = auth.create_key(session, "analyst", "bench", actor_key_id=None)
    owner = auth.Principal(owner_key.id, "owner", "bench")
    analyst = auth.Principal(analyst_key.id, "analyst", "bench")
    ids = []
    for index in range(10):
        upload = settings.data_dir / f"upload-{index}.npy"
        np.save(upload, np.random.default_rng(index).normal(size=(50, 4)) * 0.1)
        form = DatasetCreate(
            name=f"d{index}",
            epsilon_budget=Decimal(count),
            delta_budget=Decimal("0.5"),
            row_norm_bound=1.0,
            allow_large_delta=True,
        )
        with factory.begin() as session:
            ids.append(
                datasets.create_dataset(session, store, owner, form, upload, ".npy", "basic").id
            )
    worker = Worker(factory, store, settings, worker_id="bench")
    body = ReleaseRequest(
        mechanism="analyze_gauss", k=2, epsilon=Decimal("0.5"), delta=Decimal("1e-9")
    )
    basis = np.linalg.qr(np.random.default_rng(0).standard_normal((4, 2)))[0]
    for index in range(count):
        with factory.begin() as session:
            releases.request_release(session, analyst, ids[index % 10], body, None, settings)
        job = worker.claim()
        assert job is not None
        if index % 7 == 0:
            reason = "the dataset was deleted before the release ran"
            worker.finish(job, Outcome.failed(reason, refund=True))
        elif index % 5 == 0:
            worker.finish(job, Outcome.of(MechanismOutput.no_result("declined")))
        else:
            worker.finish(job, Outcome.of(MechanismOutput(basis=basis)))


def chain_only(session: Session) -> int:
    """The pre-reconciliation verify: re-hash and link every event; returns events read."""
    expected_prev = audit.GENESIS_HASH
    count = 0
    for event in audit._iter_chain(session):
        digest = audit.stored_event_digest(event)
        assert digest == event.hash and event.prev_hash == expected_prev
        expected_prev = event.hash
        count += 1
    return count


def best_of(runs: int, factory: sessionmaker[Session], check: object) -> float:
    best = float("inf")
    for _ in range(runs):
        with factory() as session:
            start = time.perf_counter()
            check(session)  # type: ignore[operator]
            best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=2000)
    parser.add_argument("--url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        url = args.url or f"sqlite:///{data_dir / 'bench.sqlite3'}"
        settings = Settings(data_dir=data_dir, database_url=url)
        upgrade_to_head(url)
        factory = make_session_factory(make_engine(url))
        start = time.perf_counter()
        populate(factory, settings, args.releases)
        built = time.perf_counter() - start
        print(f"built {args.releases} releases in {built:.1f} s ({url.split(':')[0]})")
        with factory() as session:
            report = audit.verify(session)
        assert report.ok, report.problems[:5]
        events = report.checked
        baseline = best_of(3, factory, chain_only)
        full = best_of(3, factory, lambda session: audit.verify(session))
        print(f"events: {events}")
        for label, seconds in (
            ("chain only (old verify)", baseline),
            ("chain + money (new)", full),
        ):
            print(f"{label:26s} {seconds:7.3f} s  {1e6 * seconds / events:6.1f} us/event")
        print(f"ratio new / old: {full / baseline:.2f}")


if __name__ == "__main__":
    main()
