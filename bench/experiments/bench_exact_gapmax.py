"""Exact ``exact_gapmax`` against the tolerance version it replaced (a benchmark, not a test).

The baseline is the former floating-point scoring (membership ``residual <= tol ||x||``, batched
QR and matmuls), kept verbatim below and run in the same process on the same data. Both sides
run the whole mechanism on ``n0`` sampled rows: scoring plus GAP-MAX. Cases: ``k`` in
{2, 3, 5}, ``d`` in {10, 50}; data exactly in a k-dim subspace with ``l = k - 1`` outliers
("exact", integer combinations so that membership is exact in doubles), and data in general
position ("general": every k-subset is scored, the worst case of both). The float version sees
the exact data as exact up to ``tol``; the exact version decides membership over the rationals.

Both sides run with one BLAS thread. Run: ``.venv/bin/python bench/experiments/bench_exact_gapmax.py
[--quick]``
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from typing import Any

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

from service.mechanisms.exact_gapmax import exact_gapmax, null_score, scoring_work
from service.mechanisms.linalg import FloatArray, top_right_singular_vectors
from service.mechanisms.noise import truncated_laplace_params, truncated_laplace_ppf

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# ---------------------------------------------------------------------------------------------
# Baseline: the tolerance version's scoring (service/mechanisms/exact_gapmax.py before issue 11)

RANK_TOL = 1e-10
TOL = 1e-9
BATCH_FLOATS = 4_000_000
SCREEN = 1e-12
SKIP_SETS = 64


def _batched_bases(points: FloatArray, rank: int) -> tuple[FloatArray, BoolArray]:
    """Orthonormal bases of ``(B, rank, d)`` point sets and whether each has full rank.

    Returns ``(B, d, rank)`` bases from batched QR and a ``(B,)`` mask: every ``|R_ii|``
    above ``RANK_TOL`` (the rows are unit vectors, so this is a relative test).
    """
    q, r = np.linalg.qr(points.transpose(0, 2, 1))
    diag = np.abs(np.diagonal(r, axis1=1, axis2=2))
    return np.asarray(q, dtype=np.float64), np.asarray(np.all(diag > RANK_TOL, axis=1))


def _inside(points: FloatArray, bases: FloatArray, tol: float) -> BoolArray:
    """Whether unit rows lie within ``tol`` of subspaces: ``||z - Q Q^T z|| <= tol``.

    ``points`` is ``(..., c, d)`` and ``bases`` ``(..., d, r)`` (broadcast against each other);
    returns ``(..., c)``. ``1 - ||Q^T z||^2`` is cheap (``O(c d r)`` per subspace) but cancels
    below ``~1e-7`` in the residual, so it only screens: entries it cannot exclude get the
    explicit residual ``z - Q Q^T z``, which is accurate to ``~1e-16``.
    """
    coords = np.matmul(points, bases)  # (..., c, r)
    cheap = 1.0 - np.einsum("...r,...r->...", coords, coords)
    inside = np.zeros(cheap.shape, dtype=bool)
    maybe = np.nonzero(cheap <= tol * tol + SCREEN)
    if maybe[0].size:
        shape = np.broadcast_shapes(points.shape[:-2], bases.shape[:-2])
        lead = maybe[:-1]
        pts = np.broadcast_to(points, (*shape, *points.shape[-2:]))
        bas = np.broadcast_to(bases, (*shape, *bases.shape[-2:]))
        z = pts[(*lead, maybe[-1])]  # (A, d)
        q = bas[lead]  # (A, d, r)
        residual = z - np.einsum("adr,ar->ad", q, coords[maybe])
        inside[maybe] = np.linalg.norm(residual, axis=1) <= tol
    return inside


def candidate_sets(unit_rows: FloatArray, k: int, tol: float) -> dict[int, IntArray]:
    """Member sets of the distinct candidate subspaces, grouped by size.

    Parameters
    ----------
    unit_rows : (n0, d) array
        The sampled non-zero rows, normalised to unit length.
    k : int
        Candidate dimension.
    tol : float
        Relative membership tolerance.

    Returns
    -------
    dict ``c -> (N_c, c) int array``
        Row ``j`` lists (sorted) the sample points in a distinct candidate with ``c`` members.
        Candidates are spans of rank-k k-subsets deduplicated as subspaces, i.e. by member set.
        A candidate with exactly ``k`` members is spanned by one subset only, so only larger
        ones need deduplicating; k-subsets inside the member set of one of the
        :data:`SKIP_SETS` largest candidates found so far span that same candidate and are
        skipped before scoring (on data in one subspace, all but the first batch are).
    """
    n0, _ = unit_rows.shape
    if n0 < k:
        return {}
    max_batch = max(1, BATCH_FLOATS // max(1, n0 * k))
    batch = 16  # grows geometrically: a large candidate found early skips most of what follows
    combos = itertools.combinations(range(n0), k)
    small: list[IntArray] = []
    large = np.zeros((0, n0), dtype=bool)
    while True:
        batch = min(2 * batch, max_batch)
        flat = np.fromiter(
            itertools.chain.from_iterable(itertools.islice(combos, batch)), dtype=np.int64
        )
        if flat.size == 0:
            break
        subsets = flat.reshape(-1, k)
        if large.shape[0]:
            biggest = large[np.argsort(large.sum(axis=1))[::-1][:SKIP_SETS]]
            covered = biggest[:, subsets].all(axis=2).any(axis=0)
            subsets = subsets[~covered]
        bases, full_rank = _batched_bases(unit_rows[subsets], k)
        subsets, bases = subsets[full_rank], bases[full_rank]
        if subsets.shape[0] == 0:
            continue
        member = _inside(unit_rows, bases, tol)  # (B, n0)
        member[np.arange(subsets.shape[0])[:, None], subsets] = True  # spanning points
        counts = member.sum(axis=1)
        small.append(subsets[counts == k])
        if (counts > k).any():
            large = np.unique(np.concatenate([large, member[counts > k]]), axis=0)
    groups: dict[int, IntArray] = {}
    if small and sum(s.shape[0] for s in small):
        groups[k] = np.concatenate(small, axis=0)
    sizes = large.sum(axis=1)
    for c in np.unique(sizes):
        rows = large[sizes == c]
        groups[int(c)] = np.nonzero(rows)[1].reshape(rows.shape[0], int(c)).astype(np.int64)
    return groups


def strict_subspace_counts(
    unit_rows: FloatArray, members: IntArray, k: int, tol: float
) -> IntArray:
    """``max_{t strictly inside s} |x in t|`` for candidates with ``c`` members each.

    The maximum is over spans of rank-(k-1) ``(k-1)``-subsets of the points of ``s``; points are
    counted among the members of ``s`` (a point of ``t`` is a point of ``s``: its residual to
    ``s`` is at most its residual to ``t``). One batched computation over all candidates and
    ``C(c, k-1)`` subsets, in chunks; cost ``O(N C(c, k-1) c d k)``.

    Parameters
    ----------
    unit_rows : (n0, d) array
    members : (N, c) int array
        Member indices of ``N`` candidates of equal size ``c``.

    Returns
    -------
    (N,) int array
    """
    n_cand, c = members.shape
    best = np.zeros(n_cand, dtype=np.int64)
    if k == 1 or n_cand == 0:
        return best  # t = {0} holds no non-zero point
    d = unit_rows.shape[1]
    pattern = np.array(list(itertools.combinations(range(c), k - 1)), dtype=np.int64)
    per_pattern = max(1, BATCH_FLOATS // max(1, c * d))
    for p0 in range(0, pattern.shape[0], per_pattern):
        pat = pattern[p0 : p0 + per_pattern]  # (p, k-1)
        group = max(1, BATCH_FLOATS // max(1, pat.shape[0] * c * d))
        for start in range(0, n_cand, group):
            mem = members[start : start + group]  # (g, c)
            g = mem.shape[0]
            bases, full_rank = _batched_bases(unit_rows[mem[:, pat].reshape(-1, k - 1)], k - 1)
            bases = bases.reshape(g, pat.shape[0], d, k - 1)
            inside = _inside(unit_rows[mem][:, None, :, :], bases, tol)  # (g, p, c)
            inside[:, np.arange(pat.shape[0])[:, None], pat] = True  # spanning points
            hits = inside.sum(axis=2) * full_rank.reshape(g, pat.shape[0])
            np.maximum.at(best, np.arange(start, start + g), hits.max(axis=1))
    return best


def float_gapmax(
    rows: FloatArray, k: int, epsilon: float, delta: float, robustness: int, rng: Any
) -> FloatArray | None:
    """The tolerance version's mechanism on already-sampled rows (no rounding of the basis)."""
    norms = np.linalg.norm(rows, axis=1)
    unit_rows = rows[norms > 0] / norms[norms > 0, None]
    groups = candidate_sets(unit_rows, k, TOL)
    members = list(groups.values())
    scores = np.concatenate(
        [
            np.full(g.shape[0], g.shape[1]) - strict_subspace_counts(unit_rows, g, k, TOL)
            for g in members
        ]
        or [np.zeros(0, dtype=np.int64)]
    )
    u_null = null_score(robustness, epsilon, delta)
    lam, bound = truncated_laplace_params(2.0, epsilon, delta)
    all_scores = np.concatenate([scores.astype(np.float64), [u_null]])
    order = np.argsort(all_scores, kind="stable")[::-1]
    first = int(order[0])
    second = float(all_scores[order[1]]) if all_scores.size > 1 else -math.inf
    gap = max(0.0, float(all_scores[first]) - second - 1.0)
    if (
        first == all_scores.size - 1
        or gap + float(truncated_laplace_ppf(rng.random(), lam, bound)) <= bound
    ):
        return None
    sizes = np.cumsum([0] + [g.shape[0] for g in members])
    which = int(np.searchsorted(sizes, first, side="right")) - 1
    return top_right_singular_vectors(unit_rows[members[which][first - sizes[which]]], k)


# ---------------------------------------------------------------------------------------------


def exact_data(n0: int, d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    spanning = rng.integers(-5, 6, size=(k, d)).astype(np.float64)
    rows = rng.integers(-(2**20), 2**20, size=(n0, k)).astype(np.float64) @ spanning
    rows[: k - 1] = rng.integers(-(2**20), 2**20, size=(k - 1, d))  # l = k - 1 outliers
    return rows


def best_of(repeats: int, run: Any, budget: float = 10.0) -> tuple[float, Any]:
    """Fastest of up to ``repeats`` runs, stopping once ``budget`` seconds are spent."""
    times: list[float] = []
    out = None
    while len(times) < repeats and sum(times) < budget:
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one repeat, smaller samples")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3
    # n0 per k: near the compute cap at d = 10 (smaller with --quick), equal across d;
    # epsilon is set so that n0 clears Lemma 3.5's bound.
    sizes = (
        {2: (400, 1.0), 3: (150, 2.0), 5: (40, 8.0)}
        if not args.quick
        else {
            2: (200, 1.0),
            3: (80, 4.0),
            5: (30, 16.0),
        }
    )
    delta = 1e-6
    print(
        f"{'data':>8} {'k':>2} {'d':>3} {'n0':>4} {'C(n0,k)n0d':>10} "
        f"{'float s':>8} {'exact s':>8} {'exact/float':>11} {'same outcome':>12}"
    )
    rng = np.random.default_rng(0)
    # One BLAS thread for both sides: comparable, and stable on a shared machine.
    with threadpool_limits(1):
        run_cases(sizes, repeats, delta, rng)


def run_cases(
    sizes: dict[int, tuple[int, float]], repeats: int, delta: float, rng: np.random.Generator
) -> None:
    for k, (n0, epsilon) in sizes.items():
        for d in (10, 50):
            for case in ("exact", "general"):
                data = (
                    exact_data(n0, d, k, rng) if case == "exact" else rng.standard_normal((n0, d))
                )
                t_float, out_float = best_of(
                    repeats,
                    lambda data=data, k=k, epsilon=epsilon: float_gapmax(
                        data, k, epsilon, delta, k - 1, np.random.default_rng(1)
                    ),
                )
                t_exact, out_exact = best_of(
                    repeats,
                    lambda data=data, k=k, n0=n0, epsilon=epsilon: exact_gapmax(
                        data, k, epsilon, delta, k - 1, n0, np.random.default_rng(1)
                    )[0],
                )
                same = (out_float is None) == (out_exact is None)
                print(
                    f"{case:>8} {k:>2} {d:>3} {n0:>4} {scoring_work(n0, k, d):>10.2e} "
                    f"{t_float:>8.3f} {t_exact:>8.3f} {t_exact / t_float:>11.2f} {same!s:>12}"
                )


if __name__ == "__main__":
    main()
