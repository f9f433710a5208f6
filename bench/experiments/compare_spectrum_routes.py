"""spectrum: noise on eigenvalues of X^T X (sqrt(2) C^2) against the old noise on singular
values (Mirsky, 2C), on scikit-learn's digits and on the README walkthrough's data.

For each dataset and epsilon (delta = 1e-6) it prints the noise standard deviation of each
route on the singular-value scale near the top values, how many of the top values stand clearly
above the noise (the threshold rule of the shipped suggested_k, applied to each route's own
scale), the suggested k of each route over repeated releases, and the median relative error of
the released top singular values. Both routes are computed in the same process on the same
data; the old route is reimplemented here from its last shipped version (noise N(0, sigma(2C))
on sqrt(lambda_i), clamp, sort, first drop by half above a 2 sigma floor).

    .venv/bin/python bench/experiments/compare_spectrum_routes.py [--repeats 50]
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
from sklearn.datasets import load_digits

from service.mechanisms.linalg import clipped_gram, eigenvalues_desc
from service.mechanisms.noise import analytic_gaussian_sigma
from service.mechanisms.spectrum import signal_threshold, spectrum

DELTA = 1e-6
M = 20


def readme_data() -> np.ndarray:
    """The README walkthrough's 5,000 rows near a 3-dim subspace of R^20 (row norms <= 1)."""
    rng = np.random.default_rng(7)
    basis, _ = np.linalg.qr(rng.normal(size=(20, 3)))
    rows = rng.normal(size=(5000, 3)) @ basis.T * 0.3 + rng.normal(size=(5000, 20)) * 0.002
    rows /= np.maximum(1, np.linalg.norm(rows, axis=1, keepdims=True))
    return np.asarray(rows)


def old_route(
    eigenvalues: np.ndarray, epsilon: float, clip: float, rng: np.random.Generator
) -> tuple[np.ndarray, int, float]:
    std = analytic_gaussian_sigma(2.0 * clip, epsilon, DELTA)
    noisy = np.sort(np.maximum(np.sqrt(np.maximum(eigenvalues, 0)) + rng.normal(0, std, M), 0))
    values = noisy[::-1]
    floored = np.maximum(values, 2.0 * std)
    suggested = max(1, int(np.count_nonzero(values > 2.0 * std)))
    for i in range(M - 1):
        if floored[i] >= 2.0 * floored[i + 1]:
            suggested = i + 1
            break
    return values, suggested, std


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    digits = load_digits().data / 16.0  # pixels in [0, 1]: every row has norm <= 8 = sqrt(64)
    datasets = {
        "digits (1797 x 64, pixels / 16, C = 8)": (digits, 8.0),
        "digits, rows scaled to norm 1 (C = 1)": (
            digits / np.linalg.norm(digits, axis=1, keepdims=True),
            1.0,
        ),
        "README data (5000 x 20, C = 1)": (readme_data(), 1.0),
    }
    rng = np.random.default_rng(0)
    for label, (data, clip) in datasets.items():
        eigenvalues = eigenvalues_desc(clipped_gram(data, clip))[:M]
        singular = np.sqrt(np.maximum(eigenvalues, 0))
        print(f"\n## {label}")
        print("true top singular values:", np.array2string(singular[:8], precision=2))
        print(
            "| epsilon | old std (on s) | new std (on lambda) | s_i clearly above noise, old | "
            "new | suggested k, old | new | median rel. error s_1..s_3, old | new |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for epsilon in (0.1, 0.3, 1.0):
            old_counts: Counter[int] = Counter()
            new_counts: Counter[int] = Counter()
            old_err, new_err = [], []
            old_std = new_std = 0.0
            for _ in range(args.repeats):
                old_values, old_k, old_std = old_route(eigenvalues, epsilon, clip, rng)
                new_values, new_k, new_std = spectrum(data, M, epsilon, DELTA, clip, rng)
                old_counts[old_k] += 1
                new_counts[new_k] += 1
                old_err.append(np.abs(old_values[:3] - singular[:3]) / singular[:3])
                new_err.append(np.abs(np.sqrt(new_values[:3]) - singular[:3]) / singular[:3])
            old_visible = int(np.count_nonzero(singular > signal_threshold(old_std, M)))
            new_visible = int(np.count_nonzero(eigenvalues > signal_threshold(new_std, M)))
            print(
                f"| {epsilon:g} | {old_std:.3g} | {new_std:.3g} | {old_visible} | {new_visible} | "
                f"{dict(old_counts.most_common(3))} | {dict(new_counts.most_common(3))} | "
                f"{np.median(old_err):.3g} | {np.median(new_err):.3g} |"
            )


if __name__ == "__main__":
    main()
