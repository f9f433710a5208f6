"""High-dimension candidates against ``analyze_gauss`` (issue 32 item 3), same process, same
budget, same metric.

    python -m bench.bench_highdim [--reps 2] [--quick] [--data mnist power_law sweep digits]
        [--publish]

Data: MNIST (4,000 of the 5,000-image sample drawn at random with the public seed
``MNIST_SEED``, unit rows, 784 pixels; ``bench/mnist.py``; until 29 Nov 2026 it took the
file's first 4,000 rows, which are sorted by label: the digits 0-7 only) and
synthetic power-law rows at d = 1,000 (4,000 Gaussian rows, covariance eigenvalues ~ 1/i in a
random basis, offset along the last direction, unit rows). k = 10, eps 1 and 0.3, delta 1e-6.
Metric: the share of the rows' centred variance (rows clipped to 1) that the released basis
captures, mean over ``--reps`` seeds; non-private: the top-10 centred PCA.

Candidates (all at the request's GDP ``mu``; where they centre, on a private mean with 0.2 of
``mu^2``, as ``spatial_sign``):

- ``analyze_gauss {}`` and ``analyze_gauss center=private`` (its recommended settings: clip
  quantile 0.3, centring route chosen): the registry's mechanism, unchanged.
- ``spatial_sign``: the registry's mechanism (spatial signs of the centred rows, Analyze Gauss
  noise).
- ``gap_perturbation center=private``: the registry's mechanism, Gaussian noise on the spectral
  projector with a sensitivity from a private eigengap (the idea of Cai, Xia & Zha 2024 for
  spiked covariance); a no_result keeps 0.
- ``power L``: the noisy power method (Hardt & Price 2014): ``V <- qr(H V + G)``, ``G`` d x k
  Gaussian, ``L`` iterations at ``mu/sqrt(L)`` each (``(H - H')V`` has Frobenius norm
  ``<= sqrt(2) C^2`` for orthonormal ``V``).
- ``power+RR L``: the same with ``3k`` columns and a Rayleigh-Ritz step (``V^T H V`` plus a 3k x
  3k symmetric Gaussian, 0.2 of the budget) to pick k of them.
- ``DLY separate``: Dong, Liang & Yi 2022's trace-sensitive ``Separate``: eigenvalues and
  eigenvectors released separately, half the budget each; the subspace is that of the Gram
  matrix with Analyze Gauss noise at half the budget.
- ``screen s``: private diagonal (sensitivity ``sqrt(2) C^2``, 0.1 of the budget), the ``s``
  coordinates of largest noisy variance kept, Analyze Gauss on them (diagonal thresholding).
- ``refine m``: Analyze Gauss at half the budget, then again inside its top-``m`` eigenspace
  (noise in ``m`` dimensions) with the other half.
- ``tail-sensitive c``: centred rows clipped to ``c`` (Dong, Liang & Yi's tail-sensitive idea,
  here at fixed public radii), Analyze Gauss noise scaled to ``c``.
- ``auto center=private``: the registry's ``auto`` as ``PrivatePCA`` sends it (what a user gets).
- ``friendly_aggregate`` and ``histogram_aggregate``: the registry's aggregators at their
  defaults. A refusal (too few rows for the budget) or a no_result keeps 0 and is counted
  ("no basis").

``--data why``: why no candidate reaches 1.5x on the power-law rows (eps 1): the non-private
ceiling over ``analyze_gauss``, the centred eigenvalues against the Gram noise's spike threshold
``sigma sqrt(d)``, and the *noise oracle*: Analyze Gauss on the exactly centred rows with its
noise divided by ``r`` (not a mechanism: what ``r`` times less noise, about ``r`` times the rows
or the ``mu``, would keep), so the noise cut a 1.5x needs can be read off. ``--csv PATH`` writes
every seed's figure (candidate, eps, seed, kept, no_basis).

A d-sweep (power-law rows, n = 4,000, d from 30 to 300) and a low-dimension check (digits,
1,797 x 64) show what the sign map costs where ``d`` is below
``n^(2/3)``.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.mnist import mnist_split, unit_rows
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.composition import gaussian_total_mu
from service.mechanisms.linalg import clip_rows
from service.mechanisms.noise import symmetric_gaussian
from service.mechanisms.registry import get_mechanism

K, DELTA, CENTER_SHARE = 10, 1e-6, 0.2
#: The MNIST split's public seed: ``bench_forecast_coverage``'s and ``bench_honest_point``'s.
MNIST_SEED = 0
DATA = ("mnist", "power_law", "sweep", "digits", "why")
#: The noise oracle's divisors of Analyze Gauss's noise (``--data why``).
ORACLE_R = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0)
Array = np.ndarray[Any, Any]
Candidate = Callable[[Array, float, np.random.Generator], Array | None]

SECTION = Path(__file__).resolve().parent / "results" / "highdim.md"


def power_law(n: int, d: int, seed: int, exponent: float = 1.0) -> Array:
    """Unit rows: Gaussian with covariance eigenvalues ``i^-exponent`` in a random basis, plus an
    offset along the last direction (so centring matters), then scaled to norm 1."""
    rng = np.random.default_rng(seed)
    scales = np.arange(1, d + 1) ** (-exponent / 2)
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
    rows = (rng.standard_normal((n, d)) * scales) @ basis
    rows += basis[:, -1] * 0.3 * np.sqrt(np.sum(scales**2))
    return np.asarray(rows / np.linalg.norm(rows, axis=1, keepdims=True))


def centred_rows(rows: Array) -> Array:
    y = clip_rows(rows, 1.0)
    return np.asarray(y - y.mean(axis=0))


def kept(rows: Array, basis: Array | None) -> float:
    """Share of the centred variance of the rows (clipped to 1) captured by ``basis``."""
    if basis is None:
        return 0.0
    y = centred_rows(rows)
    return float(np.sum((y @ basis) ** 2) / np.sum(y**2))


def top_k(matrix: Array, k: int) -> Array:
    return np.asarray(np.linalg.eigh(matrix)[1][:, ::-1][:, :k])


def registry_candidate(name: str, params: dict[str, Any]) -> Candidate:
    mechanism = get_mechanism(name)
    assert mechanism is not None

    def run(rows: Array, eps: float, rng: np.random.Generator) -> Array | None:
        n, d = rows.shape
        ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
        try:
            prepared = mechanism.prepare(ctx, K, eps, DELTA, mechanism.parse_params(params))
        except InvalidParameter:
            return None  # refused at this (n, eps, delta): keeps nothing (as a no_result)
        out = mechanism.run(rows, ReleaseSpec(K, eps, DELTA, prepared), rng)
        return out.basis

    return run


def private_centred(rows: Array, mu: float, rng: np.random.Generator) -> tuple[Array, float]:
    """Rows clipped to 1, centred on a private mean (``CENTER_SHARE mu^2``), clipped again; and
    the ``mu`` left for the rest."""
    n, d = rows.shape
    mu_c = math.sqrt(CENTER_SHARE) * mu
    clipped = clip_rows(rows, 1.0)
    centre = clipped.mean(axis=0) + rng.normal(0.0, (2.0 / n) / mu_c, d)
    return clip_rows(clipped - centre, 1.0), math.sqrt(1.0 - CENTER_SHARE) * mu


def ag_on(y: Array, mu: float, rng: np.random.Generator, k: int = K) -> Array:
    """Analyze Gauss on rows of norm <= 1 at ``mu``-GDP."""
    return top_k(y.T @ y + symmetric_gaussian(y.shape[1], math.sqrt(2.0) / mu, rng), k)


def power(iterations: int, rayleigh_ritz: bool) -> Candidate:
    def run(rows: Array, eps: float, rng: np.random.Generator) -> Array:
        y, mu = private_centred(rows, gaussian_total_mu(eps, DELTA, 0.0, 0.0), rng)
        d = y.shape[1]
        width = 3 * K if rayleigh_ritz else K
        mu_rr = math.sqrt(0.2) * mu if rayleigh_ritz else 0.0
        mu_step = math.sqrt(mu**2 - mu_rr**2) / math.sqrt(iterations)
        gram = y.T @ y
        basis = np.linalg.qr(rng.standard_normal((d, width)))[0]
        for _ in range(iterations):
            noise = rng.normal(0.0, math.sqrt(2.0) / mu_step, (d, width))
            basis = np.linalg.qr(gram @ basis + noise)[0]
        if not rayleigh_ritz:
            return np.asarray(basis)
        small = basis.T @ gram @ basis + symmetric_gaussian(width, math.sqrt(2.0) / mu_rr, rng)
        return np.asarray(basis @ top_k(small, K))

    return run


def dly_separate(rows: Array, eps: float, rng: np.random.Generator) -> Array:
    y, mu = private_centred(rows, gaussian_total_mu(eps, DELTA, 0.0, 0.0), rng)
    return ag_on(y, mu / math.sqrt(2.0), rng)


def screen(keep: int) -> Candidate:
    def run(rows: Array, eps: float, rng: np.random.Generator) -> Array:
        y, mu = private_centred(rows, gaussian_total_mu(eps, DELTA, 0.0, 0.0), rng)
        d = y.shape[1]
        mu_diag, mu_gram = math.sqrt(0.1) * mu, math.sqrt(0.9) * mu
        diagonal = np.sum(y * y, axis=0) + rng.normal(0.0, math.sqrt(2.0) / mu_diag, d)
        chosen = np.argsort(-diagonal)[: min(keep, d)]
        basis = np.zeros((d, K))
        basis[chosen] = ag_on(y[:, chosen], mu_gram, rng)
        return basis

    return run


def refine(width: int) -> Candidate:
    def run(rows: Array, eps: float, rng: np.random.Generator) -> Array:
        y, mu = private_centred(rows, gaussian_total_mu(eps, DELTA, 0.0, 0.0), rng)
        span = ag_on(y, mu / math.sqrt(2.0), rng, k=min(width, y.shape[1]))
        return np.asarray(span @ ag_on(y @ span, mu / math.sqrt(2.0), rng))

    return run


def tail_clip(radius: float) -> Candidate:
    def run(rows: Array, eps: float, rng: np.random.Generator) -> Array:
        y, mu = private_centred(rows, gaussian_total_mu(eps, DELTA, 0.0, 0.0), rng)
        # Clipped to c: the sensitivity is sqrt(2) c^2, the same as rows of norm 1 at c^-2 mu.
        return ag_on(clip_rows(y, radius) / radius, mu, rng)

    return run


CANDIDATES: dict[str, Candidate] = {
    "analyze_gauss {}": registry_candidate("analyze_gauss", {}),
    "analyze_gauss center=private": registry_candidate("analyze_gauss", {"center": "private"}),
    "spatial_sign": registry_candidate("spatial_sign", {}),
    "gap_perturbation center=private": registry_candidate(
        "gap_perturbation", {"center": "private"}
    ),
    "power L=2": power(2, False),
    "power+RR L=2": power(2, True),
    "DLY separate": dly_separate,
    "refine m=160": refine(160),
    "tail-sensitive c=0.5": tail_clip(0.5),
    "auto center=private": registry_candidate("auto", {"center": "private"}),
    "friendly_aggregate": registry_candidate("friendly_aggregate", {}),
    "histogram_aggregate": registry_candidate("histogram_aggregate", {}),
}


def noise_oracle(divisor: float) -> Candidate:
    """Not a mechanism: Analyze Gauss on the exactly centred rows (clipped to 1) with its noise
    divided by ``divisor``; what ``divisor`` times less noise would keep."""

    def run(rows: Array, eps: float, rng: np.random.Generator) -> Array:
        mu = gaussian_total_mu(eps, DELTA, 0.0, 0.0)
        return ag_on(clip_rows(centred_rows(rows), 1.0), mu * divisor, rng)

    return run


def candidates_for(d: int) -> dict[str, Candidate]:
    chosen = dict(CANDIDATES)
    chosen[f"screen s={d // 2}"] = screen(d // 2)
    return chosen


#: Every seed's figure: (data, candidate, eps, seed, kept, no basis), for ``--csv``.
SEED_ROWS: list[tuple[str, str, float, int, float, bool]] = []


def cell(
    rows: Array,
    eps: float,
    reps: int,
    names: list[str] | None = None,
    label: str = "",
    chosen: dict[str, Candidate] | None = None,
) -> dict[str, float]:
    if chosen is None:
        chosen = candidates_for(rows.shape[1])
    if names is not None:
        chosen = {name: chosen[name] for name in names}
    out: dict[str, float] = {}
    for name, candidate in chosen.items():
        values = []
        for seed in range(reps):
            basis = candidate(rows, eps, np.random.default_rng(seed))
            values.append(kept(rows, basis))
            SEED_ROWS.append((label, name, eps, seed, values[-1], basis is None))
        out[name] = float(np.mean(values))
    return out


def why_power_law(rows: Array, reps: int) -> list[str]:
    """Why no candidate keeps 1.5x ``analyze_gauss`` on the power-law rows at eps 1."""
    n, d = rows.shape
    mu = gaussian_total_mu(1.0, DELTA, 0.0, 0.0)
    sigma = math.sqrt(2.0) / mu
    y = centred_rows(rows)
    eigenvalues = np.linalg.eigvalsh(y.T @ y)[::-1]
    ceiling = non_private(rows)
    oracle = {f"oracle r={r:g}": noise_oracle(r) for r in ORACLE_R}
    gauss = cell(
        rows, 1.0, reps, label="why", chosen={"analyze_gauss {}": CANDIDATES["analyze_gauss {}"]}
    )
    base = gauss["analyze_gauss {}"]
    res = cell(rows, 1.0, reps, label="why", chosen=oracle)
    above = int(np.sum(eigenvalues > sigma * math.sqrt(d)))
    norms = np.linalg.norm(clip_rows(y, 1.0), axis=1)
    lines = [
        f"Why (power-law {n:,} x {d:,}, eps 1, {reps} seeds): non-private {ceiling:.3f}, "
        f"analyze_gauss {{}} {base:.3f}, ceiling / analyze_gauss {ceiling / base:.2f}x "
        f"(a 1.5x needs {1.5 * base:.3f}).",
        f"Centred eigenvalues 1-12: {', '.join(f'{v:.0f}' for v in eigenvalues[:12])}; Gram noise "
        f"sigma = {sigma:.2f}, spike threshold sigma sqrt(d) = {sigma * math.sqrt(d):.0f} "
        f"({above} eigenvalues above it); centred row norms 5/50/95%: "
        + "/".join(f"{v:.3f}" for v in np.percentile(norms, [5, 50, 95]))
        + ".",
        "",
        "| noise oracle: Analyze Gauss noise / r, exact centre | kept | x analyze_gauss {} |",
        "|---|---:|---:|",
    ]
    for name, value in res.items():
        lines.append(f"| {name} | {value:.3f} | {value / base:.2f}x |")
    lines.append("")
    return lines


def non_private(rows: Array) -> float:
    y = centred_rows(rows)
    return kept(rows, top_k(y.T @ y, K))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one seed, eps 1 only, no sweep")
    parser.add_argument("--data", nargs="+", choices=DATA, default=list(DATA))
    parser.add_argument("--publish", action="store_true", help=f"write {SECTION}")
    parser.add_argument("--eps", type=float, nargs="+", default=None, help="default 1 and 0.3")
    parser.add_argument("--csv", type=Path, default=None, help="every seed's figure")
    args = parser.parse_args(argv)
    reps = 1 if args.quick else args.reps
    epsilons = tuple(args.eps) if args.eps else ((1.0,) if args.quick else (1.0, 0.3))
    started = time.perf_counter()
    sets: dict[str, Array] = {}
    if "mnist" in args.data:
        split = mnist_split(MNIST_SEED)
        if split is None:
            print("MNIST unavailable (package index unreachable): skipped")
        else:
            sets[f"MNIST 4,000 x 784, split seed {MNIST_SEED}"] = split[0]
    if "power_law" in args.data:
        sets["power-law 4,000 x 1,000"] = power_law(4000, 1000, seed=0)
    lines = [
        "## High dimension: candidates against analyze_gauss (issue 32 item 3)",
        "",
        f"`python -m bench.bench_highdim --reps {reps} --data {' '.join(args.data)}`: "
        "share of the centred variance kept, "
        f"k = {K}, delta = {DELTA:g}, mean of {reps} seeds; ratio = against the better of the "
        "two `analyze_gauss` settings in the same cell.",
        "",
    ]
    for label, rows in sets.items():
        header = f"| candidate ({label}; non-private {non_private(rows):.3f}) |"
        header += "".join(f" eps {eps:g} | ratio |" for eps in epsilons)
        lines += [header, "|---|" + "---:|---:|" * len(epsilons)]
        results = {eps: cell(rows, eps, reps, label=label) for eps in epsilons}
        base = {
            eps: max(res["analyze_gauss {}"], res["analyze_gauss center=private"])
            for eps, res in results.items()
        }
        for name in results[epsilons[0]]:
            row = f"| {name} |"
            for eps in epsilons:
                value = results[eps][name]
                refused = sum(
                    1 for r in SEED_ROWS if r[0] == label and r[1] == name and r[2] == eps and r[5]
                )
                note = f" (no basis {refused}/{reps})" if refused else ""
                row += f" {value:.3f}{note} | {value / base[eps]:.2f}x |"
            lines.append(row)
            print(label, row, flush=True)
        lines.append("")
    if not args.quick and "sweep" in args.data:
        lines += [
            "d-sweep (power-law rows, n = 4,000, eps 1): `spatial_sign` against "
            "`analyze_gauss center=private` as d grows.",
            "",
            "| d | non-private | analyze_gauss center=private | spatial_sign | ratio |",
            "|---:|---:|---:|---:|---:|",
        ]
        names = ["analyze_gauss center=private", "spatial_sign"]
        for d in (30, 100, 300):
            rows = power_law(4000, d, seed=1)
            res = cell(rows, 1.0, reps, names)
            a, s = res[names[0]], res[names[1]]
            row = f"| {d} | {non_private(rows):.3f} | {a:.3f} | {s:.3f} | {s / a:.2f}x |"
            lines.append(row)
            print(row, flush=True)
        lines.append("")
    if not args.quick and "digits" in args.data:
        # Low dimension (d = 64 < n^(2/3) = 148): does the sign map cost anything there?
        from sklearn.datasets import load_digits  # type: ignore[import-untyped]

        digits = unit_rows(load_digits().data.astype(np.float64))
        names = ["analyze_gauss {}", "analyze_gauss center=private", "spatial_sign"]
        lines += [
            f"Low dimension: digits (1,797 x 64, unit rows; non-private {non_private(digits):.3f}),"
            f" {2 * reps} seeds.",
            "",
            "| candidate | " + " | ".join(f"eps {eps:g}" for eps in epsilons) + " |",
            "|---|" + "---:|" * len(epsilons),
        ]
        results = {eps: cell(digits, eps, 2 * reps, names) for eps in epsilons}
        for name in names:
            row = f"| {name} | " + " | ".join(f"{results[eps][name]:.3f}" for eps in epsilons)
            lines.append(row + " |")
            print(row, flush=True)
        lines.append("")
    if "why" in args.data:
        lines += why_power_law(power_law(4000, 1000, seed=0), reps)
    lines.append(f"(ran in {time.perf_counter() - started:.0f} s)")
    if args.csv is not None:
        with args.csv.open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["data", "candidate", "eps", "seed", "kept", "no_basis"])
            for data, name, eps, seed, value, refused in SEED_ROWS:
                writer.writerow([data, name, f"{eps:g}", seed, f"{value:.6f}", int(refused)])
    text = "\n".join(lines) + "\n"
    print(text)
    if args.publish:
        SECTION.parent.mkdir(parents=True, exist_ok=True)
        SECTION.write_text(text)


if __name__ == "__main__":
    main()
