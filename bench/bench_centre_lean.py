"""The private centre's bias in the captured sum: ``k/d`` of it (the service) against the lean the
released basis is expected to take (:func:`centre_lean`, a candidate estimated from released
figures only; not in the service), row-level ``analyze_gauss`` with ``center: "private"``
(issue 32 item 4).

    python -m bench.bench_centre_lean [--reps 100] [--only digits breast_cancer]
        [--eps 0.3 0.4 0.5 0.7 1 2] [--ks 1 2 5 10]

The data sets, seeds (``1000 + rep``) and truth of :mod:`bench.bench_honest_point` (the share
of the centred sum of squares of the rows clipped to C = 1 that the released basis keeps).
Each release is run once; its recorded estimate call is scored twice on the same noisy sums
and decision: ``before`` with the service's bias (shared ``k/d``), ``after`` with the bias
shared by :func:`centre_lean`. Where the basis took the centre's direction and its term stands
above the noise's edge (the whole bias in the captured sum) both are the same. Also the part
of the error that is the sums' clip (the share the exact sums keep with the rows clipped at
``variance_clip_norm`` and centred on the true mean, minus the truth). Per cell: releases,
stated points, the interval's coverage (all releases; it does not read the point's bias), the
stated points' mean absolute and signed error before -> after, all releases' likewise, the
mean lean against ``k/d``, the actual ``||U^T v||^2`` of the centre's error direction
(private: reference only), the clip's part (stated / all), and the lean's CPU over the
release's (``time.process_time`` in the same process).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import service.mechanisms.explained_variance as ev
from bench import bench_honest_point as honest
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.linalg import captured_energy, clip_rows

#: Draws of the lean's Monte Carlo average and its fixed public seed.
LEAN_DRAWS = 64
LEAN_SEED = 20261201


def centre_lean(
    eigenvalues: np.ndarray, spike: float, gram_sigma: float, trace: float, d: int
) -> float:
    """``E ||U^T v||^2``: the share of the centre's error direction ``v`` (uniform on the
    sphere) that the top-k of ``H + theta v v^T + E(sigma)`` takes, ``H`` a surrogate built from
    released figures only: the released eigenvalues above the noise's edge (debiased,
    ``spiked_debias``) and the rest of the released noisy trace, less those and ``theta``,
    spread evenly over the other directions (below the edge the release shows no shape).
    ``theta`` is the service's term in the Gram's units (``spike_in_gram``). Draws from a fixed
    public seed; everything in ``theta``'s units."""
    k = eigenvalues.shape[0]
    if not (spike > 0 and gram_sigma > 0) or k >= d:
        return k / d
    weights = ev.spiked_debias(eigenvalues, gram_sigma, d)
    above = weights[weights > 0]
    bulk = max(trace - float(above.sum()) - spike, 0.0) / (d - above.shape[0])
    diagonal = np.concatenate([above, np.full(d - above.shape[0], bulk)]) / spike
    rng = np.random.default_rng(LEAN_SEED)
    v = rng.standard_normal((LEAN_DRAWS, d))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    noise = rng.normal(0.0, gram_sigma / spike, size=(LEAN_DRAWS, d, d))
    upper = np.triu(noise)
    model = upper + np.transpose(np.triu(noise, 1), (0, 2, 1))
    model += v[:, :, None] * v[:, None, :]
    model[:, np.arange(d), np.arange(d)] += diagonal
    _, vectors = np.linalg.eigh(model)
    top = vectors[:, :, -k:]
    return float(np.mean(np.sum(np.einsum("rd,rdk->rk", v, top) ** 2, axis=1)))


def _semicircle_quantiles(count: int, radius: float) -> np.ndarray:
    """The semicircle law's quantiles on ``[-radius, radius]`` at ``(j + 0.5)/count``,
    descending."""
    p = (np.arange(count) + 0.5) / count
    x = np.linspace(-1.0, 1.0, 4001)
    cdf = 0.5 + (x * np.sqrt(1.0 - x**2) + np.arcsin(x)) / np.pi
    return np.asarray(radius * np.interp(p, cdf, x)[::-1])


def centre_lean_secular(
    eigenvalues: np.ndarray,
    spike: float,
    gram_sigma: float,
    trace: float,
    d: int,
    draws: int = 256,
    iterations: int = 60,
) -> float:
    """:func:`centre_lean` without eigendecompositions (``--secular``): ``v`` uniform is
    uniform in any basis, so the top-k of ``H + E + theta v v^T`` is the rank-one update of
    ``diag(s)``, ``s`` the spectrum of ``H + E``, surrogated by the released eigenvalues above
    the edge and the flat bulk plus the semicircle's quantiles (radius ``2 sigma
    sqrt(d - a)``). Each top eigenvalue ``lam`` solves ``theta sum_j v_j^2/(lam - s_j) = 1``
    (one root above ``s_1``, one in each ``(s_(i+1), s_i)``; bisection) and its vector's
    ``(u^T v)^2 = 1/(theta^2 sum_j v_j^2/(lam - s_j)^2)``: ``O(draws k d)`` per iteration."""
    k = eigenvalues.shape[0]
    if not (spike > 0 and gram_sigma > 0) or k >= d:
        return k / d
    weights = ev.spiked_debias(eigenvalues, gram_sigma, d)
    above = weights > 0
    count = d - int(above.sum())
    bulk = max(trace - float(weights[above].sum()) - spike, 0.0) / count
    spread = _semicircle_quantiles(count, 2.0 * gram_sigma * np.sqrt(count))
    s = np.sort(np.concatenate([eigenvalues[above], bulk + spread]))[::-1] / spike
    rng = np.random.default_rng(LEAN_SEED)
    v2 = rng.standard_normal((draws, d)) ** 2
    v2 /= v2.sum(axis=1, keepdims=True)
    low = np.broadcast_to(s[:k], (draws, k)).copy()
    high = np.broadcast_to(np.concatenate([[s[0] + 1.0], s[: k - 1]]), (draws, k)).copy()
    for _ in range(iterations):
        mid = (low + high) / 2.0
        value = np.einsum("rd,rkd->rk", v2, 1.0 / (mid[:, :, None] - s[None, None, :]))
        right = value > 1.0
        low = np.where(right, mid, low)
        high = np.where(right, high, mid)
    lam = (low + high) / 2.0
    slope = np.einsum("rd,rkd->rk", v2, 1.0 / (lam[:, :, None] - s[None, None, :]) ** 2)
    return float(np.mean(np.sum(1.0 / slope, axis=1)))


def cell(rows: np.ndarray, eps: float, k: int, reps: int, secular: bool = False) -> dict[str, Any]:
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = honest.MECHANISM.parse_params({"center": "private"})
    resolved = honest.MECHANISM.prepare(ctx, k, eps, honest.DELTA, params)
    spec = ReleaseSpec(k=k, epsilon=eps, delta=honest.DELTA, params=resolved)
    mean = clip_rows(rows, 1.0).mean(axis=0)
    err: dict[str, list[float]] = {"before": [], "after": []}
    stated_err: dict[str, list[float]] = {"before": [], "after": []}
    covered, leans, actual, lean_cpu, run_cpu = [], [], [], 0.0, 0.0
    clip_part: dict[str, list[float]] = {"stated": [], "all": []}
    for seed in range(reps):
        honest._calls.clear()
        start = time.process_time()
        out = honest.MECHANISM.run(rows, spec, np.random.default_rng(1000 + seed))
        run_cpu += time.process_time() - start
        assert out.basis is not None and len(honest._calls) == 1
        ex = out.extras
        call = honest._calls[0]
        share = honest.truth(rows, out.basis)
        before = honest._real(*call)
        bias = call[4]
        new_bias = bias
        if bias[1] != 0.0 and "center" in ex:
            total = bias[0] + bias[1]
            spike = ev.spike_in_gram(total, n, call[0] + call[1], None, ex.get("row_clip_norm"))
            start = time.process_time()
            estimator = centre_lean_secular if secular else centre_lean
            lean = estimator(
                np.asarray(ex["eigenvalues"]), spike, ex["gram_noise_std"], ex["trace"], d
            )
            lean_cpu += time.process_time() - start
            leans.append(lean)
            new_bias = (total * lean, total * (1.0 - lean))
        after = honest._real(*call[:4], new_bias, *call[5:])
        assert before.interval == after.interval and before.hidden == after.hidden
        low, high = after.interval
        covered.append(low <= share <= high)
        for name, est in (("before", before), ("after", after)):
            e = float(np.sum(est.ratio)) - share
            err[name].append(e)
            if not est.hidden:
                stated_err[name].append(e)
        if "center" in ex:
            delta = np.asarray(ex["center"]) - mean
            actual.append(float(np.sum((out.basis.T @ delta) ** 2) / (delta @ delta)))
        if "variance_clip_norm" in ex:
            c_v, r_v = captured_energy(
                rows, out.basis, 1.0, mean, row_clip=ex["variance_clip_norm"]
            )
            part = c_v / (c_v + r_v) - share
            clip_part["all"].append(part)
            if not before.hidden:
                clip_part["stated"].append(part)
    res: dict[str, Any] = {
        "stated": len(stated_err["after"]),
        "cover": float(np.mean(covered)),
        "lean": float(np.mean(leans)) if leans else float("nan"),
        "actual": float(np.mean(actual)) if actual else float("nan"),
        "lean_share": lean_cpu / run_cpu if run_cpu > 0 else float("nan"),
        "clip_stated": float(np.mean(clip_part["stated"])) if clip_part["stated"] else float("nan"),
        "clip_all": float(np.mean(clip_part["all"])) if clip_part["all"] else float("nan"),
    }
    for name in ("before", "after"):
        s = np.asarray(stated_err[name])
        a = np.asarray(err[name])
        res[f"{name}_mae"] = float(np.mean(np.abs(s))) if s.size else float("nan")
        res[f"{name}_err"] = float(np.mean(s)) if s.size else float("nan")
        res[f"{name}_all_mae"] = float(np.mean(np.abs(a)))
        res[f"{name}_all_err"] = float(np.mean(a))
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--only", nargs="+", default=["digits", "breast_cancer"])
    parser.add_argument("--eps", type=float, nargs="+", default=[0.3, 0.4, 0.5, 0.7, 1.0, 2.0])
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 5, 10])
    parser.add_argument(
        "--secular", action="store_true", help="the lean by the rank-one update's roots"
    )
    args = parser.parse_args()
    print(
        "| data | eps | k | stated | interval covers | stated: MAE before -> after | "
        "stated: mean error before -> after | all: MAE before -> after | all: mean error "
        "before -> after | lean (k/d) | actual ||U^T v||^2 | clip's part stated / all | "
        "lean CPU / release CPU |"
    )
    print("|---" * 13 + "|")
    for name, rows in honest.datasets(True).items():
        if name not in args.only:
            continue
        d = rows.shape[1]
        for eps in args.eps:
            for k in args.ks:
                r = cell(rows, eps, k, args.reps, args.secular)
                print(
                    f"| {name} | {eps:g} | {k} | {r['stated']} of {args.reps} | {r['cover']:.2f} "
                    f"| {r['before_mae']:.3f} -> {r['after_mae']:.3f} "
                    f"| {r['before_err']:+.3f} -> {r['after_err']:+.3f} "
                    f"| {r['before_all_mae']:.3f} -> {r['after_all_mae']:.3f} "
                    f"| {r['before_all_err']:+.3f} -> {r['after_all_err']:+.3f} "
                    f"| {r['lean']:.3f} ({k / d:.3f}) | {r['actual']:.3f} "
                    f"| {r['clip_stated']:+.3f} / {r['clip_all']:+.3f} "
                    f"| {r['lean_share']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
