"""Issue 32 item 4, as a user meets it: "the dry run's forecast within 0.1 of what the release
then keeps" for ``PrivatePCA``-style default requests.

    python -m bench.bench_forecast_default [--reps 20] [--k 2 5 10] [--eps 1] [--mnist [--prior]]

Per data set (digits, breast_cancer; unit rows; MNIST 4,000 x 784 only with ``--mnist`` and
only where ``bench/mnist.py`` finds its sample cached, no download is attempted otherwise) and
``k``: ``--reps`` pairs of releases made as ``PrivatePCA(k, epsilon)`` sends them
(``mechanism: auto``, ``center: "private"``, the default clip choice, delta 1e-6): release
``rep`` (seed ``EARLIER_SEED + rep``) is the earlier one; the dry run of the same request with
``?forecast_from=`` it (``service.preview._auto_forecast_from``, the code the API runs) states
its range and, where it determines the share, a point; release ``rep`` with seed
``NEW_SEED + rep`` is what the request then keeps (the share of the rows' centred variance,
rows clipped to 1). Printed per cell: the kept share's mean and standard deviation across
seeds and its mean absolute deviation from its own mean (the error of a forecast that knew the
expected share exactly: where it exceeds 0.1, "within 0.1" is out of any forecast's reach), the
points stated and their mean absolute error (and the largest), the range's coverage and width.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

from bench.bench_honest_point import DELTA, truth, unit
from service.mechanisms.auto import Auto
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.explained_variance import HIDDEN_WIDTH

EARLIER_SEED = 7_000
NEW_SEED = 8_000
MECHANISM = Auto()


#: The public prior's columns (``--prior``), as issue 32's done-when.
PRIOR_COLUMNS = 64


def datasets(mnist: bool, prior: bool = False) -> dict[str, np.ndarray[Any, Any]]:
    from sklearn.datasets import load_breast_cancer, load_digits

    sets = {"digits": unit(load_digits().data), "breast_cancer": unit(load_breast_cancer().data)}
    if mnist:
        from bench.mnist import is_cached, mnist_split

        split = mnist_split(0) if is_cached() else None
        if split is not None:
            sets["MNIST 4000x784"] = split[0]
            if prior:
                from bench.bench_prior import top_directions
                from bench.mnist import dct_prior

                private, public = split
                dct = dct_prior(PRIOR_COLUMNS)
                sets[f"MNIST, DCT prior {PRIOR_COLUMNS}"] = private @ dct
                split_prior = top_directions(public, PRIOR_COLUMNS)
                sets[f"MNIST, public-split prior {PRIOR_COLUMNS}"] = private @ split_prior
        else:
            print("MNIST: no cached sample (not fetched): skipped")
    return sets


def spec_of(ctx: PublicContext, eps: float, k: int) -> ReleaseSpec[Any]:
    params = MECHANISM.prepare(ctx, k, eps, DELTA, MECHANISM.parse_params({"center": "private"}))
    return ReleaseSpec(k=k, epsilon=eps, delta=DELTA, params=params)


def cell(rows: np.ndarray[Any, Any], k: int, eps: float, reps: int) -> dict[str, Any]:
    from service.preview import _auto_forecast_from

    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    spec = spec_of(ctx, eps, k)
    kept, points, errors, covered, widths, choices = [], [], [], 0, [], set()
    stated: list[float] = []
    interval_covers = 0
    for rep in range(reps):
        before = MECHANISM.run(rows, spec, np.random.default_rng(EARLIER_SEED + rep))
        after = MECHANISM.run(rows, spec, np.random.default_rng(NEW_SEED + rep))
        assert after.basis is not None
        share = truth(rows, after.basis)
        kept.append(share)
        choices.add(str(after.extras.get("auto_choice")))
        # The release's own point estimate (issue 32 item 4's first half): stated where its
        # interval is narrower than HIDDEN_WIDTH and the noise does not hide it.
        low_ci, high_ci = after.extras["explained_variance_ratio_interval"]
        interval_covers += low_ci <= share <= high_ci
        ratios = after.extras.get("explained_variance_ratio")
        hidden = after.extras.get("explained_variance_hidden_by_noise") is True
        if ratios is not None and not hidden and high_ci - low_ci < HIDDEN_WIDTH:
            stated.append(float(sum(ratios)) - share)
        found = _auto_forecast_from(ctx, spec, k, before.extras)
        if found is None:
            continue
        shown = found[0]
        low = shown["forecast_from_release_captured_share_low"]
        high = shown["forecast_from_release_captured_share_high"]
        covered += low <= share <= high
        widths.append(high - low)
        point = shown["forecast_from_release_captured_share"]
        if point is not None:
            points.append(point)
            errors.append(point - share)
    values = np.asarray(kept)
    return {
        "k": k,
        "eps": eps,
        "runs": len(kept),
        "mechanism": "/".join(sorted(choices)),
        "kept_mean": float(values.mean()),
        "kept_sd": float(values.std(ddof=1)) if values.size > 1 else 0.0,
        "oracle_abs": float(np.mean(np.abs(values - values.mean()))),
        "forecasts": len(widths),
        "points": len(errors),
        "point_abs": float(np.mean(np.abs(errors))) if errors else float("nan"),
        "point_max": float(np.max(np.abs(errors))) if errors else float("nan"),
        "cover": covered / len(widths) if widths else float("nan"),
        "width": float(np.mean(widths)) if widths else float("nan"),
        "interval_cover": interval_covers / len(kept),
        "stated": len(stated),
        "stated_err": float(np.mean(stated)) if stated else float("nan"),
        "stated_abs": float(np.mean(np.abs(stated))) if stated else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--k", type=int, nargs="*", default=[2, 5, 10])
    parser.add_argument("--eps", type=float, nargs="*", default=[1.0])
    parser.add_argument("--mnist", action="store_true")
    parser.add_argument("--prior", action="store_true", help="with --mnist: inside two priors")
    parser.add_argument("--only", nargs="*", help="only these data sets")
    args = parser.parse_args()
    print(f"PrivatePCA-style requests (auto, center private, default clip), delta {DELTA}; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")  # fmt: skip
    print(
        "| data | k | eps | mechanism | runs | kept: mean | kept: sd | kept: mean abs dev "
        "| points | point: mean abs error | point: largest error | range covers | width "
        "| release: interval covers | release: points stated | their mean error "
        "| their mean abs error |"
    )
    print("|---" * 17 + "|")
    for name, rows in datasets(args.mnist, args.prior).items():
        if args.only and name not in args.only:
            continue
        for eps in args.eps:
            for k in args.k:
                r = cell(rows, k, eps, args.reps)
                print(
                    f"| {name} | {k} | {eps} | {r['mechanism']} | {r['runs']} "
                    f"| {r['kept_mean']:.3f} | {r['kept_sd']:.3f} | {r['oracle_abs']:.3f} "
                    f"| {r['points']}/{r['forecasts']} | {r['point_abs']:.3f} "
                    f"| {r['point_max']:.3f} | {r['cover']:.2f} | {r['width']:.3f} "
                    f"| {r['interval_cover']:.2f} | {r['stated']}/{r['runs']} "
                    f"| {r['stated_err']:+.3f} | {r['stated_abs']:.3f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
