"""The clip quantile's public floor (30 Nov 2026, wip/autoclip): before and after, paired.

    python -m bench.bench_clip_floor [--reps 10] [--ns 200 300 400 1000] [--eps 0.1 0.2 0.5]
        [--grid-reps 2]

"Before" is the same code with :func:`service.mechanisms.clip_quantile.resolvable_steps`
returning the whole grid and ``auto``'s :func:`~service.mechanisms.auto_gram.quantile_resolvable`
always true: the read-out and the plan of the parent commit (the first passage over all 48
edges, the quantile always kept). Both run on the same data and the same noise seed, in the same
process. Families: ``digits`` (sklearn's ``load_digits``, 1,797 x 64, rows scaled to unit norm,
a seeded sample of ``n``), ``power_law`` (``bench_auto_realistic.rows``, d = 20, norms ~1/3),
``short`` (d = 20, random directions, norms uniform in 0.5-0.8: the report's rows),
``short_dir`` (power-law rows with a quarter replaced by rows of norm 0.05-0.2 along one
direction). Per cell and
version: the median ``row_clip_norm`` (C when none released) and the median captured-variance
deficit ``1 - captured/PCA's`` (uncentred, the rows as given), k = 3, delta = 1e-6, for
``auto`` and for ``analyze_gauss`` with ``clip_quantile`` 0.3. Then a few issue-33 grid cells
(``bench_auto_cells``: n >= 20,000) with ``auto`` both ways, their bases compared exactly.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from bench.bench_auto_cells import data_of, error, noise_rng
from bench.bench_auto_realistic import rows
from service.mechanisms import auto_gram, clip_quantile
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism

DELTA, K = 1e-6, 3


@contextmanager
def before() -> Iterator[None]:
    """The parent commit's rule: the whole grid read, the quantile always kept."""
    steps, resolvable = clip_quantile.resolvable_steps, auto_gram.quantile_resolvable
    clip_quantile.resolvable_steps = lambda n, q, mu: clip_quantile.GRID_STEPS  # type: ignore[assignment]
    auto_gram.quantile_resolvable = lambda n, e, d, c: True  # type: ignore[assignment]
    try:
        yield
    finally:
        clip_quantile.resolvable_steps = steps  # type: ignore[assignment]
        auto_gram.quantile_resolvable = resolvable  # type: ignore[assignment]


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


def run(
    name: str, raw: dict[str, Any], x: np.ndarray[Any, Any], eps: float, seed: int
) -> tuple[float, float, str]:
    """(row clip, captured deficit, what ran)."""
    mechanism = get_mechanism(name)
    assert mechanism is not None
    n, d = x.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, K, eps, DELTA, mechanism.parse_params(raw))
    out = mechanism.run(x, ReleaseSpec(K, eps, DELTA, params), np.random.default_rng(seed))
    best = float(np.linalg.eigvalsh(x.T @ x)[-K:].sum())
    deficit = 1.0 if out.basis is None else 1.0 - float(np.sum((x @ out.basis) ** 2)) / best
    ran = str(out.extras.get("auto_choice", name))
    if ran == "analyze_gauss" and not out.extras.get("auto_params", raw).get("clip_quantile"):
        ran += "@C"
    return float(out.extras.get("row_clip_norm", 1.0)), deficit, ran


def small_cells(ns: list[int], epsilons: list[float], reps: int) -> None:
    print("kind n eps mechanism | clip before/after | deficit before/after | ran after")
    for kind in ("digits", "power_law", "short", "short_dir"):
        for n in ns:
            for eps in epsilons:
                for name, raw in (("auto", {}), ("analyze_gauss", {"clip_quantile": 0.3})):
                    got: dict[str, list[tuple[float, float, str]]] = {"old": [], "new": []}
                    for seed in range(reps):
                        x = family(kind, n, seed)
                        with before():
                            got["old"].append(run(name, raw, x, eps, 1000 + seed))
                        got["new"].append(run(name, raw, x, eps, 1000 + seed))
                    med = {
                        v: (
                            float(np.median([g[0] for g in got[v]])),
                            float(np.median([g[1] for g in got[v]])),
                        )
                        for v in got
                    }
                    ran = sorted({g[2] for g in got["new"]})
                    print(
                        f"{kind} {n} {eps} {name} | {med['old'][0]:.3g} / {med['new'][0]:.3g} | "
                        f"{med['old'][1]:.4f} / {med['new'][1]:.4f} | {','.join(ran)}",
                        flush=True,
                    )


GRID_CELLS = [
    ("power_law", 50, 20_000, 0.1),
    ("heavy_tailed", 50, 20_000, 0.1),
    ("spiked_outliers", 50, 20_000, 1.0),
    ("near_0.01", 50, 20_000, 0.1),
]


def grid_cells(reps: int) -> None:
    """auto both ways on the issue-33 cells, paired: identical bases where the grid resolves."""
    auto = get_mechanism("auto")
    assert auto is not None
    for kind, d, n, eps in GRID_CELLS:
        same, errs = 0, []
        for seed in range(reps):
            x, planted = data_of(kind, n, d, K, seed)
            ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
            params = auto.prepare(ctx, K, eps, DELTA, auto.parse_params({}))
            spec = ReleaseSpec(K, eps, DELTA, params)
            with before():
                old = auto.run(x, spec, noise_rng(kind, d, n, eps, seed))
            new = auto.run(x, spec, noise_rng(kind, d, n, eps, seed))
            if old.basis is None or new.basis is None:
                same += int(old.basis is None and new.basis is None)
            else:
                same += int(np.array_equal(old.basis, new.basis))
            best = float(np.linalg.eigvalsh(x.T @ x)[-K:].sum()) if planted is None else 0.0
            errs.append((error(x, old.basis, planted, best), error(x, new.basis, planted, best)))
        print(
            f"grid {kind} d={d} n={n} eps={eps}: identical bases {same}/{reps}, errors "
            f"before {[round(e[0], 5) for e in errs]} after {[round(e[1], 5) for e in errs]}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--ns", type=int, nargs="+", default=[200, 300, 400, 1000])
    parser.add_argument("--eps", type=float, nargs="+", default=[0.1, 0.2, 0.5])
    parser.add_argument("--grid-reps", type=int, default=2)
    args = parser.parse_args()
    with open("/proc/loadavg") as handle:
        print("loadavg", handle.read().strip())
    small_cells(args.ns, args.eps, args.reps)
    grid_cells(args.grid_reps)
    with open("/proc/loadavg") as handle:
        print("loadavg", handle.read().strip())


if __name__ == "__main__":
    main()
