"""The unseen tail of a released spectrum, extrapolated (issue 32 item 4).

An earlier ``analyze_gauss`` release resolves ``m`` eigenvalues above its noise's edge; the rest
of its (noisy, unbiased) trace is spread over ``d - m`` directions it did not resolve. A release
with less noise or more components reaches into that tail, so a forecast that counts the tail at
a random subspace's share (what :mod:`service.mechanisms.gauss_release_forecast` did) reads low:
digits from eps 1, k 2 to k 10 forecast 0.38 for 0.59 kept. The stated model here: the tail
continues the last resolved eigenvalue as a power law, ``t_j = a ((m + j)/m)^(-b)`` (``a`` the
anchor), with ``b >= 0`` chosen so that the tail holds the rest of the trace; where that law's
first value would have stood out of the earlier noise (it released an eigenvalue below its
edge, so none did) or no such law holds the trace, the known eigenvalues are spikes over a bulk
and the tail stays flat. Released figures and public facts in, numbers out: post-processing,
no budget, no row.
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


def tail_spectrum(
    anchor: float, m: int, remaining: float, count: int, cap: float, measured: bool = False
) -> FloatArray:
    """The tail's eigenvalues ``t_1 >= ... >= t_count`` (shape ``(count,)``) for directions
    ``m + 1 .. m + count``, in the same units as ``anchor``.

    ``anchor``: the last resolved eigenvalue (index ``m >= 1``); ``remaining``: the trace the
    tail holds; ``cap``: the most an unresolved eigenvalue can be (``inf`` when unknown). The
    power law ``t_j = anchor ((m + j)/m)^(-b)``, ``b >= 0`` with ``sum t = remaining``; from a
    single known eigenvalue of a release that measured its share (``m = 1``, ``measured``)
    counted in the tail's own rank instead (:func:`_from_one`). Where
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
    if m == 1 and measured:
        return _from_one(anchor, remaining, count, cap, flat)
    if m <= 0 or not anchor > 0 or anchor * count <= remaining:
        return flat
    ratio = (m + np.arange(1, count + 1, dtype=np.float64)) / m

    def total(b: float) -> float:
        return float(np.sum(anchor * ratio ** (-b)))

    values = _law(anchor, ratio, remaining)
    if values is None or values[0] > cap:
        return flat
    return values


def _law(start: float, ratio: FloatArray, remaining: float) -> FloatArray | None:
    """``start ratio^(-b)`` with the ``b`` in ``[0, MAX_EXPONENT]`` that holds ``remaining``
    (bisection), or ``None`` where even the steepest law holds more: the tail is then below any
    power law from ``start``, i.e. a bulk under spikes."""

    def total(b: float) -> float:
        return float(np.sum(start * ratio ** (-b)))

    low, high = 0.0, MAX_EXPONENT
    if total(high) > remaining:
        return None
    for _ in range(STEPS):
        middle = (low + high) / 2.0
        if total(middle) > remaining:
            low = middle
        else:
            high = middle
    values = start * ratio ** (-high)
    return values * (remaining / float(values.sum()))


def _from_one(
    anchor: float, remaining: float, count: int, cap: float, flat: FloatArray
) -> FloatArray:
    """:func:`tail_spectrum` from a single known eigenvalue: the law counted in the tail's own
    rank, ``t_j = s j^(-b)``, from the largest first value the released figures leave open,
    ``s = min(anchor, cap)``.

    With ``m >= 2`` the law from the anchor continues a decay the released eigenvalues above it
    show, and its first step, ``((m + 1)/m)^(-b)``, is at most ``1.5^(-b)``. From one
    eigenvalue the figures show no decay at all: the law counted from rank 1 would put the
    next eigenvalue at ``2^(-b)`` times it, the steepest step of a power law anywhere, and
    that step is the one thing the figures say nothing of (a release of one component cannot
    show an eigengap below it; digits: 0.58 of the top eigenvalue read for 0.93 true, and the
    forecast of a release at eps 0.3 from one at eps 1 or 3 sat 0.015 low, both misses on the
    top). What the figures do bound is the next eigenvalue's largest value: the anchor (the
    order), and the earlier noise's detection threshold ``cap`` where that release showed an
    eigenvalue below its edge (it would otherwise have resolved it). So the tail starts there
    and the power law in its own rank, with ``b`` again holding the trace, sets how fast it
    falls: the tail's total is the same, only which directions hold it moves. Flat where no
    such law holds the trace (as :func:`tail_spectrum`).

    Only from a release that measured its share (the one release a stated point comes from):
    there the one eigenvalue is a data direction's. From a hidden release the one eigenvalue
    left is itself one reading of which is the data's (the uncentred route's mean or the
    mean's noise spike dropped), and the range already spans those readings; there the level
    start widened the range without covering more (power-law rows, k 2, eps 0.3 -> 2 from an
    uncentred hidden release: width 0.277 -> 0.363, 20 of 20 both ways, the central figure's
    error 0.040 -> 0.048; a pure ``1/i`` law is where the law from rank 1 is exact)."""
    start = min(anchor, cap)
    if not start > 0 or start * count <= remaining:
        return flat
    values = _law(start, np.arange(1, count + 1, dtype=np.float64), remaining)
    return flat if values is None else values
