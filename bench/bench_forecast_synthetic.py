"""Issue 32, item 4: the forecast from an earlier release's spectrum on synthetic spectra.

    python -m bench.bench_forecast_synthetic [--seeds 6]

Held-out check of :func:`service.mechanisms.gauss_release_forecast.spectrum_share` (the
``?forecast_from=`` path taken when the earlier release's share was hidden by its noise): no
constant of it was fitted, and none of these spectra is a benchmark dataset. Gaussian rows
(n = 2,000) with a known spectrum are clipped at the 0.3 quantile of their norms (as the
default clip quantile does), a release-like noisy Gram ``H + E(sigma)`` gives the earlier
release's top-k eigenvalues and trace, and a second draw of the noise gives the basis whose
kept share (of the covariance's variance) the forecast is scored against. ``sigma`` puts the
noise's edge ``2 sigma sqrt(d)`` at 0.05, 0.15 and 0.4 of the clipped trace. Columns: the mean
kept share, the mean forecast, its mean absolute error, and the same without the clip's
correction (the clipped spectrum read as the covariance's).

``--cross``: the forecast across settings (issue 32 item 4), from an earlier release at one
(edge, k) to a new release at another (every pair of edges 0.05 / 0.4 and k 2 / 10), with
:func:`service.mechanisms.gauss_release_forecast.range_from_release`: the central figure's mean
absolute error, how often the range covers what the new release keeps, its mean width, and how
often it is narrow enough for a point (and that point's error). Nothing of the forecast was
fitted on these spectra either.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import numpy as np

from service.mechanisms.forecast_figures import ReleasedFigures
from service.mechanisms.gauss_release_forecast import NewRelease, range_from_release, spectrum_share
from service.mechanisms.noise import symmetric_gaussian

Rows = np.ndarray[Any, Any]

SPECTRA: dict[str, Rows] = {
    "spiked, d 30": np.r_[[20.0, 6.0, 2.0], np.full(27, 0.1)],
    "i^-1, d 100": 1.0 / np.arange(1, 101),
    "i^-2, d 100": 1.0 / np.arange(1, 101) ** 2,
    "one spike + flat, d 200": np.r_[[5.0], np.full(199, 0.05)],
    "i^-0.5, d 300": 1.0 / np.arange(1, 301) ** 0.5,
}


def release(rows: Rows, clip: float, sigma: float, k: int, seed: int) -> tuple[Rows, Rows, float]:
    norms = np.linalg.norm(rows, axis=1)
    clipped = rows * np.minimum(1.0, clip / norms)[:, None]
    noise = symmetric_gaussian(rows.shape[1], sigma, np.random.default_rng(seed))
    values, vectors = np.linalg.eigh(clipped.T @ clipped + noise)
    return values[::-1][:k], vectors[:, ::-1][:, :k], float(np.trace(clipped.T @ clipped + noise))


def trial(spectrum: Rows, k: int, edge_share: float, seed: int) -> tuple[float, float, float]:
    n, d = 2000, spectrum.shape[0]
    rows = np.random.default_rng(seed).standard_normal((n, d)) * np.sqrt(spectrum)
    clip = float(np.quantile(np.linalg.norm(rows, axis=1), 0.3))
    sigma = edge_share * n * clip**2 / (2.0 * np.sqrt(d))
    values, _, trace = release(rows, clip, sigma, k, 1000 + seed)
    figures = ReleasedFigures(
        ratios=(0.0,) * k, interval=(0.0, 1.0), eigenvalues=tuple(values), trace=trace,
        sigma=sigma, n_cols=d, n_rows=n, row_clip=clip,
    )  # fmt: skip
    forecast = spectrum_share(figures, k, 1.0)
    plain = spectrum_share(dataclasses.replace(figures, row_clip=0.0), k, 1.0)
    _, basis, _ = release(rows, clip, sigma, k, 2000 + seed)
    kept = float(np.sum(spectrum[:, None] * basis**2) / spectrum.sum())
    return kept, forecast, plain


def cross_trial(
    spectrum: Rows, earlier: tuple[float, int], new: tuple[float, int], seed: int
) -> tuple[float, float, float, float, float | None]:
    """``(kept, central, low, high, point)`` for a release at ``new`` forecast from one at
    ``earlier`` ((edge share, k) each) on the same rows."""
    n, d = 2000, spectrum.shape[0]
    rows = np.random.default_rng(seed).standard_normal((n, d)) * np.sqrt(spectrum)
    clip = float(np.quantile(np.linalg.norm(rows, axis=1), 0.3))
    sigmas = [edge * n * clip**2 / (2.0 * np.sqrt(d)) for edge, _ in (earlier, new)]
    k0, k1 = earlier[1], new[1]
    values, _, trace = release(rows, clip, sigmas[0], k0, 1000 + seed)
    figures = ReleasedFigures(
        ratios=(0.0,) * k0, interval=(0.0, 1.0), eigenvalues=tuple(values), trace=trace,
        sigma=sigmas[0], n_cols=d, n_rows=n, row_clip=clip,
    )  # fmt: skip
    found = range_from_release(figures, NewRelease(k1, sigmas[1] / sigmas[0]))
    _, basis, _ = release(rows, clip, sigmas[1], k1, 2000 + seed)
    kept = float(np.sum(spectrum[:, None] * basis**2) / spectrum.sum())
    return kept, found.central, found.low, found.high, found.point


def main_cross(seeds: int) -> None:
    print(
        "| spectrum | earlier edge / k | new edge / k | kept | central: mean abs error "
        "| range covers | range width | runs with a point | point: mean abs error |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    settings = [(0.05, 2), (0.05, 10), (0.4, 2), (0.4, 10)]
    errors, covers, pointed, point_errors = [], [], 0, []
    for name, spectrum in SPECTRA.items():
        for earlier in settings:
            for new in settings:
                runs = [cross_trial(spectrum, earlier, new, s) for s in range(seeds)]
                kept = np.asarray([r[0] for r in runs])
                central = np.asarray([r[1] for r in runs])
                cover = np.mean([r[2] <= r[0] <= r[3] for r in runs])
                width = np.mean([r[3] - r[2] for r in runs])
                points = [r[4] - r[0] for r in runs if r[4] is not None]
                error = float(np.mean(np.abs(central - kept)))
                errors.append(error)
                covers.append(cover)
                pointed += len(points)
                point_errors += points
                point = f"{np.mean(np.abs(points)):.3f}" if points else "-"
                print(
                    f"| {name} | {earlier[0]} / {earlier[1]} | {new[0]} / {new[1]} "
                    f"| {kept.mean():.3f} | {error:.3f} | {cover:.2f} | {width:.2f} "
                    f"| {len(points) / seeds:.2f} | {point} |",
                    flush=True,
                )
    total = len(errors) * seeds
    print(
        f"\ncentral: median cell error {float(np.median(errors)):.3f}, largest "
        f"{max(errors):.3f}; range coverage {float(np.mean(covers)):.3f} over {total} runs; "
        f"a point in {pointed} of {total}, mean abs error "
        f"{float(np.mean(np.abs(point_errors))) if point_errors else float('nan'):.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--cross", action="store_true", help="forecasts across settings")
    args = parser.parse_args()
    if args.cross:
        main_cross(args.seeds)
        return
    print(
        "| spectrum | k | edge / clipped trace | kept | forecast | mean abs error "
        "| without the clip's correction |"
    )
    print("|---|---|---|---|---|---|---|")
    errors = []
    for name, spectrum in SPECTRA.items():
        for k in (2, 10):
            for edge_share in (0.05, 0.15, 0.4):
                runs = np.asarray([trial(spectrum, k, edge_share, s) for s in range(args.seeds)])
                kept, forecast, plain = runs.T
                error = float(np.mean(np.abs(forecast - kept)))
                errors.append(error)
                print(
                    f"| {name} | {k} | {edge_share} | {kept.mean():.3f} | {forecast.mean():.3f} "
                    f"| {error:.3f} | {np.mean(np.abs(plain - kept)):.3f} |",
                    flush=True,
                )
    print(f"\nlargest cell error {max(errors):.3f}; median {float(np.median(errors)):.3f}")


if __name__ == "__main__":
    main()
