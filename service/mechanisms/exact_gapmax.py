"""M4 ``exact_gapmax``: GAP-MAX over the subspaces spanned by k-subsets of the data.

Singhal & Steinke, "Privately Learning Subspaces", NeurIPS 2021, Algorithm 1 (DPESE), with the
GAP-MAX analysis of Bun, Dwork, Rothblum & Steinke (2018); seeds 000/003 (Lemmas 2.14, 3.3-3.5).

Privacy: the score ``u(s) = |x in s| - max_{t strictly inside s} |x in t|`` has sensitivity 1, so
the gap ``max(0, u(s) - u(s2) - 1)`` has sensitivity 2 and is non-zero for at most one candidate
on either of two neighbouring datasets; adding ``TLap(2, eps, delta)`` to every gap is
``(eps, delta)``-DP. A subspace spanned on one side only has score ``<= 1 < u(NULL)``, so its gap
is 0; we release the winner only when its noisy gap exceeds the noise bound ``A`` (see below),
which no zero-gap candidate can reach. The sample of rows is public randomness (one replaced row
changes at most one sampled row). Cost: exactly ``(eps, delta)``.

Where this module makes choices the paper leaves open
------------------------------------------------------
* **Release rule.** Written literally, Algorithm 1 outputs the argmax of ``gap + xi`` over all
  candidates. When two candidates share the top score every gap is 0, the argmax is a uniform
  candidate, and candidates that exist on one side only (spanned using the replaced row) then
  have positive probability on one side and zero on the other: the proof of Lemma 3.3 assumes
  NULL always beats them, which fails once ``u(s2) >= u(NULL)``. We therefore release the
  argmax only if its noisy value exceeds ``A`` (the truncation bound of ``TLap``); zero-gap
  values are at most ``A``, so the release is a post-processing of the noisy gaps of the
  candidates common to both sides, and the argument above is exact. Only ``s1`` can pass, so the
  mechanism draws ``xi(s1)`` and never needs the maximum of the zero-valued candidates. In the
  regime of Lemma 3.5 this rule changes nothing.
* **Sample size.** ``n0 = sample_rows`` defaults to the largest ``n0 <= n`` with scoring work
  ``C(n0, k) * n0 * d <= MAX_SCORING_WORK`` (module constant, ``2e9``; at the cap one release
  on data in general position took 11 s for k = 2 and 36 s for k = 3, d = 10, on a loaded
  core), and the release is refused unless ``n0 >= n_min``, where ``n_min`` is the bound of
  Lemma 3.5, ``3l + 8 ln(1/delta)/eps + 2``, sharpened to the exact truncation bound:
  recovery needs ``n0 - 2l - u(NULL) - 1 > 2A``. Both are public.
* **Candidates and deduplication.** A k-subset is a candidate when its unit rows have numerical
  rank k (every ``|R_ii|`` of their QR above ``RANK_TOL``). Every candidate is the span of the
  sample points it contains, so two candidates are the same subspace exactly when they contain
  the same sample points: candidates are deduplicated by their membership sets.
* **Strict subspaces.** ``max_t |x in t|`` is taken over spans of ``(k-1)``-subsets of the
  points in ``s`` that have rank ``k-1`` (in exact arithmetic this is the supremum over all
  strict subspaces of ``s``: the points of any ``t`` extend, within ``s``, to such a span).
* **Floating point: a known limitation.** Membership is ``residual <= tol * ||x||`` (as
  ALGORITHMS.md prescribes). The sensitivity-1 argument holds for exact membership only: one
  replaced row lying within ``tol`` of the subspace but not exactly in it can span a
  near-duplicate candidate that holds most of the points, which erases the gap. Found by review
  and pinned by a strict-xfail test (``test_neighbours_within_the_tolerance_keep_the_release_
  probability``): on 40 exact points in a plane of R^4, moving one row by 8.9e-10 (< ``tol``)
  turns "released 20/20" into "released 0/20". So the (eps, delta) guarantee holds for data
  whose membership is exact, and is not proved against neighbours that differ within ``tol``.
  Making it sound needs exact membership (rational arithmetic) or a score with provable
  sensitivity under a tolerance; neither is done.
* **Basis and tolerance.** The released basis is computed from the member points, which may
  differ within ``tol`` depending on which points are members; rounding to 12 digits does not
  hide differences of order ``tol``.
* **Released basis.** Top-k right singular vectors of the member points, rotated by a
  Haar-random ``k x k`` orthogonal matrix and rounded to 12 significant digits, so that it
  depends on the subspace (up to ``tol`` and rounding) and not on which points span it.

Cost of scoring (vectorised: batched QR and batched matmuls, no Python loop per point):
``O(C(n0, k) * n0 * d * k)`` flops and ``O(C(n0, k) * n0 / 8)`` bytes for the membership sets,
plus ``O(sum_s C(|s|, k-1) * |s| * d * k)`` for the strict-subspace counts of the distinct
candidates (at most ``k`` times the first term). Measured in ``bench/bench_exact_gapmax.py``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from pydantic import Field

from service.mechanisms.base import (
    InvalidParameter,
    Mechanism,
    MechanismOutput,
    MechanismParams,
    PublicContext,
    ReleaseSpec,
)
from service.mechanisms.linalg import FloatArray, top_right_singular_vectors
from service.mechanisms.noise import (
    haar_orthogonal,
    truncated_laplace_params,
    truncated_laplace_ppf,
)

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Cap on the scoring work ``C(n0, k) * n0 * d`` (residual evaluations times dimension).
MAX_SCORING_WORK = 2_000_000_000
#: A k-subset of unit rows is a candidate when every ``|R_ii|`` of its QR exceeds this.
RANK_TOL = 1e-10
#: Default relative tolerance of membership: ``x in s`` iff ``||x - P_s x|| <= tol ||x||``.
DEFAULT_TOL = 1e-9
#: Significant digits kept in the released basis.
BASIS_DIGITS = 12
#: Floats held per batch of residual evaluations (32 MB).
BATCH_FLOATS = 4_000_000
#: ``1 - ||Q^T z||^2`` above ``tol^2 + SCREEN`` excludes ``z`` without an explicit residual.
SCREEN = 1e-12
#: Largest candidates whose k-subsets are skipped during enumeration.
SKIP_SETS = 64
#: Sensitivity of the gap ``max(0, u(s) - u(s2) - 1)``.
GAP_SENSITIVITY = 2.0


class ExactGapMaxParams(MechanismParams):
    """Params of ``exact_gapmax``."""

    robustness: int | None = Field(
        default=None,
        ge=0,
        description="l: the number of points allowed off the subspace (and in any strictly "
        "smaller subspace). Default k - 1 (points in general position inside the subspace).",
    )
    tol: float = Field(
        default=DEFAULT_TOL,
        ge=0,
        lt=1,
        allow_inf_nan=False,
        description="Relative tolerance of membership: x is in s when ||x - P_s x|| <= tol ||x||.",
    )
    sample_rows: int | None = Field(
        default=None,
        ge=1,
        description="n0: rows sampled uniformly without replacement and scored. Default: the "
        "largest n0 <= n whose scoring work C(n0, k) n0 d stays within the compute cap.",
    )


# ---------------------------------------------------------------------------------------------
# Public calibration


def null_score(robustness: int, epsilon: float, delta: float) -> float:
    """``u(NULL) = l + 4 ln(1/delta)/eps + 1``."""
    return robustness + 4.0 * math.log(1.0 / delta) / epsilon + 1.0


def noise_bound(epsilon: float, delta: float) -> float:
    """``A`` of ``TLap(2, eps, delta)``: ``(2/eps) ln(1 + (e^eps - 1)/(2 delta))``."""
    return truncated_laplace_params(GAP_SENSITIVITY, epsilon, delta)[1]


def min_sample_rows(robustness: int, epsilon: float, delta: float) -> int:
    """Smallest ``n0`` for which Algorithm 1 (with our release rule) recovers ``s*`` surely.

    The larger of Lemma 3.5's ``3l + 8 ln(1/delta)/eps + 2`` and the exact condition
    ``n0 - 2l - u(NULL) - 1 > 2A`` (``u(s*) >= n0 - 2l``, runner-up ``<= u(NULL)``).
    """
    lemma = 3 * robustness + 8.0 * math.log(1.0 / delta) / epsilon + 2.0
    exact = (
        2 * robustness
        + null_score(robustness, epsilon, delta)
        + 1.0
        + 2.0 * noise_bound(epsilon, delta)
    )
    return max(math.ceil(lemma), math.floor(exact) + 1)


def scoring_work(n0: int, k: int, d: int) -> int:
    """``C(n0, k) * n0 * d``: the quantity capped by :data:`MAX_SCORING_WORK`."""
    return math.comb(n0, k) * n0 * d


def default_sample_rows(n: int, k: int, d: int, cap: int = MAX_SCORING_WORK) -> int:
    """Largest ``n0 <= n`` with ``scoring_work(n0, k, d) <= cap`` (0 if even ``n0 = k`` fails)."""
    if scoring_work(n, k, d) <= cap:
        return n
    low, high = 0, n  # invariant: work(low) <= cap < work(high), work increasing in n0 >= k
    while high - low > 1:
        mid = (low + high) // 2
        if mid >= k and scoring_work(mid, k, d) > cap:
            high = mid
        else:
            low = mid
    return low if low >= k else 0


# ---------------------------------------------------------------------------------------------
# Scoring


def _batched_bases(points: FloatArray, rank: int) -> tuple[FloatArray, BoolArray]:
    """Orthonormal bases of ``(B, rank, d)`` point sets and whether each has full rank.

    Returns ``(B, d, rank)`` bases from batched QR and a ``(B,)`` mask: every ``|R_ii|``
    above :data:`RANK_TOL` (the rows are unit vectors, so this is a relative test).
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


def round_significant(values: FloatArray, digits: int = BASIS_DIGITS) -> FloatArray:
    """Round every entry to ``digits`` significant decimal digits (zeros stay zero)."""
    magnitude = np.floor(np.log10(np.where(values == 0, 1.0, np.abs(values))))
    scale = 10.0 ** (digits - 1 - magnitude)
    return np.asarray(np.round(values * scale) / scale, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# The mechanism


def exact_gapmax(
    data: FloatArray,
    k: int,
    epsilon: float,
    delta: float,
    robustness: int,
    tol: float,
    sample_rows: int,
    rng: np.random.Generator,
) -> tuple[FloatArray | None, dict[str, Any]]:
    """GAP-MAX over spans of k-subsets of ``sample_rows`` sampled rows (Algorithm 1).

    Parameters
    ----------
    data : (n, d) array
        The rows; may be a read-only memory map (only the sampled rows are read).
    k : int
        Dimension of the released subspace.
    epsilon, delta : float
        Privacy cost, ``epsilon > 0``, ``0 < delta < 1``.
    robustness : int
        ``l``, the number of points allowed outside the subspace.
    tol : float
        Relative membership tolerance.
    sample_rows : int
        ``n0 <= n``; public, resolved by ``prepare``.
    rng : numpy.random.Generator
        The release's generator (sample, noise and rotation).

    Returns
    -------
    basis : (d, k) array or None
        Rounded, Haar-rotated orthonormal basis of the winning subspace; ``None`` for NULL.
    info : dict
        Public facts about the run (``sample_rows``, ``null_score``, ``noise_bound``).
    """
    n = data.shape[0]
    sample = np.sort(rng.choice(n, size=sample_rows, replace=False))
    rows = np.asarray(data[sample], dtype=np.float64)
    norms = np.linalg.norm(rows, axis=1)
    unit_rows = rows[norms > 0] / norms[norms > 0, None]

    groups = candidate_sets(unit_rows, k, tol)
    members = [g for g in groups.values()]
    scores = np.concatenate(
        [
            np.full(g.shape[0], g.shape[1]) - strict_subspace_counts(unit_rows, g, k, tol)
            for g in members
        ]
        or [np.zeros(0, dtype=np.int64)]
    )

    u_null = null_score(robustness, epsilon, delta)
    lam, bound = truncated_laplace_params(GAP_SENSITIVITY, epsilon, delta)
    all_scores = np.concatenate([scores.astype(np.float64), [u_null]])
    order = np.argsort(all_scores, kind="stable")[::-1]
    first = int(order[0])
    second_score = float(all_scores[order[1]]) if all_scores.size > 1 else -math.inf
    gap = max(0.0, float(all_scores[first]) - second_score - 1.0)
    noisy_gap = gap + float(truncated_laplace_ppf(rng.random(), lam, bound))
    info: dict[str, Any] = {
        "sample_rows": sample_rows,
        "null_score": u_null,
        "noise_bound": bound,
    }
    if first == all_scores.size - 1 or noisy_gap <= bound:
        return None, info
    sizes = np.cumsum([0] + [g.shape[0] for g in members])
    which = int(np.searchsorted(sizes, first, side="right")) - 1
    winner = members[which][first - sizes[which]]
    subspace = top_right_singular_vectors(unit_rows[winner], k)
    rotated = subspace @ haar_orthogonal(k, rng)
    return round_significant(rotated), info


class ExactGapMax(Mechanism[ExactGapMaxParams]):
    name: ClassVar[str] = "exact_gapmax"
    title: ClassVar[str] = "GAP-MAX over spanned subspaces (exact case)"
    paper: ClassVar[str] = (
        "Singhal & Steinke, Privately Learning Subspaces, NeurIPS 2021, Algorithm 1"
    )
    summary: ClassVar[str] = (
        "For data lying exactly in a k-dimensional subspace, up to a few outliers: scores every "
        "subspace spanned by k sampled points and releases the best one through GAP-MAX with "
        "truncated Laplace noise. Recovers the subspace exactly once n >= 3l + 8 ln(1/delta)/eps "
        "+ 2; otherwise (or on data in general position) returns no result. No clipping. "
        "Limitation: the guarantee assumes exact membership; a neighbour within tol of the "
        "subspace is not covered (see docs/mechanisms.md)."
    )
    params_model: ClassVar[type[ExactGapMaxParams]] = ExactGapMaxParams

    def prepare(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: ExactGapMaxParams
    ) -> ExactGapMaxParams:
        self.check_common(ctx, k, epsilon, delta)
        n, d = ctx.n_rows, ctx.n_cols
        robustness = k - 1 if params.robustness is None else params.robustness
        needed = min_sample_rows(robustness, epsilon, delta)
        if params.sample_rows is not None:
            n0 = params.sample_rows
            if n0 > n:
                raise InvalidParameter(
                    "sample_rows", f"is {n0}, more than the dataset's {n} rows by {n0 - n}"
                )
            work = scoring_work(n0, k, d)
            if work > MAX_SCORING_WORK:
                raise InvalidParameter(
                    "sample_rows",
                    f"scoring C({n0}, {k}) * {n0} * {d} = {work:.3g} exceeds the compute cap "
                    f"{MAX_SCORING_WORK:.3g} by a factor {work / MAX_SCORING_WORK:.3g}; the "
                    f"largest affordable sample is {default_sample_rows(n, k, d)} rows",
                )
            if n0 < needed:
                raise InvalidParameter(
                    "sample_rows",
                    f"is {n0}, below the {needed} rows that Lemma 3.5 needs for l={robustness}, "
                    f"epsilon={epsilon:g}, delta={delta:g} (short by {needed - n0})",
                )
        else:
            if n < needed:
                raise InvalidParameter(
                    "n_rows",
                    f"the dataset has {n} rows, below the {needed} that Lemma 3.5 needs for "
                    f"l={robustness}, epsilon={epsilon:g}, delta={delta:g} (short by "
                    f"{needed - n}); raise epsilon or delta",
                )
            n0 = default_sample_rows(n, k, d)
            if n0 < needed:
                raise InvalidParameter(
                    "k",
                    f"the compute cap ({MAX_SCORING_WORK:.3g} = C(n0, k) n0 d) allows at most "
                    f"{n0} sampled rows for k={k}, d={d}, below the {needed} that Lemma 3.5 "
                    f"needs (short by {needed - n0}); lower k or raise epsilon or delta",
                )
        return params.model_copy(update={"robustness": robustness, "sample_rows": n0})

    def run(
        self, data: FloatArray, spec: ReleaseSpec[ExactGapMaxParams], rng: np.random.Generator
    ) -> MechanismOutput:
        params = spec.params
        assert params.robustness is not None and params.sample_rows is not None  # by prepare
        basis, info = exact_gapmax(
            data,
            spec.k,
            spec.epsilon,
            spec.delta,
            params.robustness,
            params.tol,
            params.sample_rows,
            rng,
        )
        if basis is None:
            return MechanismOutput.no_result(
                "no subspace won GAP-MAX: the data is not (up to robustness outliers) in one "
                "k-dimensional subspace, or too few points lie in it for this budget",
                **info,
            )
        return MechanismOutput(basis=basis, extras=info)
