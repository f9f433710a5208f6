"""Friend counts, weights and the total weight ``W`` of M6 ``friendly_aggregate``.

ALGORITHMS.md M6, friendly averaging: ``c_j(r) = #{l : ||y_j - y_l|| <= r}`` (``j`` itself
included), ``w_j = clip((c_j - t/2 - 1)/b, 0, 1)`` with the ramp ``b = t/2 - 1``
(:func:`ramp_width`, derivation F1), ``W = sum_j w_j``; and the sensitivities the other parts
calibrate with.

Privacy argument (what the other parts rely on): a replaced row moves one of the ``t`` points
``y_j`` (``sample_aggregate``). Its own weight moves by at most 1 and every other point's count by
at most 1, hence its weight by at most ``1/b``: ``|W - W'| <= Delta_W = 1 + (t-1)/b``
(:func:`weight_sensitivity`). Any two positive-weight points, in either neighbour, share a friend
that is not the moved one, so they lie within ``2r`` of each other and the weighted mean moves by
at most ``r (4(t-1)/b + 6)/W`` (:func:`mean_sensitivity`). Nothing here is released or draws
randomness; the search (``friendly_radius``), the test (``friendly_ptr``) and the mean
(``friendly_aggregators``) add the noise.

Floating point: every distance is a per-pair formula, direct differences ``||y_j - y_l||``
(scipy's ``cdist``, in tiles and blocks; never centred on a global mean, never through a Gram
matrix of all points), or for projections the ``k x k`` cross products of the pair (or, for
``d + 1 < 2 k^2``, the dot product of the pair's packed projectors, :func:`packed_projection_block`,
within the same rounding allowance); counts are
integers and ``W`` is summed exactly rounded (``math.fsum``), so one moved point changes only the
distances of its own pairs and ``|W - W'| <= Delta_W`` holds for the *computed* weights. The
mean's sensitivity is calibrated at the radius inflated by a public rounding allowance
(:func:`calibrated_sensitivity`). Memory: blocks of distances and integer counts ``t x R``, never
a ``t x t`` matrix (:func:`count_friends`).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy.spatial.distance import cdist

# The packed projectors' names, re-exported (tests and friendly_sizing read them from here).
# isort: off
from service.mechanisms.friendly_packed import (
    PACKED_CHUNK_KD as PACKED_CHUNK_KD,
    PACKED_FLOATS as PACKED_FLOATS,
    packed_chunks as packed_chunks,
    packed_length as packed_length,
    packed_projections as packed_projections,
    packed_projector_rows as packed_projector_rows,
)

# isort: on
from service.mechanisms.friendly_screen import SingleScreen, cross_screen, single_screen
from service.mechanisms.linalg import FloatArray

Aggregator = Literal["reference_points", "projection"]


def ramp_width(t: int) -> float:
    """``b = t/2 - 1``: weights ramp from 0 at ``c = t/2 + 1`` friends to 1 at ``c = t``.

    The widest ramp that still reaches 1 (a point cannot have more than ``t`` friends), so
    ``Delta_W = 1 + (t-1)/b`` is smallest (``~3`` instead of ``~5`` for ``t/4``); derivation F1 in
    ``docs/mechanisms.md``. Needs ``t >= 3`` (``b > 0``).
    """
    if t < 3:
        raise ValueError(f"t = {t}: the ramp t/2 - 1 needs t >= 3")
    return t / 2.0 - 1.0


def weight_sensitivity(t: int, b: float) -> float:
    """``Delta_W = 1 + (t-1)/b``: the replaced point's own weight moves by 1, each other by 1/b."""
    return 1.0 + (t - 1) / b


def mean_sensitivity(radius: float, t: int, b: float, weight: float) -> float:
    """``r (4(t-1)/b + 6) / W``: l2 sensitivity of the weighted mean at total weight ``W``."""
    return radius * (4.0 * (t - 1) / b + 6.0) / weight


#: Relative allowance for rounding in the reference-point route: a computed distance is within
#: ``(q d + 3) eps_machine`` (relative) of the distance of the computed points, and the computed
#: mean (:func:`weighted_mean`) within ``eps_machine r_max + 3 t eps_machine r`` of the exact
#: one, which is below ``6e-6 D`` for ``t <= 10^4`` at the radius floor (``D >= 14 r/t``).
REFERENCE_ROUNDING = 2.0**-16


def projection_rounding(d: int, k: int) -> float:
    """Public bound on the absolute rounding of a computed projector distance,
    ``4 k sqrt(d eps_machine)`` (each of the ``k^2`` entries of ``U_j^T U_l`` is a length-``d``
    dot product; the squared distance is a difference of sums of their squares)."""
    return 4.0 * k * math.sqrt(d * float(np.finfo(np.float64).eps))


def projection_mean_rounding(d: int, k: int, t: int) -> float:
    """Public bound on the Frobenius rounding of the computed ``sum_j w_j U_j U_j^T / W`` on
    both neighbours together: ``2 d t k^2 eps_machine``."""
    return 2.0 * d * t * k * k * float(np.finfo(np.float64).eps)


def calibrated_sensitivity(
    radius: float, t: int, b: float, weight: float, aggregator: Aggregator, d: int, k: int
) -> float:
    """The ``D`` the Gaussian noise is calibrated for: :func:`mean_sensitivity` at the radius
    plus the public rounding allowances of the computed distances and mean.

    A computed distance ``<= r`` only guarantees a distance ``<= r (1 + 2^-16)`` between the
    computed points (reference points) or ``<= r + projection_rounding(d, k)`` (projections),
    so the ``2r`` argument runs with that radius; the projection mean's own rounding is added.
    """
    if aggregator == "reference_points":
        return mean_sensitivity(radius * (1.0 + REFERENCE_ROUNDING), t, b, weight)
    inflated = mean_sensitivity(radius + projection_rounding(d, k), t, b, weight)
    return inflated + projection_mean_rounding(d, k, t)


# ---------------------------------------------------------------------------------------------
# Friendly averaging: distances by direct differences, counts in blocks


#: The distance step runs on this many threads at most (scipy's distance kernels release the
#: GIL); the memory estimate assumes all of them are busy.
MAX_DISTANCE_WORKERS = 4
#: Entries of one block of distances (``rows x columns``) a worker holds at once: 8 MB.
BLOCK_FLOATS = 1 << 20
#: Points per chunk when the weighted mean is accumulated.
MEAN_CHUNK_FLOATS = 1 << 20

#: Points per tile of the direct-difference distances (rows x columns).
ROW_TILE, COL_TILE = 16, 32

BlockFn = Callable[[int, int], FloatArray]


def reference_distance_block(points: FloatArray) -> BlockFn:
    """``(start, stop) -> ||y_j - y_l||`` for ``j in [start, stop)``, ``l in [start, t)``.

    Direct differences: ``sqrt(sum_c (y_jc - y_lc)^2)`` pair by pair (scipy's ``cdist``, which
    subtracts, squares and sums each pair's coordinates in a fixed order). A computed distance
    is therefore a function of the two points alone: no centring, no Gram matrix, no norm of
    any other point enters it, and its relative error is a few units of ``eps_machine``.

    Parameters
    ----------
    points : (t, p) array
    """

    t = points.shape[0]

    def block(start: int, stop: int) -> FloatArray:
        out = np.zeros((stop - start, t - start), dtype=np.float64)
        # Tiles of ROW_TILE x COL_TILE points keep both tiles in cache while every pair of them
        # is computed (about twice as fast as whole rows at q d = 10^4); tiles left of the
        # diagonal are skipped (the block's square part is symmetrised from its upper half).
        for r0 in range(start, stop, ROW_TILE):
            r1 = min(stop, r0 + ROW_TILE)
            rows = points[r0:r1]
            for c0 in range(r0, t, COL_TILE):
                c1 = min(t, c0 + COL_TILE)
                out[r0 - start : r1 - start, c0 - start : c1 - start] = cdist(rows, points[c0:c1])
        return out

    return block


def projection_distance_block(bases: FloatArray) -> BlockFn:
    """``(start, stop) -> ||U_j U_j^T - U_l U_l^T||_F``, as
    ``sqrt(||U_j^T U_j||_F^2 + ||U_l^T U_l||_F^2 - 2 ||U_j^T U_l||_F^2)``.

    For ``j in [start, stop)``, ``l in [start, t)``, from the ``k x k`` cross products of the
    stacked bases (one matrix product per block, never the ``d x d`` projectors): each entry of
    ``U_j^T U_l`` is a dot product of a column of ``U_j`` and one of ``U_l``, so the computed
    distance is a function of the pair alone. Its absolute error is at most
    :func:`projection_rounding` (``~ 2e-8 r_max`` measured at ``d = 1000``), hence the higher
    radius floor of this aggregator and the allowance in :func:`calibrated_sensitivity`.

    Parameters
    ----------
    bases : (t, d, k) array
    """
    t, d, k = bases.shape
    stacked = np.ascontiguousarray(bases.transpose(1, 0, 2).reshape(d, t * k))
    # ||U_j U_j^T||_F^2 = ||U_j^T U_j||_F^2 of the computed basis itself (k only up to its
    # loss of orthogonality), so the formula is exact for the projectors the mean averages.
    self_overlap = np.square(np.matmul(bases.transpose(0, 2, 1), bases)).sum(axis=(1, 2))

    def block(start: int, stop: int) -> FloatArray:
        # One triangle of the cross-Gram: the block's own square part as ``A^T A`` of one
        # buffer (numpy hands that to BLAS syrk, which computes one triangle and mirrors it,
        # so each of its entries is still one dot product of two columns), and the pairs with
        # later points as a plain product. Without the split a block holding all t points
        # computed both triangles, twice the work. Pairs left of the block are never formed.
        own = stacked[:, start * k : stop * k]
        cross = np.empty(((stop - start) * k, (t - start) * k), dtype=np.float64)
        cross[:, : (stop - start) * k] = own.T @ own
        if stop < t:
            np.matmul(own.T, stacked[:, stop * k :], out=cross[:, (stop - start) * k :])
        # ||U_j^T U_l||_F^2: square in place, then sum over the block's k columns first (whole
        # rows added, vectorised) and the later point's k last; about half the time of one
        # reduction over both axes, which strided through the array. The order of the sum is
        # not the one before, so a distance may differ in its last bits; any order is inside
        # projection_rounding (a sum of k^2 squares of length-d dot products).
        np.multiply(cross, cross, out=cross)
        rows = cross.reshape(stop - start, k, (t - start) * k).sum(axis=1)
        overlap = rows.reshape(stop - start, t - start, k).sum(axis=2)
        dist2 = self_overlap[start:stop, None] + self_overlap[None, start:] - 2.0 * overlap
        np.maximum(dist2, 0.0, out=dist2)
        return np.asarray(np.sqrt(dist2, out=dist2), dtype=np.float64)

    return block


def packed_projection_block(bases: FloatArray) -> BlockFn:
    """``(start, stop) -> ||U_j U_j^T - U_l U_l^T||_F`` as
    ``sqrt(<p_j, p_j> + <p_l, p_l> - 2 <p_j, p_l>)`` over the packed projectors ``p_j``
    (:func:`packed_projector_rows`): ``d (d + 1) / 2`` multiply-adds a pair instead of the
    ``k^2 d`` of :func:`projection_distance_block`, in one product of ``t`` rows instead of
    ``t k``; half the work or less for ``d + 1 < 2 k^2``.

    Rounding (why :func:`projection_rounding` still bounds it, so the calibrated sensitivity is
    unchanged): each ``<p_j, p_l>`` is summed as products of at most ``k d`` terms
    (:data:`PACKED_CHUNK_KD`, :func:`packed_chunks`: ``ceil(L / (k d))`` chunks) added chunk
    by chunk, a summation of depth at most ``h = k d + ceil(L / (k d)) <= 2 k d``
    (``L = d (d + 1) / 2 <= k^2 d``), so its error is at most
    ``h eps sum |p_j p_l| (1 + O(eps)) <= 2 k d eps ||P_j||_F ||P_l||_F = 2 k^2 d eps`` (plus
    ``k^2 eps``-sized errors of the computed projectors and of the ``sqrt 2``). The squared
    distance ``s_j + s_l - 2 o_jl`` then errs by at most about ``8 k^2 d eps``, and the distance
    by at most its square root, ``2 sqrt 2 k sqrt(d eps) < projection_rounding = 4 k sqrt(d eps)``.
    Each entry is a dot product of the pair's own rows (a matrix product's entry reads one row of
    each factor, in an order fixed by the public shapes), so a distance is still a function of
    the pair alone; the counts equal those of :func:`projection_distance_block` except for a
    distance within rounding of a radius.
    """
    t, d, k = bases.shape
    n_chunks, chunk = packed_chunks(d, k)
    rows = packed_projector_rows(bases, n_chunks, chunk)
    # Column slices of the rows (a matrix product reads them with a row stride, no copy).
    packed = [rows[:, c * chunk : (c + 1) * chunk] for c in range(n_chunks)]
    self_overlap = np.zeros(t, dtype=np.float64)
    for part in packed:
        self_overlap += np.einsum("ij,ij->i", part, part)

    def block(start: int, stop: int) -> FloatArray:
        size = stop - start
        overlap = np.zeros((size, t - start), dtype=np.float64)
        for part in packed:
            own = part[start:stop]
            # The block's square part as one symmetric product (one triangle computed and
            # mirrored), the later points as a plain product; pairs left of the block never.
            overlap[:, :size] += own @ own.T
            if stop < t:
                overlap[:, size:] += own @ part[stop:].T
        dist2 = self_overlap[start:stop, None] + self_overlap[None, start:] - 2.0 * overlap
        np.maximum(dist2, 0.0, out=dist2)
        return np.asarray(np.sqrt(dist2, out=dist2), dtype=np.float64)

    return block


#: Tiles of the exact route in :func:`centred_projection_block`: fixed boundaries on the pair
#: indices (``j // tile``, ``l // tile``), so a pair's exact distance always comes
#: from a product of the same public shape, whichever other pairs needed it.
#: Square tiles of 32 points on both routes (on the cross products 16 wasted less around the
#: few pairs the band cannot place, 0.19x against 0.30x ``X^T X`` at 50,000 x 1,000 "near", but
#: cost 0.87x against 0.59x where every tile is exact, "power" rows: 32 keeps those at the
#: one-block route's 0.53x).
TILE_PACKED, TILE_CROSS = 32, 32

#: Median band width (on ``D^2``, about ``4 s_j^2``) above which
#: :class:`CentredProjectionBlock` skips the band and computes every tile exactly (a choice of
#: work only: the counts are the same).
USELESS_BAND = 1e-2
#: Rows of the band's strips (each against the later columns).
STRIP_ROWS = 64

#: Where the band is useless, place the pairs by the single-precision screen
#: (``friendly_screen``, packed or cross products); ``False``: every tile exact, as before,
#: for the same-process comparison in bench/bench_aggregator_speed.py (the same counts).
SINGLE_SCREEN = True

#: Largest ``||U_j^T U_j - I||_F`` the centred bounds accept (beyond it: the exact route).
CENTRED_ORTHONORMALITY = 1e-6


class CentredProjectionBlock:
    """The projector friend counts of the packed route (:func:`packed_projection_block`'s
    formula, ``d + 1 < 2 k^2``) or of the cross products (:func:`projection_distance_block`'s),
    at a fraction of the work where the subsets agree: a cheap two-sided bound on each squared
    distance first, the exact formula only for the pairs the bound cannot place.

    **The exact distance** of a pair ``j < l``, ``F_jl``, is the packed formula
    ``sqrt(o_j + o_l - 2 <p_j, p_l>)`` (``o_j = ||U_j^T U_j||_F^2``, ``p_j`` the packed projector
    rows, summed in the same chunks; or ``o_j + o_l - 2 ||U_j^T U_l||_F^2`` by the cross
    products) computed in the pair's *tile*: rows
    ``[a R, (a + 1) R)`` by columns ``[b C, (b + 1) C)`` with ``a = j // R``, ``b = l // C``
    (:data:`TILE_PACKED` or :data:`TILE_CROSS`), one product of fixed public shape per chunk. A
    matrix product's entry reads one row of each factor in an order fixed by the shapes, so
    ``F_jl`` is a function of ``U_j`` and ``U_l`` alone (and public sizes), whichever other
    pairs are computed; its rounding is its route's (within :func:`projection_rounding` of
    ``D_jl = ||U_j U_j^T - U_l U_l^T||_F``). Every count this class yields is
    ``#{l : F_jl <= r}``: the privacy argument (one moved subset moves only its own pairs'
    predicates; a friend is within ``r + projection_rounding`` of the true projector) and
    the calibration are those of before. Against the one-block routes of before ``F_jl`` may
    differ in its last bits (a product of another shape), so the counts can differ from theirs
    only where a distance is within ~``1e-11`` of a radius of the grid.

    **The bound**, centred on one subset's basis ``U_0`` (``bases[0]``; which one does not
    matter to any count, see below): ``C_j = U_0^T U_j``, ``E_j = U_j - U_0 C_j``
    (``(I - Q) U_j``, ``Q = U_0 U_0^T``) and ``G_j = E_j C_j^T`` (``(I - Q) P_j U_0``, ``d x k``).
    For exact rank-``k`` orthogonal projectors the Frobenius norm of ``M = P_j - P_l`` splits
    over the blocks of ``Q`` and ``I - Q``:
    ``D^2 = ||Q M Q||^2 + 2 ||(I - Q) M Q||^2 + ||(I - Q) M (I - Q)||^2``.
    The middle term is ``2 T`` with ``T = ||G_j - G_l||_F^2``; ``Q P_j Q - Q = -Q (I - P_j) Q`` and
    ``(I - Q) P_j (I - Q)`` both have Frobenius norm at most ``||(I - Q) P_j||_F^2 = s_j``
    (``s_j = ||E_j||_F^2``), so each outer term is at most ``(s_j + s_l)^2 <= 2 (s_j^2 + s_l^2)``:
    ``2 T <= D^2 <= 2 T + 4 (s_j^2 + s_l^2)``, second order in the distance to ``U_0`` (rows near
    a subspace: a band of ~``1e-5`` of ``D^2``). Rounding, on both ends (:meth:`_margins`):
    the computed ``G`` and ``T``, the bases' loss of orthonormality
    ``delta_j = ||U_j^T U_j - I||_F`` (beyond :data:`CENTRED_ORTHONORMALITY`, or not finite: the
    exact route), and the exact route's own rounding (:meth:`exact_slack`, twice its proof's),
    each with a factor of 2 or more to spare. So ``F_jl^2`` lies in a computed ``[L, H]``; a
    pair whose interval holds no radius of the grid has ``#{r < F} = #{r^2 < L}`` without
    ``F``; the others take their tile's exact distances.

    ``U_0`` (another subset's basis) and the bound choose only *which* tiles are computed,
    never a count: every count equals the one from the exact per-pair distances.
    """

    def __init__(self, bases: FloatArray) -> None:
        t, d, k = bases.shape
        self.bases, self.t, self.d, self.k = bases, t, d, k
        self.n_chunks, self.chunk = packed_chunks(d, k)
        self.packed = packed_projections(t, d, k)
        self.tile = TILE_PACKED if self.packed else TILE_CROSS
        self._stacked: FloatArray | None = None
        self._lock = threading.Lock()
        eps = float(np.finfo(np.float64).eps)
        own = np.matmul(bases.transpose(0, 2, 1), bases)  # per basis: one product each
        self.self_overlap = np.square(own).sum(axis=(1, 2))
        own[:, np.arange(k), np.arange(k)] -= 1.0
        orth = np.sqrt(np.square(own).sum(axis=(1, 2)))
        # The bound's terms: any rounding here only widens or narrows the band, which the
        # margins below cover; no count reads these values except through the band.
        ref = bases[0]
        cross = np.matmul(ref.T, bases)  # C_j, (t, k, k), contiguous
        # Whether the band can place pairs at all (a choice of work only, never of a count):
        # s_j ~ ||U_j||_F^2 - ||C_j||_F^2; subsets that disagree leave every tile exact.
        rough = np.trace(own, axis1=1, axis2=2) + k - np.square(cross).sum(axis=(1, 2))
        finite = rough[np.isfinite(rough)]  # a non-finite basis is exact on either route
        self.useless = bool(finite.size and 4.0 * float(np.median(finite)) ** 2 > USELESS_BAND)
        if self.useless:
            self.g = np.zeros((t, 0), dtype=np.float64)
            zero = np.zeros(t, dtype=np.float64)
            self.low, self.high, self.bad = zero, zero, np.ones(t, dtype=bool)
        else:
            resid = np.matmul(ref, cross)
            np.subtract(bases, resid, out=resid)  # E_j = (I - Q) U_j, one t d k temporary
            g = np.matmul(resid, cross.transpose(0, 2, 1)).reshape(t, d * k)  # G_j
            self.g = g
            g_norm2 = np.einsum("ij,ij->i", g, g)
            spread = np.einsum("gij,gij->g", resid, resid)
            del resid
            self.low, self.high, self.bad = self._margins(g_norm2, spread, orth, eps)
        self._rows_all: FloatArray | None = None
        self._have = np.zeros(t, dtype=bool)
        self.last_exact_pairs = 0
        # Where the band is useless, the single-precision screen places
        # the pairs instead (friendly_screen; again a choice of work only, never of a count).
        self.screen: SingleScreen | None = None
        if SINGLE_SCREEN and self.useless and self.packed:
            self.screen = single_screen(
                bases, self.n_chunks, self.chunk, self.self_overlap, self.exact_slack(eps)
            )
        elif SINGLE_SCREEN and self.useless:
            self.screen = cross_screen(bases, self.self_overlap, self.exact_slack(eps))

    def _margins(
        self, g: FloatArray, s: FloatArray, orth: FloatArray, eps: float
    ) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """Per-basis terms with ``L = -4 <G_j, G_l> + low_j + low_l`` and
        ``H = -4 <G_j, G_l> + high_j + high_l`` (``2 T = 2 g_j + 2 g_l - 4 <G_j, G_l>``,
        ``g_j = ||G_j||_F^2``), and the bases the band cannot serve.

        Slack ``u_j`` (absolute, on ``D^2``, charged to each of the pair's two bases):
        ``2 T`` from one product of length ``d k`` and five additions errs by at most
        ``2 (d k + 5) eps (g_j + g_l + 2 |G_j| |G_l|) <= 4 (d k + 5) eps (g_j + g_l)``: charged
        ``16 (d k + 5) eps g_j``. The computed ``G_j`` is within ``e = 16 (k + d) sqrt(d k) eps``
        of the exact one (its entries are dot products of length ``d`` and ``k`` of unit-sized
        rows: first order ``(k + d) eps`` each, times ``sqrt(d k)`` entries; 16 to spare), which
        moves ``2 ||G_j - G_l||^2`` by at most ``2 (2 (|G_j| + |G_l|) 2 e + 4 e^2)``: charged
        ``8 e |G_j| + 4 e^2``. Each of ``U_j U_j^T``, ``U_l U_l^T``, ``Q`` is within
        ``1.01 delta`` of an exact projector (``delta <= 1e-6``), which moves ``G``, ``s`` and
        ``D`` by at most ``4 delta_sum`` and the squares by at most ``20 sqrt(2 k) delta_sum``:
        charged ``64 k delta_j`` (and ``delta_0``), over 3 times that for every ``k >= 1``.
        The exact route's rounding (:meth:`exact_slack`): half to each. The spread term:
        ``s_j`` grows by ``4 delta_j`` (and ``delta_0``) and its square by 2% (for the rounding
        of ``s``)."""
        k, d = self.k, self.d
        e = 16.0 * (k + d) * math.sqrt(d * k) * eps
        slack = (
            16.0 * (d * k + 5) * eps * g
            + 8.0 * e * np.sqrt(g)
            + 4.0 * e * e
            + 64.0 * k * (orth + 0.5 * orth[0])
            + 0.5 * self.exact_slack(eps)
        )
        spread = s + 4.0 * (orth + 0.5 * orth[0])
        low = 2.0 * g - slack
        high = 2.0 * g + 4.0 * 1.02 * spread * spread + slack
        bad = ~(np.isfinite(low) & np.isfinite(high)) | ~(orth <= CENTRED_ORTHONORMALITY)
        if not orth[0] <= CENTRED_ORTHONORMALITY:
            bad[:] = True
        return low, high, bad

    def exact_slack(self, eps: float) -> float:
        """Bound on ``|F^2 - D^2|``, twice the proof's. Packed route: ``16 k^2 d eps``
        (:func:`packed_projection_block`: ``8 k^2 d eps``). Cross products:
        ``16 d k^1.5 eps + 8 (k^3 + 2 k) eps``: each ``c_ab = u_a^T v_b`` (unit columns, length
        ``d``) errs by at most ``e = 1.01 d eps``, its square by ``2 |c_ab| e + e^2`` plus one
        rounding, and ``sum_ab |c_ab| <= k ||C||_F <= 1.01 k^1.5``, so ``sum_ab c_ab^2`` errs by at
        most ``2.04 d k^1.5 eps + (k^3 + k) 1.01 eps`` (with the sum's own ``k^2 eps ||C||_F^2``);
        ``F^2 = o_j + o_l - 2 sum`` holds three such sums (``o_j`` is the same formula for the
        pair ``(j, j)``) with weight 4 in all, and three additions (``6 k eps``)."""
        k, d = self.k, self.d
        if self.packed:
            return float(16.0 * k * k * d * eps)
        return float(16.0 * d * k * math.sqrt(k) * eps + 8.0 * (k**3 + 2 * k) * eps)

    # -- the exact route ----------------------------------------------------------------
    def _pack(self, need: npt.NDArray[np.bool_]) -> FloatArray:
        """The packed projector rows, with those of ``need`` built if not yet (in runs of
        consecutive bases; a row is a function of its basis alone, whatever the batch:
        :func:`packed_projector_rows` forms it from products of that basis with itself)."""
        with self._lock:  # count_friends may run blocks on several threads
            if self._rows_all is None:
                self._rows_all = np.zeros((self.t, self.n_chunks * self.chunk), dtype=np.float64)
            todo = need & ~self._have
            if todo.any():
                edges = np.flatnonzero(np.diff(np.concatenate(([0], todo.view(np.int8), [0]))))
                for lo, hi in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
                    packed_projector_rows(
                        self.bases[lo:hi], self.n_chunks, self.chunk, out=self._rows_all[lo:hi]
                    )
                self._have |= todo
            return self._rows_all

    def _tile(self, rows: FloatArray | None, a: int, b: int) -> FloatArray:
        """``F`` on the tile ``(a, b)``: rows ``[a R, (a+1) R)`` by columns ``[b C, (b+1) C)``
        (cut at ``t``). Packed route (``rows``, the packed projectors): one product of public
        shape per chunk, as :func:`packed_projection_block`; cross products: one product of
        the tile's stacked bases, ``U_j^T U_l`` for every pair, squared and summed, as
        :func:`projection_distance_block` (each within its route's rounding proof)."""
        t, k = self.t, self.k
        r0, r1 = a * self.tile, min(t, (a + 1) * self.tile)
        c0, c1 = b * self.tile, min(t, (b + 1) * self.tile)
        if rows is not None:
            overlap = np.zeros((r1 - r0, c1 - c0), dtype=np.float64)
            for c in range(self.n_chunks):
                part = slice(c * self.chunk, (c + 1) * self.chunk)
                overlap += rows[r0:r1, part] @ rows[c0:c1, part].T
        else:
            with self._lock:
                if self._stacked is None:
                    self._stacked = np.ascontiguousarray(
                        self.bases.transpose(1, 0, 2).reshape(self.d, t * k)
                    )
                stacked = self._stacked
            cross = stacked[:, r0 * k : r1 * k].T @ stacked[:, c0 * k : c1 * k]
            np.multiply(cross, cross, out=cross)
            summed = cross.reshape(r1 - r0, k, (c1 - c0) * k).sum(axis=1)
            overlap = summed.reshape(r1 - r0, c1 - c0, k).sum(axis=2)
        dist2 = self.self_overlap[r0:r1, None] + self.self_overlap[None, c0:c1] - 2.0 * overlap
        np.maximum(dist2, 0.0, out=dist2)
        return np.asarray(np.sqrt(dist2, out=dist2), dtype=np.float64)

    def _exact(
        self, start: int, stop: int, tiles: list[tuple[int, int]]
    ) -> list[tuple[slice, slice, FloatArray]]:
        """``F`` on ``tiles``, cut to rows ``[start, stop)`` and columns ``[start, t)``, as
        (row slice, column slice) of the block with their values."""
        t = self.t
        need = np.zeros(t, dtype=bool)
        for a, b in tiles:
            need[a * self.tile : (a + 1) * self.tile] = True
            need[b * self.tile : (b + 1) * self.tile] = True
        rows = self._pack(need) if self.packed else None
        parts = []
        for a, b in tiles:
            r0, r1 = a * self.tile, min(t, (a + 1) * self.tile)
            c0, c1 = b * self.tile, min(t, (b + 1) * self.tile)
            lo_r, hi_r, lo_c = max(r0, start), min(r1, stop), max(c0, start)
            if lo_r >= hi_r or lo_c >= c1:
                continue
            values = self._tile(rows, a, b)[lo_r - r0 : hi_r - r0, lo_c - c0 :]
            parts.append(
                (slice(lo_r - start, hi_r - start), slice(lo_c - start, c1 - start), values)
            )
        return parts

    def _unsure_tiles(
        self, unsure: npt.NDArray[np.bool_], first: int, tiles: set[tuple[int, int]]
    ) -> int:
        """Add to ``tiles`` the tiles of the unsure pairs ``j < l`` of a strip whose row ``0``
        and column ``0`` are point ``first``; return how many such pairs."""
        js, ls = np.nonzero(unsure)
        js += first
        ls += first
        keep = ls > js
        js, ls = js[keep], ls[keep]
        if js.size:
            ids = np.unique((js // self.tile) * self.t + ls // self.tile)
            tiles.update(zip((ids // self.t).tolist(), (ids % self.t).tolist(), strict=True))
        return int(js.size)

    def _all_tiles(self, start: int, stop: int) -> list[tuple[int, int]]:
        return [
            (a, b)
            for a in range(start // self.tile, (stop - 1) // self.tile + 1)
            for b in range(start // self.tile, (self.t - 1) // self.tile + 1)
            if (b + 1) * self.tile > a * self.tile
        ]

    def __call__(self, start: int, stop: int) -> FloatArray:
        """``F_jl`` for ``j in [start, stop)``, ``l in [start, t)`` (pairs ``j < l``; the others
        are left to the count step's mirror)."""
        out = np.zeros((stop - start, self.t - start), dtype=np.float64)
        for rows, cols, values in self._exact(start, stop, self._all_tiles(start, stop)):
            out[rows, cols] = values
        return out

    # -- the counts -----------------------------------------------------------------------
    def bins(self, start: int, stop: int, radii: FloatArray) -> npt.NDArray[np.int64]:
        """``#{i : radii_i < F_jl}`` for ``j in [start, stop)``, ``l in [start, t)``: what
        :func:`count_friends` reads of the exact distances (pairs ``j < l``; the others are
        left to its mirror).

        In squares: ``L`` and ``H`` are computed with a few roundings (relative ``3 eps``) and
        ``F`` is within one rounding of ``sqrt(F^2)``; comparing ``L`` with ``fl(r^2) (1 + 2^-40)``
        and ``H`` with ``fl(r^2) (1 - 2^-40)`` absorbs them: ``fl(r^2)(1 + 2^-40) < L`` implies
        ``r < F`` and ``fl(r^2)(1 - 2^-40) >= H`` implies ``r >= F``. Where the two counts agree
        every radius is on a known side and the bin is the first count; elsewhere the pair's
        tile is computed exactly."""
        t, size = self.t, stop - start
        squares = np.square(radii)
        below_low = squares * (1.0 + 2.0**-40)
        below_high = squares * (1.0 - 2.0**-40)
        out = np.zeros((size, t - start), dtype=np.int64)
        if self.screen is not None:
            out[:], unsure = self.screen.place(start, stop, below_low, below_high)
            tiles: set[tuple[int, int]] = set()
            self.last_exact_pairs = self._unsure_tiles(unsure, start, tiles)
            unsure_tiles = sorted(tiles)
        elif self.useless:
            # Most bases far from U_0 (subsets that disagree): the band would place few
            # pairs, so every tile is exact (which tiles are computed never changes a count).
            unsure_tiles = self._all_tiles(start, stop)
            self.last_exact_pairs = -1
        else:
            tiles = set()
            self.last_exact_pairs = 0
            # Strips of rows, each against the later columns only (the pairs j < l).
            for r0 in range(start, stop, STRIP_ROWS):
                r1 = min(stop, r0 + STRIP_ROWS)
                inner = self.g[r0:r1] @ self.g[r0:].T
                inner *= -4.0
                low = inner + self.low[r0:r1, None]
                low += self.low[None, r0:]
                high = inner
                high += self.high[r0:r1, None]
                high += self.high[None, r0:]
                bins = np.searchsorted(below_low, low, side="left")
                unsure = np.searchsorted(below_high, high, side="left") != bins
                unsure |= self.bad[r0:r1, None] | self.bad[None, r0:]
                out[r0 - start : r1 - start, r0 - start :] = bins
                self.last_exact_pairs += self._unsure_tiles(unsure, r0, tiles)
            unsure_tiles = sorted(tiles)
        for rows, cols, values in self._exact(start, stop, unsure_tiles):
            out[rows, cols] = np.searchsorted(radii, values, side="left")
        return out


def centred_projection_block(bases: FloatArray) -> CentredProjectionBlock:
    """:class:`CentredProjectionBlock` of the bases."""
    return CentredProjectionBlock(bases)


def projection_block(bases: FloatArray) -> tuple[BlockFn, int]:
    """The projector-distance blocks of the cheaper route for ``(d, k)`` (packed for
    ``d + 1 < 2 k^2``, else the cross products) and their rows per block."""
    block = centred_projection_block(bases)
    return block, centred_rows(bases.shape[0], block.tile)


def centred_rows(t: int, tile: int) -> int:
    """Rows per block of :class:`CentredProjectionBlock` (``rows x t`` bins and band temporaries
    of at most :data:`BLOCK_FLOATS` / 4 each), a multiple of its tile below ``t``, so no tile's
    exact distances are computed for two blocks."""
    rows = block_rows(t, 4)
    return rows if rows >= t else max(tile, rows // tile * tile)


def block_rows(t: int, width: int = 1) -> int:
    """Rows per block so that a ``rows x t`` block of ``width`` floats each fits
    :data:`BLOCK_FLOATS`."""
    return max(1, min(t, BLOCK_FLOATS // max(1, t * width)))


def _square_part_symmetric(dist: FloatArray) -> None:
    """Within a block's own rows, use the ``j <= l`` value for both orders and 0 on the
    diagonal, so the pair ``(j, l)`` has one computed distance (in place)."""
    rows = dist.shape[0]
    square = dist[:, :rows]
    upper = np.triu(square, 1)
    square[...] = upper + upper.T


def count_friends(
    block: BlockFn, t: int, radii: FloatArray, *, rows: int, workers: int = 1
) -> npt.NDArray[np.int64]:
    """``c_j(r_i) = #{l : dist(j, l) <= r_i}`` (``j`` itself included) for every radius.

    Each unordered pair's distance is computed once, in the block of the smaller index, and
    counted for both points; only integer counts leave a block, so memory is
    ``O(workers rows t + t R)`` whatever ``t``, and the counts do not depend on the blocking or
    on the threads' schedule.

    Parameters
    ----------
    block : callable ``(start, stop) -> (stop - start, t - start)`` distances
    t : int
    radii : (R,) ascending array
    rows : int
        Rows per block.
    workers : int
        Threads (blocks are dealt round-robin; each worker keeps its own counts).

    Returns
    -------
    (t, R) int array
    """
    n_radii = radii.shape[0]
    starts = list(range(0, t, rows))

    def work(mine: list[int]) -> npt.NDArray[np.int64]:
        # bins[j, l] = smallest i with dist <= radii[i] (n_radii: beyond every radius)
        hist = np.zeros((t, n_radii + 1), dtype=np.int64)
        for start in mine:
            stop = min(t, start + rows)
            banded = getattr(block, "bins", None)
            if banded is None:
                dist = block(start, stop)
                _square_part_symmetric(dist)
                bins = np.searchsorted(radii, dist, side="left")
            else:  # a CentredProjectionBlock: the same bins without every exact distance
                bins = banded(start, stop, radii)
                _square_part_symmetric(bins)
            size = stop - start
            offsets = np.arange(size, dtype=np.int64)[:, None] * (n_radii + 1)
            hist[start:stop] += np.bincount(
                (bins + offsets).ravel(), minlength=size * (n_radii + 1)
            ).reshape(size, n_radii + 1)
            if stop < t:
                later = bins[:, size:]
                offsets = np.arange(t - stop, dtype=np.int64)[None, :] * (n_radii + 1)
                hist[stop:] += np.bincount(
                    (later + offsets).ravel(), minlength=(t - stop) * (n_radii + 1)
                ).reshape(t - stop, n_radii + 1)
        return hist

    shares = [starts[w::workers] for w in range(max(1, min(workers, len(starts))))]
    if len(shares) == 1:
        hist = work(shares[0])
    else:
        with ThreadPoolExecutor(max_workers=len(shares)) as pool:
            hist = sum(pool.map(work, shares), np.zeros((t, n_radii + 1), dtype=np.int64))
    return np.asarray(np.cumsum(hist, axis=1)[:, :n_radii], dtype=np.int64)


def distance_workers() -> int:
    """Threads for the distance step: the CPUs this process may use, at most
    :data:`MAX_DISTANCE_WORKERS` (the counts are the same for any number)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_DISTANCE_WORKERS, cpus))


def pairwise_distances(points: FloatArray) -> FloatArray:
    """All distances ``||y_j - y_l||`` by direct differences, as a ``(t, t)`` array (tests and
    small ``t``; the mechanism itself only keeps counts)."""
    t = points.shape[0]
    block = reference_distance_block(points)(0, t)
    _square_part_symmetric(block)
    return block


def projection_distances(bases: FloatArray) -> FloatArray:
    """All projector distances as a ``(t, t)`` array (tests and small ``t``)."""
    t = bases.shape[0]
    block = projection_distance_block(bases)(0, t)
    _square_part_symmetric(block)
    return block


def friend_counts(distances: FloatArray, radius: float) -> npt.NDArray[np.int64]:
    """``c_j = #{l : ||y_j - y_l|| <= r}``, the point itself included, from a full matrix."""
    return np.asarray(np.count_nonzero(distances <= radius, axis=1), dtype=np.int64)


def weights_from_counts(counts: npt.NDArray[np.int64], t: int, b: float) -> FloatArray:
    """``w_j = clip((c_j - t/2 - 1)/b, 0, 1)`` elementwise (any shape of counts)."""
    return np.asarray(np.clip((counts - t / 2.0 - 1.0) / b, 0.0, 1.0), dtype=np.float64)


def total_weight(weights: FloatArray) -> float:
    """``W = sum_j w_j``, correctly rounded (``math.fsum``): the sum's rounding cannot add to
    ``|W - W'|`` beyond one rounding of each side."""
    return math.fsum(weights.tolist())


def friendly_weights(distances: FloatArray, radius: float, b: float) -> FloatArray:
    """``w_j = clip((c_j - t/2 - 1)/b, 0, 1)`` from a full distance matrix.

    Parameters
    ----------
    distances : (t, t) array
    radius : float
    b : float
        Ramp width.

    Returns
    -------
    (t,) array of weights in ``[0, 1]``.
    """
    t = distances.shape[0]
    return weights_from_counts(friend_counts(distances, radius), t, b)
