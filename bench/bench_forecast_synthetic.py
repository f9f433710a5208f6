"""Issue 32, item 4: the forecast from an earlier release's spectrum on synthetic spectra.

    python -m bench.bench_forecast_synthetic [--seeds 6]

Held-out check of :func:`service.mechanisms.gauss_forecast.spectrum_share` (the
``?forecast_from=`` path taken when the earlier release's share was hidden by its noise): no
constant of it was fitted, and none of these spectra is a benchmark dataset. Gaussian rows
(n = 2,000) with a known spectrum are clipped at the 0.3 quantile of their norms (as the
default clip quantile does), a release-like noisy Gram ``H + E(sigma)`` gives the earlier
release's top-k eigenvalues and trace, and a second draw of the noise gives the basis whose
kept share (of the covariance's variance) the forecast is scored against. ``sigma`` puts the
noise's edge ``2 sigma sqrt(d)`` at 0.05, 0.15 and 0.4 of the clipped trace. Columns: the mean
kept share, the mean forecast, its mean absolute error, and the same without the clip's
correction (the clipped spectrum read as the covariance's).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import numpy as np

from service.mechanisms.gauss_forecast import ReleasedFigures, spectrum_share
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=6)
    args = parser.parse_args()
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
