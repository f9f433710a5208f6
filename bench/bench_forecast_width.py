"""Issue 32 item 4: what makes the dry run's forecast range from a hidden earlier release wide
(breast_cancer at eps 1: 0.44-0.48, no point), reading by reading.

    python -m bench.bench_forecast_width [--reps 20] [--k 1 2 5 10] [--eps 1] [--only NAME]

The same pairs of ``PrivatePCA``-style releases as ``bench.bench_forecast_default`` (release
``rep`` with seed ``EARLIER_SEED + rep`` forecasts release ``rep`` with seed ``NEW_SEED +
rep``; ``auto``, ``center: "private"``, the default clip choice), each forecast made again
with one of the range's readings switched off (a diagnostic: the readings are patched in this
process only):

- ``trace``: the hidden release's shares read at its noisy trace alone, not also at ``tr -/+ Z
  sigma sqrt(d)`` (``forecast_spread.trace_readings``);
- ``eigen``: its eigenvalues read as released, not also at ``-/+ Z sqrt(2) sigma`` (``Z = 0``);
- ``declip``: no correction for the clip's flattening (``declipped_shares`` the identity);
- ``spread``: the simulated new release's own draw-to-draw spread left out;
- ``ceiling``: the trace's high reading capped at ``n C2^2`` (the most the clipped rows' trace
  can be; the data's part scaled as ``data_spectrum`` scales it), everything else as shipped.

Printed per cell and variant: the range's coverage of what the new release kept, its mean
width, the central figure's mean absolute error and the mean of the larger distance from the
central figure to an end (a point is stated only where it is at most 0.1); then per run the
figures behind the central error: the earlier release's clip, ``tr / (n C2^2)`` (its fill), its
top eigenvalue over its trace, ``sigma sqrt(d) / tr`` (the trace noise's sd over the trace),
the new release's clip and what it kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from bench.bench_forecast_default import forecast_pairs, main_diagnostic, print_scores
from service.mechanisms import clipped_spectrum, forecast_simulation, gauss_release_forecast
from service.mechanisms.base import PublicContext
from service.mechanisms.gauss_preview import release_forecast

VARIANTS = ("shipped", "ceiling", "trace", "eigen", "declip", "spread", "trace+eigen", "all four")

#: The earlier release's figures the ``ceiling`` variant caps the trace with (set per run).
_CURRENT: dict[str, Any] = {}


@contextmanager
def patched(variant: str) -> Iterator[None]:
    """The forecast's module-level readings switched off (or capped) for ``variant``."""
    # (getattr: the two names are gauss_release_forecast's imports, patched where it reads them.)
    names: list[tuple[Any, str]] = [
        (gauss_release_forecast, "trace_readings"),
        (gauss_release_forecast, "Z"),
    ]
    names += [(gauss_release_forecast, "simulated_share"), (clipped_spectrum, "declipped_shares")]
    saved = [getattr(module, name) for module, name in names]
    readings: Callable[..., tuple[Any, Any]] = saved[0]
    simulate: Callable[..., forecast_simulation.Simulated] = saved[2]
    parts = set(variant.split("+")) if variant != "all four" else {"trace", "eigen", "spread"}
    if variant == "all four":
        parts.add("declip")

    def flat(shares: Any, *_: Any) -> tuple[Any, Any]:
        return shares, shares

    def capped(shares: Any, trace: float, sigma: float, d: int) -> tuple[Any, Any]:
        figures = _CURRENT["figures"]
        ceiling = math.inf
        if not figures.uncentred and figures.n_rows > 0 and figures.row_clip > 0:
            ceiling = figures.n_rows * figures.row_clip**2 * trace / figures.trace
        spread = gauss_release_forecast.Z * sigma * math.sqrt(d)
        if math.isfinite(ceiling) and trace + spread > ceiling and trace > 0:
            # The low reading at the bound (never below the noisy trace itself).
            _, high = readings(shares, trace, sigma, d)
            return shares * trace / max(ceiling, trace), high
        return readings(shares, trace, sigma, d)

    def still(*args: Any, **kwargs: Any) -> forecast_simulation.Simulated:
        return simulate(*args, **kwargs)._replace(below=0.0, above=0.0)

    def undeclipped(shares: Any, *_: Any) -> tuple[Any, None]:
        return shares, None

    setters: list[Callable[[], None]] = []
    if variant == "ceiling":
        setters.append(lambda: setattr(gauss_release_forecast, "trace_readings", capped))
    if "trace" in parts:
        setters.append(lambda: setattr(gauss_release_forecast, "trace_readings", flat))
    if "eigen" in parts:
        setters.append(lambda: setattr(gauss_release_forecast, "Z", 0.0))
    if "spread" in parts:
        setters.append(lambda: setattr(gauss_release_forecast, "simulated_share", still))
    if "declip" in parts:
        setters.append(lambda: setattr(clipped_spectrum, "declipped_shares", undeclipped))
    try:
        for setter in setters:
            setter()
        yield
    finally:
        for (module, name), value in zip(names, saved, strict=True):
            setattr(module, name, value)


def cell(rows: np.ndarray[Any, Any], k: int, eps: float, reps: int) -> None:
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    scores: dict[str, list[tuple[float, float, float, float]]] = {v: [] for v in VARIANTS}
    runs: list[str] = []
    for pair in forecast_pairs(ctx, rows, k, eps, reps):
        rep, after, kept, extras = pair.rep, pair.after, pair.kept, pair.before.extras
        figures = None
        for variant in VARIANTS:
            with patched(variant):
                found = release_forecast(ctx, pair.new, pair.earlier, extras)
                if found is None:
                    continue
                # ("shipped" runs first: the ceiling variant reads this run's figures.)
                figures, forecast, _ = found
                _CURRENT["figures"] = figures
            scores[variant].append((kept, forecast.low, forecast.high, forecast.central))
        if figures is not None and figures.trace != 0:
            runs.append(
                f"  run {rep:2d}: earlier clip {figures.row_clip:.4f} fill "
                f"{figures.clipped_share:.2f} top/tr {figures.eigenvalues[0] / figures.trace:.3f} "
                f"sigma sqrt(d)/tr {figures.sigma * math.sqrt(d) / figures.trace:.3f} hidden "
                f"{not figures.measured} | new clip "
                f"{float(after.extras.get('row_clip_norm', math.nan)):.4f} kept {kept:.3f} "
                f"central {scores['shipped'][-1][3]:.3f}"
            )

    def off(r: np.ndarray[Any, Any]) -> str:
        return f"{np.mean(np.maximum(r[:, 3] - r[:, 1], r[:, 2] - r[:, 3])):.3f}"

    print_scores(k, eps, scores, "largest distance central-end", off)
    print("\n".join(runs), flush=True)


def main() -> None:
    main_diagnostic(cell)


if __name__ == "__main__":
    main()
