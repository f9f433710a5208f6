"""Does an analyst's read of a release get slower once a large result is stored (issue 22, 0b)?

    python -m bench.bench_hidden_release [--reps 300] [--mb 5] [--backends sqlite,postgresql]

In this process (the app through ``TestClient``, no network), on a fresh SQLite file or a fresh
database of the local PostgreSQL server (``DPSS_BENCH_POSTGRES_URL``): an analyst requests a
release padded by an hour, then reads it ``--reps`` times per endpoint (``GET
/v1/releases/{id}``, its ``/epochs``, ``GET /v1/releases``), interleaved. Then the outcome is
stored as the worker stores it (``succeeded``, a ``--mb`` MB basis, 2,560 x k float64, in
``release_bases``) and the
reads are repeated, still before ``visible_at``. Each read alternates with a control (the same
call about a second release that stays queued; for the history a page that lists nothing).
Printed per endpoint: the median latency before, after, their ratio, the control's ratio (what
this machine's load alone changed meanwhile) and the first over the second.

Before the fix (the basis in the ``releases`` row, loaded with it), 5 MB gave ratio/control 2.7
to 27 on SQLite and 4.8 to 5.9 on PostgreSQL; after it 0.98 to 1.01 (docs/reliability.md).
The stored extras are a mean-route centre of 2,560 numbers (46 KB of JSON), as
``analyze_gauss`` stores them (``reason`` and ``result_extras`` are deferred since; a median
ratio on a loaded machine hardly sees 46 KB, the interleaved two-sample test of
``tests/api/test_hidden_outcomes.py``'s commit did: advantage 0.19 before, 0.04 after).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import update

from bench.bench_perf_wake import postgres_database
from service import auth
from service.app import create_app
from service.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.db.models import Release, ReleaseBasis, utcnow
from service.migrate import upgrade_to_head
from service.releases import encode_basis


@contextmanager
def database(backend: str, workdir: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{workdir / 'bench.db'}"
    else:
        with postgres_database() as url:
            yield url


def seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def run(backend: str, reps: int, megabytes: float) -> None:
    with tempfile.TemporaryDirectory() as tmp, database(backend, Path(tmp)) as url:
        settings = Settings(
            data_dir=Path(tmp) / "data",
            database_url=url,
            admin_api_key=None,
            rate_limit_per_second=0,
            release_padding_floor_seconds=3600,
            release_padding_multiplier=1.0,
            worker_wake=False,
        )
        upgrade_to_head(url)
        engine = make_engine(url)
        factory = make_session_factory(engine)
        with factory.begin() as session:
            _, owner = auth.create_key(session, "owner", "owner", actor_key_id=None)
            _, analyst = auth.create_key(session, "analyst", "analyst", actor_key_id=None)
        with TestClient(create_app(settings)) as client:
            rows = np.random.default_rng(0).normal(size=(200, 6)) / 10
            buffer = io.BytesIO()
            np.save(buffer, rows)
            made = client.post(
                "/v1/datasets",
                headers={"Authorization": f"Bearer {owner}"},
                files={"file": ("d.npy", buffer.getvalue(), "application/octet-stream")},
                data={"name": "b", "epsilon_budget": "10", "delta_budget": "1e-3",
                      "row_norm_bound": "1", "allow_large_delta": "true"},
            )  # fmt: skip
            made.raise_for_status()
            headers = {"Authorization": f"Bearer {analyst}"}
            body = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-7"}
            release, control = (
                client.post(
                    f"/v1/datasets/{made.json()['id']}/releases", headers=headers, json=body
                ).json()["id"]
                for _ in range(2)
            )
            # Each endpoint with its control: the same call about a release that stays queued
            # (for the history, a page with no row), read in turn with it.
            paths = {
                "release": (f"/v1/releases/{release}", f"/v1/releases/{control}"),
                "epochs": (f"/v1/releases/{release}/epochs", f"/v1/releases/{control}/epochs"),
                "history": ("/v1/releases", "/v1/releases?mechanism=none"),
            }

            def measure() -> dict[str, tuple[list[float], list[float]]]:
                out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in paths}
                for _ in range(reps):
                    for name, pair in paths.items():
                        for times, path in zip(out[name], pair, strict=True):
                            times.append(seconds(lambda p=path: client.get(p, headers=headers)))
                return out

            measure()  # warm up
            before = measure()
            k = max(1, int(megabytes * 1e6 / (2560 * 8)))
            rng = np.random.default_rng(1)
            basis = rng.normal(size=(2560, k))
            data, shape, sha = encode_basis(basis)
            with factory.begin() as session:
                session.execute(
                    update(Release)
                    .where(Release.id == uuid.UUID(release))
                    .values(
                        status="succeeded",
                        result_shape=shape,
                        result_sha256=sha,
                        # As ``analyze_gauss``'s mean route stores them at d = 2,560: the
                        # centre alone is d numbers (``reason`` and ``result_extras`` are
                        # deferred: an analyst's read of a hidden release loads neither).
                        result_extras={
                            "centring": "mean",
                            "center": [round(float(x), 9) for x in rng.normal(0, 0.01, 2560)],
                            "eigenvalues": [float(x) for x in rng.normal(1, 0.1, k)],
                            "trace": 1.0,
                        },
                        finished_at=utcnow(),
                        visible_at=utcnow() + timedelta(hours=1),
                    )
                )
                session.add(ReleaseBasis(release_id=uuid.UUID(release), epoch=0, basis=data))
            shown = client.get(paths["release"][0], headers=headers).json()
            assert shown["status"] == "queued"
            after = measure()
        engine.dispose()
    print(f"{backend}: {len(data) / 1e6:.1f} MB basis, {reps} reads per endpoint and phase")
    print(
        f"  {'endpoint':<9} {'before ms':>9} {'after ms':>9} {'ratio':>6} "
        f"{'control':>7} {'ratio/control':>13}"
    )
    for name in paths:
        (b, b_control), (a, a_control) = before[name], after[name]
        ratio = statistics.median(a) / statistics.median(b)
        control = statistics.median(a_control) / statistics.median(b_control)
        b_ms, a_ms = statistics.median(b) * 1e3, statistics.median(a) * 1e3
        print(
            f"  {name:<9} {b_ms:9.2f} {a_ms:9.2f} {ratio:6.2f} {control:7.2f} "
            f"{ratio / control:13.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--mb", type=float, default=5.0)
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    for backend in args.backends.split(","):
        run(backend, args.reps, args.mb)


if __name__ == "__main__":
    main()
