"""Issue 24, item 5: does every random-level success carry the usefulness warning?

    PYTHONPATH=. .venv/bin/python bench/experiments/friendly_warning_realistic.py \
        [--dims 50] [--reps 1] [--mechanisms friendly_aggregate histogram_aggregate]

On ``bench.bench_auto_realistic``'s rows (k = 5, C = 1): per run the status, the captured share
of the sum of squares over non-private PCA's, a random subspace's share, and whether the release
carries ``warning``. A success "at the random level" captures at most 1.5x a random subspace's
share; the check should warn on every such success and on few others.
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.bench_auto_realistic import DELTA, K, captured, rows
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", type=int, nargs="+", default=[50])
    parser.add_argument("--ns", type=int, nargs="+", default=[5000, 50000])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument(
        "--mechanisms", nargs="+", default=["friendly_aggregate", "histogram_aggregate"]
    )
    args = parser.parse_args()
    print("| mechanism | data | d | n | eps | seed | status | share | random | warned |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    tally = {"random_level": 0, "random_level_warned": 0, "useful": 0, "useful_warned": 0}
    for name in args.mechanisms:
        mechanism = get_mechanism(name)
        assert mechanism is not None
        for kind in ("power_law", "heavy_tailed", "spiked_outliers"):
            for d in args.dims:
                for n in args.ns:
                    for eps in (0.1, 1.0):
                        for rep in range(args.reps):
                            x = rows(kind, n, d, seed=rep)
                            best = float(np.linalg.eigvalsh(x.T @ x)[-K:].sum())
                            ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
                            try:
                                params = mechanism.prepare(
                                    ctx, K, eps, DELTA, mechanism.parse_params({})
                                )
                            except InvalidParameter:
                                continue
                            out = mechanism.run(
                                x, ReleaseSpec(K, eps, DELTA, params), np.random.default_rng(rep)
                            )
                            q, _ = np.linalg.qr(
                                np.random.default_rng(99 + rep).standard_normal((d, K))
                            )
                            rand = captured(x, q) / best
                            warned = "warning" in out.extras
                            if out.basis is None:
                                status, share = "no_result", float("nan")
                            else:
                                status, share = "succeeded", captured(x, out.basis) / best
                                key = "random_level" if share <= 1.5 * rand else "useful"
                                tally[key] += 1
                                tally[key + "_warned"] += int(warned)
                            cells = [name, kind, d, n, eps, rep, status, f"{share:.3f}"]
                            cells += [f"{rand:.3f}", warned]
                            print("| " + " | ".join(map(str, cells)) + " |", flush=True)
    print(tally)


if __name__ == "__main__":
    main()
