"""The person-level release's private-centre term in the bounded Gram's units (issue 32 item 4's
fix carried to :mod:`service.privacy_unit_centre`).

    python -m bench.bench_person_centre_units [--reps 10] [--cells 2000x30 4000x60]

Synthetic people (seeded): P people, 70% with one small row (``0.3 + 0.05 N(0, I)``), 30% with
``r`` rows spread along ``e1`` (``+ 0.7 N(0, 1) e1 + 0.05 N(0, I)``), ``d = 20``, ``analyze_gauss``
with ``center: "private"`` (the default clip quantile 0.3), k = 1, eps 1, delta 1e-5, seeds
``1000 + rep``. The per-person clip reads low from the one-row people, so the Gram the basis
comes from holds the many-row people at a small trace. Each release is run three ways, the same
draws: ``old`` (no ``gram_clip``: the rows' units), ``rows`` (``gram_clip`` over the ``n`` rows,
the row-level call as is) and ``fix`` (``gram_clip`` over the ``P`` people). Per way: how often
the released direction was counted as the data's (``components_above_noise``), the stated
points and their error against the truth (the share of the rows centred on the people's true
mean, each person bounded to a trace ``C^2``, that the basis keeps), and the centre's term:
exact in the Gram (``||delta||^2 sum_i s_i^2``) against each way's reading of it.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

import service.privacy_unit_centre as puc
from service.mechanisms.analyze_gauss import AnalyzeGauss, AnalyzeGaussParams
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.centring import mean_sensitivity
from service.mechanisms.explained_variance import spike_in_gram, variance_extras
from service.mechanisms.gauss_calibration import gauss_split

WAYS = ("old", "rows", "fix")


def people(n_people: int, many: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    counts = np.where(rng.random(n_people) < 0.3, many, 1)
    units = np.repeat(np.arange(n_people), counts)
    big = (counts > 1)[units]
    rows = 0.3 + 0.05 * rng.standard_normal((units.size, d))
    rows[big, 0] += 0.7 * rng.standard_normal(int(big.sum()))
    rows[big] += 0.05 * rng.standard_normal((int(big.sum()), d))
    return rows, units


def way(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        if name == "old":
            kwargs.pop("gram_clip")
        if name != "fix":
            kwargs.pop("gram_units")
        return variance_extras(*args, **kwargs)

    return call


def cell(n_people: int, many: int, reps: int, d: int = 20) -> None:
    rows, units = people(n_people, many, d)
    n = units.size
    mechanism = AnalyzeGauss()
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(
        ctx, 1, 1.0, 1e-5, AnalyzeGaussParams(center="private", center_route="mean")
    )
    spec = ReleaseSpec(1, 1.0, 1e-5, params)
    split = gauss_split(1.0, 1e-5, params)
    mean_noise = mean_sensitivity(1.0, n_people) / split.mean_mu
    mu = puc.person_means(rows, units, 1.0, n_people).mean(axis=0)
    gram_c, _ = puc.bounded_grams(
        rows, units, 1.0, mu, 1.0, puc.person_sizes(rows, units, 1.0, n_people, mu)
    )
    print(f"P {n_people}, r {many}, n {n}, d {d}, eps 1, {reps} seeds")
    real = puc.variance_extras
    try:
        for name in WAYS:
            puc.variance_extras = way(name)
            counted, stated, spikes = [], [], []
            for rep in range(reps):
                out = puc.gauss_person_run(rows, units, spec, np.random.default_rng(1000 + rep))
                ex = out.extras
                counted.append(ex["components_above_noise"])
                basis = out.basis
                assert basis is not None
                if ex["explained_variance_hidden_by_noise"] is False:
                    truth = float(np.trace(basis.T @ gram_c @ basis) / np.trace(gram_c))
                    stated.append(sum(ex["explained_variance_ratio"]) - truth)
                centre = np.asarray(ex["center"])
                delta = centre - mu
                sizes = puc.person_sizes(rows, units, 1.0, n_people, centre)
                f_c = np.sqrt(1.0 / np.maximum(sizes, 1.0))
                f_c[np.bincount(units) == 1] = 1.0
                c2 = ex["row_clip_norm"]
                f_low = np.sqrt(np.minimum(1.0, c2**2 / np.maximum(sizes, 1e-300)))
                exact = float(delta @ delta * np.sum(np.minimum(f_c, f_low)[units] ** 2))
                # As the run reads it: n d sigma_mu^2, over the total (exact here: the noisy
                # sums are withheld when the point is).
                bias = n * d * mean_noise**2
                total = float(np.trace(gram_c))
                read = {
                    "old": bias,
                    "rows": spike_in_gram(bias, n, total, None, c2),
                    "fix": spike_in_gram(bias, n, total, None, c2, n_people),
                }.get(name, float("nan"))
                spikes.append((exact, read, ex["eigenvalues"][0]))
            errors = np.asarray(stated)
            ex_s, read_s, eig = (float(np.mean(x)) for x in zip(*spikes, strict=True))
            point = (
                f"MAE {np.mean(np.abs(errors)):.4f}, mean {np.mean(errors):+.4f}"
                if errors.size
                else "-"
            )
            print(
                f"  {name:4s} counted {np.mean(counted):.2f}, stated {errors.size}/{reps} "
                f"({point}), centre term exact {ex_s:.2f} read {read_s:.2f}, eigenvalue {eig:.2f}"
            )
    finally:
        puc.variance_extras = real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--cells", nargs="+", default=["2000x30", "4000x60"])
    args = parser.parse_args()
    for text in args.cells:
        n_people, many = (int(x) for x in text.split("x"))
        cell(n_people, many, args.reps)


if __name__ == "__main__":
    main()
