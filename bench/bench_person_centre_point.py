"""The person-level release's stated point and 90% interval with a private centre, on several
people layouts (issue 32 item 4, ``service/privacy_unit_centre.py::gauss_person_run``).

    python -m bench.bench_person_centre_point [--reps 100] [--eps 1 2] [--layouts ...]

The private centre's error ``delta`` adds ``||delta||^2 w`` to the sums of squares, with
``w = sum_p r_p min(1, C^2 / T_p)`` between ``P`` and ``n`` (the maths beside the call in
:func:`service.privacy_unit_centre.gauss_person_run`). Each release (``analyze_gauss``,
``center: "private"``, the mean route, the default clip quantile, k 1, d 20, seeds
``1000 + rep``) is scored with the point it states (``service``: the bias read at ``n``,
checked equal to the ``n`` column) and, on the same noisy sums and the same decision, the
point with the bias read at other values of ``w``: ``P``, ``(n + P)/2`` (``mid``),
``sqrt(n P)`` (``geo``) and ``w`` itself computed from the private data (``oracle``, reference
only). Per layout and eps: releases, stated points, their mean absolute and signed
error against the truth (the share of the rows centred on the people's true mean, each person
bounded to a trace ``C^2``, that the released basis keeps), and the 90% interval's coverage
(all releases, and the stated ones). The interval and the decision do not depend on ``w``
(the bias bound stays ``n``), so coverage is one column.

Layouts (synthetic, seeded; rows ``0.3 + a (0.7 N(0, 1) e1 + 0.05 N(0, I))`` for people with
structure, ``0.3 + 0.05 a N(0, I)`` for the rest):
``single``: 2,000 people of one row, 30% structured (``a = 1``);
``many_small``: 2,000 people of 30 rows, all structured, ``a = 0.15`` (traces about 0.4-0.6:
no person scaled at ``C``, so ``w = n``);
``many_large``: 2,000 people of 30 rows, ``a = 1`` (every person scaled: ``w`` near ``P``);
``mix``: 70% one small row, 30% of 30 rows structured (``bench_person_centre_units``'s);
``mix_small``: as ``mix`` with the 30-row people's rows at ``a = 0.15`` (unscaled);
``few``: 100 people of 200 rows, structured, ``a = 1``.
Coverage is of all releases and of the stated ones; ``w`` is the oracle's mean over the stated.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import service.mechanisms.explained_variance as ev
import service.privacy_unit_centre as puc
from service.mechanisms.analyze_gauss import AnalyzeGauss, AnalyzeGaussParams
from service.mechanisms.base import PublicContext, ReleaseSpec

D = 20
LAYOUTS = ("single", "many_small", "many_large", "mix", "mix_small", "few")
READINGS = ("n", "P", "mid", "geo", "service", "oracle")


def people(layout: str, d: int = D) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    if layout == "single":
        counts, structured, scale = np.ones(2000, dtype=int), rng.random(2000) < 0.3, 1.0
    elif layout in ("many_small", "many_large"):
        counts, structured = np.full(2000, 30), np.ones(2000, dtype=bool)
        scale = 0.15 if layout == "many_small" else 1.0
    elif layout in ("mix", "mix_small"):
        structured = rng.random(2000) < 0.3
        counts = np.where(structured, 30, 1)
        scale = 0.15 if layout == "mix_small" else 1.0
    elif layout == "few":
        counts, structured, scale = np.full(100, 200), np.ones(100, dtype=bool), 1.0
    else:
        raise ValueError(layout)
    units = np.repeat(np.arange(counts.size), counts)
    big = structured[units]
    rows = 0.05 * rng.standard_normal((units.size, d))
    rows[big, 0] += 0.7 * rng.standard_normal(int(big.sum()))
    rows[big] *= scale
    return rows + 0.3, units


def oracle_units(rows: np.ndarray, units: np.ndarray, centre: np.ndarray, n_people: int) -> float:
    """``w = sum_p r_p min(1, C^2/T_p)`` at the released centre (private data: reference only)."""
    sizes = puc.person_sizes(rows, units, 1.0, n_people, centre)
    factor = np.minimum(1.0, 1.0 / np.maximum(sizes, 1e-300))
    factor[np.bincount(units, minlength=n_people) == 1] = 1.0
    return float(np.sum(factor[units]))


def cell(layout: str, eps: float, reps: int) -> dict[str, Any]:
    rows, units = people(layout)
    n, d = rows.shape
    n_people = int(units.max()) + 1
    mechanism = AnalyzeGauss()
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(
        ctx, 1, eps, 1e-5, AnalyzeGaussParams(center="private", center_route="mean")
    )
    spec = ReleaseSpec(1, eps, 1e-5, params)
    mu = puc.person_means(rows, units, 1.0, n_people).mean(axis=0)
    gram_c, _ = puc.bounded_grams(
        rows, units, 1.0, mu, 1.0, puc.person_sizes(rows, units, 1.0, n_people, mu)
    )
    real = ev.explained_variance
    calls: list[tuple[Any, ...]] = []

    def recorder(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    out_rows: dict[str, list[float]] = {r: [] for r in READINGS}
    covered, stated_cov, stated_n, w_true = [], [], 0, []
    ev.explained_variance = recorder  # type: ignore[assignment]
    try:
        for rep in range(reps):
            calls.clear()
            out = puc.gauss_person_run(rows, units, spec, np.random.default_rng(1000 + rep))
            ex = out.extras
            basis = out.basis
            assert basis is not None and len(calls) == 1
            truth = float(np.trace(basis.T @ gram_c @ basis) / np.trace(gram_c))
            low, high = ex["explained_variance_ratio_interval"]
            covered.append(low <= truth <= high)
            if ex["explained_variance_hidden_by_noise"] is not False:
                continue
            stated_n += 1
            stated_cov.append(low <= truth <= high)
            captured, residual, noise_std, weights, bias, high_b, prior, draw = calls[0]
            centre = np.asarray(ex["center"])
            w = oracle_units(rows, units, centre, n_people)
            w_true.append(w)
            units_read = {
                "n": float(n),
                "P": float(n_people),
                "mid": (n + n_people) / 2.0,
                "geo": float(np.sqrt(n * n_people)),
                "service": float(n),  # the service reads the bias at its bound n
                "oracle": w,
            }
            stated = sum(ex["explained_variance_ratio"])
            for name in READINGS:
                # The point's bias is per_dim times (k, d - k) or (d, 0); per_dim in w's units.
                # "service" is the run's own point; the others are re-estimated on its sums.
                f = units_read[name] / units_read["service"]
                est = real(
                    captured,
                    residual,
                    noise_std,
                    weights,
                    (bias[0] * f, bias[1] * f),
                    high_b,
                    prior,
                    draw,
                )
                point = float(np.sum(est.ratio))
                if name == "service":
                    assert abs(point - stated) < 1e-12, (point, stated)
                out_rows[name].append(point - truth)
    finally:
        ev.explained_variance = real  # type: ignore[assignment]
    return {
        "layout": layout,
        "eps": eps,
        "n": n,
        "P": n_people,
        "w": float(np.mean(w_true)) if w_true else float("nan"),
        "reps": reps,
        "stated": stated_n,
        "coverage": float(np.mean(covered)),
        "stated_coverage": float(np.mean(stated_cov)) if stated_cov else float("nan"),
        "errors": {k: np.asarray(v) for k, v in out_rows.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--eps", type=float, nargs="+", default=[1.0, 2.0])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    args = parser.parse_args()
    print(
        "| layout | eps | n / P / w (oracle, mean) | stated | interval covers (all / stated) | "
        + " | ".join(f"{r}: MAE / mean" for r in READINGS)
        + " |"
    )
    for layout in args.layouts:
        for eps in args.eps:
            start = time.process_time()
            res = cell(layout, eps, args.reps)
            parts = []
            for r in READINGS:
                e = res["errors"][r]
                parts.append(f"{np.mean(np.abs(e)):.4f} / {np.mean(e):+.4f}" if e.size else "-")
            print(
                f"| {layout} | {eps:g} | {res['n']} / {res['P']} / {res['w']:.0f} | "
                f"{res['stated']}/{res['reps']} | {res['coverage']:.3f} / "
                f"{res['stated_coverage']:.3f} | " + " | ".join(parts) + f" | "
                f"({time.process_time() - start:.1f} s CPU)",
                flush=True,
            )


if __name__ == "__main__":
    main()
