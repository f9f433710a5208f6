"""M8 ``continual_gauss``: the top-k subspace of a growing dataset after every batch, one charge.

Dwork, Talwar, Thakurta & Zhang, "Analyze Gauss", STOC 2014, Section 4 and Algorithms 3-4 (seed
002), with tree-based aggregation (Section 2.3.2) and, by default, Honaker's variance-optimal
combination of the tree's nodes.

Stream and tree
---------------
The leaves are the dataset's batches, in order (batch 1 is the upload, batch ``t`` the
``(t-1)``-th append); ``T`` (``horizon``) is public. Leaf ``t`` holds ``G_t = sum a a^T`` over
its rows clipped to ``C``. Node ``(h, j)`` of the dyadic tree covers leaves
``[j 2^h + 1, (j + 1) 2^h]`` and holds ``N_(h,j) = sum of G_t`` over them; it *closes* after its
last leaf, and then, once, gets ``E_(h,j)(sigma)``, a symmetric Gaussian matrix drawn from the
release's CSPRNG and kept in the state (never released). Nodes ending after ``T`` never close, so
the released nodes are those with ``(j + 1) 2^h <= T``: levels ``h = 0 .. floor(log2 T)``.

Privacy (replace-one neighbours over the whole stream)
-------------------------------------------------------
A row lives in one leaf. Replacing it (``a`` by ``b``, both clipped to ``C``) changes ``G_t`` by
``a a^T - b b^T``, whose upper triangle (diagonal included) has l2 norm ``<= sqrt(2) C^2``, and
changes exactly the nodes containing leaf ``t``: one per released level, so at most
``L = floor(log2 T) + 1`` nodes. The vector of the upper triangles of all released nodes
therefore has l2 sensitivity ``sqrt(L) sqrt(2) C^2``; every entry of every node gets independent
``N(0, sigma^2)`` noise with ``sigma`` the analytic-Gaussian scale (Balle & Wang 2018) for that
sensitivity and ``(epsilon, delta)``, so the noisy node vector is ``(epsilon, delta)``-DP. Every
epoch's output (the prefix estimate ``C_hat_t``, a fixed linear function of the noisy nodes
closed by ``t``, and its top-k eigenvectors) is post-processing, so the whole sequence of epochs
costs exactly ``(epsilon, delta)``, charged once at creation. (The issue's
``L = ceil(log2 T) + 1`` counts the root of the tree padded to a power of two; that root never
closes when ``T`` is not a power of two, so the count used here is the same for powers of two and
one smaller otherwise: ``tests/mechanisms/test_continual_gauss.py`` checks it by brute force.)
The node noise is drawn once, when the node closes, and lives in :class:`ContinualState`: an
epoch recomputed from a stored state reuses it, so no node is ever drawn twice.

Per person (a dataset with ``privacy_unit_column``): the worker bounds each person once over
all batches, ``sum_t ||G_p^t||_F <= C^2`` over the leaves (their rows in each batch take what
their earlier batches left, :func:`service.privacy_unit.continual_batch_rows`, with what each
person used kept in the state's ``person_used``); a replaced person then moves each released
level by at most ``sqrt(2) C^2``, as a row does, so this calibration is per person.

Estimators of the prefix ``C_t = N over [1, t]``
------------------------------------------------
The nodes closed by ``t`` lie in ``[1, t]``, and the maximal ones are the dyadic decomposition of
``[1, t]`` (one node per set bit of ``t``).

- ``tree``: ``C_hat_t`` is the sum of the noisy nodes of that decomposition; per-entry variance
  ``popcount(t) sigma^2``.
- ``honaker`` (default): each closed node keeps a refined estimate, the inverse-variance
  combination of its noisy value and the sum of its children's refined estimates
  (``v_0 = sigma^2``, ``v_h = 1 / (1/sigma^2 + 1/(2 v_(h-1)))``); ``C_hat_t`` is the sum of the
  refined estimates of the decomposition, per-entry variance ``sum over set bits h of v_h``. The
  bottom-up refinement is the best linear unbiased estimate of a subtree's root from the subtree
  (Hay, Rastogi, Miklau & Suciu, VLDB 2010; Honaker 2015), the decomposition's subtrees hold
  every closed node and their noises are independent, so this is the best linear unbiased
  estimate of ``C_t`` from everything released by ``t``.

Both keep ``O(L)`` ``d x d`` matrices in the state: per level, the refined (or noisy) closed node
of the decomposition, and the exact sum of the still-open node (private, never released).

Floating point and totality: rows are clipped after power-of-two scaling
(:func:`~service.mechanisms.linalg.clipped_gram`), clip norms whose square times the largest
quantity computed is not a comfortable double are refused before charging, and the eigensolver
has a fixed public fallback; every finite batch (extreme values, duplicates, zero rows) yields an
epoch. Released eigenvalues are rounded to ``sigma / 1000``.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from service.mechanisms.base import (
    ClipParams,
    ClippingMechanism,
    GaussianStep,
    MechanismOutput,
    Preview,
    PrivacyStep,
    PublicContext,
    ReleaseSpec,
)
from service.mechanisms.linalg import (
    FloatArray,
    clipped_gram,
    clipped_gram_memory,
    eigh_memory,
    top_k_eigh,
)
from service.mechanisms.noise import (
    GRID_DIVISOR,
    analytic_gaussian_sigma,
    round_to_grid,
    symmetric_gaussian,
)
from service.mechanisms.usefulness import count_above, usefulness_extras, wigner_edge

__all__ = [
    "MAX_HORIZON",
    "ContinualGauss",
    "ContinualGaussParams",
    "ContinualState",
    "Estimator",
    "closed_nodes",
    "honaker_level_variances",
    "levels",
    "noise_sigma",
    "prefix_estimate",
    "prefix_variance",
    "sqrt_factorization_variance",
    "tree_sensitivity",
]

#: The largest public horizon accepted (the issue's bound).
MAX_HORIZON = 4096

#: Public bound on the rows a stream can hold, for the floating-point range of ``C^2`` times the
#: prefix sums' entries (a stream's total row count is unknown when the release is created).
MAX_STREAM_ROWS = 2.0**48

Estimator = Literal["honaker", "tree"]


class ContinualGaussParams(ClipParams):
    """Params of ``continual_gauss``: the clip norm, the horizon and the prefix estimator."""

    horizon: int = Field(
        ge=1,
        le=MAX_HORIZON,
        description=(
            "Public horizon T: the most batches the release follows (batch 1 is the upload). "
            "The noise grows like log T, so choose the smallest horizon that suffices."
        ),
    )
    estimator: Estimator = Field(
        default="honaker",
        description=(
            "How each epoch estimates the prefix sum from the noisy tree nodes: 'honaker' (the "
            "variance-optimal combination of every closed node, the default) or 'tree' (the "
            "plain sum of the dyadic nodes covering the prefix). Both cost the same."
        ),
    )


# ---------------------------------------------------------------------------------------------
# Calibration and the tree's public structure


def levels(horizon: int) -> int:
    """``L = floor(log2 T) + 1``: the released tree levels, the nodes a leaf's change moves."""
    return int(horizon).bit_length()


def closed_nodes(horizon: int) -> list[tuple[int, int, int]]:
    """Every node released over the whole stream as ``(level, first_leaf, last_leaf)``."""
    return [
        (h, j * 2**h + 1, (j + 1) * 2**h)
        for h in range(levels(horizon))
        for j in range(horizon // 2**h)
    ]


def tree_sensitivity(clip_norm: float, horizon: int) -> float:
    """l2 sensitivity of all released nodes' upper triangles: ``sqrt(L) sqrt(2) C^2``."""
    return math.sqrt(levels(horizon)) * math.sqrt(2.0) * clip_norm**2


def noise_sigma(clip_norm: float, epsilon: float, delta: float, horizon: int) -> float:
    """Per-entry standard deviation of every node's ``E(sigma)``."""
    return analytic_gaussian_sigma(tree_sensitivity(clip_norm, horizon), epsilon, delta)


def honaker_level_variances(horizon: int) -> list[float]:
    """``v_h / sigma^2`` for ``h = 0 .. L-1``: the per-entry variance of a refined node."""
    variances = [1.0]
    for _ in range(1, levels(horizon)):
        variances.append(1.0 / (1.0 + 1.0 / (2.0 * variances[-1])))
    return variances


def prefix_variance(t: int, horizon: int, estimator: Estimator) -> float:
    """Per-entry variance of ``C_hat_t`` in units of ``sigma^2`` (exact, by the recurrences)."""
    bits = [h for h in range(levels(horizon)) if t >> h & 1]
    if estimator == "tree":
        return float(len(bits))
    refined = honaker_level_variances(horizon)
    return float(sum(refined[h] for h in bits))


def sqrt_factorization_variance(t: int, horizon: int) -> float:
    """For reference: per-entry variance of ``C_hat_t`` under the square-root factorization of
    the prefix-sum matrix (Henzinger, Upadhyay & Upadhyay, SODA 2023; ``A = S S``, ``S`` lower
    triangular Toeplitz with ``s_j = binom(2j, j) / 4^j``), in units of ``sigma^2`` of the tree
    at the same ``T``: its sensitivity is ``||S e_1|| sqrt(2) C^2``, so its noise variance per
    entry is ``sum_(j<T) s_j^2 / L`` tree-sigmas squared times ``sum_(j<t) s_j^2``."""
    coeffs = [1.0]
    for j in range(1, horizon):
        coeffs.append(coeffs[-1] * (2 * j - 1) / (2 * j))
    squares = np.cumsum(np.square(coeffs))
    return float(squares[horizon - 1] * squares[t - 1] / levels(horizon))


# ---------------------------------------------------------------------------------------------
# State


@dataclass(frozen=True, eq=False)  # arrays have no single truth value: compare to_bytes()
class ContinualState:
    """What a continual release keeps between epochs (private: never released or logged).

    ``closed[h]`` is the refined (``honaker``) or noisy (``tree``) estimate of the closed level-h
    node of the dyadic decomposition of ``[1, leaves_done]`` (present iff bit ``h`` of
    ``leaves_done`` is set); ``open_sums[h]`` is the exact sum of the leaves of the open level-h
    node so far (``None`` when that node is empty). All ``d x d``; at most ``2 L`` of them.
    """

    horizon: int
    d: int
    leaves_done: int
    closed: tuple[FloatArray | None, ...]
    open_sums: tuple[FloatArray | None, ...]
    #: Per person (a person-level dataset): how much of each person's bound, in units of
    #: ``C^2``, the batches so far took (:func:`service.privacy_unit.continual_batch_rows`).
    #: ``None`` on a row-level dataset, and in a state kept before it existed.
    person_used: FloatArray | None = None

    def to_bytes(self) -> bytes:
        """``np.savez`` of the meta data and the present matrices (no pickle)."""
        arrays: dict[str, FloatArray] = {
            "meta": np.asarray([self.horizon, self.d, self.leaves_done], dtype=np.float64)
        }
        for name, matrices in (("closed", self.closed), ("open", self.open_sums)):
            for h, matrix in enumerate(matrices):
                if matrix is not None:
                    arrays[f"{name}_{h}"] = matrix
        if self.person_used is not None:
            arrays["person_used"] = self.person_used
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, raw: bytes) -> ContinualState:
        """Inverse of :meth:`to_bytes`; refuses pickled content."""
        with np.load(io.BytesIO(raw), allow_pickle=False) as archive:
            horizon, d, leaves_done = (int(x) for x in archive["meta"])
            count = levels(horizon)

            def matrices(name: str) -> tuple[FloatArray | None, ...]:
                return tuple(
                    np.array(archive[f"{name}_{h}"], dtype=np.float64)
                    if f"{name}_{h}" in archive.files
                    else None
                    for h in range(count)
                )

            used = (
                np.array(archive["person_used"], dtype=np.float64)
                if "person_used" in archive.files
                else None
            )
            state = cls(horizon, d, leaves_done, matrices("closed"), matrices("open"), used)
        if used is not None and used.ndim != 1:
            raise ValueError("not a continual_gauss state")
        present = [m for m in state.closed + state.open_sums if m is not None]
        if not 0 <= leaves_done <= horizon or any(m.shape != (d, d) for m in present):
            raise ValueError("not a continual_gauss state")
        return state


def prefix_estimate(state: ContinualState) -> FloatArray:
    """``C_hat_t`` for ``t = state.leaves_done``: the sum of the decomposition's closed nodes."""
    total = np.zeros((state.d, state.d))
    for matrix in state.closed:
        if matrix is not None:
            total = total + matrix
    return total


def _advance_state(
    state: ContinualState,
    leaf: FloatArray,
    sigma: float,
    estimator: Estimator,
    rng: np.random.Generator,
) -> ContinualState:
    """The state after leaf ``t = leaves_done + 1`` with exact sum ``leaf``; draws the noise of
    the nodes closing at ``t`` (levels ``0 .. v``, ``2^v`` the largest power of two dividing
    ``t``), in ascending level order, once each."""
    t = state.leaves_done + 1
    count = levels(state.horizon)
    closed = list(state.closed)
    open_sums: list[FloatArray | None] = [
        leaf if matrix is None else matrix + leaf for matrix in state.open_sums
    ]
    refined = honaker_level_variances(state.horizon)
    child: FloatArray | None = None  # the estimate of the node just closed one level below
    for h in range(count):
        if t % 2**h:
            break
        exact = open_sums[h]
        assert exact is not None  # every open node has received leaf t
        noisy = exact + symmetric_gaussian(state.d, sigma, rng)
        if h == 0 or estimator == "tree":
            estimate = noisy
        else:
            # Inverse-variance combination of the node's own noisy value (variance 1 in units
            # of sigma^2) and its children's refined sum (variance 2 v_(h-1)): the left child
            # is the decomposition's level-(h-1) node before leaf t, the right one just closed.
            left = state.closed[h - 1]
            assert left is not None and child is not None
            own_weight = refined[h]
            children_weight = refined[h] / (2.0 * refined[h - 1])
            estimate = own_weight * noisy + children_weight * (left + child)
        # The lower levels now lie inside this node (bits 0..h-1 of t are 0).
        closed[:h] = [None] * h
        closed[h] = estimate
        open_sums[h] = None
        child = estimate
    return ContinualState(state.horizon, state.d, t, tuple(closed), tuple(open_sums))


# ---------------------------------------------------------------------------------------------
# Mechanism


class ContinualGauss(ClippingMechanism[ContinualGaussParams]):
    name: ClassVar[str] = "continual_gauss"
    accountings: ClassVar[frozenset[str]] = frozenset({"basic", "gaussian", "zcdp"})
    title: ClassVar[str] = "Continual Analyze Gauss (tree aggregation over a growing dataset)"
    paper: ClassVar[str] = (
        "Dwork, Talwar, Thakurta & Zhang, Analyze Gauss: Optimal Bounds for "
        "Privacy-Preserving PCA, STOC 2014, Section 4 and Algorithms 3-4"
    )
    summary: ClassVar[str] = (
        "Follows a dataset that grows by batches for up to T batches: after each batch, releases "
        "the top-k eigenvectors of a noisy prefix sum of the clipped X^T X, built from a binary "
        "tree of noisy partial sums (each row touches floor(log2 T) + 1 nodes). The whole "
        "sequence of epochs costs (epsilon, delta), charged once."
    )
    cost_rule: ClassVar[str] = (
        "Charges exactly the requested (epsilon, delta) once, at creation, for every epoch."
    )
    params_model: ClassVar[type[ContinualGaussParams]] = ContinualGaussParams
    continual: ClassVar[bool] = True

    def c2_multiples(
        self, ctx: PublicContext, k: int, epsilon: float, delta: float
    ) -> tuple[float, float]:
        # Per unit C^2: prefix entries <= MAX_STREAM_ROWS (the stream's rows are not known at
        # creation), noise draws <= 64 sigma per node and L nodes per prefix, eigenvalues <= d
        # times the largest entry; the smallest is the rounding grid. sigma is largest at T max.
        unit_sigma = noise_sigma(1.0, epsilon, delta, MAX_HORIZON)
        low = min(1.0, noise_sigma(1.0, epsilon, delta, 1) / GRID_DIVISOR)
        high = ctx.n_cols * (MAX_STREAM_ROWS + 64.0 * levels(MAX_HORIZON) * unit_sigma)
        return low, high

    def privacy_steps(
        self, ctx: PublicContext, spec: ReleaseSpec[ContinualGaussParams]
    ) -> list[PrivacyStep]:
        """The whole tree, charged once: one Gaussian mechanism on the vector of every node's
        upper triangle over the horizon, l2 sensitivity ``sqrt(L) sqrt(2) C^2``."""
        assert spec.params.clip_norm is not None  # resolved by prepare
        horizon = spec.params.horizon
        return [
            GaussianStep(
                tree_sensitivity(spec.params.clip_norm, horizon),
                noise_sigma(spec.params.clip_norm, spec.epsilon, spec.delta, horizon),
            )
        ]

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[ContinualGaussParams]) -> Preview:
        params = spec.params
        assert params.clip_norm is not None  # resolved by prepare
        horizon = params.horizon
        sigma = noise_sigma(params.clip_norm, spec.epsilon, spec.delta, horizon)
        first = sigma * math.sqrt(prefix_variance(1, horizon, params.estimator))
        last = sigma * math.sqrt(prefix_variance(horizon, horizon, params.estimator))
        worst = sigma * math.sqrt(
            max(prefix_variance(t, horizon, params.estimator) for t in range(1, horizon + 1))
        )
        return Preview(
            scales={
                "sigma": sigma,
                "levels": levels(horizon),
                "horizon": horizon,
                "estimator": params.estimator,
                "prefix_entry_std_first_epoch": first,
                "prefix_entry_std_last_epoch": last,
                "prefix_entry_std_worst_epoch": worst,
                "noise_spectral_norm_last_epoch": 2.0 * last * math.sqrt(ctx.n_cols),
                "eigenvalue_grid": sigma / GRID_DIVISOR,
            },
            meaning=[
                f"Each batch's rows enter {levels(horizon)} nodes of a binary tree over the "
                f"{horizon} batches; each node gets Gaussian noise of standard deviation "
                f"sigma = {sigma:.4g} per entry once, when it closes.",
                f"After batch t the released subspace is the top-k eigenspace of a noisy sum of "
                f"X^T X over batches 1..t whose entries have standard deviation {first:.4g} at "
                f"t = 1, {last:.4g} at t = {horizon}, at most {worst:.4g} at any t "
                f"({params.estimator} estimator).",
                "The whole sequence of epochs costs the requested (epsilon, delta), charged once; "
                f"after {horizon} batches the release ends.",
            ],
        )

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[ContinualGaussParams]) -> int:
        d = ctx.n_cols
        count = levels(spec.params.horizon)
        # The input state and the new one (pure: up to 2 L matrices each), the leaf's Gram pass
        # (n: the batch's public row count, chunked), then per closing node E(sigma) (4 d^2),
        # the noisy node and its estimate; then the prefix and the eigensolver.
        states = 8 * (4 * count * d * d)
        return states + max(
            clipped_gram_memory(ctx.n_rows, d),
            8 * (7 * d * d),
            8 * (d * d) + eigh_memory(d, spec.k),
        )

    def start(self, d: int, spec: ReleaseSpec[ContinualGaussParams]) -> ContinualState:
        """The empty state of a release over ``d`` columns: no leaf seen, no node drawn."""
        count = levels(spec.params.horizon)
        empty: tuple[FloatArray | None, ...] = (None,) * count
        return ContinualState(spec.params.horizon, d, 0, empty, empty)

    def advance(
        self,
        state: ContinualState,
        batch: FloatArray,
        spec: ReleaseSpec[ContinualGaussParams],
        rng: np.random.Generator,
    ) -> tuple[ContinualState, MechanismOutput]:
        """Consume leaf ``t = state.leaves_done + 1`` and release epoch ``t``.

        Parameters
        ----------
        state : ContinualState
            The state after epoch ``t - 1`` (not mutated).
        batch : (n_t, d) array or RowSource
            The rows of batch ``t``; may be a read-only memory map, may have 0 rows, or (as
            every mechanism's data may be) a :class:`~service.mechanisms.linalg.RowSource`, a
            dataset by reference's batch, whose clipped Gram is one pass of the engine: the
            same ``G_t`` up to summation order, so the privacy argument is unchanged.
        spec : ReleaseSpec
            The prepared spec (same for every epoch).
        rng : numpy.random.Generator
            The release's generator; the noise of each node closing at ``t`` is drawn from it.

        Returns
        -------
        state : ContinualState
            The state after epoch ``t``, holding the closed nodes' noise.
        output : MechanismOutput
            ``basis`` ``(d, k)``: top-k eigenvectors of ``C_hat_t``; extras ``epoch``,
            ``noise_sigma``, ``prefix_entry_std``, ``estimator``, ``eigenvalues`` (rounded to
            ``sigma / 1000``).
        """
        params = spec.params
        assert params.clip_norm is not None  # resolved by prepare
        if params.horizon != state.horizon:
            raise ValueError("the spec's horizon is not the state's")
        if state.leaves_done >= state.horizon:
            raise ValueError(f"the release has followed its horizon of {state.horizon} batches")
        if len(batch.shape) != 2 or batch.shape[1] != state.d:
            raise ValueError(f"a batch must have {state.d} columns")
        sigma = noise_sigma(params.clip_norm, spec.epsilon, spec.delta, params.horizon)
        leaf = clipped_gram(batch, params.clip_norm)
        new_state = _advance_state(state, leaf, sigma, params.estimator, rng)
        values, basis = top_k_eigh(prefix_estimate(new_state), spec.k)
        t = new_state.leaves_done
        prefix_std = sigma * math.sqrt(prefix_variance(t, params.horizon, params.estimator))
        rounded = round_to_grid(values, sigma / GRID_DIVISOR)
        extras = {
            "epoch": t,
            "horizon": params.horizon,
            "estimator": params.estimator,
            "noise_sigma": sigma,
            "prefix_entry_std": prefix_std,
            "eigenvalues": rounded.tolist(),
        }
        # Issue 24, item 5: the released eigenvalues against the prefix noise's edge
        # 2 std sqrt(d) (public scale; post-processing).
        above = count_above(rounded, spec.k, wigner_edge(prefix_std, state.d))
        extras.update(
            usefulness_extras(
                above,
                spec.k,
                "released eigenvalues against the prefix noise's edge 2 std sqrt(d)",
            )
        )
        return new_state, MechanismOutput(basis=basis, extras=extras)

    def run(
        self,
        data: FloatArray,
        spec: ReleaseSpec[ContinualGaussParams],
        rng: np.random.Generator,
    ) -> MechanismOutput:
        """One-shot use (a stream of one batch): ``start``; ``advance(data)``; epoch 1."""
        _, output = self.advance(self.start(data.shape[1], spec), data, spec, rng)
        return output
