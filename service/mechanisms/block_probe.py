"""The probe's pass over rows paired in blocks (issue 32 item 5): each row read once.

:func:`~service.mechanisms.centring_choice.probe_pass` reads the rows in their stored order and
gathers each pair's partner, an earlier row, from wherever the uniform pairing put it: ``n/2``
rows copied from random places, the step of the recommended settings that a shared memory bus
slows most. With the pairing of :func:`~service.mechanisms.paired_rows.block_pairing` (drawn
from the run's CSPRNG before the data is read: whole blocks of ``B`` consecutive rows matched
two by two, their rows by a random bijection) the pass visits the pairs of blocks in the
pairing's order instead: both blocks are contiguous slices of the rows (views, nothing
copied but the second block's rows in the bijection's order, within the core's cache), so
every row is read once and nothing is gathered from far away.

It computes the statistics :func:`probe_pass` computes for the same pairing: each row's squared
norm and clip factor to ``C`` (the same arithmetic per row, so the same bits), the clipped
rows' sum (in another order of its terms: the same sum up to rounding), each pair's dot
product (the same kernel) and from them the pairs' norms
``||p_j||^2 = (f_a^2 s_a + f_b^2 s_b - 2 f_a f_b x_a.x_b)/2`` (clamped at 0), and the two
histograms' exact counts on :func:`~service.mechanisms.centring_choice.probe_edges`.

**Privacy: the probe's argument as stated in** :mod:`~service.mechanisms.centring_choice`.
Each row's count depends on that row only and each pair's on its two rows only (and public
``C`` and the pairing), and a row lies in one pair at most, so replacing one row moves one
row count and one pair count, each by one down and one up: l2 sensitivity 2 for the two
histograms, the noise ``N(0, (2/mu_Q)^2)`` per count unchanged
(:func:`~service.mechanisms.centring_choice.read_probe`). The clipped sum's terms are the
clipped rows, each of norm ``<= C (1 + ROUNDING_SLACK)``: the mean's sensitivity ``2C/n``
unchanged. Nothing here sets a parameter from the data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.mechanisms.centring_choice import (
    ProbePass,
    _count,
    gathered_probe_pass,
    probe_edges,
    probe_pass,
)
from service.mechanisms.fast_rows import (
    _safe_squares,
    clip_factors,
    row_dots,
    row_squares,
    row_squares_into,
)
from service.mechanisms.linalg import ROUNDING_SLACK, FloatArray
from service.mechanisms.paired_rows import BlockPairing


def block_probe_pass(data: Any, clip_norm: float, pairing: BlockPairing) -> ProbePass:
    """:class:`ProbePass` for ``pairing`` (module docstring), reading the pairs of blocks in
    the pairing's order; :func:`probe_pass` when the pairing has no blocks or the rows are not
    a float64 array, and the gathered pass with its power-of-two rescaling when a squared norm
    leaves the safe range (as :func:`probe_pass`)."""
    order = pairing.order
    if pairing.block_rows <= 1 or not (isinstance(data, np.ndarray) and data.dtype == np.float64):
        return probe_pass(data, clip_norm, order)
    n, d = data.shape
    m = n // 2
    size = pairing.block_rows
    raw_squares = np.empty(n, dtype=np.float64)
    factors = np.ones(n, dtype=np.float64)
    total = np.zeros(d, dtype=np.float64)
    dots = np.empty(m, dtype=np.float64)
    limit = clip_norm * clip_norm * (1.0 + ROUNDING_SLACK)
    ones = np.ones(size, dtype=np.float64)
    matched = np.empty((size, d), dtype=np.float64)

    def add(rows: FloatArray, squares: FloatArray, start: int) -> None:
        """The rows' clipped sum into ``total`` and their factors (``start``: their first row,
        or -1 for gathered rows, whose factors the caller stores)."""
        nonlocal total
        if float(squares.max(initial=0.0)) > limit:
            factor = clip_factors(squares, clip_norm)
            if factor is not None:
                if start >= 0:
                    factors[start : start + rows.shape[0]] = factor
                total += factor @ rows
                return
        total += ones[: rows.shape[0]] @ rows

    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        for j in range(pairing.low_starts.shape[0]):
            low, high = int(pairing.low_starts[j]), int(pairing.high_starts[j])
            rows_a = data[low : low + size]
            rows_b = data[high : high + size]
            add(rows_a, row_squares_into(rows_a, raw_squares[low : low + size]), low)
            add(rows_b, row_squares_into(rows_b, raw_squares[high : high + size]), high)
            # The second block's rows in the bijection's order (in cache: a 256 KB block).
            np.take(rows_b, pairing.within[j], axis=0, out=matched, mode="clip")
            row_dots(rows_a, matched, out=dots[j * size : (j + 1) * size])
        first = 2 * pairing.low_starts.shape[0] * size
        rest = order[first:]
        if rest.size:
            # Fewer than 2B rows: gathered (their order is the pairing's).
            rows = np.take(data, rest, axis=0)
            squares = row_squares(rows)
            raw_squares[rest] = squares
            factor = clip_factors(squares, clip_norm)
            if factor is not None:
                factors[rest] = factor
                total += factor @ rows
            else:
                total += rows.sum(axis=0)
            pairs = rest.size // 2
            row_dots(rows[0 : 2 * pairs : 2], rows[1 : 2 * pairs : 2], out=dots[first // 2 :])
        if _safe_squares(raw_squares, clip_norm, raw_squares) is None:
            return gathered_probe_pass(data, clip_norm, order)
        # 2 ||p_j||^2 = f_a^2 s_a + f_b^2 s_b - 2 f_a f_b x_a.x_b (probe_pass's arithmetic).
        first_rows, second_rows = order[0 : 2 * m : 2], order[1 : 2 * m : 2]
        dots *= -2.0
        if bool(np.any(factors != 1.0)):
            f_a, f_b = factors[first_rows], factors[second_rows]
            dots *= f_a
            dots *= f_b
            for f, rows_of in ((f_a, first_rows), (f_b, second_rows)):
                term = raw_squares[rows_of]
                term *= f
                term *= f
                dots += term
            del f_a, f_b, term
        else:
            dots += raw_squares[first_rows]
            dots += raw_squares[second_rows]
        dots *= 0.5
        np.maximum(dots, 0.0, out=dots)
        np.sqrt(dots, out=dots)
    edges = probe_edges(clip_norm)
    counts_u = _count(np.sqrt(raw_squares), edges, clip_norm)
    counts_p = _count(dots, edges, clip_norm)
    return ProbePass(counts_u, counts_p, total, m, factors, dots, raw_squares)
