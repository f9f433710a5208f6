"""Issue 32 item 4: the dry run's forecast from an earlier release, CPU with and without the
per-request cache of its simulations (:func:`~service.mechanisms.forecast_simulation.
request_cache`), in one process on the same released figures.

    python -m bench.bench_forecast_cpu [--reps 5]

Per cell (data, k, earlier eps -> new eps; ``center: "private"``, delta 1e-6, the seeds of
``bench/bench_forecast_coverage.py``'s release 0): one earlier release, then the forecast
(:func:`~service.mechanisms.gauss_preview.release_forecast`) timed ``--reps`` times with the
cache (as the dry run runs it) and without (every simulation run, as before the cache), CPU
time (``time.process_time``) median; the ratio is cached over uncached. Also printed: the
simulations one forecast asks for and how many the cache answered. Run with one BLAS thread
(``OMP_NUM_THREADS=1``) for figures comparable across loads.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.bench_forecast_coverage import EPSILONS, KS, SEED_BASE, datasets
from bench.bench_honest_point import MECHANISM, spec_of
from service.mechanisms import forecast_simulation, gauss_release_forecast
from service.mechanisms.base import PublicContext
from service.mechanisms.gauss_preview import release_forecast

CELLS = (
    ("digits", 1, 3.0, 0.3),
    ("digits", 10, 1.0, 0.3),
    ("digits", 5, 1.0, 1.0),
    ("breast_cancer", 5, 1.0, 0.1),
    ("power-law 3000x100", 10, 1.0, 0.1),
)


def _median_cpu(call: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    sets = datasets(False)
    print("| data | k | earlier eps -> new | simulations | from the cache | uncached ms "
          "| cached ms | ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    real = gauss_release_forecast.request_cache
    runs: list[int] = []
    inner = forecast_simulation._simulate

    def counted(*a: Any) -> Any:
        runs.append(1)
        return inner(*a)

    for name, k, earlier, new in CELLS:
        rows = sets[name]
        n, d = rows.shape
        ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
        index = EPSILONS.index(earlier) * len(KS) + KS.index(k)
        before = MECHANISM.run(
            rows, spec_of(ctx, earlier, k), np.random.default_rng(SEED_BASE * (index + 1))
        )
        spec, earlier_spec = spec_of(ctx, new, k), spec_of(ctx, earlier, k)

        forecast = functools.partial(release_forecast, ctx, spec, earlier_spec, before.extras)

        forecast_simulation._simulate = counted  # type: ignore[assignment]
        runs.clear()
        cached_result = forecast()
        ran = len(runs)
        gauss_release_forecast.request_cache = _no_cache  # type: ignore[assignment]
        runs.clear()
        plain_result = forecast()
        asked = len(runs)
        forecast_simulation._simulate = inner  # type: ignore[assignment]
        assert cached_result == plain_result, "the cache changed the forecast"
        uncached = _median_cpu(forecast, args.reps)
        gauss_release_forecast.request_cache = real  # type: ignore[assignment]
        cached = _median_cpu(forecast, args.reps)
        print(
            f"| {name} | {k} | {earlier} -> {new} | {asked} | {asked - ran} "
            f"| {uncached * 1e3:.0f} | {cached * 1e3:.0f} | {cached / uncached:.2f} |",
            flush=True,
        )


class _NoCache:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _no_cache() -> _NoCache:
    return _NoCache()


if __name__ == "__main__":
    main()
