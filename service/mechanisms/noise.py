"""Noise primitives shared by every mechanism, all drawing from one release's generator.

Randomness
----------
:func:`secure_generator` returns a ``numpy.random.Generator`` over randomgen's ChaCha (20 rounds),
a cryptographically secure stream cipher, keyed with 256 bits from ``os.urandom``. Each release
gets a fresh one; public randomness (partitions, reference points, rotations) comes from the same
generator. Tests pass a seeded generator instead; production code never seeds.

Floating point
--------------
The samplers below are the textbook ones on IEEE doubles (NumPy's Laplace, normal, Cauchy, and
inverse-CDF transforms of 53-bit uniforms). Mironov (CCS 2012) shows such samplers leave gaps in
the set of reachable doubles, so a *directly released* noisy value can in principle reveal its
unperturbed input. What the service does about it: the subspace mechanisms release eigenvectors
or QR factors of noisy matrices (a non-linear post-processing that does not preserve the
low-order bits of any single noisy entry), and directly released noisy numbers (``spectrum``'s
eigenvalues, ``analyze_gauss``'s eigenvalues) are rounded to a grid of ``sigma / 1000``
(:func:`round_to_grid`), far coarser than a double's spacing. What remains: no snapping
mechanism is implemented, so the guarantee is the idealised real-number one and not a proof
for floating-point arithmetic.

Scale: :func:`analytic_gaussian_sigma` calibrates at unit sensitivity and scales the result,
so no step of its bisection can over- or underflow, and the product is finite for every
sensitivity the mechanisms accept (clip norms are checked at prepare time, see
``base.check_clip_scale``).
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np
from randomgen import ChaCha
from scipy.special import log_ndtr
from scipy.stats import ortho_group

from service.mechanisms.linalg import FloatArray


def secure_generator() -> np.random.Generator:
    """A fresh generator over ChaCha20 keyed with 256 bits from the OS CSPRNG."""
    key = int.from_bytes(os.urandom(32), "little")
    return np.random.Generator(ChaCha(key=key, counter=0, rounds=20))


# ---------------------------------------------------------------------------------------------
# Gaussian: analytic calibration (Balle & Wang, ICML 2018, Theorem 8)


def gaussian_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """The smallest delta for which ``N(0, sigma^2)`` noise is ``(epsilon, delta)``-DP.

    ``delta(sigma) = Phi(D/(2 sigma) - eps sigma/D) - e^eps Phi(-D/(2 sigma) - eps sigma/D)``,
    evaluated in log space so that tiny deltas do not underflow.
    """
    ratio = sensitivity / (2.0 * sigma)
    shift = epsilon * sigma / sensitivity
    log_first = float(log_ndtr(ratio - shift))
    log_second = epsilon + float(log_ndtr(-ratio - shift))
    if log_second >= log_first:
        return 0.0
    return math.exp(log_first) * -math.expm1(log_second - log_first)


def analytic_gaussian_sigma(
    sensitivity: float, epsilon: float, delta: float, *, rel_tol: float = 1e-12
) -> float:
    """Smallest ``sigma`` such that Gaussian noise of l2 sensitivity ``D`` is ``(eps, delta)``-DP.

    ``delta(sigma)`` depends on ``D / sigma`` only, so ``sigma(D) = D sigma(1)``: the bisection
    runs at ``D = 1`` (on ``log sigma``, where no step can over- or underflow whatever the scale
    of ``D``) and the result is multiplied by ``D``. ``delta(sigma)`` decreases in ``sigma``, and
    the returned value is the upper end of the final bracket, so it satisfies the bound. Valid
    for every ``epsilon > 0`` (unlike the classical ``sqrt(2 ln(1.25/delta)) D/eps``).
    """
    if not (0 < sensitivity < math.inf and 0 < epsilon < math.inf and 0 < delta < 1):
        raise ValueError("need 0 < sensitivity < inf, 0 < epsilon < inf and 0 < delta < 1")
    sigma = sensitivity * _unit_sigma(epsilon, delta, rel_tol)
    if gaussian_delta(sigma, sensitivity, epsilon) <= delta:
        return sigma
    # delta(.) evaluated at this D rounds differently from D = 1 (relative 1e-10 near tiny
    # deltas): widen upwards until the bound holds here, then bisect back. The bracket stays
    # within a factor of a few of sigma, and its arithmetic midpoint cannot underflow.
    low, high, step = sigma, sigma, rel_tol
    while gaussian_delta(high, sensitivity, epsilon) > delta:
        low, high, step = high, sigma * (1.0 + step), step * 2.0
    while high - low > rel_tol * high:
        mid = low + (high - low) / 2.0
        if gaussian_delta(mid, sensitivity, epsilon) <= delta:
            high = mid
        else:
            low = mid
    return high


@functools.lru_cache(maxsize=256)
def _unit_sigma(epsilon: float, delta: float, rel_tol: float) -> float:
    """``analytic_gaussian_sigma(1, epsilon, delta)``."""
    low = high = 1.0
    while gaussian_delta(high, 1.0, epsilon) > delta:
        low, high = high, high * 2.0
    while gaussian_delta(low, 1.0, epsilon) <= delta:
        low, high = low / 2.0, low
    while high - low > rel_tol * high:
        mid = math.sqrt(low * high)
        if gaussian_delta(mid, 1.0, epsilon) <= delta:
            high = mid
        else:
            low = mid
    return high


#: Directly released noisy numbers are rounded to multiples of ``sigma / GRID_DIVISOR``: far
#: finer than the noise (error at most ``sigma / 2000``), far coarser than a double's ulp.
GRID_DIVISOR = 1000.0


def round_to_grid(values: FloatArray, width: float) -> FloatArray:
    """Round each value to the nearest multiple of ``width`` (post-processing)."""
    return np.asarray(np.round(values / width) * width, dtype=np.float64)


def symmetric_gaussian(dim: int, sigma: float, rng: np.random.Generator) -> FloatArray:
    """``E(sigma)``: a ``dim x dim`` symmetric matrix, upper triangle (diagonal included) iid
    ``N(0, sigma^2)`` and the lower triangle mirrored."""
    # dim (dim + 1)/2 draws, not dim^2 (the lower half of a full draw was thrown away): row i
    # of the upper triangle takes the next dim - i draws and is mirrored into column i. At
    # dim = 784: 6.6 ms against 17.5 ms (issue 35, the floor's noise draw).
    draws = rng.normal(0.0, sigma, size=dim * (dim + 1) // 2)
    noise = np.empty((dim, dim), dtype=np.float64)
    start = 0
    for i in range(dim):
        row = draws[start : start + dim - i]
        noise[i, i:] = row
        noise[i:, i] = row
        start += dim - i
    return noise


# ---------------------------------------------------------------------------------------------
# Laplace family


def laplace(
    scale: float, rng: np.random.Generator, size: int | tuple[int, ...] | None = None
) -> FloatArray:
    """``Lap(b)`` samples with density ``exp(-|x|/b) / (2b)``."""
    return np.asarray(rng.laplace(0.0, scale, size=size), dtype=np.float64)


#: Below ``ln`` of the largest double (709.78): ``math.exp`` and ``math.expm1`` of a larger
#: argument raise ``OverflowError``; a request's epsilon goes up to 1000.
LARGEST_EXP_ARGUMENT = 709.0


def truncated_laplace_params(
    sensitivity: float, epsilon: float, delta: float
) -> tuple[float, float]:
    """``(lam, A)`` of ``TLap(D, eps, delta)`` (seed 003, Lemma 2.14).

    ``lam = D/eps`` and ``A = (D/eps) ln(1 + (e^eps - 1)/(2 delta))``.
    """
    lam = sensitivity / epsilon
    if epsilon < LARGEST_EXP_ARGUMENT:
        ratio = math.expm1(epsilon) / (2.0 * delta)
        if math.isfinite(ratio):
            return lam, lam * math.log1p(ratio)
    # e^eps - 1 (eps up to the request's 1000) or its ratio to 2 delta is past the largest
    # double: ln(1 + r) = ln r + ln(1 + 1/r), with ln r = eps + ln(1 - e^-eps) - ln(2 delta).
    log_ratio = epsilon + math.log(-math.expm1(-epsilon)) - math.log(2.0 * delta)
    return lam, lam * (log_ratio + math.log1p(math.exp(-log_ratio)))


def truncated_laplace_ppf(p: FloatArray | float, lam: float, bound: float) -> FloatArray:
    """Inverse CDF of the density proportional to ``exp(-|x|/lam)`` on ``[-A, A]``."""
    prob = np.asarray(p, dtype=np.float64)
    tail = math.exp(-bound / lam)
    mass = 1.0 - tail  # the (unnormalised) mass of one half, times 1/lam
    lower = lam * np.log(np.maximum(2.0 * prob * mass + tail, tail))
    upper = -lam * np.log(np.maximum(1.0 - (2.0 * prob - 1.0) * mass, tail))
    return np.where(prob < 0.5, lower, upper)


def truncated_laplace(
    sensitivity: float,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    size: int | tuple[int, ...] | None = None,
) -> FloatArray:
    """Samples of ``TLap(D, eps, delta)`` by inverse CDF."""
    lam, bound = truncated_laplace_params(sensitivity, epsilon, delta)
    return truncated_laplace_ppf(rng.random(size=size), lam, bound)


def cauchy(rng: np.random.Generator, size: int | tuple[int, ...] | None = None) -> FloatArray:
    """Standard Cauchy samples (for the pure variant of smooth sensitivity)."""
    return np.asarray(rng.standard_cauchy(size=size), dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# Rotations


def haar_orthogonal(dim: int, rng: np.random.Generator) -> FloatArray:
    """A Haar-random ``dim x dim`` orthogonal matrix (public randomness)."""
    if dim == 1:
        return np.array([[1.0 if rng.random() < 0.5 else -1.0]])
    return np.asarray(ortho_group.rvs(dim, random_state=rng), dtype=np.float64)
