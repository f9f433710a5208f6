"""Issue 32, item 4: how far the clip's correction (:mod:`service.mechanisms.clipped_spectrum`)
is from the truth on rows it was not built for.

    python -m bench.bench_declip_error [--seeds 4]

The forecast from an earlier release reads the shares of the clipped rows' Gram and undoes the
clip's flattening with a Gaussian model (:func:`declipped_shares`). Here, without any privacy
noise (the model's error alone), rows of six families none of which is a benchmark dataset
(Gaussian, Student-t, unit rows with an offset, a cluster mixture, a uniform box, a
log-normal radial law) are centred, clipped at the 0.3 quantile of their norms (the default
clip quantile), and for the top ``m`` eigenvectors of the clipped Gram the share of the centred
variance they hold (the truth) is compared with the clipped Gram's own shares ("plain") and the
corrected ones. ``t = (truth - plain) / (corrected - plain)``: 1 where the correction is exact,
0 where it should not have been made, above 1 where it falls short. Only cells whose correction
is at least 0.02 give a ``t`` (below, the ratio is rounding).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np

from service.mechanisms.clipped_spectrum import declipped_shares

Rows = np.ndarray[Any, Any]
Rng = np.random.Generator


def gaussian(rng: Rng) -> Rows:
    return rng.standard_normal((3000, 50)) / np.sqrt(np.arange(1, 51))


def spiked(rng: Rng) -> Rows:
    scales = np.r_[[4.0, 2.5, 1.5], np.full(27, 0.3)]
    return rng.standard_normal((3000, 30)) * scales


def student(rng: Rng) -> Rows:
    rows = rng.standard_normal((3000, 40)) / np.arange(1, 41)
    return rows / np.sqrt(rng.chisquare(4, (3000, 1)) / 4)


def unit_offset(rng: Rng) -> Rows:
    rows = rng.standard_normal((3000, 60)) / np.arange(1, 61) ** 0.6
    rows[:, 5] += 1.5
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def clusters(rng: Rng) -> Rows:
    centres = rng.standard_normal((3, 30)) * 2.0
    labels = rng.integers(0, 3, 3000)
    return centres[labels] + rng.standard_normal((3000, 30)) * 0.5


def box(rng: Rng) -> Rows:
    return rng.uniform(-1, 1, (3000, 20)) * np.r_[[3.0, 2.0], np.ones(18)]


def lognormal_radius(rng: Rng) -> Rows:
    rows = rng.standard_normal((3000, 40)) / np.arange(1, 41) ** 0.8
    return rows * np.exp(rng.standard_normal((3000, 1)) * 0.7)


FAMILIES: dict[str, Callable[[Rng], Rows]] = {
    "Gaussian i^-1, d 50": gaussian,
    "Gaussian spiked, d 30": spiked,
    "Student-t (4) i^-2, d 40": student,
    "unit rows + offset, d 60": unit_offset,
    "3 clusters, d 30": clusters,
    "uniform box, d 20": box,
    "log-normal radius, d 40": lognormal_radius,
}


def cell(rows: Rows, m: int) -> tuple[float, float, float]:
    """``(truth, plain, corrected)``: the top-``m`` share of the centred variance, of the clipped
    Gram, and the corrected one."""
    y = rows - rows.mean(axis=0)
    norms = np.linalg.norm(y, axis=1)
    clip = float(np.quantile(norms, 0.3))
    z = y * np.minimum(1.0, clip / norms)[:, None]
    gram = z.T @ z
    values, vectors = np.linalg.eigh(gram)
    values, vectors = values[::-1], vectors[:, ::-1]
    plain = values / values.sum()
    truth = float(np.sum((y @ vectors[:, :m]) ** 2) / np.sum(y**2))
    filled = float(np.trace(gram)) / (rows.shape[0] * clip**2)
    corrected, _ = declipped_shares(plain[:m], rows.shape[1], filled)
    return truth, float(plain[:m].sum()), float(corrected.sum())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    print("| rows | m | truth | plain | corrected | corrected - truth | t |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for name, family in FAMILIES.items():
        for m in (1, 3, 5):
            runs = np.asarray(
                [cell(family(np.random.default_rng(seed)), m) for seed in range(args.seeds)]
            )
            truth, plain, corrected = runs.mean(axis=0)
            t = (truth - plain) / (corrected - plain) if abs(corrected - plain) >= 0.02 else None
            if t is not None:
                ratios.append(t)
            shown = f"{t:.2f}" if t is not None else "-"
            print(
                f"| {name} | {m} | {truth:.3f} | {plain:.3f} | {corrected:.3f} "
                f"| {corrected - truth:+.3f} | {shown} |",
                flush=True,
            )
    print(f"\nt over {len(ratios)} cells: min {min(ratios):.2f}, max {max(ratios):.2f}")


if __name__ == "__main__":
    main()
