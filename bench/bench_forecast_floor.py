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

import math
from typing import Any

import numpy as np

from bench.bench_forecast_default import forecast_pairs, main_diagnostic, print_scores
from service.mechanisms import analyze_gauss, gauss_release_forecast
from service.mechanisms.base import PublicContext
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
    scores: dict[str, list[tuple[float, float, float, float]]] = {v: [] for v in VARIANTS}
    kept_all = []
    analyze_gauss.release_of_gram = _recording
    try:
        for pair in forecast_pairs(ctx, rows, k, eps, reps, seen=lambda: _EXACT["trace"]):
            exact_trace, kept, earlier = pair.seen, pair.kept, pair.earlier
            kept_all.append(kept)
            extras = dict(pair.before.extras)
            # Pairs: the released figures are the m-pair Gram's scaled to n rows.
            ratio = _pairs_scale(extras, n)
            if pair.rep == 0:
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
                    found = release_forecast(ctx, pair.new, earlier, shown)
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
    print_scores(
        k, eps, scores, "width <= 0.2", lambda r: f"{int(np.sum(r[:, 2] - r[:, 1] <= 0.2))}"
    )


def _pairs_scale(extras: dict[str, Any], n: int) -> float:
    """``n / m`` on the pairs route (the released figures are scaled by it), else 1."""
    if extras.get("centring") != "pairs":
        return 1.0
    return n / (n // 2)


def main() -> None:
    main_diagnostic(cell)


if __name__ == "__main__":
    main()
