"""Two spreads the forecast from an earlier release must carry into its 90% range (issue 32
item 4), from released figures and public scales only (post-processing: no budget, no row).

- :func:`trace_readings`: a hidden earlier release is read off its eigenvalues as shares of its
  noisy trace ``tr(H + E)``, whose noise ``tr(E)`` is ``N(0, d sigma^2)`` (``d`` diagonal
  entries of ``E(sigma)``, each ``N(0, sigma^2)``). Where the clip sat at its grid's floor the
  trace's noise is 0.27-0.63 of the trace itself (breast_cancer, eps 0.3), and a share read at
  the noisy trace alone came out 0.998 for a direction holding 0.77: ranges 0.06 wide, 0.2
  above what the release then kept. The shares are read at the trace's two ends
  ``tr -/+ Z sigma sqrt(d)`` as well.
- :func:`filled`: the earlier release's figures as a release at the grid's floor clip (a sign
  map, every row filling the clip) would show them, for the high end where the new probe may
  read its clip from noise.
- :func:`random_share_high`: components a release spends on directions no earlier release
  resolved land at random in what is left; their *expected* share is ``m / D`` of the
  unresolved variance, but one release's is a draw. At most, that variance lies along one
  direction, whose squared projection on a uniformly random ``m``-dimensional subspace of
  ``R^D`` is ``Beta(m/2, (D - m)/2)``: its ``0.95`` quantile is the high end (digits, eps 0.1,
  ``k = 1``: the range's high end was ``1/64``, the releases kept up to 0.034).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from scipy.special import betaincinv

from service.mechanisms.linalg import FloatArray

#: The range's one-sided level (a 90% range: 5% each side), as ``gauss_release_forecast.Z``.
UPPER = 0.95
Z = 1.6448536269514722


def trace_readings(
    shares: FloatArray, trace: float, sigma: float, d: int
) -> tuple[FloatArray, FloatArray]:
    """``shares`` (eigenvalues over the noisy ``trace``) read at ``trace + Z sigma sqrt(d)``
    (low) and at ``trace - Z sigma sqrt(d)`` (high; all of the trace where that is not
    positive), the high reading scaled to leave a sliver for the rest as the central one."""
    spread = Z * sigma * math.sqrt(d)
    if not trace > 0 or not spread > 0:
        return shares, shares
    low = shares * trace / (trace + spread)
    high = np.minimum(shares * trace / max(trace - spread, trace * 1e-12), 1.0)
    if high.sum() > 1.0 - 1e-6:
        high = high * (1.0 - 1e-6) / high.sum()
    return low, np.maximum(high, shares)


def random_share_high(m: float, dims: float) -> float:
    """The :data:`UPPER` quantile of the share of one direction's variance that a uniformly
    random ``m``-dimensional subspace of ``R^dims`` keeps (``Beta(m/2, (dims - m)/2)``); 1
    when ``m >= dims``, 0 when ``m <= 0``."""
    if m <= 0:
        return 0.0
    if m >= dims:
        return 1.0
    return float(betaincinv(m / 2.0, (dims - m) / 2.0, UPPER))


def filled(figures: Any) -> Any:
    """An earlier release's figures (``forecast_figures.ReleasedFigures``) read as if its Gram's
    rows had filled their clip: the eigenvalues and the trace over
    ``clipped_share = tr / (n C2^2)``, so ``tr = n C2^2``; ``None`` where the fill is unknown
    or already full.

    Where the new release's probe may read its clip from its count noise (``probe_risk`` at
    least 0.05) the clip can land at the grid's floor: every row is then clipped (a sign map)
    and the data's eigenvalues stand ``1 / clipped_share`` times higher against the same Gram
    noise (both scale with ``C2^2``) than at the earlier clip. The range's high end allows it.
    Post-processing of released figures and public scales."""
    share = float(figures.clipped_share)
    if not 0.0 < share < 1.0:
        return None
    eigenvalues = tuple(float(value) / share for value in figures.eigenvalues)
    return dataclasses.replace(figures, eigenvalues=eigenvalues, trace=figures.trace / share)


def moved_share(shares: FloatArray, before: FloatArray, after: FloatArray) -> FloatArray:
    """A measured uncentred release's shares ``shares`` (of the centred variance along its
    components, each stated ratio over its squared overlap ``before`` at the earlier noise)
    with one component's stated share moved onto a component of a larger eigenvalue, the move
    that keeps the most at the new overlaps ``after``; ``shares`` unchanged when no move keeps more.

    Such a release states the share its components capture together, split among them in
    proportion to their uncentred eigenvalues: the rows' mean's component (which holds about
    none of the centred variance) takes a share that is the data's (power-law rows whose mean
    lies along a weak direction: the top direction was stated 0.10 of the 0.19 it holds, the
    mean's 0.07; from eps 2 to 0.3 at k 2 the releases kept 0.14-0.16 above a high end of
    0.13-0.15 in 9 of 20 runs). The released figures do not say which component is the
    mean's, so the high end reads each: stated ratio ``r_i = shares_i before_i`` moved to
    component ``j`` is ``r_i / before_j`` there. Post-processing of released figures."""
    count = shares.shape[0]
    if count < 2:
        return shares
    tiny = np.finfo(np.float64).tiny
    ratios = shares * before
    gain = np.zeros((count, count))
    for i in range(count):
        # Only onto a component of a larger eigenvalue (``shares`` in the release's order,
        # descending): the data's top direction outranks the mean's where it is not the mean.
        # A move down would credit a stated share over a smaller overlap (MNIST, eps 1 to 2:
        # ranges 0.13 -> 0.32 wide, no other cell covered).
        for j in range(i):
            if before[j] > tiny:
                moved = min(shares[j] + ratios[i] / before[j], 1.0) - shares[j]
                gain[i, j] = moved * after[j] - shares[i] * after[i]
    best = int(np.argmax(gain))
    source, target = best // count, best % count
    # (A move that only reorders the same total, within rounding, is none.)
    if not gain[source, target] > 1e-12:
        return shares
    out = shares.copy()
    out[target] = min(shares[target] + ratios[source] / before[target], 1.0)
    out[source] = 0.0
    return out
