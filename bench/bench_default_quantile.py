"""Issue 32, item 1: which clip quantile a ``center: "private"`` request gets by default.

    python -m bench.bench_default_quantile [--reps 20]

``analyze_gauss`` with ``center: "private"`` (the centring route chosen by the probe) at each
clip quantile q, and with the quantile opted out ("none": clip at C, private mean), k = 10,
delta = 1e-6, eps 0.3 and 1; a fresh 75% split and run per repetition. Data: digits and
breast_cancer (rows scaled to norm 1), and two synthetic sets not tuned on: a 1/i spectrum
with an offset mean (3,000 x 60, norms uniform in [0.3, 1]) and a 1/i^1.5 spectrum (5,000 x
200, scaled so the longest row has norm 1). Prints the mean captured share of the centred
variance per q (non-private PCA for reference).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from sklearn.datasets import load_breast_cancer, load_digits

from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism

K, DELTA = 10, 1e-6
QUANTILES: list[float | str] = ["none", 0.1, 0.2, 0.3, 0.4, 0.5, 0.7]

Rows = np.ndarray[Any, Any]


def unit(x: Rows) -> Rows:
    return np.asarray(x / np.linalg.norm(x, axis=1, keepdims=True))


def offset_power_law(seed: int = 0) -> Rows:
    rng = np.random.default_rng(seed)
    n, d = 3000, 60
    x = rng.normal(size=(n, d)) * np.sqrt(1.0 / np.arange(1, d + 1))
    x = x + 3.0 * rng.normal(size=d) / np.sqrt(d)
    return unit(x) * rng.uniform(0.3, 1.0, size=(n, 1))


def steep_power_law(seed: int = 1) -> Rows:
    rng = np.random.default_rng(seed)
    n, d = 5000, 200
    x = rng.normal(size=(n, d)) * np.sqrt(1.0 / np.arange(1, d + 1) ** 1.5)
    x = x + 0.2 * rng.normal(size=d)
    return np.asarray(x / np.max(np.linalg.norm(x, axis=1)))


def kept(rows: Rows, quantile: float | str, eps: float, reps: int) -> float:
    mechanism = get_mechanism("analyze_gauss")
    assert mechanism is not None
    shares = []
    for rep in range(reps):
        rng = np.random.default_rng(rep)
        train = rows[rng.permutation(len(rows))[: int(0.75 * len(rows))]]
        n, d = train.shape
        ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
        raw = {"center": "private", "clip_quantile": quantile}
        params = mechanism.prepare(ctx, K, eps, DELTA, mechanism.parse_params(raw))
        out = mechanism.run(train, ReleaseSpec(K, eps, DELTA, params), np.random.default_rng(rep))
        assert out.basis is not None
        y = train - train.mean(axis=0)
        shares.append(float(np.sum((y @ out.basis) ** 2) / np.sum(y**2)))
    return float(np.mean(shares))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    reps = parser.parse_args().reps
    sets = {
        "digits": unit(load_digits().data),
        "breast_cancer": unit(load_breast_cancer().data),
        "offset_power_law": offset_power_law(),
        "steep_power_law": steep_power_law(),
    }
    print("| data | eps | non-private | " + " | ".join(f"q={q}" for q in QUANTILES) + " |")
    print("|---" * (3 + len(QUANTILES)) + "|")
    for eps in (0.3, 1.0):
        for name, rows in sets.items():
            y = rows - rows.mean(axis=0)
            s = np.linalg.svd(y, compute_uv=False) ** 2
            figures = [kept(rows, q, eps, reps) for q in QUANTILES]
            print(
                f"| {name} | {eps} | {s[:K].sum() / s.sum():.3f} | "
                + " | ".join(f"{f:.3f}" for f in figures)
                + " |",
                flush=True,
            )


if __name__ == "__main__":
    main()
