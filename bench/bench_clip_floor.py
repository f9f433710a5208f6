"""The clip quantile at small ``n eps`` (30 Nov 2026, wip/autoclip): the service's read-out
against two public alternatives, paired.

    python -m bench.bench_clip_floor [--reps 10] [--ns 200 300 400 1000] [--eps 0.1 0.2 0.5]

``analyze_gauss`` with ``clip_quantile`` 0.3 (auto's Gram candidate below ``n^(2/3)``), k = 3,
delta = 1e-6, three ways on the same data and noise seed, in one process: ``quantile`` (the
service: the first passage over all 48 edges of ``C 2^(-j/4)``), ``floor`` (the read-out
restricted to the top :func:`~service.mechanisms.clip_quantile.resolvable_steps` edges, ``C``
without a draw below 2: the rule tried and not shipped) and ``C`` (no quantile: its share of
``mu^2`` to the Gram, what ``auto`` would run with the quantile skipped). Families: ``digits``
(sklearn's ``load_digits``, 1,797 x 64, rows scaled to unit norm, a seeded sample of ``n``),
``power_law`` (``bench_auto_realistic.rows``, d = 20, norms ~1/3), ``short`` (d = 20, random
directions, norms uniform in 0.5-0.8: the report's rows), ``short_dir`` (power-law rows with a
quarter replaced by rows of norm 0.05-0.2 along one direction). Per cell and way: the median
``row_clip_norm`` (C when none) and the median captured-variance deficit ``1 - captured/PCA's``
(uncentred, the rows as given).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from bench.bench_auto_realistic import rows
from service.mechanisms import analyze_gauss, clip_quantile
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.gauss_calibration import AnalyzeGaussParams, gauss_split
from service.mechanisms.registry import get_mechanism

DELTA, K = 1e-6, 3


def floor_read_out(
    counts: Any, n_rows: int, clip_norm: float, quantile: float, mu: float, rng: Any
) -> float:
    """The rejected rule: only the top ``B'`` edges read, the bins below merged."""
    steps = clip_quantile.resolvable_steps(n_rows, quantile, mu)
    if steps < 2:
        return float(clip_norm)
    cut = clip_quantile.GRID_STEPS - steps
    edges = clip_quantile.quantile_edges(clip_norm)[cut:]
    merged = np.concatenate([[float(np.sum(counts[: cut + 1]))], counts[cut + 1 :]])
    noisy = merged + rng.normal(0.0, clip_quantile.count_noise_std(mu), size=steps)
    above = clip_quantile.noisy_above(noisy, n_rows)
    fits = np.flatnonzero(above <= (1.0 - quantile) * n_rows)
    return float(edges[fits[0]]) if fits.size else float(clip_norm)


@contextmanager
def floor_rule() -> Iterator[None]:
    real = analyze_gauss.clip_from_counts
    analyze_gauss.clip_from_counts = floor_read_out  # type: ignore[assignment]
    try:
        yield
    finally:
        analyze_gauss.clip_from_counts = real  # type: ignore[assignment]


def family(kind: str, n: int, seed: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    if kind == "digits":
        from sklearn.datasets import load_digits

        x = np.asarray(load_digits().data, dtype=np.float64)
        x = x[rng.choice(x.shape[0], size=n, replace=False)]
        return np.asarray(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300))
    if kind == "power_law":
        return rows("power_law", n, 20, seed)
    if kind == "short_dir":
        # power-law rows (norms ~1/3) with a quarter replaced by rows of norm 0.05-0.2 along
        # one direction: short rows with a direction of their own (auto_gram's docstring), which
        # a sign map (every row clipped far below its norm) weights as long ones.
        x = rows("power_law", n, 20, seed)
        u = rng.standard_normal(20)
        bad = rng.choice(n, size=n // 4, replace=False)
        signs = rng.choice([-1.0, 1.0], size=(bad.size, 1))
        x[bad] = signs * rng.uniform(0.05, 0.2, (bad.size, 1)) * u / np.linalg.norm(u)
        return x
    x = rng.standard_normal((n, 20))
    return np.asarray(x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0.5, 0.8, (n, 1)))


def run(raw: dict[str, Any], x: np.ndarray[Any, Any], eps: float, seed: int) -> tuple[float, float]:
    """(row clip, captured deficit) of analyze_gauss with ``raw``."""
    mechanism = get_mechanism("analyze_gauss")
    assert mechanism is not None
    n, d = x.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, K, eps, DELTA, mechanism.parse_params(raw))
    out = mechanism.run(x, ReleaseSpec(K, eps, DELTA, params), np.random.default_rng(seed))
    best = float(np.linalg.eigvalsh(x.T @ x)[-K:].sum())
    deficit = 1.0 if out.basis is None else 1.0 - float(np.sum((x @ out.basis) ** 2)) / best
    return float(out.extras.get("row_clip_norm", 1.0)), deficit


def cells(ns: list[int], epsilons: list[float], reps: int) -> None:
    print("kind n eps B' | clip quantile/floor | deficit quantile/floor/C")
    q = {"clip_quantile": 0.3}
    for kind in ("digits", "power_law", "short", "short_dir"):
        for n in ns:
            for eps in epsilons:
                got: dict[str, list[tuple[float, float]]] = {"quantile": [], "floor": [], "C": []}
                for seed in range(reps):
                    x = family(kind, n, seed)
                    got["quantile"].append(run(q, x, eps, 1000 + seed))
                    with floor_rule():
                        got["floor"].append(run(q, x, eps, 1000 + seed))
                    got["C"].append(run({}, x, eps, 1000 + seed))
                clip = {v: float(np.median([g[0] for g in got[v]])) for v in got}
                err = {v: float(np.median([g[1] for g in got[v]])) for v in got}
                mu = gauss_split(eps, DELTA, AnalyzeGaussParams.model_validate(q)).clip_mu
                steps = clip_quantile.resolvable_steps(n, 0.3, mu)
                print(
                    f"{kind} {n} {eps} {steps} | {clip['quantile']:.3g} / {clip['floor']:.3g} | "
                    f"{err['quantile']:.4f} / {err['floor']:.4f} / {err['C']:.4f}",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--ns", type=int, nargs="+", default=[200, 300, 400, 1000])
    parser.add_argument("--eps", type=float, nargs="+", default=[0.1, 0.2, 0.5])
    args = parser.parse_args()
    with open("/proc/loadavg") as handle:
        print("loadavg", handle.read().strip())
    cells(args.ns, args.eps, args.reps)
    with open("/proc/loadavg") as handle:
        print("loadavg", handle.read().strip())


if __name__ == "__main__":
    main()
