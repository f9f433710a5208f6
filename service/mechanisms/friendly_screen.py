"""A single-precision screen for the projector friend counts of M6 ``friendly_aggregate`` where
the centred band cannot place pairs (subsets that disagree; issue 35 item 1, ninth pass).

What it is for: :class:`~service.mechanisms.friendly_weights.CentredProjectionBlock` counts
``#{l : F_jl <= r}`` for the exact per-pair distances ``F_jl`` of the packed route. Where the
subsets agree, its centred band places almost every pair without ``F``; where they do not (the
band is ``useless``), every tile of ``F`` was computed: ``t^2 L / 2`` double multiply-adds
(``L = d (d + 1) / 2``), about 2.5 times the bare ``X^T X`` at 50,000 x 100, ``t = 500`` (on the
cross-product route, ``d + 1 >= 2 k^2``, ``t^2 k^2 d / 2``: :class:`CrossScreen`). The
radius grid is coarse (``r_i = r_max 2^-i``), so a cheap estimate of ``F^2`` with a proven error
bound places almost every such pair too: the same inner products ``<p_j, p_l>`` of the packed
projectors, in single precision (half the work of the double product, one product per block).
As with the band, the screen chooses only *which* tiles are computed exactly, never a count:
a pair whose interval ``[S - M, S + M]`` holds no radius of the grid has ``#{r < F} =
#{r^2 < S - M}``; the others take their tile's exact ``F``. So every count, every weight and
every released value is the same, bit for bit, as with every tile exact.

**The bound** ``|S_jl - F_jl^2| <= M``, with ``u = 2^-24`` (single precision) and
``gamma_n = n u / (1 - n u)`` (Higham, Accuracy and Stability of Numerical Algorithms, 2002,
Section 3.1: a sum of ``n`` products in any order, with or without fused multiply-adds, errs by
at most ``gamma_n`` times the sum of the products' magnitudes):

* ``p~_j``, the packed projector of ``U_j`` rounded to single: each entry
  ``w_ab sum_c U_ac U_bc`` (``w = 1`` or ``sqrt 2``) is formed from the rounded ``U`` (relative
  ``u`` each), a ``k``-term sum and at most two more roundings (the weight and its product),
  so it errs by at most ``gamma_{k+4} w_ab (|U| |U|^T)_ab``, and
  ``||p~_j - p_j|| <= gamma_{k+4} || |U_j| |U_j|^T ||_F <= gamma_{k+4} ||U_j||_F^2 =: Delta_j``
  (the packed norm is the Frobenius norm of the symmetric matrix).
* ``g_jl``, the single-precision product of ``p~_j`` and ``p~_l`` over the ``L'`` padded entries
  (the padding is zeros): ``|g_jl - <p~_j, p~_l>| <= gamma_L' ||p~_j|| ||p~_l||``, and
  ``|<p~_j, p~_l> - <p_j, p_l>| <= Delta_j ||p_l|| + ||p~_j|| Delta_l``; with
  ``a_j = sqrt(o_j) + Delta_j >= ||p_j||, ||p~_j||`` (``||p_j||^2 = ||U_j^T U_j||_F^2 = o_j``).
* ``S_jl = o_j + o_l - 2 g_jl`` in double, with the computed ``o_j``: it differs from the true
  ``D_jl^2 = o_j + o_l - 2 <p_j, p_l>`` by at most ``2 (gamma_L' a_j a_l + Delta_j a_l + a_j
  Delta_l)``, plus the error of the computed ``o_j`` and ``o_l`` (each inside ``exact_slack``,
  the exact route's bound on ``|F^2 - D^2|``, which holds three such sums) and a few double
  roundings of values below ``4 (k + a^2)``; and ``|F^2 - D^2| <= exact_slack``.

``M`` is that sum at the largest ``a_j`` and ``Delta_j`` of the bases the screen serves, times 2
to spare, plus ``1e-30`` for single-precision underflow (absolute errors of ``2^-149`` per
operation, ``~1e4`` of them). Bases it cannot serve (a non-finite entry, or
``||U_j||_F^2 > 4 k``, far from any computed orthonormal basis) are zero rows of the screen and
every pair of theirs takes the exact route. At ``k = 10``, ``d = 100``: ``M ~ 0.03`` on
``F^2 <= 2 k = 20``, against squared radii ``5`` and ``20`` around "power" rows'
``F^2 in [6.4, 10.5]``.

Run time: as the band's, the work done beyond the screen (which tiles are exact) depends on the
data, and the screen itself runs only where the band is useless (a function of all subsets);
run time is hidden from analysts (ALGORITHMS.md, "Totality"). Memory: the single rows
(``4 t L'`` bytes) and per block the band's temporaries (``friendly_sizing``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from service.mechanisms.friendly_packed import packed_projector_rows
from service.mechanisms.linalg import FloatArray

#: Unit roundoff of single precision.
SINGLE_UNIT = 2.0**-24
#: ``||U_j||_F^2`` above this many ``k``: the basis is not served (its pairs are exact).
SCREEN_FROBENIUS = 4.0


def gamma(n: int, unit: float = SINGLE_UNIT) -> float:
    """``gamma_n = n u / (1 - n u)``: the relative bound of an ``n``-term sum of products."""
    return n * unit / (1.0 - n * unit)


def margin(single: float, exact_slack: float, double: float) -> float:
    """``M = 2 (single + 3 exact_slack + double) + 1e-30``, the bound both screens use (each
    derives its own ``single`` and ``double`` terms); the 1e-30 keeps ``M`` positive when every
    term is 0."""
    return 2.0 * (single + 3.0 * exact_slack + double) + 1e-30


class SingleScreen:
    """``S_jl`` and its bound ``M`` (module docstring) for the packed single rows of the bases.

    Parameters
    ----------
    rows : (t, L') float32 array
        The packed projectors of the served bases in single precision
        (``friendly_weights.packed_projector_rows`` of the bases rounded to single), zero rows
        for the others.
    self_overlap : (t,) array
        ``o_j``, as the exact route computes it.
    frobenius2 : (t,) array
        ``||U_j||_F^2``.
    served : (t,) bool array
        The bases whose rows hold their packed projectors.
    k : int
    exact_slack : float
        The exact route's bound on ``|F^2 - D^2|``.
    """

    def __init__(
        self,
        rows: npt.NDArray[np.float32],
        self_overlap: FloatArray,
        frobenius2: FloatArray,
        served: npt.NDArray[np.bool_],
        k: int,
        exact_slack: float,
    ) -> None:
        t, length = rows.shape
        self.rows, self.t = rows, t
        good, o_max = self._keep_overlap(self_overlap, served)
        eps = float(np.finfo(np.float64).eps)
        delta = gamma(k + 4) * frobenius2 * 1.01
        norm = np.sqrt(np.abs(self.overlap)) * (1.0 + 1e-6) + delta
        a = float(norm[good].max()) if good.any() else 0.0
        d_max = float(delta[good].max()) if good.any() else 0.0
        single = 2.0 * (gamma(length) * a * a + 2.0 * d_max * a)
        double = 64.0 * eps * (4.0 * o_max + 4.0 * a * a)
        self.margin = margin(single, exact_slack, double)

    def _keep_overlap(
        self, self_overlap: FloatArray, served: npt.NDArray[np.bool_]
    ) -> tuple[npt.NDArray[np.bool_], float]:
        """Sets ``overlap`` (the ``o_j`` in double) and ``bad`` (the bases not served or with a
        non-finite ``o_j``); returns the others and their largest ``|o_j|`` (0 if none)."""
        self.overlap = np.asarray(self_overlap, dtype=np.float64)
        self.bad = ~served | ~np.isfinite(self.overlap)
        good = ~self.bad
        return good, float(np.abs(self.overlap[good]).max()) if good.any() else 0.0

    def estimate(self, start: int, stop: int) -> FloatArray:
        """``S_jl = o_j + o_l - 2 g_jl`` for ``j in [start, stop)``, ``l in [start, t)``
        (:meth:`inner` the ``g_jl``)."""
        square = self.inner(start, stop)
        square *= -2.0
        square += self.overlap[start:stop, None]
        square += self.overlap[None, start:]
        return square

    def inner(self, start: int, stop: int) -> FloatArray:
        """``g_jl`` in double: one single-precision product per block, the block's own square
        part as ``A A^T`` (BLAS ``syrk``), the later rows as a plain product; rows left of the
        block never."""
        t, size = self.t, stop - start
        own = self.rows[start:stop]
        inner = np.empty((size, t - start), dtype=np.float32)
        inner[:, :size] = own @ own.T
        if stop < t:
            np.matmul(own, self.rows[stop:].T, out=inner[:, size:])
        return inner.astype(np.float64)

    def place(
        self, start: int, stop: int, below_low: FloatArray, below_high: FloatArray
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """For ``j in [start, stop)``, ``l in [start, t)``: ``#{i : below_low_i < S - M}``
        (the bin, where sure) and whether it is unsure (it differs from
        ``#{i : below_high_i < S + M}``, or a basis is not served); ``below_low`` and
        ``below_high`` are the squared radii widened as ``CentredProjectionBlock.bins`` does
        (:meth:`estimate`, then one search and one gather)."""
        square = self.estimate(start, stop)
        square -= self.margin
        bins = np.searchsorted(below_low, square, side="left")
        square += 2.0 * self.margin
        # #{i : below_high_i < S + M} equals the bin b = #{i : below_low_i < S - M} exactly
        # when below_high_b >= S + M (both ascending, below_high_i < below_low_i, so the first
        # b are below S + M): one gather instead of a second search.
        above = np.append(below_high, np.inf)
        unsure = np.take(above, bins) < square
        unsure |= self.bad[start:stop, None] | self.bad[None, start:]
        return np.asarray(bins, dtype=np.int64), unsure


def single_screen(
    bases: FloatArray, n_chunks: int, chunk: int, self_overlap: FloatArray, exact_slack: float
) -> SingleScreen:
    """:class:`SingleScreen` of the ``(t, d, k)`` bases: their packed projectors
    (:func:`~service.mechanisms.friendly_packed.packed_projector_rows`, in ``n_chunks`` chunks
    of ``chunk``) from the bases rounded to single; zero rows for the bases it does not serve
    (a non-finite entry, or ``||U_j||_F^2 > 4 k``)."""
    t, _, k = bases.shape
    with np.errstate(all="ignore"):
        frobenius2 = np.einsum("gij,gij->g", bases, bases)
    served = np.isfinite(frobenius2) & (frobenius2 <= SCREEN_FROBENIUS * k)
    source = bases if served.all() else np.where(served[:, None, None], bases, 0.0)
    rows = np.zeros((t, n_chunks * chunk), dtype=np.float32)
    packed_projector_rows(source.astype(np.float32), n_chunks, chunk, out=rows)
    return SingleScreen(rows, self_overlap, frobenius2, served, k, exact_slack)


class CrossScreen(SingleScreen):
    """The screen of the cross-product route (``d + 1 >= 2 k^2``, or too many packed rows):
    ``g_jl = sum_ab c~_ab^2`` with ``c~ = U~_j^T U~_l`` in single precision (the stacked bases
    rounded to single, one product per strip of bases against every later one), the squares
    summed in double.

    Bound: each ``c_ab = u_a . v_b`` (columns of ``U_j`` and ``U_l``, length ``d``) from the
    rounded columns errs by at most ``e_ab = gamma_{d+2} ||u_a|| ||v_b||``, so with
    ``Phi_j = ||U_j||_F^2``, ``sum_ab |c~_ab^2 - c_ab^2| <= sum_ab (2 |c_ab| e_ab + e_ab^2)
    <= (2 gamma + gamma^2) Phi_j Phi_l`` (Cauchy-Schwarz; ``sum c^2 <= Phi_j Phi_l``), and the
    single rounding of each square adds ``u (1 + gamma)^2 Phi_j Phi_l``: at most
    ``4 gamma_{d+2} Phi_j Phi_l`` together. ``S`` then errs by twice that, plus the terms of
    :class:`SingleScreen` (``exact_slack``, double roundings); ``M`` is that at the largest
    ``Phi_j`` served, times 2.

    Parameters
    ----------
    stacked : (d, t k) float32 array
        The bases side by side, rounded to single (zero columns for bases not served).
    self_overlap, frobenius2, served, k, exact_slack
        As :class:`SingleScreen`.
    """

    def __init__(
        self,
        stacked: npt.NDArray[np.float32],
        self_overlap: FloatArray,
        frobenius2: FloatArray,
        served: npt.NDArray[np.bool_],
        k: int,
        exact_slack: float,
    ) -> None:
        d = stacked.shape[0]
        self.stacked, self.k, self.t = stacked, k, stacked.shape[1] // k
        self.rows = np.zeros((self.t, 0), dtype=np.float32)
        good, o_max = self._keep_overlap(self_overlap, served)
        eps = float(np.finfo(np.float64).eps)
        phi = float(frobenius2[good].max()) if good.any() else 0.0
        single = 2.0 * 4.0 * gamma(d + 2) * phi * phi
        double = 64.0 * eps * (4.0 * o_max + 4.0 * phi * phi) + 4.0 * k * k * eps * phi * phi
        self.margin = margin(single, exact_slack, double)
        self.strip = cross_strip(self.t, k)

    def inner(self, start: int, stop: int) -> FloatArray:
        """``g_jl`` for ``j in [start, stop)``, ``l in [start, t)``, a strip at a time."""
        t, k = self.t, self.k
        out = np.zeros((stop - start, t - start), dtype=np.float64)
        for r0 in range(start, stop, self.strip):
            # Each strip against the later bases only (the pairs j < l; the rest stay 0 and
            # are never read: the count step mirrors the upper triangle).
            r1 = min(stop, r0 + self.strip)
            cross = self.stacked[:, r0 * k : r1 * k].T @ self.stacked[:, r0 * k :]
            np.multiply(cross, cross, out=cross)
            summed = cross.reshape(r1 - r0, k, (t - r0) * k).sum(axis=1, dtype=np.float64)
            out[r0 - start : r1 - start, r0 - start :] = summed.reshape(r1 - r0, t - r0, k).sum(
                axis=2
            )
        return out


#: Single-precision entries of one strip's cross products in :class:`CrossScreen` (1 MB).
CROSS_STRIP_FLOATS = 1 << 18


def cross_strip(t: int, k: int) -> int:
    """Bases per strip of :class:`CrossScreen`: its products (``strip k x t k`` singles) within
    :data:`CROSS_STRIP_FLOATS`, at least one base."""
    return max(1, CROSS_STRIP_FLOATS // max(1, t * k * k))


def cross_strip_bytes(t: int, k: int) -> int:
    """Peak bytes of one strip of :class:`CrossScreen` (public sizes): its single-precision
    products and their sums over ``a`` in double."""
    strip = cross_strip(t, k)
    return 4 * strip * k * t * k + 8 * strip * t * k


def cross_screen(bases: FloatArray, self_overlap: FloatArray, exact_slack: float) -> CrossScreen:
    """:class:`CrossScreen` of the ``(t, d, k)`` bases (zero columns for the bases it does not
    serve, as :func:`single_screen`)."""
    t, d, k = bases.shape
    with np.errstate(all="ignore"):
        frobenius2 = np.einsum("gij,gij->g", bases, bases)
    served = np.isfinite(frobenius2) & (frobenius2 <= SCREEN_FROBENIUS * k)
    source = bases if served.all() else np.where(served[:, None, None], bases, 0.0)
    stacked = np.ascontiguousarray(source.astype(np.float32).transpose(1, 0, 2).reshape(d, t * k))
    return CrossScreen(stacked, self_overlap, frobenius2, served, k, exact_slack)
