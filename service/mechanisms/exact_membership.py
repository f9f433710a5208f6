"""Exact membership for M4 ``exact_gapmax``: primitive integer directions, exact rank and
membership over the rationals, and the modular filter that decides most of them first.

Singhal & Steinke, "Privately Learning Subspaces", NeurIPS 2021, Algorithm 1 (DPESE): the
score counts the points *in* a subspace, and its sensitivity of 1 holds only if membership is
exact. This module decides it exactly; ``exact_gapmax`` scores and releases.

Privacy argument (what ``exact_gapmax`` relies on): every decision here is exact rational
membership or rank of the doubles as stored (no tolerance, so no data-dependent rounding
decides a count); the prime ``p`` and the mixing matrix ``G`` of the filter are public
randomness drawn from the release's generator before the data is read, and the filter only
ever rejects non-members with certainty (no false negatives) while its acceptances are
confirmed exactly, so the counts, hence the scores, are those of exact membership whatever
``p`` and ``G`` are. Nothing here draws noise or releases anything.

A double is an odd integer times a power of two, so a row is, up to a positive scale (which
changes no span), an integer vector; dividing by the gcd of its entries and fixing the sign of
its first non-zero entry gives its *primitive direction*, identical for two rows exactly when
they are parallel. Entries are at most ``2^53 * 2^(971 + 1074)``: at most
:data:`MAX_ENTRY_BITS` bits, whatever the data (the exponent range of doubles is public). Only
all-zero rows are dropped; parallel rows are merged into one direction with a weight (their
count), which changes no span and no count.

Rank and membership are decided over the rationals. A modular filter decides most of them with
certainty first; :mod:`flint` (``fmpz_mat.rank``/``rref``) confirms the rest:

* A prime ``p`` (random in ``[P/2, P)``, ``P = sqrt(2^52/(k+1))`` so that a mod-p dot product of
  length ``k+1`` is exact in float64) and a mixing matrix ``G`` (``d x (k+1)``, uniform mod p)
  are drawn from the release's generator before the data is read: public randomness.
* For a k-subset ``S`` (a ``k x d`` integer matrix) let ``Y_S = S G mod p``. If ``Y_S`` has rank
  ``k`` over ``F_p`` (its leading ``k x k`` block is invertible), then (i) ``S`` has rank ``k``
  over ``Q`` (rank can only drop mod p and under ``G``), and (ii) for every point ``x``,
  ``x in span_Q(S)`` implies ``x G in span_p(Y_S)``: by Cramer's rule on a ``k x k`` minor of
  ``S`` that is non-zero mod p, ``x = sum_i c_i s_i`` with coefficients whose denominators are
  invertible mod p, and the relation survives reduction and the linear map ``G``. So a point the
  filter rejects is certainly not a member (**no false negatives**); it is tested as
  ``(x G) . v == 0 mod p`` with ``v`` the null vector of ``Y_S``. A point it accepts may be a
  false positive (``p`` divides every ``(k+1)``-minor of ``[S; x]``, or ``G`` is unlucky):
  acceptance is confirmed exactly.
* If ``Y_S`` is singular mod p, nothing is concluded: the rank of ``S`` is computed exactly (for
  all undecided subsets of a batch at once when their union has rank ``< k``).
* Only candidates whose weight can beat ``u(NULL)`` matter (``exact_gapmax``), and the
  filter's weight is an upper bound on the exact one; those it cannot exclude are confirmed by
  one exact rank of their accepted points (``rank == k``: all are members). False positives
  only cost time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from flint import fmpz, fmpz_mat

from service.mechanisms.linalg import FloatArray

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
IntRows = list[list[int]]

#: Largest bit length of an entry of a row scaled to integers: a 53-bit mantissa shifted by at
#: most ``971 + 1074`` (largest minus smallest binary exponent of a non-zero double).
MAX_ENTRY_BITS = 53 + 971 + 1074
#: Filter entries (points x subsets) per batch.
BATCH_ENTRIES = 1_000_000


def prime_bound(k: int) -> int:
    """``P`` with ``(k + 1) (P - 1)^2 < 2^52``: mod-p dot products of length ``k + 1`` are exact
    in float64 (so the filter runs as one BLAS product), and so is ``p * rint(x / p)``."""
    return math.isqrt((2**52 - 1) // (k + 1))


def random_prime(rng: np.random.Generator, bound: int) -> int:
    """A prime in ``[bound/2, bound)``: the first one at or after a uniform start (cyclically)."""
    low = bound // 2
    candidate = int(rng.integers(low, bound))
    while not fmpz(candidate).is_prime():
        candidate = candidate + 1 if candidate + 1 < bound else low
    return candidate


# ---------------------------------------------------------------------------------------------
# Exact integer rows


@dataclass(frozen=True)
class Directions:
    """The distinct primitive directions of the sampled non-zero rows.

    ``ints[i]`` is direction ``i`` as a primitive integer vector (``d`` Python ints of at most
    :data:`MAX_ENTRY_BITS` bits, first non-zero entry positive) and ``weights[i]`` the number of
    sampled rows parallel to it.
    """

    ints: IntRows
    weights: IntArray

    @property
    def count(self) -> int:
        return len(self.ints)


def primitive_directions(rows: FloatArray) -> Directions:
    """Exact primitive integer directions of the non-zero rows of ``rows`` (``(n0, d)``).

    ``x = M 2^e`` entrywise with ``M`` an odd (or zero) integer below ``2^53``; scaling a row by
    ``2^-min(e)`` makes it integral without changing its span.
    """
    mantissa, exponent = np.frexp(rows)
    ints = (mantissa * 2.0**53).astype(np.int64)  # exact: |mantissa| < 1 has 53 bits
    exps = exponent.astype(np.int64) - 53
    nonzero = ints != 0
    lowest = np.where(nonzero, ints & -ints, 1)  # lowest set bit, a power of two
    shift = np.frexp(lowest.astype(np.float64))[1].astype(np.int64) - 1
    ints = np.where(nonzero, ints >> shift, 0)
    exps = np.where(nonzero, exps + shift, np.iinfo(np.int64).max)
    keep = nonzero.any(axis=1)
    ints, exps = ints[keep], exps[keep]
    exps = np.where(ints != 0, exps - exps.min(axis=1, keepdims=True), 0)
    index: dict[tuple[int, ...], int] = {}
    out: IntRows = []
    weights: list[int] = []
    for mant_row, exp_row in zip(ints.tolist(), exps.tolist(), strict=True):
        row = [m << e for m, e in zip(mant_row, exp_row, strict=True)]
        g = math.gcd(*row)
        sign = -1 if next(v for v in row if v) < 0 else 1
        row = [v // g * sign for v in row] if g != 1 or sign < 0 else row
        key = tuple(row)
        at = index.get(key)
        if at is None:
            index[key] = len(out)
            out.append(row)
            weights.append(1)
        else:
            weights[at] += 1
    return Directions(out, np.asarray(weights, dtype=np.int64))


def reduce_mod(ints: IntRows, p: int) -> IntArray:
    """``(m, d)`` residues of the integer rows modulo ``p`` (no row of a primitive direction is
    zero mod p: its entries are coprime)."""
    return np.array([[v % p for v in row] for row in ints], dtype=np.int64).reshape(len(ints), -1)


def mix_mod(residues: IntArray, mixing: IntArray, p: int) -> IntArray:
    """``residues @ mixing mod p`` in int64, summing at most ``2^63 / p^2`` products at a time."""
    chunk = max(1, (2**63 - 1) // (p - 1) ** 2 - 1)
    out = np.zeros((residues.shape[0], mixing.shape[1]), dtype=np.int64)
    for start in range(0, residues.shape[1], chunk):
        part = residues[:, start : start + chunk] @ mixing[start : start + chunk]
        out = (out + part % p) % p
    return out


def exact_rank(ints: IntRows, index: IntArray | list[int]) -> int:
    """Rank over ``Q`` of the rows ``index`` (flint's fraction-free elimination)."""
    return int(fmpz_mat([ints[i] for i in index]).rank())


def exact_members(ints: IntRows, spanning: IntArray, among: IntArray) -> IntArray:
    """Those of ``among`` in ``span_Q(spanning)`` (rank ``len(spanning)``), decided exactly.

    The reduced echelon form ``R / den`` (pivots ``piv``) gives ``x in span`` iff
    ``den x = x[piv] R``; the slow path, used only where the filter or the union shortcut
    cannot decide.
    """
    rref, den, _ = fmpz_mat([ints[i] for i in spanning]).rref()
    pivots = pivot_columns(rref)
    points = fmpz_mat([ints[i] for i in among])
    lhs = points * den
    rhs = fmpz_mat([[ints[i][c] for c in pivots] for i in among]) * rref
    diff = (lhs - rhs).tolist()
    return np.asarray(
        [i for i, row in zip(among.tolist(), diff, strict=True) if not any(row)], dtype=np.int64
    )


def pivot_columns(rref: fmpz_mat) -> list[int]:
    """The pivot column of each row of a (full-rank) reduced echelon form."""
    return [next(c for c, v in enumerate(row) if v) for row in rref.tolist()]


# ---------------------------------------------------------------------------------------------
# The modular filter


def null_vectors(blocks: IntArray, p: int) -> tuple[BoolArray, IntArray]:
    """Null vectors of ``(B, j, j+1)`` matrices over ``F_p`` with an invertible leading block.

    Division-free Gauss-Jordan elimination without pivoting (``row_r <- a_cc row_r - a_rc
    row_c``: each step multiplies a row by a non-zero scalar, so the null space is unchanged)
    turns ``[M | m]`` into ``[D | w]`` with ``D`` diagonal; then ``v_i = -w_i prod_{l != i} d_l``,
    ``v_j = prod_l d_l`` spans the null space. Returns ``ok`` (``(B,)``: every pivot non-zero,
    i.e. rank ``j`` with ``M`` invertible) and ``v`` (``(B, j+1)``; meaningful where ``ok``).
    Products stay below ``p^2 < 2^52``.
    """
    a = blocks % p
    n_batch, j, _ = a.shape
    ok = np.ones(n_batch, dtype=bool)
    for c in range(j):
        pivot = a[:, c, c, None]
        ok &= pivot[:, 0] != 0
        for r in range(j):
            if r != c:
                a[:, r, :] = (pivot * a[:, r, :] - a[:, r, c, None] * a[:, c, :]) % p
    diagonal = np.diagonal(a, axis1=1, axis2=2)  # (B, j)
    before = np.ones((n_batch, j + 1), dtype=np.int64)  # prod_{l < i} d_l
    after = np.ones((n_batch, j + 1), dtype=np.int64)  # prod_{l >= i} d_l
    for i in range(j):
        before[:, i + 1] = before[:, i] * diagonal[:, i] % p
        after[:, j - 1 - i] = after[:, j - i] * diagonal[:, j - 1 - i] % p
    v = np.empty((n_batch, j + 1), dtype=np.int64)
    v[:, :j] = (p - a[:, :, j]) % p * (before[:, :j] * after[:, 1:] % p) % p
    v[:, j] = before[:, j]
    return ok, v


def filter_hits(mixed: FloatArray, vectors: IntArray, p: int) -> BoolArray:
    """``(B, m)``: point ``x`` passes for subset ``b`` iff ``(x G) . v_b == 0 mod p``.

    One float64 product: entries are below ``p`` and ``(j + 1) p^2 < 2^52``, so it is exact, and
    ``x = p rint(x / p)`` holds exactly when ``p | x`` (a multiple divides exactly; otherwise
    ``p r < 2^53`` is exact and differs from ``x``). In place: one temporary of ``B m`` floats.
    """
    products = vectors.astype(np.float64) @ mixed.T
    rounded = np.divide(products, p)
    np.rint(rounded, out=rounded)
    rounded *= p
    return np.asarray(np.equal(products, rounded))


def batch_size(m: int, k: int) -> int:
    """Subsets per batch: at most :data:`BATCH_ENTRIES` filter entries."""
    return max(1, BATCH_ENTRIES // max(1, m, k + 1))


def decide_singular(ints: IntRows, subsets: IntArray, rank: int) -> IntArray:
    """Of subsets that are singular mod p, those of exact rank ``rank`` (usually none).

    If the union of all of them has rank ``< rank`` every one is rank-deficient (one exact
    rank); otherwise each is checked.
    """
    if subsets.shape[0] == 0:
        return subsets
    union = np.unique(subsets)
    if union.size < rank or exact_rank(ints, union) < rank:
        return subsets[:0]
    full = [exact_rank(ints, s) == rank for s in subsets]
    return np.asarray(subsets[np.asarray(full, dtype=bool)], dtype=np.int64)


def confirmed_members(ints: IntRows, spanning: IntArray, accepted: IntArray, rank: int) -> IntArray:
    """The exact members among ``accepted`` (a superset of them, containing ``spanning``).

    One exact rank of the accepted points: if it is ``rank``, they all lie in the span.
    """
    if accepted.size == rank or exact_rank(ints, accepted) == rank:
        return accepted
    return exact_members(ints, spanning, accepted)
