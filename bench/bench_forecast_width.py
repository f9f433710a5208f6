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

import argparse
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from bench.bench_forecast_default import EARLIER_SEED, MECHANISM, NEW_SEED, datasets, spec_of
from bench.bench_honest_point import DELTA, truth
from service.mechanisms import clipped_spectrum, forecast_simulation, gauss_release_forecast
from service.mechanisms.analyze_gauss import AnalyzeGauss
from service.mechanisms.auto import plan as auto_plan
from service.mechanisms.base import PublicContext, ReleaseSpec
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
    spec = spec_of(ctx, eps, k)
    chosen = auto_plan(ctx, k, eps, DELTA, spec.params).default
    scores: dict[str, list[tuple[float, float, float, float]]] = {v: [] for v in VARIANTS}
    runs: list[str] = []
    for rep in range(reps):
        before = MECHANISM.run(rows, spec, np.random.default_rng(EARLIER_SEED + rep))
        after = MECHANISM.run(rows, spec, np.random.default_rng(NEW_SEED + rep))
        assert after.basis is not None
        kept = truth(rows, after.basis)
        extras = before.extras
        earlier = ReleaseSpec(
            k,
            float(extras["auto_epsilon"]),
            float(extras["auto_delta"]),
            AnalyzeGauss().parse_params(extras["auto_params"]),
        )
        figures = None
        for variant in VARIANTS:
            with patched(variant):
                found = release_forecast(ctx, chosen.spec(k), earlier, extras)
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
    print(
        "| variant | k | eps | runs | range covers | width | central: mean abs error "
        "| largest distance central-end |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for variant, found_rows in scores.items():
        r = np.asarray(found_rows)
        if r.size == 0:
            continue
        cover = np.mean((r[:, 1] <= r[:, 0]) & (r[:, 0] <= r[:, 2]))
        off = np.mean(np.maximum(r[:, 3] - r[:, 1], r[:, 2] - r[:, 3]))
        width = np.mean(r[:, 2] - r[:, 1])
        print(
            f"| {variant} | {k} | {eps} | {len(r)} | {cover:.2f} | {width:.3f} "
            f"| {np.mean(np.abs(r[:, 3] - r[:, 0])):.3f} | {off:.3f} |"
        )
    print("\n".join(runs), flush=True)


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
