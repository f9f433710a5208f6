"""Issue 32 item 4: how narrow can the forecast from a hidden earlier release get, at best?
(breast_cancer at eps 1: ranges 0.43-0.48 wide, no point.)

    python -m bench.bench_forecast_floor [--reps 20] [--k 1 2 5 10] [--eps 1] [--only NAME]

The pairs of ``PrivatePCA``-style releases of ``bench.bench_forecast_default`` (seeds
``EARLIER_SEED + rep`` / ``NEW_SEED + rep``). Per cell, two floors beside the shipped forecast:

- ``own 90%``: the shortest interval holding 90% of what the new releases kept (the
  ``ceil(0.9 runs)`` closest order statistics): no 90% range, however it is made, is narrower
  on average than this; a point is stated only where the range is at most 0.2 wide
  (``DETERMINED_WIDTH``), so where this floor exceeds 0.2 no honest rule states one;
- ``exact trace``: the forecast made again with the earlier release's noisy trace replaced by
  the trace of the very Gram it noised (**not private**: an oracle no released figure gives)
  and read at that trace alone (``trace_readings`` flat): the most any better estimate of the
  trace from released figures could take off;

Printed per variant: coverage of what the new release kept, mean width, the central figure's
mean absolute error and how many runs a point would be stated by the width rule (range <= 0.2).
A diagnostic: the oracles are patched in this process only and no forecast uses them.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from bench.bench_forecast_default import EARLIER_SEED, MECHANISM, NEW_SEED, datasets, spec_of
from bench.bench_honest_point import truth
from service.mechanisms import analyze_gauss, gauss_release_forecast
from service.mechanisms.analyze_gauss import AnalyzeGauss
from service.mechanisms.auto import plan as auto_plan
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.gauss_preview import release_forecast

VARIANTS = ("shipped", "exact trace")
_EXACT: dict[str, Any] = {}
_real_release = analyze_gauss.release_of_gram


def _recording(gram: Any, k: int, sigma: float, rng: np.random.Generator) -> Any:
    _EXACT["trace"] = float(np.trace(gram))
    return _real_release(gram, k, sigma, rng)


def shortest_cover(values: np.ndarray[Any, Any], level: float = 0.9) -> float:
    """The width of the shortest interval holding ``ceil(level * len)`` of ``values``."""
    ordered = np.sort(values)
    m = math.ceil(level * ordered.size)
    return float(np.min(ordered[m - 1 :] - ordered[: ordered.size - m + 1]))


def cell(rows: np.ndarray[Any, Any], k: int, eps: float, reps: int) -> None:
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    spec = spec_of(ctx, eps, k)
    chosen = auto_plan(ctx, k, eps, spec.delta, spec.params).default
    scores: dict[str, list[tuple[float, float, float, float]]] = {v: [] for v in VARIANTS}
    kept_all = []
    analyze_gauss.release_of_gram = _recording
    try:
        for rep in range(reps):
            before = MECHANISM.run(rows, spec, np.random.default_rng(EARLIER_SEED + rep))
            exact_trace = _EXACT["trace"]
            after = MECHANISM.run(rows, spec, np.random.default_rng(NEW_SEED + rep))
            assert after.basis is not None
            kept = truth(rows, after.basis)
            kept_all.append(kept)
            extras = dict(before.extras)
            earlier = ReleaseSpec(
                k,
                float(extras["auto_epsilon"]),
                float(extras["auto_delta"]),
                AnalyzeGauss().parse_params(extras["auto_params"]),
            )
            # Pairs: the released figures are the m-pair Gram's scaled to n rows.
            ratio = _pairs_scale(extras, n)
            if rep == 0:
                gap = float(extras["trace"]) - exact_trace * ratio
                gap /= float(extras["gram_noise_std"]) * math.sqrt(d)
                print(f"  (run 0: released trace - exact, in the trace noise's sd: {gap:.2f})")
            for variant in VARIANTS:
                shown = dict(extras)
                saved_readings = gauss_release_forecast.trace_readings
                if variant != "shipped":
                    shown["trace"] = exact_trace * ratio
                    gauss_release_forecast.trace_readings = lambda s, *_: (s, s)
                try:
                    found = release_forecast(ctx, chosen.spec(k), earlier, shown)
                finally:
                    gauss_release_forecast.trace_readings = saved_readings
                if found is not None:
                    forecast = found[1]
                    scores[variant].append((kept, forecast.low, forecast.high, forecast.central))
    finally:
        analyze_gauss.release_of_gram = _real_release
    kept_values = np.asarray(kept_all)
    print(
        f"kept mean {kept_values.mean():.3f}, own mean abs dev "
        f"{np.mean(np.abs(kept_values - kept_values.mean())):.3f}, own 90% (shortest interval "
        f"holding {math.ceil(0.9 * reps)} of {reps}) {shortest_cover(kept_values):.3f}"
    )
    print(
        "| variant | k | eps | runs | range covers | width | central: mean abs error "
        "| width <= 0.2 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for variant, found_rows in scores.items():
        r = np.asarray(found_rows)
        if r.size == 0:
            continue
        cover = np.mean((r[:, 1] <= r[:, 0]) & (r[:, 0] <= r[:, 2]))
        widths = r[:, 2] - r[:, 1]
        print(
            f"| {variant} | {k} | {eps} | {len(r)} | {cover:.2f} | {widths.mean():.3f} "
            f"| {np.mean(np.abs(r[:, 3] - r[:, 0])):.3f} | {int(np.sum(widths <= 0.2))} |",
            flush=True,
        )


def _pairs_scale(extras: dict[str, Any], n: int) -> float:
    """``n / m`` on the pairs route (the released figures are scaled by it), else 1."""
    if extras.get("centring") != "pairs":
        return 1.0
    return n / (n // 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--k", type=int, nargs="*", default=[1, 2, 5, 10])
    parser.add_argument("--eps", type=float, nargs="*", default=[1.0])
    parser.add_argument("--only", nargs="*", default=["breast_cancer"])
    args = parser.parse_args()
    for name, rows in datasets(False).items():
        if name not in args.only:
            continue
        for eps in args.eps:
            for k in args.k:
                print(f"\n{name}, k {k}, eps {eps}")
                cell(rows, k, eps, args.reps)


if __name__ == "__main__":
    main()
