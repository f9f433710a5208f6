"""Issue 24, item 5: auto against analyze_gauss at the whole budget on realistic spectra.

    python -m bench.bench_auto_realistic [--reps 2] [--dims 50 300 1000] [--ns 5000 50000]
        [--ks 5] [--kinds power_law heavy_tailed spiked_outliers]

Three kinds of rows, scaled to norm <= 1 by a public factor and clipped (C = 1), k = 5 (or each
of ``--ks``; the rows do not depend on k: 5 spikes whatever k is asked):
``power_law`` (Gaussian rows, covariance eigenvalues ~ 1/i, random rotation), ``heavy_tailed``
(the same, times a Student-t radius with 3 degrees of freedom), ``spiked_outliers`` (k spikes of
variance 1 over an isotropic floor of 0.05, plus 1% of rows at the bound in random
directions); not by default, ``near_low_rank`` (K spikes over a floor of variance 1e-4: rows
at relative distance ~0.03-0.1 of a K-dim subspace, where auto's tests may choose
friendly_aggregate). Per cell: the share of the (clipped, uncentred) sum of squares the released
subspace captures, over non-private PCA's (1 = as good as PCA), for analyze_gauss, auto and a
random subspace, the ratio of their deficits ``(1 - auto)/(1 - analyze_gauss)`` and auto's
choices. delta = 1e-6.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import numpy as np

from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.linalg import clip_rows
from service.mechanisms.registry import get_mechanism

K, DELTA = 5, 1e-6  # K: the number of spikes of ``spiked_outliers`` (and the default k)


def rows(kind: str, n: int, d: int, seed: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.standard_normal((d, d)))
    if kind == "spiked_outliers":
        scales = np.full(d, np.sqrt(0.05))
        scales[:K] = 1.0
    elif kind == "near_low_rank":  # K spikes over a floor of variance 1e-4: near a subspace
        scales = np.full(d, 1e-2)
        scales[:K] = 1.0
    else:
        scales = 1.0 / np.sqrt(np.arange(1, d + 1))
    x = (rng.standard_normal((n, d)) * scales) @ rotation.T
    if kind == "heavy_tailed":
        x *= np.sqrt(3.0 / rng.chisquare(3.0, size=(n, 1)))
    x /= 3.0 * np.sqrt(np.sum(scales**2))  # a public scale: typical norms ~1/3
    if kind == "spiked_outliers":
        bad = rng.choice(n, size=n // 100, replace=False)
        out = rng.standard_normal((bad.size, d))
        x[bad] = out / np.linalg.norm(out, axis=1, keepdims=True)
    return clip_rows(x, 1.0)


def captured(x: np.ndarray[Any, Any], basis: np.ndarray[Any, Any]) -> float:
    return float(np.sum((x @ basis) ** 2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--dims", type=int, nargs="+", default=[50, 300, 1000])
    parser.add_argument("--ns", type=int, nargs="+", default=[5000, 50000])
    parser.add_argument("--ks", type=int, nargs="+", default=[K])
    parser.add_argument(
        "--kinds", nargs="+", default=["power_law", "heavy_tailed", "spiked_outliers"]
    )
    args = parser.parse_args()
    print(
        "| data | k | d | n | eps | analyze_gauss | auto | random | auto deficit / gauss's "
        "| auto ran |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind, k in ((kind, k) for k in args.ks for kind in args.kinds):
        for d in args.dims:
            for n in args.ns:
                for eps in (0.1, 1.0):
                    shares: dict[str, list[float]] = {"analyze_gauss": [], "auto": [], "random": []}
                    ran: Counter[str] = Counter()
                    for rep in range(args.reps):
                        x = rows(kind, n, d, seed=rep)
                        values = np.linalg.eigvalsh(x.T @ x)
                        best = float(values[-k:].sum())
                        ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
                        for name in ("analyze_gauss", "auto"):
                            mechanism = get_mechanism(name)
                            assert mechanism is not None
                            params = mechanism.prepare(
                                ctx, k, eps, DELTA, mechanism.parse_params({})
                            )
                            out = mechanism.run(
                                x, ReleaseSpec(k, eps, DELTA, params), np.random.default_rng(rep)
                            )
                            share = 0.0 if out.basis is None else captured(x, out.basis) / best
                            shares[name].append(share)
                            if name == "auto":
                                ran[str(out.extras.get("auto_choice"))] += 1
                        q, _ = np.linalg.qr(np.random.default_rng(99 + rep).standard_normal((d, k)))
                        shares["random"].append(captured(x, q) / best)
                    gauss, auto, rand = (
                        float(np.mean(shares[m])) for m in ("analyze_gauss", "auto", "random")
                    )
                    ratio = (1 - auto) / max(1 - gauss, 1e-12)
                    choices = ", ".join(f"{c} {v}" for c, v in ran.items())
                    cells = [kind, k, d, n, eps, f"{gauss:.3f}", f"{auto:.3f}", f"{rand:.3f}"]
                    cells += [f"{ratio:.2f}", choices]
                    print("| " + " | ".join(map(str, cells)) + " |", flush=True)


if __name__ == "__main__":
    main()
