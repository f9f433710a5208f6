"""Issue 32, item 2: a public prior on MNIST.

    python -m bench.bench_prior [--reps 5] [--eps 1.0]

MNIST (the 5,000-image sample of :mod:`bench.mnist`, unit rows), a fresh random split per
repetition: 4,000 private rows x 784, the other 1,000 public. k = 10, delta = 1e-6, and the
settings a user gets by default (``analyze_gauss`` with ``center: "private"``, what
``PrivatePCA`` sends: the private clip quantile and centring route). Each release runs exactly
as a worker runs it (the mechanism from the registry, wrapped by
:func:`service.prior_projection.on_prior` when a prior is named, prepared from public facts).

Rows printed, each the centred variance of the 4,000 private rows kept by the released basis
(``||(X - mean) B||_F^2 / ||X - mean||_F^2``; mean and spread over the repetitions):

- (a) prior: the top 64 principal directions (centred) of the 1,000 public rows;
- (b) prior: the 64 lowest-frequency 2-D DCT components (no data);
- (c) no prior (the baseline, measured in the same process);
- the non-private top-10 PCA of the private rows, and each prior's ceiling (the non-private
  top-10 inside its span), so the gap to each can be read.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from typing import Any

import numpy as np

from bench.mnist import dct_prior, mnist_split
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.registry import get_mechanism
from service.prior_projection import on_prior

K, DELTA, M = 10, 1e-6, 64
PRIVATE_ROWS = 4000
PARAMS = {"center": "private"}

Rows = np.ndarray[Any, Any]


def kept_share(private: Rows, basis: Rows) -> float:
    centred = private - private.mean(axis=0)
    return float(np.sum((centred @ basis) ** 2) / np.sum(centred**2))


def top_directions(rows: Rows, count: int) -> Rows:
    centred = rows - rows.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return np.ascontiguousarray(vt[:count].T)


def release(private: Rows, prior: Rows | None, eps: float, seed: int) -> tuple[Rows, float]:
    """One release as the worker runs it; the basis and the seconds it took."""
    mechanism = get_mechanism("analyze_gauss")
    assert mechanism is not None
    if prior is not None:
        digest = hashlib.sha256(np.ascontiguousarray(prior, dtype="<f8").tobytes()).hexdigest()
        mechanism = on_prior(mechanism, prior, digest)
    n, d = private.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    params = mechanism.prepare(ctx, K, eps, DELTA, mechanism.parse_params(dict(PARAMS)))
    started = time.process_time()
    out = mechanism.run(private, ReleaseSpec(K, eps, DELTA, params), np.random.default_rng(seed))
    seconds = time.process_time() - started
    assert out.basis is not None, out.no_result_reason
    return out.basis, seconds


def summary(values: list[float]) -> str:
    array = np.asarray(values)
    return f"{array.mean():.3f} (sd {array.std(ddof=1):.3f}, {array.min():.3f}-{array.max():.3f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--eps", type=float, default=1.0)
    args = parser.parse_args()
    if mnist_split(0) is None:
        print("MNIST unavailable (the package index could not be reached)")
        return
    dct = dct_prior(M)
    figures: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}

    def note(name: str, value: float, seconds: float | None = None) -> None:
        figures.setdefault(name, []).append(value)
        if seconds is not None:
            cpu.setdefault(name, []).append(seconds)

    for rep in range(args.reps):
        split = mnist_split(1000 + rep, PRIVATE_ROWS)
        assert split is not None
        private, public = split
        split_prior = top_directions(public, M)
        note("non-private top-10 PCA", kept_share(private, top_directions(private, K)))
        for name, prior in (("(a) public-split prior", split_prior), ("(b) DCT prior", dct)):
            inside = private @ prior
            note(f"{name}: ceiling", kept_share(private, prior @ top_directions(inside, K)))
            basis, seconds = release(private, prior, args.eps, seed=rep)
            note(f"{name}: private", kept_share(private, basis), seconds)
        basis, seconds = release(private, None, args.eps, seed=rep)
        note("(c) no prior (analyze_gauss)", kept_share(private, basis), seconds)
        print(f"rep {rep + 1}/{args.reps} done", flush=True)

    baseline = np.mean(figures["(c) no prior (analyze_gauss)"])
    print(
        f"\nMNIST, {PRIVATE_ROWS} private rows x 784 (unit rows), k={K}, eps={args.eps}, "
        f"delta={DELTA}, params={PARAMS}, m={M}, {args.reps} repetitions (fresh split and noise)"
    )
    print("| release | centred variance kept: mean (sd, range) | x no prior | CPU s/release |")
    print("|---|---|---|---|")
    for name, values in figures.items():
        ratio = f"{np.mean(values) / baseline:.2f}x" if ": private" in name or "(c)" in name else ""
        seconds = f"{np.mean(cpu[name]):.2f}" if name in cpu else ""
        print(f"| {name} | {summary(values)} | {ratio} | {seconds} |")


if __name__ == "__main__":
    main()
