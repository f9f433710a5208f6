"""The continual-epoch padding chain's cost (``service.padding_epochs._Chain``) at N pending.

    python -m bench.bench_chain [--backend sqlite|postgresql] [--n 10 100 300 1000]
                                [--shape one many] [--reps 3] [--old-reps 1] [--no-old]

A database state built directly (ORM rows, no worker): N continual releases (horizon 3,
``continual_gauss``, k 1, d 3) requested 0.5 s apart, each with epoch 1 stored on batch 0 and
shown at its due moment, the epochs chained one second apart as a busy worker shows them
(``max(own floor, the one before + 1 s)``), so most epochs 1 are not yet shown when the
dataset's next batch is committed: *one*: N releases on 1 dataset, one batch appended after the
last request; *many*: N releases on N datasets, one batch appended to each 0.2 s after its
release. At the moment asked (just after the last batch) every release has epoch 2 pending,
and many epoch 1 too. Timed per call: ``epoch_seconds`` at that moment (what every release or
registration request adds: *request*) and ``epoch_padding`` of the last release's epoch 2 (the
worker's *claim*); statements counted per request (``before_cursor_execute``). *old*: the chain
as it was (``tests/continual/chain_reference.py``) in the same process on the same state,
alternated with the new; the bench asserts both give the same figures (``==``).
Medians; the load average printed beside them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.harness import create_database, drop_database
from service import padding_epochs
from service.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.db.models import Dataset, DatasetBatch, Release, ReleaseEpoch, utcnow
from service.migrate import upgrade_to_head
from tests.continual import chain_reference

D = 3
FLOOR = 1.0


def _settings(url: str, data: Path) -> Settings:
    # As tests/continual/conftest.epoch_rated: an operator's rate modelling an epoch at seconds.
    return Settings(
        data_dir=data,
        database_url=url,
        admin_api_key=None,
        release_padding_floor_seconds=FLOOR,
        release_padding_calibrated=False,
        release_padding_multiplier=1.0,
        release_padding_rates={"continual_gauss": 150.0},
    )


def _dataset(session: Session, created: datetime, n: int) -> Dataset:
    dataset = Dataset(
        name="bench",
        owner_key_id=None,
        n_rows=n,
        n_cols=D,
        epsilon_total=Decimal(100),
        delta_total=Decimal("1e-3"),
        file_name=None,
        created_at=created,
    )
    session.add(dataset)
    session.flush()
    session.add(
        DatasetBatch(
            dataset_id=dataset.id, seq=0, n_rows=n, row_offset=0, file_name=None, created_at=created
        )
    )
    return dataset


def build(session: Session, n: int, shape: str) -> tuple[datetime, uuid.UUID]:
    """The state (module docstring); returns the moment asked and the last release's id."""
    t0 = utcnow() - timedelta(seconds=n * 1.5 + 60)
    one = _dataset(session, t0 - timedelta(seconds=5), 30) if shape == "one" else None
    shown_before: datetime | None = None
    last = uuid.uuid4()
    appended = t0
    for i in range(n):
        created = t0 + timedelta(seconds=0.5 * i)
        dataset = one if one is not None else _dataset(session, created - timedelta(seconds=1), 30)
        release = Release(
            dataset_id=dataset.id,
            requester_key_id=None,
            mechanism="continual_gauss",
            k=1,
            epsilon=Decimal("0.1"),
            delta=Decimal("1e-7"),
            params={"horizon": 3},
            request_hash="0" * 64,
            status="running",
            created_at=created,
            visible_at=created + timedelta(seconds=2 * FLOOR),
            epochs_done=1,
        )
        session.add(release)
        session.flush()
        due = created + timedelta(seconds=2 * FLOOR)
        if shown_before is not None:
            due = max(due, shown_before + timedelta(seconds=1))
        shown_before = due
        session.add(
            ReleaseEpoch(
                release_id=release.id,
                epoch=1,
                batch_seq=0,
                n_rows_read=30,
                created_at=created,
                visible_at=due,
                due_at=due,
            )
        )
        if one is None:
            appended = _append(session, dataset, created + timedelta(seconds=0.2))
        last = release.id
    if one is not None:
        appended = _append(session, one, t0 + timedelta(seconds=0.5 * n))
    return appended + timedelta(seconds=0.1), last


def _append(session: Session, dataset: Dataset, at: datetime) -> datetime:
    """The dataset's next batch (seq 1: 20 rows after its 30) committed at ``at``; returns
    ``at``."""
    session.add(
        DatasetBatch(
            dataset_id=dataset.id, seq=1, n_rows=20, row_offset=30, file_name=None, created_at=at
        )
    )
    dataset.n_rows, dataset.n_batches = 50, 2
    return at


@contextmanager
def database(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            upgrade_to_head(url)
            yield url
    else:
        name = f"bench_chain_{os.getpid()}"
        url = create_database(name)
        try:
            upgrade_to_head(url)
            yield url
        finally:
            drop_database(name)


def timed(
    engine: Engine, call: Callable[[], Any], reps: int
) -> tuple[float, int, Any]:  # (median ms, statements, figure)
    counted = [0]

    def count(*args: Any) -> None:
        counted[0] += 1

    event.listen(engine, "before_cursor_execute", count)
    try:
        times, figure = [], None
        for _ in range(reps):
            counted[0] = 0
            start = time.perf_counter()
            figure = call()
            times.append((time.perf_counter() - start) * 1000)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return statistics.median(times), counted[0], figure


def _call(function: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: function(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--n", type=int, nargs="+", default=[10, 100, 300, 1000])
    parser.add_argument("--shape", nargs="+", choices=["one", "many"], default=["one", "many"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--old-reps", type=int, default=1)
    parser.add_argument("--no-old", action="store_true")
    args = parser.parse_args()
    print(
        "| backend | case | request old | request new | ratio | statements old / new "
        "| claim old | claim new | ratio | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.shape:
        for n in args.n:
            with database(args.backend) as url, tempfile.TemporaryDirectory() as data:
                settings = _settings(url, Path(data))
                engine = make_engine(url)
                factory = make_session_factory(engine)
                with factory.begin() as session:
                    now, last_id = build(session, n, shape)
                rows: dict[str, tuple[float, int, Any, float, int, Any]] = {}
                modules = [("new", padding_epochs)]
                if not args.no_old:
                    modules.append(("old", chain_reference))
                for name, module in modules:
                    reps = args.reps if name == "new" else args.old_reps
                    with factory() as session:
                        last = session.get(Release, last_id)
                        assert last is not None
                        dataset = session.get(Dataset, last.dataset_id)
                        assert dataset is not None
                        request = timed(
                            engine, _call(module.epoch_seconds, session, settings, now), reps
                        )
                        claim = timed(
                            engine,
                            _call(module.epoch_padding, session, settings, last, dataset, 2),
                            reps,
                        )
                    rows[name] = (*request, *claim)
                engine.dispose()
                new = rows["new"]
                old = rows.get("old")
                if old is not None:
                    assert (old[2], old[5]) == (new[2], new[5]), (shape, n)
                load = Path("/proc/loadavg").read_text().split()[0]
                case = f"{n} on {'1 dataset' if shape == 'one' else f'{n} datasets'}"
                if old is None:
                    print(
                        f"| {args.backend} | {case} | - | {new[0]:,.1f} ms | - | - / {new[1]} "
                        f"| - | {new[3]:,.1f} ms | - | {load} |"
                    )
                else:
                    print(
                        f"| {args.backend} | {case} | {old[0]:,.1f} ms | {new[0]:,.1f} ms "
                        f"| {new[0] / old[0]:.2f} | {old[1]} / {new[1]} | {old[3]:,.1f} ms "
                        f"| {new[3]:,.1f} ms | {new[3] / old[3]:.2f} | {load} |"
                    )
                sys.stdout.flush()


if __name__ == "__main__":
    main()
