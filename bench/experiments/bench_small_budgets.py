"""friendly_aggregate at small budgets and the gap-free histogram_aggregate (issue 16, items 2, 5).

Prints Markdown tables:

1. The refusal boundary of ``friendly_aggregate`` (``d = 50``, ``k = 3``, ``delta = 1e-6``):
   ``t_min`` and the smallest ``n`` accepted with default params, before (ramp ``b = t/4``,
   default ``t = min(floor(n/(10k)), 2000)``) and after (``b = t/2 - 1``, ``t_min`` by
   bisection, default ``t`` = the largest with ``m >= 10k`` that fits the memory limit). The
   "after" boundary is found by bisection on ``n`` over the mechanism's own ``prepare``.
2. Subspace error (median over repeats, spectral ``||Pi_hat - Pi||_2``) and no-result rate at
   ``n = 50,000``, ``d = 50``, ``k = 3``, distance ``1e-5`` to the subspace, ``eps in {1, 0.1}``:
   ``friendly_aggregate`` before (the old ramp patched back in, reference points, ``t <= 2000``)
   and after (defaults), ``histogram_aggregate`` with the width searched (no ``gamma``) and with
   ``gamma = 1e-5``, and ``analyze_gauss`` (``C = 1``), all on the same datasets.

    PYTHONPATH=. .venv/bin/python bench/experiments/bench_small_budgets.py [--repeats 5] [--quick]
        [--friendly-only] [--eps 1 0.1]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from service.mechanisms import friendly_aggregate as fa
from service.mechanisms.analyze_gauss import analyze_gauss
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.histogram_aggregate import HistogramAggregate, HistogramAggregateParams
from service.mechanisms.linalg import subspace_distance

D, K, DELTA = 50, 3, 1e-6
OLD_T_CAP = 2000


def near_subspace(
    n: int, d: int, k: int, distance: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of norm 0.2-0.9 in a random k-dim subspace plus an orthogonal residual of norm
    exactly ``distance`` (as in ``compare_friendly_vs_gauss.py``)."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((d, k)))
    coords = rng.standard_normal((n, k))
    coords *= rng.uniform(0.2, 0.9, (n, 1)) / np.linalg.norm(coords, axis=1, keepdims=True)
    resid = rng.standard_normal((n, d))
    resid -= (resid @ basis) @ basis.T
    resid *= distance / np.linalg.norm(resid, axis=1, keepdims=True)
    return coords @ basis.T + resid, basis


# ---------------------------------------------------------------------------------------------
# 1. Refusal boundary


def old_t_min(eps1: float, delta1: float) -> int:
    """``t_min`` with the former ramp ``b = t/4`` (``Delta_W = 5 - 4/t``), by linear search."""
    shift = math.log(1.0 / (2.0 * delta1)) / eps1
    t = 2
    while t - (5.0 - 4.0 / t) * shift < (5.0 - 4.0 / t) + 1.0:
        t += 1
    return t


def accepted(n: int, eps: float) -> bool:
    try:
        fa.FriendlyAggregate().prepare(
            PublicContext(n, D, None), K, eps, DELTA, fa.FriendlyAggregateParams()
        )
    except InvalidParameter:
        return False
    return True


def smallest_n(eps: float) -> int:
    """Smallest ``n`` whose default request is accepted (acceptance is monotone in ``n``)."""
    low, high = 1, 10 * K
    while not accepted(high, eps):
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        if accepted(mid, eps):
            high = mid
        else:
            low = mid
    return high


def boundary_table() -> None:
    print("| epsilon | t_min before | smallest n before | t_min after | smallest n after |")
    print("|---|---|---|---|---|")
    for eps in (0.1, 1.0):
        split = fa.standard_split(eps, DELTA, radius_given=False)
        before = old_t_min(split.eps1, split.delta1)
        n_before = (
            f"{before * 10 * K:,}"
            if before <= OLD_T_CAP
            else f"never (t_min > the cap {OLD_T_CAP:,})"
        )
        after = fa.t_min_for(eps, DELTA, radius_given=False)
        print(f"| {eps:g} | {before:,} | {n_before} | {after:,} | {smallest_n(eps):,} |")


# ---------------------------------------------------------------------------------------------
# 2. Error and no-result rate


@contextmanager
def old_ramp() -> Iterator[None]:
    """The former ramp ``b = t/4`` (everything else in the mechanism unchanged)."""
    real = fa.ramp_width
    fa.ramp_width = lambda t: t / 4.0  # type: ignore[assignment]
    try:
        yield
    finally:
        fa.ramp_width = real  # type: ignore[assignment]


Runner = Callable[[np.ndarray, float, np.random.Generator], "np.ndarray | None"]


def friendly_before(data: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray | None:
    n = data.shape[0]
    t = min(n // (10 * K), OLD_T_CAP)
    split = fa.standard_split(eps, DELTA, radius_given=False)
    if t < old_t_min(split.eps1, split.delta1):
        raise InvalidParameter("t", "refused")
    with old_ramp():
        return fa.friendly_aggregate(
            data, K, eps, DELTA, rng, t=t, aggregator="reference_points"
        ).basis


def mechanism_runner(mech: Any, params: Any) -> Runner:
    def run(data: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray | None:
        n, d = data.shape
        resolved = mech.prepare(PublicContext(n, d, None), K, eps, DELTA, params)
        basis: np.ndarray | None = mech.run(data, ReleaseSpec(K, eps, DELTA, resolved), rng).basis
        return basis

    return run


def gauss(data: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray | None:
    basis, _ = analyze_gauss(data, K, eps, DELTA, 1.0, rng)
    return basis


def error_table(
    n: int,
    distance: float,
    repeats: int,
    friendly_only: bool = False,
    epsilons: tuple[float, ...] = (1.0, 0.1),
) -> None:
    runners: dict[str, Runner] = {
        "friendly_aggregate before (b = t/4, reference points, t <= 2000)": friendly_before,
        "friendly_aggregate after (defaults)": mechanism_runner(
            fa.FriendlyAggregate(), fa.FriendlyAggregateParams()
        ),
        "histogram_aggregate, width searched (no gamma)": mechanism_runner(
            HistogramAggregate(), HistogramAggregateParams()
        ),
        f"histogram_aggregate, gamma = {distance:g}": mechanism_runner(
            HistogramAggregate(), HistogramAggregateParams(gamma=distance)
        ),
        "analyze_gauss (C = 1)": gauss,
    }
    if friendly_only:  # derivation F2's before/after: the current defaults alone
        runners = {name: run for name, run in runners.items() if "after" in name}
    print(
        f"\nn = {n:,}, d = {D}, k = {K}, delta = {DELTA:g}, distance {distance:g}, "
        f"{repeats} datasets; median error over runs with a result (no_result counted apart)\n"
    )
    print("| mechanism | epsilon | median error | no_result | seconds per run |")
    print("|---|---|---|---|---|")
    datasets = [near_subspace(n, D, K, distance, seed) for seed in range(repeats)]
    for eps in epsilons:
        for name, runner in runners.items():
            errors: list[float] = []
            none = 0
            start = time.perf_counter()
            try:
                for seed, (data, basis) in enumerate(datasets):
                    released = runner(data, eps, np.random.default_rng(1000 + seed))
                    if released is None:
                        none += 1
                    else:
                        errors.append(subspace_distance(released, basis))
            except InvalidParameter:
                print(f"| {name} | {eps:g} | refused (422) | - | - |")
                continue
            per_run = (time.perf_counter() - start) / repeats
            median = f"{np.median(errors):.2g}" if errors else "-"
            print(f"| {name} | {eps:g} | {median} | {none}/{repeats} | {per_run:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="n = 20,000 and 2 repeats")
    parser.add_argument(
        "--friendly-only",
        action="store_true",
        help="only friendly_aggregate with the current defaults (same datasets and seeds)",
    )
    parser.add_argument("--eps", type=float, nargs="+", default=[1.0, 0.1])
    args = parser.parse_args()
    boundary_table()
    if args.quick:
        error_table(20_000, 1e-5, 2)
    else:
        error_table(50_000, 1e-5, args.repeats, args.friendly_only, tuple(args.eps))


if __name__ == "__main__":
    main()
