"""M4 ``exact_gapmax``: GAP-MAX over the subspaces spanned by k-subsets of the data, in exact
arithmetic.

Singhal & Steinke, "Privately Learning Subspaces", NeurIPS 2021, Algorithm 1 (DPESE), with the
GAP-MAX analysis of Bun, Dwork, Rothblum & Steinke (2018); seeds 000/003 (Lemmas 2.14, 3.3-3.5).

Privacy: with exact membership the score ``u(s) = |x in s| - max_{t strictly inside s} |x in t|``
has sensitivity 1, so the gap ``max(0, u(s) - u(s2) - 1)`` has sensitivity 2 and is non-zero for
at most one candidate on either of two neighbouring datasets; ``TLap(2, eps, delta)`` on the gap
is ``(eps, delta)``-DP. A subspace spanned on one side only has score ``<= 1 < u(NULL)``, so its
gap is 0, and we release only a noisy gap above the noise bound ``A``, which no zero gap reaches.
The released basis is a function of the chosen subspace and public randomness only. The row
sample is public randomness (one replaced row changes at most one sampled row). Cost ``(eps,
delta)``. **Assumption**: membership is exact rational membership of the doubles as stored;
floating point enters only after the choice, to turn the exact basis into doubles.

Profile under the accountings (ALGORITHMS.md, "Accounting across releases"): ``delta``-
approximately ``(eps^2/2)``-zCDP (Bun & Steinke 2016, Definition 8.1 and Proposition 1.4).
Fix the public row sample and a neighbouring pair ``x, x'``; let ``s*`` be the one candidate
with a positive gap on either side, ``g, g'`` its gaps (``|g - g'| <= 2 = D``; 0 where it has
none), and ``y = g + xi`` the noisy gap (``xi ~ TLap`` on ``[-A, A]``, density proportional to
``exp(-|z|/lam)``, ``lam = D/eps``). The output (``s*`` iff ``y > A``, else no result) is a
function of ``y`` and public facts. **The event** is ``y in I = [max(g, g') - A, min(g, g') + A]``,
the intersection of the two supports: one set of outputs that serves both neighbours. Outside
it lies a band of width ``|g - g'| <= D`` at one end of each side's support, of mass at most
``e^{-A/lam} (e^eps - 1) / (2 (1 - e^{-A/lam}))``, which is exactly ``delta`` at
``A = lam ln(1 + (e^eps - 1)/(2 delta))``
(:func:`service.mechanisms.noise.truncated_laplace_params`; tested). The two bands have
equal mass (the noise is symmetric), so conditioned on ``I`` both sides are Laplace
densities on ``I`` with the same normaliser, whose ratio is at most
``e^{|g - g'|/lam} <= e^eps``: pure ``eps``-DP both ways, hence ``eps^2/2`` in every Renyi
divergence, and post-processing keeps it. Declared as one ``ApproximateStep(eps, delta)``. The
``gaussian`` accounting refuses the mechanism (not a Gaussian step; no fully adaptive theorem
for mixing is cited).

Exact membership
----------------
Rows become primitive integer directions, and rank and membership are decided over the
rationals, a modular filter first and :mod:`flint` to confirm, in
:mod:`~service.mechanisms.exact_membership` (its docstring states how, and why no count is
approximate; its names are re-exported here).


Where this module makes choices the paper leaves open
-------------------------------------------------------
* **Release rule.** Written literally, Algorithm 1 outputs the argmax of ``gap + xi`` over all
  candidates. When two candidates share the top score every gap is 0, the argmax is a uniform
  candidate, and candidates that exist on one side only (spanned using the replaced row) then
  have positive probability on one side and zero on the other. We release the argmax only if
  its noisy value exceeds ``A`` (the truncation bound of ``TLap``); zero-gap values are at most
  ``A``, so the release is a post-processing of the noisy gap of the one candidate that can have
  a positive gap, and only ``xi(s1)`` is drawn. In the regime of Lemma 3.5 this changes nothing.
* **Only competitive candidates are scored exactly.** ``u(s) <= w(s) - (k - 1)`` (the ``k - 1``
  spanning points of a strict subspace are in it; ``u = w`` for ``k = 1``), and the outcome
  depends only on candidates with ``u > u(NULL)``: the winner and the runner-up score
  ``max(u(s2), u(NULL))``. Candidates of weight ``<= u(NULL) + k - 1`` are skipped without
  changing the output distribution.
* **Sample size.** ``n0 = sample_rows`` defaults to the largest ``n0 <= n`` with
  ``C(n0, k) * n0 * d <= MAX_SCORING_WORK``; the release is refused unless ``n0 >= n_min``
  (Lemma 3.5, sharpened to the exact truncation bound: ``n0 - 2l - u(NULL) - 1 > 2A``).
* **Strict subspaces.** ``max_t |x in t|`` is over spans of rank-``(k-1)`` ``(k-1)``-subsets of
  the members of ``s`` (in exact arithmetic the supremum over all strict subspaces).
* **Released basis.** The exact reduced row-echelon form of the winning subspace (canonical: it
  depends on the subspace, not on the points that span it), each row scaled by a power of two
  and rounded to doubles, orthonormalised by QR, rotated by a Haar-random ``k x k`` orthogonal
  matrix. (An SVD of the member rows is not a function of the subspace: its rounding reveals
  the members.) For a subspace whose echelon entries span more than the double range, rounding
  can lose accuracy; the output is still a function of the subspace only.

Cost (public bounds). Memory: :meth:`ExactGapMax.memory_bytes`, a function of ``n0``, ``d``,
``k``: the sample, its integer rows (``<= MAX_ENTRY_BITS`` bits per entry), batches of at most
:data:`BATCH_ENTRIES` filter entries and :data:`SKIP_SETS` + 2 member sets; nothing grows with
the number of candidates. Time: ``O(C(n0, k) (n0 + k^3))`` word operations for the filter; exact
work is one rank per competitive candidate (``|s| x d`` entries of ``<= 2098`` bits; for
``k >= 3`` its ``C(|s|, k-1)`` strict subsets also go through the filter) plus, in the worst
case (every k-subset singular mod p, e.g. points spread over several (k-1)-dim subspaces, so
that no union of a batch has rank below k), one exact ``k x d`` rank per k-subset. Figures:
``bench/experiments/bench_exact_gapmax.py`` (removed; in git history at commit ad45863) and
docs/mechanisms.md.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from flint import fmpz_mat
from pydantic import Field

from api_schemas.common import format_budget
from service.mechanisms.base import (
    ApproximateStep,
    InvalidParameter,
    Mechanism,
    MechanismOutput,
    MechanismParams,
    Preview,
    PrivacyStep,
    PublicContext,
    ReleaseSpec,
)

# The exact-membership part's names, re-exported for the tests and callers that import them
# from here (one statement: isort would split every ``name as name`` into its own statement).
# isort: off
from service.mechanisms.exact_membership import (
    BATCH_ENTRIES as BATCH_ENTRIES,
    MAX_ENTRY_BITS as MAX_ENTRY_BITS,
    Directions as Directions,
    batch_size as batch_size,
    confirmed_members as confirmed_members,
    decide_singular as decide_singular,
    exact_members as exact_members,
    exact_rank as exact_rank,
    filter_hits as filter_hits,
    mix_mod as mix_mod,
    null_vectors as null_vectors,
    pivot_columns as pivot_columns,
    prime_bound as prime_bound,
    primitive_directions as primitive_directions,
    random_prime as random_prime,
    reduce_mod as reduce_mod,
)

# isort: on
from service.mechanisms.linalg import FloatArray
from service.mechanisms.noise import (
    haar_orthogonal,
    truncated_laplace_params,
    truncated_laplace_ppf,
)

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
IntRows = list[list[int]]

#: Cap on the scoring work ``C(n0, k) * n0 * d`` (membership tests times dimension).
MAX_SCORING_WORK = 2_000_000_000
#: Largest confirmed member sets kept to skip the k-subsets they contain (besides the top two).
SKIP_SETS = 64
#: Sensitivity of the gap ``max(0, u(s) - u(s2) - 1)``.
GAP_SENSITIVITY = 2.0


class ExactGapMaxParams(MechanismParams):
    """Params of ``exact_gapmax`` (membership is exact: there is no tolerance)."""

    robustness: int | None = Field(
        default=None,
        ge=0,
        description="l: the number of points allowed off the subspace (and in any strictly "
        "smaller subspace). Default k - 1 (points in general position inside the subspace).",
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


def strict_count(dirs: Directions, members: IntArray, k: int, mixed: IntArray, p: int) -> int:
    """``max_{t strictly inside s} |x in t|`` for a confirmed candidate ``s`` with ``members``.

    ``t`` ranges over spans of rank-``(k-1)`` ``(k-1)``-subsets of the members, whose points are
    members of ``s``. For ``k = 2`` the lines are the member directions themselves. Otherwise
    the filter (``mixed``: ``(m, k)`` residues of ``X H``) gives upper bounds on each ``t``'s
    weight, and flats are confirmed exactly, heaviest first, until none can beat the best.
    """
    weights = dirs.weights
    if k == 1:
        return 0  # t = {0} holds no non-zero point
    if k == 2:
        return int(weights[members].max())
    local = mixed[members].astype(np.float64)
    local_w = weights[members]
    best = 0
    combos = itertools.combinations(range(members.size), k - 1)
    size = batch_size(members.size, k - 1)
    while True:
        flat = np.fromiter(
            itertools.chain.from_iterable(itertools.islice(combos, size)), dtype=np.int64
        )
        if flat.size == 0:
            return best
        subsets = flat.reshape(-1, k - 1)
        ok, vectors = null_vectors(mixed[members[subsets]], p)
        for s in decide_singular(dirs.ints, members[subsets[~ok]], k - 1):
            inside = exact_members(dirs.ints, s, members)
            best = max(best, int(weights[inside].sum()))
        subsets, vectors = subsets[ok], vectors[ok]
        if subsets.shape[0] == 0:
            continue
        hits = filter_hits(local, vectors, p)
        upper = hits.astype(np.int64) @ local_w
        for b in np.argsort(upper, kind="stable")[::-1]:
            if upper[b] <= best:
                break
            accepted = members[np.nonzero(hits[b])[0]]
            inside = confirmed_members(dirs.ints, members[subsets[b]], accepted, k - 1)
            best = max(best, int(weights[inside].sum()))


@dataclass
class Leaders:
    """The two best competitive candidates seen so far and the member sets used for skipping.

    Scores only increase and replacements are strict, so a candidate met again after it left
    the top two can change neither the top two's scores nor the winner (it scores at most the
    runner-up); a candidate in the top two is never met again (its member set is kept, and every
    k-subset inside it is skipped).
    """

    m: int
    first: tuple[int, IntArray, IntArray] | None = None  # (score, members, spanning subset)
    second: int | None = None
    second_members: IntArray | None = None
    skip: list[IntArray] = field(default_factory=list)

    def known(self, members: IntArray) -> bool:
        for other in self._kept():
            if other.size == members.size and np.array_equal(other, members):
                return True
        return False

    def offer(self, score: int, members: IntArray, spanning: IntArray) -> None:
        if self.first is None or score > self.first[0]:
            if self.first is not None:
                self.second, self.second_members = self.first[0], self.first[1]
            self.first = (score, members, spanning)
        elif self.second is None or score > self.second:
            self.second, self.second_members = score, members
        self.skip.append(members)
        self.skip.sort(key=lambda s: -s.size)
        del self.skip[SKIP_SETS:]

    def _kept(self) -> list[IntArray]:
        kept = list(self.skip)
        if self.first is not None:
            kept.append(self.first[1])
        if self.second_members is not None:
            kept.append(self.second_members)
        return kept

    def covered(self, subsets: IntArray) -> BoolArray:
        """``(B,)``: the subset lies inside a kept member set (it spans that candidate or less)."""
        covered = np.zeros(subsets.shape[0], dtype=bool)
        for members in self._kept():
            mask = np.zeros(self.m, dtype=bool)
            mask[members] = True
            covered |= mask[subsets].all(axis=1)
        return covered


def competitive_candidates(
    dirs: Directions,
    k: int,
    threshold: float,
    p: int,
    mixing: IntArray,
    strict_mixing: IntArray,
) -> Leaders:
    """Exact scores of the candidates of weight ``> threshold`` (``u(NULL) + k - 1``); the top
    two are returned.

    Parameters
    ----------
    dirs : Directions
        ``m`` distinct directions with weights.
    k : int
        Candidate dimension.
    threshold : float
        Candidates of exact weight at most this cannot beat ``u(NULL)``.
    p : int
        The public prime.
    mixing : (d, k + 1) int array
        Public mixing for k-subsets; ``strict_mixing`` ``(d, k)`` for strict subspaces.
    """
    m = dirs.count
    leaders = Leaders(m)
    if m < k:
        return leaders
    residues = reduce_mod(dirs.ints, p)
    mixed = mix_mod(residues, mixing, p)
    strict_mixed = mix_mod(residues, strict_mixing, p) if k >= 3 else mixed
    del residues
    mixed_f = mixed.astype(np.float64)
    weights = dirs.weights
    weights_f, heaviest = weights.astype(np.float64), int(weights.max(initial=0))

    def score(members: IntArray, spanning: IntArray) -> None:
        total = int(weights[members].sum())
        if total <= threshold or leaders.known(members):
            return
        leaders.offer(total - strict_count(dirs, members, k, strict_mixed, p), members, spanning)

    if k == 1:  # every direction is its own line, and a line's only strict subspace is {0}
        for i in np.nonzero(weights > threshold)[0]:
            score(np.array([i]), np.array([i]))
        return leaders
    combos = itertools.combinations(range(m), k)
    size, largest = 16, batch_size(m, k)  # grows: a candidate found early skips what follows
    while True:
        size = min(2 * size, largest)
        flat = np.fromiter(
            itertools.chain.from_iterable(itertools.islice(combos, size)), dtype=np.int64
        )
        if flat.size == 0:
            return leaders
        subsets = flat.reshape(-1, k)
        subsets = subsets[~leaders.covered(subsets)]
        ok, vectors = null_vectors(mixed[subsets], p)
        for s in decide_singular(dirs.ints, subsets[~ok], k):
            score(exact_members(dirs.ints, s, np.arange(m)), s)
        subsets, vectors = subsets[ok], vectors[ok]
        if subsets.shape[0] == 0:
            continue
        hits = filter_hits(mixed_f, vectors, p)
        # count * max weight bounds the weight: only rows it cannot exclude are summed.
        maybe = np.nonzero(np.count_nonzero(hits, axis=1) * heaviest > threshold)[0]
        upper = hits[maybe].astype(np.float64) @ weights_f
        competitive = maybe[upper > threshold]
        hits = hits[competitive]
        subsets = subsets[competitive]
        # Confirm one competitive subset at a time; every subset inside its exact member set
        # spans the same candidate (rank k is certain), the others wait for their turn.
        pending = np.ones(subsets.shape[0], dtype=bool)
        while pending.any():
            b = int(np.argmax(pending))
            members = confirmed_members(dirs.ints, subsets[b], np.nonzero(hits[b])[0], k)
            score(members, subsets[b])
            inside = np.zeros(m, dtype=bool)
            inside[members] = True
            pending &= ~inside[subsets].all(axis=1)
            pending[b] = False


# ---------------------------------------------------------------------------------------------
# The released basis


def echelon_basis(ints: IntRows, spanning: IntArray) -> FloatArray:
    """An orthonormal ``(d, k)`` basis of ``span_Q(spanning)`` that depends on the span only.

    The exact reduced row-echelon form is canonical for the subspace; each of its rows is scaled
    by a power of two (so that its largest entry is about 1) and rounded to doubles (correctly
    rounded integer division; entries far below the largest may underflow to 0), then the rows
    are orthonormalised by a Householder QR. Always finite, and no fallback is needed: a QR of
    finite, power-of-two-scaled rows does not fail.
    """
    rref, den, _ = fmpz_mat([ints[i] for i in spanning]).rref()
    denominator = int(den)
    rows = []
    for row in rref.tolist():
        entries = [int(v) for v in row]
        top = max(abs(v).bit_length() for v in entries) - denominator.bit_length()
        num_scale, den_scale = (1 << -top, 1) if top < 0 else (1, 1 << top)
        rows.append([v * num_scale / (denominator * den_scale) for v in entries])
    q, _ = np.linalg.qr(np.asarray(rows, dtype=np.float64).T)
    return np.asarray(q, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# The mechanism


def exact_gapmax(
    data: FloatArray,
    k: int,
    epsilon: float,
    delta: float,
    robustness: int,
    sample_rows: int,
    rng: np.random.Generator,
) -> tuple[FloatArray | None, dict[str, Any]]:
    """GAP-MAX over spans of k-subsets of ``sample_rows`` sampled rows, membership exact.

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
    sample_rows : int
        ``n0 <= n``; public, resolved by ``prepare``.
    rng : numpy.random.Generator
        The release's generator. Draws, in an order that does not depend on the data: the
        sample, the prime, the two mixing matrices, the noise, then (on release) the rotation.

    Returns
    -------
    basis : (d, k) array or None
        Haar-rotated orthonormal basis of the winning subspace; ``None`` for NULL.
    info : dict
        Public facts about the run (``sample_rows``, ``null_score``, ``noise_bound``).
    """
    n, d = data.shape
    sample = np.sort(rng.choice(n, size=sample_rows, replace=False))
    p = random_prime(rng, prime_bound(k))
    mixing = rng.integers(0, p, size=(d, k + 1), dtype=np.int64)
    strict_mixing = rng.integers(0, p, size=(d, k), dtype=np.int64)
    uniform = rng.random()

    u_null = null_score(robustness, epsilon, delta)
    lam, bound = truncated_laplace_params(GAP_SENSITIVITY, epsilon, delta)
    info: dict[str, Any] = {"sample_rows": sample_rows, "null_score": u_null, "noise_bound": bound}

    dirs = primitive_directions(np.asarray(data[sample], dtype=np.float64))
    leaders = competitive_candidates(dirs, k, u_null + k - 1, p, mixing, strict_mixing)
    if leaders.first is None or leaders.first[0] <= u_null:
        return None, info
    best, _, spanning = leaders.first
    runner_up = max(float(leaders.second) if leaders.second is not None else -math.inf, u_null)
    gap = max(0.0, best - runner_up - 1.0)
    if gap + float(truncated_laplace_ppf(uniform, lam, bound)) <= bound:
        return None, info
    basis = echelon_basis(dirs.ints, spanning) @ haar_orthogonal(k, rng)
    return np.asarray(basis, dtype=np.float64), info


def memory_estimate(n0: int, d: int, k: int) -> int:
    """Peak bytes of :func:`exact_gapmax` beyond the data, from public facts (see the class)."""
    entry_bytes = 32 + 4 * math.ceil(MAX_ENTRY_BITS / 30)  # a CPython int of MAX_ENTRY_BITS
    flint_entry = 16 + MAX_ENTRY_BITS // 8  # an fmpz of that size (flint's own allocator)
    sample = 8 * n0 * d * 8  # the float sample and its frexp/integer/shift arrays (int64)
    integer_rows = n0 * d * (2 * entry_bytes + 24) + 120 * n0  # two live copies, lists, dict
    residues = 8 * n0 * (d + 4 * (k + 1))
    batch, skip = 0, (SKIP_SETS + 3) * (8 * n0 + 120)
    # k = 1 needs no filter. Otherwise one batch of k-subsets (float products, their quotients
    # and the boolean hits) and, for k >= 3, one batch of (k-1)-subsets inside a candidate.
    for j in range(max(1, k - 1), k + 1) if k >= 2 else ():
        size = min(math.comb(n0, j), batch_size(n0, j))
        batch += 26 * size * n0 + size * (8 * j * 6 + 16 * (j + 2)) + 32 * size * j
        skip += 2 * n0 * size
    # One exact rank or echelon form of at most n0 x d entries (k = 1: only the echelon form of
    # one row); fraction-free elimination holds entries of up to (k + 1) times the input size.
    exact = (n0 if k > 1 else 1) * d * (flint_entry * (k + 2) + 2 * entry_bytes)
    return sample + integer_rows + residues + batch + skip + exact + 1_000_000


class ExactGapMax(Mechanism[ExactGapMaxParams]):
    name: ClassVar[str] = "exact_gapmax"
    title: ClassVar[str] = "GAP-MAX over spanned subspaces (exact case)"
    paper: ClassVar[str] = (
        "Singhal & Steinke, Privately Learning Subspaces, NeurIPS 2021, Algorithm 1"
    )
    summary: ClassVar[str] = (
        "For data lying exactly in a k-dimensional subspace, up to a few outliers: scores every "
        "subspace spanned by k sampled points, with membership decided in exact rational "
        "arithmetic on the doubles as stored, and releases the best one through GAP-MAX with "
        "truncated Laplace noise. Recovers the subspace exactly once n >= 3l + 8 ln(1/delta)/eps "
        "+ 2; otherwise (or on data in general position, including data only approximately in a "
        "subspace) returns no result. No clipping."
    )
    params_model: ClassVar[type[ExactGapMaxParams]] = ExactGapMaxParams
    accountings: ClassVar[frozenset[str]] = frozenset({"basic", "zcdp"})

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[ExactGapMaxParams]
    ) -> list[PrivacyStep]:
        """One step: ``eps``-DP outside the event that the noisy gap leaves the intersection of
        the neighbours' truncation intervals (probability ``<= delta``; module docstring)."""
        return [ApproximateStep(spec.epsilon, spec.delta)]

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
                    f"epsilon={format_budget(epsilon)}, "
                    f"delta={format_budget(delta)} (short by {needed - n0})",
                )
        else:
            if n < needed:
                raise InvalidParameter(
                    # The cost is what the analyst can change (no param is n_rows).
                    "epsilon",
                    f"the dataset has {n} rows, below the {needed} that Lemma 3.5 needs for "
                    f"l={robustness}, epsilon={format_budget(epsilon)}, "
                    f"delta={format_budget(delta)} (short by "
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
            params.sample_rows,
            rng,
        )
        if basis is None:
            return MechanismOutput.no_result(
                "no subspace won GAP-MAX: the data is not (up to robustness outliers) exactly in "
                "one k-dimensional subspace, or too few points lie in it for this budget",
                **info,
            )
        return MechanismOutput(basis=basis, extras=info)

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[ExactGapMaxParams]) -> Preview:
        params = spec.params
        assert params.robustness is not None and params.sample_rows is not None  # by prepare
        n0, ell = params.sample_rows, params.robustness
        u_null = null_score(ell, spec.epsilon, spec.delta)
        bound = noise_bound(spec.epsilon, spec.delta)
        needed = min_sample_rows(ell, spec.epsilon, spec.delta)
        return Preview(
            scales={
                "sample_rows": n0,
                "robustness": ell,
                "null_score": u_null,
                "noise_bound": bound,
                "min_sample_rows": needed,
            },
            meaning=[
                f"{n0} rows are sampled; a k-dimensional subspace scores the number of them it "
                "holds exactly (up to robustness outliers).",
                f"The winner is released only if its score beats u(NULL) = {u_null:.4g} and the "
                f"runner-up by more than the truncated-Laplace bound A = {bound:.4g}; otherwise "
                "no_result (charged).",
                f"Recovery is certain when at least {needed} sampled rows lie exactly in one "
                f"k-dimensional subspace with at most {ell} elsewhere; data only approximately "
                "in a subspace ends in no_result.",
            ],
        )

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[ExactGapMaxParams]) -> int:
        """Peak working memory: the sample and its exact integer rows (every entry counted at
        :data:`MAX_ENTRY_BITS` bits), one filter batch (:data:`BATCH_ENTRIES`), the kept member
        sets and one exact elimination of at most ``n0 x d`` entries. Never the number of
        candidates, which depends on the data."""
        n0 = spec.params.sample_rows if spec.params.sample_rows is not None else ctx.n_rows
        return memory_estimate(n0, ctx.n_cols, spec.k)
