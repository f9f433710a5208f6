"""M7 ``spectrum``: noisy top singular values of the clipped data, and a suggested ``k``.

Tsfadia, "On Differentially Private Subspace Estimation in a Distribution-Free Setting",
NeurIPS 2024, Section 2.1 (seed 001): privately choosing ``k``.

Privacy: by Mirsky's inequality, replacing one clipped row moves the vector of singular values
(and so its top-``m`` part) by at most ``||x - x'||_2 <= 2C`` in l2. Adding iid Gaussian noise with
the analytic ``sigma`` for ``D = 2C`` makes the vector ``(eps, delta)``-DP. Clamping at zero,
sorting, rounding to a public grid and the suggested ``k`` are post-processing. Cost:
exactly ``(eps, delta)``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from service.mechanisms.base import (
    ClipParams,
    ClippingMechanism,
    InvalidParameter,
    MechanismOutput,
    PublicContext,
    ReleaseSpec,
)
from service.mechanisms.linalg import FloatArray, clipped_gram, eigenvalues_desc
from service.mechanisms.noise import GRID_DIVISOR, analytic_gaussian_sigma, round_to_grid

#: A value below ``NOISE_FLOOR * noise_std`` is treated as indistinguishable from zero when
#: suggesting ``k``: pure noise exceeds it with probability ``2 Phi(-2) ~ 5%`` per value.
NOISE_FLOOR = 2.0

#: A "large multiplicative drop" between consecutive (floored) values.
DROP_RATIO = 2.0


class SpectrumParams(ClipParams):
    """Params of ``spectrum``: only the clip norm (``k`` is the number of values)."""


def spectrum_sensitivity(clip_norm: float) -> float:
    """l2 sensitivity of the singular-value vector under replacement (Mirsky): ``2C``."""
    return 2.0 * clip_norm


def noise_std(clip_norm: float, epsilon: float, delta: float) -> float:
    """Per-value standard deviation: analytic Gaussian ``sigma`` for ``D = 2C``."""
    return analytic_gaussian_sigma(spectrum_sensitivity(clip_norm), epsilon, delta)


def suggest_k(values: FloatArray, std: float) -> int:
    """The first large multiplicative drop in the released values.

    Each value is floored at ``NOISE_FLOOR * std`` (below that it could be noise); the
    suggestion is the first ``i`` with ``t_i >= DROP_RATIO * t_{i+1}``. Without such a drop it
    is the number of values above the floor, at least 1 (``m`` if all are significant: ask for
    more values, the drop may lie beyond them).

    Parameters
    ----------
    values : (m,) array
        Released singular values, descending.
    std : float
        Their noise standard deviation.
    """
    floor = NOISE_FLOOR * std
    floored = np.maximum(values, floor)
    for i in range(len(floored) - 1):
        if floored[i] >= DROP_RATIO * floored[i + 1]:
            return i + 1
    return max(1, int(np.count_nonzero(values > floor)))


def spectrum(
    data: FloatArray,
    m: int,
    epsilon: float,
    delta: float,
    clip_norm: float,
    rng: np.random.Generator,
) -> tuple[FloatArray, int, float]:
    """Release the top-``m`` singular values of the clipped data with Gaussian noise.

    Parameters
    ----------
    data : (n, d) array
        The rows; may be a read-only memory map (read in chunks, memory ``O(d^2)``).
    m : int
        Number of values, ``1 <= m <= min(n, d)``.
    epsilon, delta : float
        Privacy cost, ``epsilon > 0``, ``0 < delta < 1``.
    clip_norm : float
        Public row norm bound ``C``.
    rng : numpy.random.Generator
        The release's generator.

    Returns
    -------
    values : (m,) array
        Noisy singular values, clamped at 0, sorted descending, rounded to multiples of
        ``std / GRID_DIVISOR``.
    suggested_k : int
        See :func:`suggest_k`.
    std : float
        Per-value noise standard deviation (public: depends on ``C, eps, delta`` only).
    """
    eigenvalues = eigenvalues_desc(clipped_gram(data, clip_norm))[:m]
    singular = np.sqrt(np.maximum(eigenvalues, 0.0))
    std = noise_std(clip_norm, epsilon, delta)
    noisy = singular + rng.normal(0.0, std, size=m)
    # True singular values are non-negative and sorted, so clamping and sorting never increase
    # the largest per-value error.
    released = round_to_grid(np.sort(np.maximum(noisy, 0.0))[::-1], std / GRID_DIVISOR)
    return released, suggest_k(released, std), std


class Spectrum(ClippingMechanism[SpectrumParams]):
    name: ClassVar[str] = "spectrum"
    title: ClassVar[str] = "Noisy singular values, for choosing k"
    paper: ClassVar[str] = (
        "Tsfadia, On Differentially Private Subspace Estimation in a Distribution-Free "
        "Setting, NeurIPS 2024, Section 2.1"
    )
    summary: ClassVar[str] = (
        "Releases the top-k singular values of the clipped data (k = how many, at most "
        "min(n, d)) with Gaussian noise for sensitivity 2C, its noise_std, and a suggested_k "
        "(first large multiplicative drop). No basis. Spend a small budget here to pick k "
        "before a subspace release."
    )
    params_model: ClassVar[type[SpectrumParams]] = SpectrumParams
    releases_basis: ClassVar[bool] = False

    def check_specific(self, ctx: PublicContext, k: int, params: SpectrumParams) -> None:
        limit = min(ctx.n_rows, ctx.n_cols)
        if k > limit:
            raise InvalidParameter(
                "k",
                f"must be <= min(n, d) = {limit} (the number of singular values); "
                f"got {k}, {k - limit} too many",
            )

    def run(
        self, data: FloatArray, spec: ReleaseSpec[SpectrumParams], rng: np.random.Generator
    ) -> MechanismOutput:
        assert spec.params.clip_norm is not None  # resolved by prepare
        values, suggested, std = spectrum(
            data, spec.k, spec.epsilon, spec.delta, spec.params.clip_norm, rng
        )
        return MechanismOutput(
            basis=None,
            extras={
                "singular_values": values.tolist(),
                "suggested_k": suggested,
                "noise_std": std,
                "grid": std / GRID_DIVISOR,
            },
        )
