"""Utility audit of the default path on sets issue 32 does not name.

    python -m bench.bench_utility_audit [--seeds 5] [--cases wine digits ...] [--eps 0.1 1 8]

Every release is what a user gets without settings: ``PrivatePCA(client, dataset,
n_components=k, epsilon=eps)`` (the real app in this process, as in
:mod:`bench.bench_issue32_done`), beside ``PrivatePCA(..., mechanism="analyze_gauss",
clip_quantile=0.5)`` (the documented clip choice) on the same dataset and seed. Per cell (median
over the seeds): the share of the clipped rows' centred variance kept (default, analyze_gauss
q0.5, non-private top k, a random k-subspace's expected ``k/d``), the stated share
``sum(explained_variance_ratio_)``, its 90% interval's coverage, the hidden-by-noise flag, how
often the release warned, and what ``auto`` ran.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sklearn import datasets as skd  # type: ignore[import-untyped]

from bench.bench_issue32_done import Service, fit, top_directions
from bench.mnist import mnist_split, unit_rows
from dpss_client import Client
from dpss_client.client import DpssError

Array = np.ndarray[Any, Any]


def clipped(rows: Array, bound: float) -> Array:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    out: Array = rows * np.minimum(1.0, bound / np.maximum(norms, 1e-300))
    return out


def kept(rows: Array, bound: float, basis: Array) -> float:
    y = clipped(rows, bound)
    y = y - y.mean(axis=0)
    return float(np.sum((y @ basis) ** 2) / np.sum(y**2))


def nonprivate(rows: Array, bound: float, k: int) -> float:
    y = clipped(rows, bound)
    return kept(rows, bound, top_directions(y, k))


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def heavy(n: int, d: int) -> Array:
    base = _rng(1).standard_t(2, size=(n, d)) @ np.diag(np.linspace(3, 0.3, d))
    return base


def spiked(n: int, d: int, rank: int = 3) -> Array:
    g = _rng(2)
    u = np.linalg.qr(g.standard_normal((d, rank)))[0]
    out: Array = (g.standard_normal((n, rank)) * [5, 3, 2][:rank]) @ u.T
    return out + 0.5 * g.standard_normal((n, d))


def outlier(n: int, d: int) -> Array:
    rows = spiked(n, d)
    rows[0] = 1e4 * _rng(3).standard_normal(d)
    return rows


def scales(n: int, d: int) -> Array:
    return spiked(n, d) * np.logspace(-2, 3, d)


def duplicates(n: int, d: int) -> Array:
    rows = spiked(n // 10, d)
    return np.repeat(rows, 10, axis=0)


def constant_cols(n: int, d: int) -> Array:
    rows = spiked(n, d)
    rows[:, : d // 2] = 7.0
    return rows


def offset(n: int, d: int) -> Array:
    """Rows far from the origin (a large shared mean) with a weak spread around it."""
    return spiked(n, d) + 20.0


CASES: dict[str, Callable[[], Array]] = {
    "iris": lambda: skd.load_iris().data,
    "wine": lambda: skd.load_wine().data,
    "breast_cancer": lambda: skd.load_breast_cancer().data,
    "diabetes": lambda: skd.load_diabetes().data,
    "digits": lambda: skd.load_digits().data,
    "spiked_n50_d20": lambda: spiked(50, 20),
    "spiked_n200_d500": lambda: spiked(200, 500),
    "spiked_n500_d30": lambda: spiked(500, 30),
    "heavy_t2_n500_d20": lambda: heavy(500, 20),
    "outlier_n500_d20": lambda: outlier(500, 20),
    "scales_n500_d20": lambda: scales(500, 20),
    "dup_n500_d20": lambda: duplicates(500, 20),
    "const_n500_d20": lambda: constant_cols(500, 20),
    "offset_n500_d20": lambda: offset(500, 20),
}


def mnist_rows() -> Array:
    """2,000 raw rows drawn at random (public seed 0) from the 5,000-image sample."""
    split = mnist_split(0, 2000, unit=False)
    assert split is not None
    return split[0]


CASES["mnist_2000"] = mnist_rows
CASES["mnist_1000"] = lambda: mnist_rows()[:1000]

#: How the user prepares the rows: ``unit`` (each row scaled to norm 1, bound 1), ``raw`` (the
#: rows as they are, bound their largest norm: a public bound that clips nothing), ``std``
#: (columns standardised, bound sqrt(d) * 3).
PREP = ("unit", "raw", "std")


def prepared(rows: Array, prep: str) -> tuple[Array, float]:
    if prep == "unit":
        return unit_rows(rows.astype(np.float64)), 1.0
    if prep == "raw":
        bound = float(np.max(np.linalg.norm(rows, axis=1)))
        return rows.astype(np.float64), float(f"{bound * 1.0001:.6g}")
    sd = rows.std(axis=0)
    sd[sd == 0] = 1.0
    std = (rows - rows.mean(axis=0)) / sd
    return std, 3.0 * float(np.sqrt(rows.shape[1]))


def upload(owner: Client, rows: Array, bound: float, name: str) -> str:
    dataset = owner.upload(
        rows,
        name=name,
        epsilon_budget="10000",
        delta_budget="1e-4",
        row_norm_bound=bound,
        allow_large_delta=rows.shape[0] * 1e-4 > 1,
    )
    return str(dataset.id)


def one(
    service: Service,
    analyst: Client,
    dataset: str,
    rows: Array,
    bound: float,
    k: int,
    eps: float,
    seed: int,
    **kw: Any,
) -> dict[str, Any]:
    try:
        pca = fit(service, analyst, dataset, k, eps, seed, **kw)
    except DpssError as error:
        return {"error": f"{error.code}: {str(error.detail)[:80]}"}
    extras = analyst.get_release(pca.release_id_).extras
    share = kept(rows, bound, pca.components_.T)
    ratio = pca.explained_variance_ratio_
    stated = None if ratio is None else float(np.sum(ratio))
    interval = pca.explained_variance_ratio_interval_
    return {
        "kept": share,
        "stated": stated,
        "covers": None if interval is None else interval[0] <= share <= interval[1],
        "width": None if interval is None else interval[1] - interval[0],
        "hidden": pca.explained_variance_hidden_by_noise_,
        "warned": pca.warning_ is not None,
        "above": extras.get("components_above_noise"),
        "ran": extras.get("auto_choice", "-"),
        "centring": extras.get("centring", "-"),
    }


def med(values: list[Any]) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    return f"{float(np.median(np.asarray(vals, dtype=float))):.3f}"


def frac(values: list[Any]) -> str:
    vals = [v for v in values if v is not None]
    return "-" if not vals else f"{sum(bool(v) for v in vals)}/{len(vals)}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--prep", nargs="*", default=list(PREP))
    parser.add_argument("--eps", nargs="*", type=float, default=[0.1, 1.0, 8.0])
    parser.add_argument("--k", nargs="*", type=int, default=[1, 2])
    args = parser.parse_args()
    print(
        "| case | prep | n x d | k | eps | ran | default kept | stated | covers | width | hidden "
        "| warned | above | aG q0.5 kept | non-private | k/d |"
    )
    print("|" + "---|" * 16)
    with tempfile.TemporaryDirectory() as tmp:
        service = Service(Path(tmp))
        with service.running() as (owner, analyst):
            for case in args.cases:
                raw = CASES[case]()
                for prep in args.prep:
                    rows, bound = prepared(raw, prep)
                    n, d = rows.shape
                    dataset = upload(owner, rows, bound, f"{case}-{prep}")
                    ks = sorted({min(k, d) for k in args.k} | {min(d - 1, 10)} if d > 2 else {1})
                    for k in ks:
                        for eps in args.eps:
                            res = [
                                one(service, analyst, dataset, rows, bound, k, eps, s)
                                for s in range(args.seeds)
                            ]
                            gauss = [
                                one(
                                    service,
                                    analyst,
                                    dataset,
                                    rows,
                                    bound,
                                    k,
                                    eps,
                                    s,
                                    mechanism="analyze_gauss",
                                    clip_quantile=0.5,
                                )
                                for s in range(args.seeds)
                            ]
                            errors = {r["error"] for r in res + gauss if "error" in r}
                            ok = [r for r in res if "error" not in r]
                            okg = [r for r in gauss if "error" not in r]
                            ran = sorted({f"{r['ran']}/{r['centring']}" for r in ok})
                            print(
                                f"| {case} | {prep} | {n}x{d} | {k} | {eps} | {','.join(ran)} "
                                f"| {med([r['kept'] for r in ok])} "
                                f"| {med([r['stated'] for r in ok])} "
                                f"| {frac([r['covers'] for r in ok])} "
                                f"| {med([r['width'] for r in ok])} "
                                f"| {frac([r['hidden'] for r in ok])} "
                                f"| {frac([r['warned'] for r in ok])} "
                                f"| {med([r['above'] for r in ok])} "
                                f"| {med([r['kept'] for r in okg])} "
                                f"| {nonprivate(rows, bound, k):.3f} | {k / d:.3f} |"
                                + (f" errors: {sorted(errors)}" if errors else ""),
                                flush=True,
                            )


if __name__ == "__main__":
    main()
