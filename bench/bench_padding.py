"""Calibrate the run-time model behind ``visible_at`` (a benchmark, not a test).

For each mechanism and a few public shapes, runs the mechanism once on random data, and prints
its seconds, the model's work units (:mod:`service.padding`), the implied rate (work / second)
against the default rate, and the run time as a fraction of the padding the default settings
give. A fraction near or above 1 means jobs of that shape would end after their padding and
reveal their lateness: lower that mechanism's rate with ``DPSS_RELEASE_PADDING_RATES``.
Baseline in the same process: a float64 matmul's rate (flop/s), which the BLAS-bound
mechanisms should approach.

Run: ``.venv/bin/python bench/bench_padding.py`` (about a minute; keep the machine quiet).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from service.config import Settings
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.registry import MECHANISMS
from service.padding import PaddingModel

SHAPES = [(2_000, 20, 3), (20_000, 50, 3), (50_000, 200, 5)]


def matmul_rate() -> float:
    a = np.random.default_rng(0).standard_normal((1000, 1000))
    a @ a
    start = time.perf_counter()
    a @ a
    return 2 * 1000**3 / (time.perf_counter() - start)


def dataset(n: int, d: int, k: int, exact: bool, rng: np.random.Generator) -> Any:
    basis, _ = np.linalg.qr(rng.standard_normal((d, k)))
    rows = rng.standard_normal((n, k)) @ basis.T * 0.3
    if not exact:
        rows += rng.standard_normal((n, d)) * 1e-3
    return rows / np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))


def main() -> None:
    rng = np.random.default_rng(1)
    model = PaddingModel.from_settings(Settings())
    baseline = matmul_rate()
    print(f"baseline matmul: {baseline:.3g} flop/s")
    print(
        f"{'mechanism':20} {'n':>7} {'d':>4} {'k':>2} {'seconds':>8} {'work':>9} "
        f"{'rate':>9} {'default':>9} {'vs matmul':>9} {'run/padding':>11}"
    )
    for name, mechanism in sorted(MECHANISMS.items()):
        for n, d, k in SHAPES:
            if name == "exact_gapmax" and d > 50:
                continue
            ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
            raw = {"cell_width": 0.1} if name == "histogram_aggregate" else {}
            try:
                params = mechanism.prepare(ctx, k, 1.0, 1e-6, mechanism.parse_params(raw))
            except InvalidParameter as exc:
                print(f"{name:20} {n:>7} {d:>4} {k:>2} refused: {exc.message[:60]}")
                continue
            # exact_gapmax's worst case is rows in general position (no candidate is skipped).
            data = dataset(n, d, k, exact=False, rng=rng)
            spec = ReleaseSpec(k=k, epsilon=1.0, delta=1e-6, params=params)
            start = time.perf_counter()
            mechanism.run(data, spec, np.random.default_rng(2))
            seconds = time.perf_counter() - start
            resolved = params.model_dump(mode="json")
            work = model.work(name, n, d, k, resolved)
            padding = model.padding(name, n, d, k, resolved).total_seconds()
            rate = work / seconds
            print(
                f"{name:20} {n:>7} {d:>4} {k:>2} {seconds:>8.3f} {work:>9.3g} {rate:>9.3g} "
                f"{model.rates[name]:>9.3g} {rate / baseline:>9.3f} {seconds / padding:>11.3f}"
            )


if __name__ == "__main__":
    main()
