"""Continual release (``continual_gauss``): the prefix estimators' error, and the issue's stream.

Part 1, analytic (exact scalar recurrences) for ``T`` in {16, 256, 4096} at ``epsilon = 1``,
``delta = 1e-6``, ``C = 1``: the per-entry variance of ``C_hat_t`` (mean and max over
``t = 1..T``) under the plain tree, Honaker's bottom-up estimator (the default) and, for
reference, the square-root factorization of the prefix-sum matrix (not implemented: it keeps
one noise matrix per batch, ``O(T d^2)`` state); and the ratio of the paper's per-node variance
``50 log^3(T/delta)/eps^2`` to the calibrated ``sigma^2``.

Part 2, Monte-Carlo confirmation of part 1 with the mechanism's own state update (``d = 1``,
empty batches).

Part 3, the "done when" stream of issue 14 with the pure mechanism: 64 batches of 2,000 rows near
a 3-dimensional subspace of R^50, one continual release with ``epsilon = 1``, ``delta = 1e-6``,
``T = 64``: the subspace error ``||sin Theta||`` at each epoch, both estimators; the time per
epoch against a baseline in the same process (one ``analyze_gauss`` run on one batch) and the
state's size.

Run: ``.venv/bin/python bench/experiments/bench_continual_estimators.py`` (about half a minute).
"""

from __future__ import annotations

import math
import time

import numpy as np

from service.mechanisms import continual_gauss as cg
from service.mechanisms.analyze_gauss import AnalyzeGauss, AnalyzeGaussParams
from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.linalg import subspace_distance

EPS, DELTA, CLIP = 1.0, 1e-6, 1.0


def variances(horizon: int) -> dict[str, list[float]]:
    """Per-entry variance of ``C_hat_t`` (absolute, at ``EPS``, ``DELTA``, ``CLIP``)."""
    sigma2 = cg.noise_sigma(CLIP, EPS, DELTA, horizon) ** 2
    steps = range(1, horizon + 1)
    return {
        "tree": [sigma2 * cg.prefix_variance(t, horizon, "tree") for t in steps],
        "honaker": [sigma2 * cg.prefix_variance(t, horizon, "honaker") for t in steps],
        "sqrt-factorization": [sigma2 * cg.sqrt_factorization_variance(t, horizon) for t in steps],
    }


def part_analytic() -> None:
    print("Part 1: per-entry variance of C_hat_t, eps = 1, delta = 1e-6, C = 1 (exact)")
    print(
        f"{'T':>5} {'L':>3} {'sigma':>7} | {'tree mean':>9} {'max':>7} | {'honaker mean':>12} "
        f"{'max':>7} | {'h/t mean':>8} {'h/t max':>7} | {'sqrtfact mean':>13} {'max':>7} | "
        f"{'paper/sigma^2':>13}"
    )
    for horizon in (16, 256, 4096):
        table = variances(horizon)
        sigma = cg.noise_sigma(CLIP, EPS, DELTA, horizon)
        tree, honaker, sqrt_f = (table[k] for k in ("tree", "honaker", "sqrt-factorization"))
        paper = 50.0 * math.log(horizon / DELTA) ** 3 / EPS**2
        print(
            f"{horizon:>5} {cg.levels(horizon):>3} {sigma:>7.2f} | {np.mean(tree):>9.0f} "
            f"{max(tree):>7.0f} | {np.mean(honaker):>12.0f} {max(honaker):>7.0f} | "
            f"{np.mean(honaker) / np.mean(tree):>8.3f} {max(honaker) / max(tree):>7.3f} | "
            f"{np.mean(sqrt_f):>13.0f} {max(sqrt_f):>7.0f} | {paper / sigma**2:>13.0f}"
        )


def part_monte_carlo(reps: int = 1000) -> None:
    print(f"\nPart 2: Monte-Carlo ({reps} streams, d = 1, sigma = 1): mean over t of var(C_hat_t)")
    rng = np.random.default_rng(0)
    for horizon in (16, 256):
        count = cg.levels(horizon)
        for estimator in ("tree", "honaker"):
            samples = np.zeros((reps, horizon))
            for r in range(reps):
                state = cg.ContinualState(horizon, 1, 0, (None,) * count, (None,) * count)
                for t in range(horizon):
                    state = cg._advance_state(state, np.zeros((1, 1)), 1.0, estimator, rng)
                    samples[r, t] = cg.prefix_estimate(state)[0, 0]
            exact = np.mean(
                [cg.prefix_variance(t, horizon, estimator) for t in range(1, horizon + 1)]
            )
            measured = float(np.mean(samples.var(axis=0)))
            print(
                f"T = {horizon:>4} {estimator:>8}: measured {measured:.3f}, exact {exact:.3f}, "
                f"ratio {measured / exact:.3f}"
            )


def near_subspace(
    n: int, d: int, k: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    basis, _ = np.linalg.qr(rng.standard_normal((d, k)))
    coords = rng.standard_normal((n, k))
    coords /= np.linalg.norm(coords, axis=1, keepdims=True)
    data = coords @ basis.T + 0.01 * rng.standard_normal((n, d)) / math.sqrt(d)
    data /= np.maximum(1.0, np.linalg.norm(data, axis=1, keepdims=True))
    return data, basis


def part_stream(batches: int = 64, rows: int = 2000, d: int = 50, k: int = 3) -> None:
    print(
        f"\nPart 3: {batches} batches of {rows} rows near a {k}-dim subspace of R^{d}; "
        f"eps = 1, delta = 1e-6, T = {batches}: ||sin Theta|| per epoch"
    )
    data, basis = near_subspace(batches * rows, d, k, np.random.default_rng(1))
    pieces = np.split(data, batches)
    ctx = PublicContext(n_rows=rows, n_cols=d, row_norm_bound=CLIP)
    mechanism = cg.ContinualGauss()
    shown = [1, 2, 4, 8, 16, 32, 48, 64]
    timings: dict[str, float] = {}
    for estimator in ("honaker", "tree"):
        raw = cg.ContinualGaussParams(horizon=batches, estimator=estimator)
        params = mechanism.prepare(ctx, k, EPS, DELTA, raw)
        spec = ReleaseSpec(k, EPS, DELTA, params)
        rng = np.random.default_rng(2)
        state = mechanism.start(d, spec)
        errors = []
        start = time.perf_counter()
        for batch in pieces:
            state, out = mechanism.advance(state, batch, spec, rng)
            assert out.basis is not None
            errors.append(subspace_distance(out.basis, basis))
        timings[estimator] = (time.perf_counter() - start) / batches
        figures = "  ".join(f"t={t}: {errors[t - 1]:.4f}" for t in shown)
        print(f"{estimator:>8}: {figures}")
        print(
            f"{'':>8}  mean over epochs {np.mean(errors):.4f}; max over the last 32 "
            f"{max(errors[32:]):.4f}; state {len(state.to_bytes()) / 1024:.0f} KiB at t = {batches}"
        )
    # Reference: one analyze_gauss release on all rows at the same budget (one epoch only).
    gauss = AnalyzeGauss()
    full = PublicContext(n_rows=batches * rows, n_cols=d, row_norm_bound=CLIP)
    g_params = gauss.prepare(full, k, EPS, DELTA, AnalyzeGaussParams())
    g_out = gauss.run(data, ReleaseSpec(k, EPS, DELTA, g_params), np.random.default_rng(3))
    assert g_out.basis is not None
    error = subspace_distance(g_out.basis, basis)
    print(f"reference: one analyze_gauss on all {batches * rows} rows: {error:.4f}")
    # Baseline in the same process: analyze_gauss on one batch (the Gram pass and one eigh).
    one = gauss.prepare(ctx, k, EPS, DELTA, AnalyzeGaussParams())
    start = time.perf_counter()
    for batch in pieces:
        gauss.run(batch, ReleaseSpec(k, EPS, DELTA, one), np.random.default_rng(4))
    baseline = (time.perf_counter() - start) / batches
    for estimator, seconds in timings.items():
        print(
            f"time per epoch ({estimator}): {seconds * 1e3:.2f} ms; analyze_gauss on one batch "
            f"{baseline * 1e3:.2f} ms; ratio {seconds / baseline:.2f}"
        )


if __name__ == "__main__":
    part_analytic()
    part_monte_carlo()
    part_stream()
