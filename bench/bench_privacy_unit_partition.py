"""Sample-and-aggregate per person: what a partition of people keeps against a partition of rows
at one (epsilon, delta) (issue 34).

Synthetic rows near a 5-dim subspace of R^50 (n = 20,000), people of 1 to 20 rows (uniform),
each person a latent point with their rows near it (as in ``bench_privacy_unit``). Two runs of
the same mechanism, same parameters, same generator seed:

- ``row``: the partition of rows (a per-row guarantee only: a 20-row person reaches up to 20
  subsets, so is protected at up to 20 epsilon);
- ``person``: what the service runs with ``privacy_unit_column``: the partition of people
  (:func:`service.mechanisms.sample_aggregate.random_partition` with ``groups``), each subset
  trimmed or padded to the public ``m`` rows.

Metric: the share of the top-k energy the released subspace captures (``||X U||_F^2`` over the
sum of the top-k eigenvalues; 0 for no result), median over seeds, and how many runs released.
Run: ``python -m bench.bench_privacy_unit_partition`` (a few minutes; ``--quick``: 2 seeds).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from bench.bench_privacy_unit import synthetic_people
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.friendly_aggregate import FriendlyAggregate, FriendlyAggregateParams
from service.mechanisms.histogram_aggregate import HistogramAggregate, HistogramAggregateParams

EPSILON, DELTA = 1.0, 1e-6


def release(name: str, rows: np.ndarray, units: Any, k: int, seed: int) -> np.ndarray | None:
    ctx = PublicContext(n_rows=rows.shape[0], n_cols=rows.shape[1], row_norm_bound=None)
    mechanism: Any
    params: Any
    if name == "friendly_aggregate":
        mechanism = FriendlyAggregate()
        params = mechanism.prepare(ctx, k, EPSILON, DELTA, FriendlyAggregateParams())
    else:
        mechanism = HistogramAggregate()
        params = mechanism.prepare(ctx, k, EPSILON, DELTA, HistogramAggregateParams())
    rng = np.random.default_rng(seed)
    spec = ReleaseSpec(k, EPSILON, DELTA, params)
    basis: np.ndarray | None = mechanism.run(rows, spec, rng, units=units).basis
    return basis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds instead of 5")
    args = parser.parse_args()
    seeds = 2 if args.quick else 5
    print(
        "| mechanism | partition | captured share (median) | released | seconds per run |\n"
        "|---|---|---|---|---|"
    )
    for name in ("friendly_aggregate", "histogram_aggregate"):
        for variant in ("row", "person"):
            shares, released, seconds = [], 0, []
            for seed in range(seeds):
                rows, units, _, k = synthetic_people(seed)
                truth = np.sort(np.linalg.eigvalsh(rows.T @ rows))[::-1][:k].sum()
                start = time.perf_counter()
                basis = release(name, rows, None if variant == "row" else units, k, 100 + seed)
                seconds.append(time.perf_counter() - start)
                if basis is not None:
                    released += 1
                    shares.append(float(np.sum((rows @ basis) ** 2) / truth))
                else:
                    shares.append(0.0)
            print(
                f"| {name} | {variant} | {statistics.median(shares):.3f} | "
                f"{released}/{seeds} | {statistics.median(seconds):.2f} |"
            )


if __name__ == "__main__":
    main()
