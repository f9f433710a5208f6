"""Issue 24, item 2: centring that does not invent a component.

    python -m bench.experiments.centring_rules [--reps 10]

Every variant spends one Gaussian-DP budget ``mu`` (the request's ``(eps, delta = 1e-6)``) as
``analyze_gauss`` does: 0.1 of ``mu^2`` for the explained-variance step (not drawn here: it
does not change the basis), 0.05 for a clip quantile at the median, the private mean's share
(if any), the rest for the Gram. Metric: the share of the centred variance (rows clipped to
C = 1, centred on their exact mean) that the released k = 10 subspace captures, as
``bench/bench_honest_pca.py`` measures it. Variants:

- ``none``: no centring (rows clipped at their private median norm).
- ``private s``: a private mean with share ``s`` of ``mu^2``, rows centred on it.
- ``private s, deflate``: as ``private s``, then the top-k of the noisy Gram with the
  eigenvector the mean's noise made dropped (rule: the public spike ``n d sigma_mu^2`` above
  the noise edge, the released top eigenvalue within its predicted range: ``spike_rule``).
- ``pairs``: differences of publicly paired rows over ``sqrt(2)`` (covariance ``Sigma``, no
  mean; n/2 rows), clipped at their private median.
- ``oracle mean``: the exact mean for free, the Gram step as ``private 0.2`` (a bound, not
  private).
- ``chosen (service)``: ``analyze_gauss`` with ``center: "private", clip_quantile: 0.5``,
  which chooses mean, pairs or none from its probe (``service.mechanisms.centring_choice``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.stats import chi2
from sklearn.datasets import load_breast_cancer, load_digits

from service.mechanisms.base import PublicContext, ReleaseSpec
from service.mechanisms.clip_quantile import clip_from_counts, quantile_edges
from service.mechanisms.composition import gaussian_total_mu
from service.mechanisms.linalg import clip_rows, clipped_gram, gram_norm_counts, top_k_eigh
from service.mechanisms.noise import symmetric_gaussian
from service.mechanisms.registry import get_mechanism

K, DELTA, VARIANCE, CLIP = 10, 1e-6, 0.1, 0.05
Array = np.ndarray[Any, Any]


def captured(rows: Array, basis: Array) -> float:
    y = clip_rows(rows, 1.0)
    y = y - y.mean(axis=0)
    return float(np.sum((y @ basis) ** 2) / np.sum(y**2))


def gram_step(
    rows: Array, center: Array | None, gram_mu: float, clip_mu: float, rng: np.random.Generator
) -> tuple[Array, float]:
    """Noisy Gram of the rows (centred on ``center``) clipped at a private median; its sigma."""
    n = rows.shape[0]
    counts = gram_norm_counts(rows, 1.0, center, quantile_edges(1.0))
    c2 = clip_from_counts(counts, n, 1.0, 0.5, clip_mu, rng)
    gram = clipped_gram(rows, 1.0, center=center, row_clip=c2)
    sigma = math.sqrt(2.0) * c2**2 / gram_mu
    return gram + symmetric_gaussian(gram.shape[0], sigma, rng), sigma


def split(total: float, mean_share: float) -> tuple[float, float, float]:
    gram = 1.0 - mean_share - CLIP - VARIANCE
    return math.sqrt(mean_share) * total, math.sqrt(CLIP) * total, math.sqrt(gram) * total


def private_mean(rows: Array, mean_mu: float, rng: np.random.Generator) -> tuple[Array, float]:
    n, d = rows.shape
    sigma = 2.0 / (n * mean_mu)
    return clip_rows(rows, 1.0).mean(axis=0) + rng.normal(0.0, sigma, size=d), sigma


def spike_rule(n: int, d: int, sigma_mu: float, sigma: float, values: Array) -> bool:
    """Drop the top eigenvector when the mean's rank-one term ``n ||delta||^2`` (public law:
    ``n sigma_mu^2 chi2_d``) stands out of the Gram noise (above ``sigma sqrt(d)``, the BBP
    threshold) and the released top eigenvalue is within its predicted range."""
    low = n * sigma_mu**2 * chi2.ppf(0.005, d)
    high = n * sigma_mu**2 * chi2.ppf(0.995, d)
    edge = sigma * math.sqrt(d)
    if low <= edge:
        return False
    # A spike theta appears at theta + sigma^2 d / theta (spiked Wigner).
    return bool(low + edge**2 / low - 2 * sigma <= values[0] <= high + edge**2 / high + 2 * sigma)


def service_run(rows: Array, eps: float, params: dict[str, Any], rng: np.random.Generator) -> Array:
    n, d = rows.shape
    mechanism = get_mechanism("analyze_gauss")
    assert mechanism is not None
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=1.0)
    resolved = mechanism.prepare(ctx, K, eps, DELTA, mechanism.parse_params(params))
    out = mechanism.run(rows, ReleaseSpec(K, eps, DELTA, resolved), rng)
    assert out.basis is not None
    return out.basis


def run_variant(name: str, rows: Array, eps: float, rng: np.random.Generator) -> Array:
    n, d = rows.shape
    total = gaussian_total_mu(eps, DELTA, 0.0, 0.0)
    if name == "chosen (service)":
        return service_run(rows, eps, {"center": "private", "clip_quantile": 0.5}, rng)
    if name == "none":
        _, clip_mu, gram_mu = split(total, 0.0)
        noisy, _ = gram_step(rows, None, gram_mu, clip_mu, rng)
        return top_k_eigh(noisy, K)[1]
    if name == "pairs":
        _, clip_mu, gram_mu = split(total, 0.0)
        m = n // 2
        diffs = (rows[0 : 2 * m : 2] - rows[1 : 2 * m : 2]) / math.sqrt(2.0)
        # Rows of norm <= 1 give differences of norm <= sqrt(2); clipped to 1 like the rows.
        noisy, _ = gram_step(diffs, None, gram_mu, clip_mu, rng)
        return top_k_eigh(noisy, K)[1]
    if name == "oracle mean":
        _, clip_mu, gram_mu = split(total, 0.2)
        center = clip_rows(rows, 1.0).mean(axis=0)
        noisy, _ = gram_step(rows, center, gram_mu, clip_mu, rng)
        return top_k_eigh(noisy, K)[1]
    share = float(name.split()[1].rstrip(","))
    mean_mu, clip_mu, gram_mu = split(total, share)
    center, sigma_mu = private_mean(rows, mean_mu, rng)
    noisy, sigma = gram_step(rows, center, gram_mu, clip_mu, rng)
    if "deflate" not in name:
        return top_k_eigh(noisy, K)[1]
    values, vectors = top_k_eigh(noisy, K + 1)
    if spike_rule(n, d, sigma_mu, sigma, values):
        return vectors[:, 1:]
    return vectors[:, :K]


def power_law(n: int, d: int, mean_norm: float, seed: int) -> Array:
    """Rows ``m + y``: ``y`` Gaussian with a 1/i spectrum in a random basis, ``E||y||^2 =
    0.3^2``, ``||m|| = mean_norm`` (a fixed random direction); clipped to 1 by the metric."""
    rng = np.random.default_rng(1000 + seed)
    basis, _ = np.linalg.qr(rng.standard_normal((d, d)))
    spectrum = 1.0 / np.arange(1, d + 1)
    spectrum *= 0.09 / spectrum.sum()
    y = (rng.standard_normal((n, d)) * np.sqrt(spectrum)) @ basis.T
    direction = rng.standard_normal(d)
    return np.asarray(y + mean_norm * direction / np.linalg.norm(direction))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--variants", default="")
    args = parser.parse_args()
    digits, cancer = load_digits().data, load_breast_cancer().data
    unit: dict[str, Callable[[int], Array]] = {}
    for label, data in (("digits", digits), ("breast_cancer", cancer)):
        normed = data / np.linalg.norm(data, axis=1, keepdims=True)

        def draw(rep: int, normed: Array = normed) -> Array:
            r = np.random.default_rng(rep)
            return normed[r.permutation(len(normed))[: int(0.7 * len(normed))]]

        unit[label] = draw
    for n in (400, 2000, 5000):
        for m in (0.7, 0.2):
            unit[f"power_law n={n} |m|={m}"] = lambda rep, n=n, m=m: power_law(n, 64, m, rep)
    variants = [
        "none",
        "private 0.2",
        "private 0.2, deflate",
        "private 0.35",
        "private 0.35, deflate",
        "private 0.5",
        "pairs",
        "oracle mean",
        "chosen (service)",
    ]
    if args.variants:
        variants = [v for v in variants if v in args.variants.split(";")]
    print("| data | eps | " + " | ".join(variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for label, draw in unit.items():
        for eps in (0.3, 1.0):
            cells = []
            for variant in variants:
                shares = []
                for rep in range(args.reps):
                    rows = draw(rep)
                    basis = run_variant(variant, rows, eps, np.random.default_rng(10_000 + rep))
                    shares.append(captured(rows, basis))
                cells.append(f"{np.mean(shares):.3f}")
            print(f"| {label} | {eps} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
