"""The unseen tail of a released spectrum, extrapolated (issue 32 item 4).

An earlier ``analyze_gauss`` release resolves ``m`` eigenvalues above its noise's edge; the rest
of its (noisy, unbiased) trace is spread over ``d - m`` directions it did not resolve. A release
with less noise or more components reaches into that tail, so a forecast that counts the tail at
a random subspace's share (what :mod:`service.mechanisms.gauss_forecast` did) reads low: digits
from eps 1, k 2 to k 10 forecast 0.38 for 0.59 kept. The stated model here: the tail continues
the last resolved eigenvalue as a power law, ``t_j = a ((m + j)/m)^(-b)`` (``a`` the anchor),
with ``b >= 0`` chosen so that the tail holds the rest of the trace; where that law's first value
would have stood out of the earlier noise (it released an eigenvalue below its edge, so none did)
or no such law holds the trace, the known eigenvalues are spikes over a bulk and the tail stays
flat. Released figures and public facts in, numbers out: post-processing, no budget, no row.
"""

from __future__ import annotations

import math

import numpy as np

from service.mechanisms.linalg import FloatArray

#: The largest exponent tried: ``(1 + 1/m)^(-64)`` is about 0 at any ``m`` that matters, i.e. the
#: whole tail is then in its first direction or two.
MAX_EXPONENT = 64.0
#: Bisection steps on the exponent (``2^-50`` of :data:`MAX_EXPONENT`: well below any effect).
STEPS = 50


def tail_spectrum(anchor: float, m: int, remaining: float, count: int, cap: float) -> FloatArray:
    """The tail's eigenvalues ``t_1 >= ... >= t_count`` (shape ``(count,)``) for directions
    ``m + 1 .. m + count``, in the same units as ``anchor``.

    ``anchor``: the last resolved eigenvalue (index ``m >= 1``); ``remaining``: the trace the
    tail holds; ``cap``: the most an unresolved eigenvalue can be (``inf`` when unknown). The
    power law ``t_j = anchor ((m + j)/m)^(-b)``, ``b >= 0`` with ``sum t = remaining``. Where
    that law is not what the released figures showed -- its first value above ``cap`` (the
    earlier release would have resolved it), or no ``b >= 0`` holding the trace (a flat tail
    at ``anchor`` holds less) -- the known eigenvalues are spikes over a bulk the figures do
    not shape, and the tail is flat at ``remaining / count`` (the random-subspace reading the
    forecast had before). Zeros when ``remaining <= 0``."""
    if count <= 0:
        return np.zeros(0)
    if not remaining > 0 or not math.isfinite(remaining):
        return np.zeros(count)
    flat = np.full(count, remaining / count)
    if m <= 0 or not anchor > 0 or anchor * count <= remaining:
        return flat
    ratio = (m + np.arange(1, count + 1, dtype=np.float64)) / m

    def total(b: float) -> float:
        return float(np.sum(anchor * ratio ** (-b)))

    low, high = 0.0, MAX_EXPONENT
    if total(high) > remaining:
        # Even the steepest law holds more than the trace left: the tail is below any power
        # law from the anchor, i.e. a bulk under spikes.
        return flat
    for _ in range(STEPS):
        middle = (low + high) / 2.0
        if total(middle) > remaining:
            low = middle
        else:
            high = middle
    values = anchor * ratio ** (-high)
    if values[0] > cap:
        return flat
    return values * (remaining / float(values.sum()))
