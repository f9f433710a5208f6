"""Issue 32, item 5: CPU time of the recommended PCA settings against the default.

    python -m bench.bench_pca_speed [--reps 5]

In one process, interleaved per repetition: ``analyze_gauss`` at its default params (uncentred,
no clip quantile) and at the recommended ones (``center: "private"``, which now gets the
default clip quantile and the centring choice), eps 1, delta 1e-6, k = 10, through
``prepare`` and ``run``, on rows of norm <= 1 at 3,500 x 784 and 50,000 x 100. Two kinds of
rows, so that each centring route is timed: "offset" (a common mean much larger than the
spread: the mean route) and "spread" (centred power-law rows: the probe takes pairs or none).
Prints the median CPU seconds (``time.process_time``) of each, the route taken and the ratio
recommended / default (issue 32 item 5: at most 1.5), and both against the floor measured in
the same repetition on the same rows (issue 35: the default at most 1.2x it): the bare
``X^T X``, drawing the noise's ``d (d + 1)/2`` entries and the top-k ``eigh``
(``scipy.linalg.eigh(subset_by_index=...)``); no clipping, no release bookkeeping. BLAS runs
on one thread: a BLAS thread
that spins while the machine's other cores are busy bills CPU time that is not work, and
made the figures swing 2x between repetitions on the shared 2-core machine.

    python -m bench.bench_pca_speed --against /path/to/other/tree [--reps 9]

Before and after in one process: the other tree's ``analyze_gauss`` module is loaded beside
this one's, and each repetition runs the default and the recommended settings under both,
alternating which goes first; prints each tree's medians, its ratio and the recommended
CPU of this tree over the other's (the machine's load moves both alike).

    python -m bench.bench_pca_speed --stages [--reps 7]

Where the recommended run's time goes: the same runs with the stages of
``chosen_centring_run`` timed (the probe pass, the Gram pass, the noise and eigensolver, the
explained-variance sums, the rest), median CPU ms per stage against the default in the same
repetitions.

    python -m bench.bench_pca_speed --floor [--reps 9]

Only the least-work primitives that ``--stages`` ends with (see :func:`primitives`): the
three passes' floor over the default in the same repetitions, and beside each floor the same
pass as the release runs it (:func:`released_passes`: the real probe, float32 Gram and
explained-variance functions on the spread rows' none route, with one release's public
values), so that each pass's distance from its floor (what its statistics cost) is measured
in the same repetitions.

    python -m bench.bench_pca_speed --contend [N] [any of the above]

The same measurement with N (1 when given bare) processes beside it that stream memory the
whole time (:data:`STREAM`: copies one 64 MB float64 array into another, over and over, so
it holds the shared L3 and the memory bus busy): the recommended run's three passes over the
rows are memory-bound where the default's one is compute-bound, so their ratio moves with
memory contention (issue 32 item 5: 1.37-1.41 on a quiet host, 1.85-1.96 beside other sessions).
With N at least the machine's cores, a streamer also shares the bench's core, time-sliced:
its copies then evict the bench's chunk from the core's own L2 between slices, as another
session's process does. Each streamer's GB/s is printed at the end (its work while the bench
ran).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import scipy.linalg
from threadpoolctl import threadpool_limits

from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism

Rows = np.ndarray[Any, Any]
SHAPES = ((3500, 784), (50_000, 100))
K, EPS, DELTA = 10, 1.0, 1e-6


def rows_of(kind: str, n: int, d: int, seed: int = 0) -> Rows:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) / np.sqrt(np.arange(1, d + 1))
    x /= np.sqrt(np.sum(1.0 / np.arange(1, d + 1)))
    if kind == "offset":
        x = 0.15 * x + 0.8 * np.ones(d) / np.sqrt(d)
    norms = np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    return np.ascontiguousarray(x / norms)


def cpu_of(rows: Rows, raw: dict[str, Any], seed: int) -> tuple[float, str]:
    mechanism = get_mechanism("analyze_gauss")
    assert mechanism is not None
    n, d = rows.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    start = time.process_time()
    params = mechanism.prepare(ctx, K, EPS, DELTA, mechanism.parse_params(raw))
    out = mechanism.run(rows, ReleaseSpec(K, EPS, DELTA, params), np.random.default_rng(seed))
    return time.process_time() - start, str(out.extras.get("centring", "-"))


def floor_cpu(rows: Rows, seed: int) -> float:
    """CPU seconds of the floor: ``X^T X``, its noise's upper triangle drawn (and mirrored),
    the top-k eigenpairs of the sum."""
    d = rows.shape[1]
    rng = np.random.default_rng(seed)
    start = time.process_time()
    gram = rows.T @ rows
    upper = np.triu_indices(d)
    gram[upper] += rng.normal(0.0, 1.0, size=upper[0].size)
    scipy.linalg.eigh(gram, lower=False, subset_by_index=[d - K, d - 1])
    return time.process_time() - start


#: The memory streamer of ``--contend`` (a separate process, one thread): two arrays of 64 MB
#: each (4x this host's 32 MiB L3), copied into each other until stdin closes; it then prints
#: the bytes moved per second (read + write).
STREAM = """
import sys, threading, time
import numpy as np
a = np.ones(1 << 23)
b = np.empty_like(a)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
start, copies = time.perf_counter(), 0
while not stop.is_set():
    np.copyto(b, a)
    a, b = b, a
    copies += 1
print(f"{2 * copies * a.nbytes / (time.perf_counter() - start) / 1e9:.1f}")
"""


@contextmanager
def contention(streams: int) -> Iterator[None]:
    """``streams`` copies of :data:`STREAM`, each in a child process, for the duration
    (stopped by closing their stdin, and waited for: only the children this started)."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", STREAM],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PATH": ""},
        )
        for _ in range(streams)
    ]
    if children:
        time.sleep(1.0)  # their arrays paged in before the first measurement
    try:
        yield
    finally:
        rates = [child.communicate("", timeout=60)[0].strip() for child in children]
        if rates:
            print(
                f"\n(contended: {len(rates)} memory streamer(s) ran beside it, "
                f"{', '.join(rates)} GB/s each)"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--stages", action="store_true")
    parser.add_argument("--floor", action="store_true", help="only the least-work primitives")
    parser.add_argument("--against", help="another checkout's root: before/after in-process")
    parser.add_argument(
        "--contend",
        type=int,
        nargs="?",
        const=1,
        default=0,
        help="memory-streaming processes beside it (1 when given bare)",
    )
    args = parser.parse_args()
    with threadpool_limits(limits=1), contention(args.contend):
        if args.against:
            against(args.against, args.reps)
        elif args.stages:
            stages(args.reps)
        elif args.floor:
            primitives(args.reps)
        else:
            table(args.reps)


#: The stages of chosen_centring_run, by the name analyze_gauss imports them under.
STAGES = {
    "probe_pass": "probe",
    "fast_gram": "gram",
    "paired_gram": "gram",
    "release_of_gram": "noise + eigh",
    "probe_paired_energy": "variance sums",
    "paired_energy": "variance sums",
    "probe_centred_energy": "variance sums",
    "fast_energy": "variance sums",
}


@contextmanager
def timed_stages(spent: dict[str, float]) -> Iterator[None]:
    """Wrap the stages in analyze_gauss's namespace so that each adds its CPU seconds to
    ``spent`` (restored on exit)."""
    from service.mechanisms import analyze_gauss as module

    saved = {name: getattr(module, name) for name in STAGES}

    def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return real(*args, **kwargs)
            finally:
                spent[STAGES[name]] += time.process_time() - start

        return run

    try:
        for name, real in saved.items():
            setattr(module, name, wrap(name, real))
        yield
    finally:
        for name, real in saved.items():
            setattr(module, name, real)


def stages(reps: int) -> None:
    order = ["probe", "gram", "noise + eigh", "variance sums", "rest"]
    print(
        "| n x d | rows | route | default ms | recommended ms | "
        + " | ".join(f"{name} ms" for name in order)
        + " |"
    )
    print("|---|---|---|---|---|" + "---|" * len(order))
    for n, d in SHAPES:
        for kind in ("offset", "spread"):
            rows = rows_of(kind, n, d)
            default, recommended, routes = [], [], set()
            per: dict[str, list[float]] = defaultdict(list)
            for rep in range(reps + 1):
                base, _ = cpu_of(rows, {}, rep)
                spent: dict[str, float] = defaultdict(float)
                with timed_stages(spent):
                    best, route = cpu_of(rows, {"center": "private"}, rep)
                if rep == 0:
                    continue
                default.append(base)
                recommended.append(best)
                routes.add(route)
                spent["rest"] = best - sum(spent.values())
                for name in order:
                    per[name].append(spent[name])
            cells = " | ".join(f"{1e3 * float(np.median(per[name])):.1f}" for name in order)
            print(
                f"| {n:,} x {d} | {kind} | {'/'.join(sorted(routes))} "
                f"| {1e3 * float(np.median(default)):.1f} "
                f"| {1e3 * float(np.median(recommended)):.1f} | {cells} |",
                flush=True,
            )
    primitives(reps)


def primitives(reps: int) -> None:
    """The least work the recommended settings' statistics need at 50,000 x 100 (spread
    rows, k = 10), each primitive alone as numpy does it best, against the default in the
    same repetitions: one pass for the norms, the n/2 partners gathered (in forward order per
    chunk, ``numpy.take``), the Gram of rows scaled to a clip (a scaled copy per chunk, then
    syrk) and ``X U``; then the three passes' floor (issue 32 item 5, ninth pass): what any
    numpy implementation of the probe, the float32 Gram and the float32 projections must do
    at least, with every per-row statistic left out (no clip factors, no sum, no pair
    norms, no histograms, no noise, no eigensolver): pass 1 the rows' squared norms and the
    partners gathered with their dot products, pass 2 the rows cast to float32 and their
    Gram in 256-row blocks (:data:`~service.mechanisms.fast_rows.SINGLE_BLOCK_ROWS`), pass 3
    the rows cast to float32 and multiplied by a ``d x k`` basis. The recommended run cannot
    be under that floor over the default; the float32 Gram of rows already in float32 is
    shown apart (the part of pass 2 no pass can stream around). Then each pass as the
    release runs it (:func:`released_passes`) and their sum."""
    from service.mechanisms.fast_rows import _add_single

    n, d = SHAPES[1]
    rows = rows_of("spread", n, d)
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.standard_normal((d, K)))[0]
    basis32 = np.ascontiguousarray(basis, dtype=np.float32)
    factors = np.minimum(1.0, 0.5 / np.linalg.norm(rows, axis=1))
    order = rng.permutation(n)
    low = np.minimum(order[0::2], order[1::2])
    high = np.maximum(order[0::2], order[1::2])
    chunk = 1024
    pieces = []
    for s in range(0, n, chunk):
        inside = (high >= s) & (high < s + chunk)
        by = np.argsort(high[inside])
        pieces.append((low[inside][by], high[inside][by] - s))
    buffer = np.empty((chunk, d))
    single: Rows = np.empty((chunk, d), dtype=np.float32)
    cast: Rows = rows.astype(np.float32)
    products = np.empty((chunk, K), dtype=np.float32)

    def norms() -> None:
        for start in range(0, n, chunk):
            np.vecdot(rows[start : start + chunk], rows[start : start + chunk])

    def gather() -> None:
        # numpy.take: 1.3-1.8x faster than fancy indexing for rows of 100 doubles (the
        # probe pass gathers so).
        for partners, _ in pieces:
            np.take(rows, partners, axis=0)

    def scaled_gram() -> None:
        gram = np.zeros((d, d))
        for start in range(0, n, chunk):
            block = rows[start : start + chunk]
            scaled = buffer[: block.shape[0]]
            np.multiply(block, factors[start : start + chunk, None], out=scaled)
            gram += scaled.T @ scaled

    def projections() -> None:
        for start in range(0, n, 256):
            rows[start : start + 256] @ basis

    def single_gram() -> None:
        gram = np.zeros((d, d))
        for start in range(0, n, chunk):
            _add_single(gram, cast[start : start + chunk])

    def floor_probe() -> None:
        for number, start in enumerate(range(0, n, chunk)):
            block = rows[start : start + chunk]
            np.vecdot(block, block)
            partners, own = pieces[number]
            np.vecdot(np.take(rows, partners, axis=0), np.take(block, own, axis=0))

    def floor_gram() -> None:
        gram = np.zeros((d, d))
        for start in range(0, n, chunk):
            block = rows[start : start + chunk]
            np.copyto(single[: block.shape[0]], block, casting="same_kind")
            _add_single(gram, single[: block.shape[0]])

    def floor_projections() -> None:
        for start in range(0, n, chunk):
            block = rows[start : start + chunk]
            np.copyto(single[: block.shape[0]], block, casting="same_kind")
            np.matmul(single[: block.shape[0]], basis32, out=products[: block.shape[0]])

    released = released_passes(rows)
    work: dict[str, Callable[[], None]] = {
        "row norms (one pass)": norms,
        "n/2 partners gathered": gather,
        "Gram of rows scaled to a clip": scaled_gram,
        "X U (k = 10)": projections,
        "float32 Gram of rows already in float32 (256-row blocks)": single_gram,
        "floor of pass 1 (the rows' squared norms, the pairs' dot products)": floor_probe,
        "floor of pass 2 (the rows cast to float32, their Gram)": floor_gram,
        "floor of pass 3 (the rows cast to float32, X U)": floor_projections,
        **released,
    }
    spent: dict[str, list[float]] = defaultdict(list)
    milliseconds: dict[str, list[float]] = defaultdict(list)
    default: list[float] = []
    for rep in range(reps + 1):
        base, _ = cpu_of(rows, {}, rep)
        times = {}
        for name, run in work.items():
            start = time.process_time()
            run()
            times[name] = time.process_time() - start
        if rep == 0:
            continue
        default.append(base)
        times["the three passes' floor (the sum of the three)"] = sum(
            value for name, value in times.items() if name.startswith("floor")
        )
        times["the three passes as released (the sum of the three)"] = sum(
            value for name, value in times.items() if name.startswith("as released")
        )
        for name, value in times.items():
            spent[name].append(value / base)
            milliseconds[name].append(1e3 * value)
    print(f"\n50,000 x 100, default {1e3 * float(np.median(default)):.1f} ms; each over it:")
    for name, ratios in spent.items():
        low_ratio, high_ratio = min(ratios), max(ratios)
        print(
            f"- {name}: {float(np.median(ratios)):.2f} ({low_ratio:.2f}-{high_ratio:.2f}), "
            f"{float(np.median(milliseconds[name])):.1f} ms"
        )


def released_passes(rows: Rows) -> dict[str, Callable[[], None]]:
    """The three passes over the rows as the recommended release runs them on ``rows`` (the
    spread rows: the none route), each called alone with the public values one recommended
    release gave (the pairing, the row clip, the basis, the variance clip): beside the
    floors, the difference is what the statistics themselves cost (the clip factors, the
    clipped sum, the pairs' norms and histograms, the rows' scaling, the pairs' scoring)."""
    from service.mechanisms import centring_choice as probe
    from service.mechanisms.fast_rows import fast_gram, single_projections_fit

    n, d = rows.shape
    mechanism = get_mechanism("analyze_gauss")
    assert mechanism is not None
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, K, EPS, DELTA, mechanism.parse_params({"center": "private"}))
    out = mechanism.run(rows, ReleaseSpec(K, EPS, DELTA, params), np.random.default_rng(0))
    extras = out.extras
    assert extras["centring"] == "none", extras["centring"]
    # The run's first draw is its pairing (chosen_centring_run): the same permutation.
    order = np.random.default_rng(0).permutation(n)
    counts = probe.probe_pass(rows, 1.0, order)
    pair_low = float(extras["probe_quantiles"]["pairs"][0])
    fits = single_projections_fit(n, d, K, 1.0, pair_low * np.sqrt(0.5))

    def first() -> None:
        probe.probe_pass(rows, 1.0, order)

    def second() -> None:
        fast_gram(rows, 1.0, None, extras["row_clip_norm"], counts.row_squares, single=True)

    def third() -> None:
        probe.probe_paired_energy(
            rows, 1.0, order, counts, out.basis, extras["variance_clip_norm"], single=fits
        )

    return {
        "as released, pass 1 (probe_pass)": first,
        "as released, pass 2 (fast_gram, float32, none route)": second,
        "as released, pass 3 (probe_paired_energy)": third,
    }


def load_tree(root: str) -> tuple[Any, Any]:
    """``(analyze_gauss module, base module)`` imported from the checkout at ``root`` as
    separate module objects (``service.*`` is imported afresh from there, then this tree's
    modules are put back in ``sys.modules``: the functions keep their own globals)."""
    import importlib
    import sys

    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "service"}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        module = importlib.import_module("service.mechanisms.analyze_gauss")
        base = importlib.import_module("service.mechanisms.base")
    finally:
        sys.path.remove(root)
        for name in [k for k in sys.modules if k.split(".")[0] == "service"]:
            del sys.modules[name]
        sys.modules.update(saved)
    return module, base


def against(root: str, reps: int) -> None:
    from service.mechanisms import analyze_gauss as here
    from service.mechanisms import base as here_base

    trees = {"other": load_tree(root), "this": (here, here_base)}
    assert trees["other"][0].__file__ != here.__file__, "the other tree is this one"

    def run(tree: str, rows: Rows, raw: dict[str, Any], seed: int) -> tuple[float, str]:
        module, base = trees[tree]
        mechanism = module.AnalyzeGauss()
        n, d = rows.shape
        ctx = base.PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
        start = time.process_time()
        params = mechanism.prepare(ctx, K, EPS, DELTA, mechanism.parse_params(raw))
        spec = base.ReleaseSpec(K, EPS, DELTA, params)
        out = mechanism.run(rows, spec, np.random.default_rng(seed))
        return time.process_time() - start, str(out.extras.get("centring", "-"))

    print(
        "| n x d | rows | route | other: default ms | other: recommended ms | other: ratio "
        "| this: default ms | this: recommended ms | this: ratio | this / other (recommended) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, d in SHAPES:
        for kind in ("offset", "spread"):
            rows = rows_of(kind, n, d)
            spent: dict[str, list[float]] = defaultdict(list)
            routes = set()
            for rep in range(reps + 1):
                for tree in ("other", "this") if rep % 2 else ("this", "other"):
                    base_cpu, _ = run(tree, rows, {}, rep)
                    best, route = run(tree, rows, {"center": "private"}, rep)
                    if rep == 0:
                        continue  # warm-up
                    routes.add(route)
                    spent[tree + " default"].append(base_cpu)
                    spent[tree + " recommended"].append(best)
                    spent[tree + " ratio"].append(best / base_cpu)
            med = {key: float(np.median(values)) for key, values in spent.items()}
            cells = " | ".join(
                f"{1e3 * med[t + ' default']:.1f} | {1e3 * med[t + ' recommended']:.1f} "
                f"| {med[t + ' ratio']:.2f}"
                for t in ("other", "this")
            )
            print(
                f"| {n:,} x {d} | {kind} | {'/'.join(sorted(routes))} | {cells} "
                f"| {med['this recommended'] / med['other recommended']:.2f} |",
                flush=True,
            )


def table(reps: int) -> None:
    print(
        "| n x d | rows | floor CPU s | default CPU s | recommended CPU s | route "
        "| recommended / default | default / floor | recommended / floor |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n, d in SHAPES:
        for kind in ("offset", "spread"):
            rows = rows_of(kind, n, d)
            floor, default, recommended, routes = [], [], [], set()
            for rep in range(reps + 1):
                bare = floor_cpu(rows, rep)
                base, _ = cpu_of(rows, {}, rep)
                best, route = cpu_of(rows, {"center": "private"}, rep)
                if rep == 0:
                    continue  # warm-up: imports, BLAS threads, page faults
                floor.append(bare)
                default.append(base)
                recommended.append(best)
                routes.add(route)
            f, a, b = (float(np.median(x)) for x in (floor, default, recommended))
            print(
                f"| {n:,} x {d} | {kind} | {f:.4f} | {a:.4f} | {b:.4f} "
                f"| {'/'.join(sorted(routes))} | {b / a:.2f} | {a / f:.2f} | {b / f:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
