"""Issue 32, item 5: what compiled per-row loops would save the recommended PCA settings.

    pip install numba   # not a dependency of the project: this bench only
    python -m bench.bench_pca_compiled [--reps 11]

A measurement, not a route of the service. Each of the recommended run's three passes over
the rows is numpy calls per chunk (a cast, a product, a norm, a gather: each a read of the
chunk), and ``bench_pca_speed --floor`` shows that even their least numpy form costs about
1.4x the default under load. This bench replaces, in this process only, the per-row steps of
the three passes with one compiled loop each (numba, ``fastmath`` reassociation only), and
times ``analyze_gauss`` at its default params against the recommended ones (``center:
"private"``) with and without them, interleaved, at 50,000 x 100 ("offset" rows: the mean
route; "spread" rows: none), one BLAS thread, as ``bench_pca_speed``:

- the probe pass: one loop over the rows for the squared norm, the clip factor, the clipped
  sum and each pair's dot product (its partner read where it lies: no copies);
- the Gram pass: one loop per chunk that rounds each row to float32 and scales it (mean
  route: also centres it and measures its float32 norm), then the same float32 ``syrk`` per
  256-row block as the service;
- the projections ``X U``: one loop over the rows in float64 (no cast pass).

The statistics are the service's; only rounding moves (the norms' sums reassociated; the
projections in float64 instead of float32), so the printout also says whether the release's
basis and extras are the service's to the bit. The compiled loops' run time depends on the
shape only (every row and pair is visited once), as the service's passes.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from bench.bench_pca_speed import DELTA, EPS, K, cpu_of, rows_of
from service.mechanisms import analyze_gauss as gauss_module
from service.mechanisms import centring_choice as choice_module
from service.mechanisms import fast_rows as rows_module
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.paired_rows import _pairs_by_higher_row

Rows = np.ndarray[Any, Any]
FASTMATH = {"reassoc", "contract"}


def kernels() -> dict[str, Callable[..., None]]:
    """The compiled loops (numba imported here: the module imports without it)."""
    from numba import njit

    @njit(fastmath=FASTMATH)  # type: ignore[misc]
    def probe(
        data: Rows, limit: float, clip: float, low_by: Rows, high_by: Rows, squares: Rows,
        factors: Rows, total: Rows, dots: Rows,
    ) -> None:  # fmt: skip
        n, d = data.shape
        m = high_by.shape[0]
        p = 0
        for i in range(n):
            s = 0.0
            for j in range(d):
                s += data[i, j] * data[i, j]
            squares[i] = s
            f = 1.0
            if s > limit:
                f = clip / math.sqrt(s)
                factors[i] = f
            for j in range(d):
                total[j] += f * data[i, j]
            while p < m and high_by[p] == i:  # the pairs whose higher row is i
                a = low_by[p]
                t = 0.0
                for j in range(d):
                    t += data[a, j] * data[i, j]
                dots[p] = t
                p += 1

    @njit(fastmath=FASTMATH)  # type: ignore[misc]
    def cast_scale(block: Rows, factors: Rows, out: Rows) -> None:
        r, d = block.shape
        for i in range(r):
            f = np.float32(factors[i])
            for j in range(d):
                out[i, j] = np.float32(block[i, j]) * f

    @njit(fastmath=FASTMATH)  # type: ignore[misc]
    def centre_scale(
        block: Rows, factors: Rows, center: Rows, bound: float, limit: float, out: Rows,
        centred: Rows,
    ) -> None:  # fmt: skip
        r, d = block.shape
        for i in range(r):
            a = np.float32(factors[i])
            t = np.float32(0.0)
            for j in range(d):
                v = np.float32(block[i, j]) * a - center[j]
                out[i, j] = v
                t += v * v
            centred[i] = t
            if t > limit:
                s = np.float32(min(bound / math.sqrt(np.float64(t)), 1.0))
                for j in range(d):
                    out[i, j] *= s

    @njit(fastmath=FASTMATH)  # type: ignore[misc]
    def project(data: Rows, basis_t: Rows, factors: Rows, out: Rows) -> None:
        n, d = data.shape
        for i in range(n):
            for c in range(basis_t.shape[0]):
                t = 0.0
                for j in range(d):
                    t += data[i, j] * basis_t[c, j]
                out[i, c] = t * factors[i]

    return {"probe": probe, "cast": cast_scale, "centre": centre_scale, "project": project}


def compiled_passes(loops: dict[str, Callable[..., None]]) -> dict[str, Callable[..., Any]]:
    """Replacements for the service's three passes (same arguments and results) built on
    ``loops``; extreme scales (the service's rescaled routes) are outside this bench."""

    def probe_pass(data: Rows, clip_norm: float, order: Rows, chunk_rows: Any = None) -> Any:
        n, d = data.shape
        m = n // 2
        low_by, high_by, by, _ = _pairs_by_higher_row(np.asarray(order), n, 1024)
        total, factors = np.zeros(d), np.ones(n)
        squares, dots = np.empty(n), np.empty(m)
        limit = clip_norm * clip_norm * (1.0 + choice_module.ROUNDING_SLACK)
        loops["probe"](data, limit, clip_norm, low_by, high_by, squares, factors, total, dots)
        # As the service's probe_pass from here on.
        dots *= -2.0
        if bool(np.any(factors != 1.0)):
            f_a, f_b = factors[low_by], factors[high_by]
            dots *= f_a
            dots *= f_b
            dots += squares[low_by] * f_a * f_a
            dots += squares[high_by] * f_b * f_b
        else:
            dots += squares[low_by]
            dots += squares[high_by]
        dots *= 0.5
        np.sqrt(np.maximum(dots, 0.0, out=dots), out=dots)
        pair_norms = np.empty(m)
        pair_norms[by] = dots
        edges = choice_module.probe_edges(clip_norm)
        return choice_module.ProbePass(
            choice_module._count(np.sqrt(squares), edges, clip_norm),
            choice_module._count(pair_norms, edges, clip_norm),
            total, m, factors, pair_norms, squares,
        )  # fmt: skip

    def gram_of_known(data: Rows, squares: Rows, bound: float, single_rows: Any = None) -> Any:
        n, d = data.shape
        factors = rows_module.clip_factors(squares, bound)
        factors = np.ones(n) if factors is None else factors
        gram = np.zeros((d, d))
        for start in range(0, n, 1024):
            block = data[start : start + 1024]
            rows = single_rows[: block.shape[0]]
            loops["cast"](block, factors[start : start + 1024], rows)
            rows_module._add_single(gram, rows)
        return gram

    def centred_gram_single(
        data: Rows, squares: Rows, clip_norm: float, center: Rows, bound: float,
        single_rows: Rows, centred_out: Any,
    ) -> Any:  # fmt: skip
        n, d = data.shape
        factors = rows_module.clip_factors(squares, clip_norm)
        factors = np.ones(n) if factors is None else factors
        centred = np.empty(n) if centred_out is None else centred_out
        limit = bound * bound * (1.0 + rows_module.ROUNDING_SLACK)
        center32 = center.astype(np.float32)
        gram = np.zeros((d, d))
        for start in range(0, n, 1024):
            block = data[start : start + 1024]
            rows = single_rows[: block.shape[0]]
            part = slice(start, start + block.shape[0])
            loops["centre"](block, factors[part], center32, bound, limit, rows, centred[part])
            rows_module._add_single(gram, rows)
        return gram

    def single_projections(
        data: Rows, columns: Rows, factors: Any, squares: Rows, **_: Any
    ) -> Rows:
        n = data.shape[0]
        out = np.empty((n, columns.shape[1]))
        scale = np.ones(n) if factors is None else factors
        loops["project"](data, np.ascontiguousarray(columns.T), scale, out)
        return out

    return {
        "probe_pass": probe_pass,
        "_gram_of_known": gram_of_known,
        "_centred_gram_single": centred_gram_single,
        "single_projections": single_projections,
    }


#: Where each replaced function is looked up at call time.
HOMES = {
    "probe_pass": gauss_module,
    "_gram_of_known": rows_module,
    "_centred_gram_single": rows_module,
    "single_projections": choice_module,
}


def switch(replacements: dict[str, Callable[..., Any]] | None, saved: dict[str, Any]) -> None:
    for name, home in HOMES.items():
        setattr(home, name, saved[name] if replacements is None else replacements[name])


def release(rows: Rows, seed: int) -> Any:
    mechanism = gauss_module.AnalyzeGauss()
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, K, EPS, DELTA, mechanism.parse_params({"center": "private"}))
    return mechanism.run(rows, ReleaseSpec(K, EPS, DELTA, params), np.random.default_rng(seed))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=11)
    args = parser.parse_args()
    try:
        loops = kernels()
    except ImportError:
        print("numba is not installed: pip install numba (this bench only)")
        return
    replacements = compiled_passes(loops)
    saved = {name: getattr(home, name) for name, home in HOMES.items()}
    print(
        "| n x d | rows | route | numpy: recommended / default | compiled: recommended / "
        "default | compiled / numpy (recommended CPU) | release to the bit | largest basis change |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with threadpool_limits(limits=1):
        for kind in ("offset", "spread"):
            rows = rows_of(kind, 50_000, 100)
            switch(None, saved)
            before = release(rows, 3)
            switch(replacements, saved)
            after = release(rows, 3)  # also compiles the loops (not timed)
            switch(None, saved)
            change = float(np.max(np.abs(np.abs(before.basis) - np.abs(after.basis))))
            ratios: dict[bool, list[float]] = {False: [], True: []}
            spent: dict[bool, list[float]] = {False: [], True: []}
            for rep in range(args.reps + 1):
                for compiled in (False, True) if rep % 2 else (True, False):
                    switch(None, saved)
                    base, _ = cpu_of(rows, {}, rep)
                    switch(replacements if compiled else None, saved)
                    best, route = cpu_of(rows, {"center": "private"}, rep)
                    switch(None, saved)
                    if rep:
                        ratios[compiled].append(best / base)
                        spent[compiled].append(best)

            def cell(values: list[float]) -> str:
                return f"{np.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

            same = np.array_equal(before.basis, after.basis) and before.extras == after.extras
            print(
                f"| 50,000 x 100 | {kind} | {route} | {cell(ratios[False])} | "
                f"{cell(ratios[True])} | "
                f"{np.median(spent[True]) / np.median(spent[False]):.2f} | "
                f"{'yes' if same else 'no'} | {change:.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
