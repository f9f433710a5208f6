"""``auto``'s block count: the decisive estimate where the tail cannot decide (issue 33).

*Why.* The tail ``T`` moves by ``C^2`` per row while rows ``delta`` from a subspace make it
``n delta^2``: at ``n = 20,000`` rows 1e-2 and 1e-5 away give 2 and 2e-6 against a Laplace scale
of ``2 C^2/(s eps)`` = 222 at eps 0.3, so where friendly wins only at the tail's optimistic end
no released tail separates them (docs/benchmarks.md, auto cells). The same first-order
prediction, made on each of ``t`` blocks of a fresh public partition instead of on the sum,
is a count: each block of ``m`` rows (friendly's own subset size, ``n/t``) predicts friendly's
spread from its own tail and head, ``r_b = 2 k sqrt(T_b/S_b)/sqrt(m_b)`` (seed 001's model, as
:func:`~service.mechanisms.auto_estimate.friendly_wins` on the sums), and loses if ``r_b``
reaches the break-even radius ``r*`` (friendly's predicted error there equals the Gram
candidate's). The count of losing blocks ranges over ``[0, t]`` with sensitivity 1.

*Rule.* Friendly runs iff the noisy count is below ``t/2`` (most blocks predict a win). At
``eps_c = 2 ln(1/(2 ALPHA))/t`` a count of ``t`` (every block loses) passes, and a count of 0
fails, each with probability ``exp(-t eps_c/2)/2 = ALPHA``: the stated error rate, derived, not
fitted. At ``t = 666`` that is 0.0069 (2.3% of eps 0.3), against the weight check's
``Delta_W ln(1/(2 ALPHA))/bar`` (sensitivity ``Delta_W = 3``: 0.0214) and the search's quarter.

*Privacy.* The partition is drawn from the mechanism's randomness, independent of the data
(on a person-level dataset it partitions people); a replaced row (person) moves one block and
so the count by at most 1, and ``count + Lap(1/eps_c)`` is ``(eps_c, 0)``-DP. ``r*`` is a
function of public facts and the released estimate; the decision is post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from service.mechanisms.auto_guard import (
    ALPHA,
    MAX_WEIGHT_SHARE,
    Choice,
    FriendlyPath,
    friendly_path,
    predicted_friendly_error,
    prepared,
    spurious_stop_bound,
)
from service.mechanisms.base import PublicContext
from service.mechanisms.friendly_radius import radius_grid, radius_steps
from service.mechanisms.linalg import FloatArray, clip_rows
from service.mechanisms.noise import laplace

#: friendly's found radius over a block's predicted spread ``r_b``: its weight needs most pairs
#: of subsets within ``r``, above the typical spread; bracketed by the powers of two friendly
#: found on rows off the grid (PLACEHOLDER).
RADIUS_RATIO = 1.18


@dataclass(frozen=True)
class CountPath:
    """The count (``epsilon``), then friendly's path without checks (``path``) if most blocks
    predict a win, else the Gram candidate (``default``), both at the budget less the count."""

    epsilon: float
    path: FriendlyPath
    default: Choice

    def choices(self) -> list[Choice]:
        return [self.default, *self.path.choices()]


def count_epsilon(t: int) -> float:
    """``2 ln(1/(2 ALPHA))/t``: the least epsilon at which a count of ``t`` falls below ``t/2``,
    and one of 0 reaches it, each with probability at most ``ALPHA``."""
    return 2.0 * math.log(1.0 / (2.0 * ALPHA)) / t


def count_path(
    ctx: PublicContext,
    k: int,
    budget: float,
    delta: float,
    gram: tuple[str, dict[str, Any]],
    notes: list[str],
) -> CountPath | None:
    """The count and friendly's path at ``budget`` less the count, from public facts; a fixed
    point, as friendly's ``t`` may grow as its budget falls. ``None`` where the count costs more
    than ``MAX_WEIGHT_SHARE`` of the budget or friendly is refused."""
    eps_c = 0.0
    for _ in range(8):
        path = friendly_path(ctx, k, budget - eps_c, 0.0, delta, gram, notes)
        if path is None:
            return None
        params: Any = path.run.params
        needed = count_epsilon(int(params.t))
        if needed <= eps_c:
            name, raw = gram
            return CountPath(eps_c, path, prepared(name, ctx, k, budget - eps_c, delta, raw))
        eps_c = 1.01 * needed if eps_c > 0 else needed
        if eps_c > MAX_WEIGHT_SHARE * budget:
            return None
    return None


def block_radii(
    data: FloatArray,
    k: int,
    t: int,
    clip_norm: float,
    rng: np.random.Generator,
    units: npt.NDArray[np.int64] | None = None,
) -> FloatArray:
    """Each block's predicted spread ``2 k sqrt(T_b/S_b)/sqrt(m_b)`` (non-private) on a fresh
    partition of the rows (of the people, given ``units``) into ``t`` blocks; ``inf`` for a
    block of no head (it predicts nothing, so it counts as a loss)."""
    n = data.shape[0]
    labels = np.arange(n) if units is None else units
    block_of = rng.permutation(int(labels.max(initial=-1)) + 1) % t
    blocks = block_of[labels]
    order = np.argsort(blocks, kind="stable")
    bounds = np.cumsum(np.bincount(blocks, minlength=t))[:-1]
    radii = np.full(t, np.inf)
    for b, rows in enumerate(np.split(order, bounds)):
        x = clip_rows(data[rows], clip_norm)
        gram = x @ x.T if len(rows) <= x.shape[1] else x.T @ x  # the smaller side's eigenvalues
        values = np.maximum(np.linalg.eigvalsh(gram)[::-1], 0.0) if len(rows) else np.zeros(0)
        head, tail = float(values[:k].sum()), float(values[k:].sum())
        if head > 0:
            radii[b] = 2.0 * k * math.sqrt(tail / head) / math.sqrt(len(rows))
    return radii


def threshold_radius(
    friendly: Choice, gram_error: float, ptr_error: float, d: int, k: int
) -> float:
    """The largest radius ``r'`` of friendly's search grid at which its predicted error plus the
    expected cost of a spurious stop below it stays under ``gram_error``: ``e_F(r) + p(r) e_ptr``
    with ``p(r) = 1 - (1 - q)^i``, ``i`` the grid radii below ``r`` (each passes AboveThreshold on
    a weight of 0 with probability ``q``, :func:`~.auto_guard.spurious_stop_bound` per radius),
    and ``e_ptr`` the Gram candidate's predicted error at what a failed test leaves it
    (``ptr_error``). 0 if none: every block then loses. Public given the released estimate."""
    params: Any = friendly.params
    steps = radius_steps(params.aggregator)
    r_max = math.sqrt(2.0 * k) if params.aggregator == "projection" else math.sqrt(params.q * d)
    q = min(1.0, spurious_stop_bound(friendly) / (steps + 1))
    best = 0.0
    for i, radius in enumerate(radius_grid(r_max, steps)):
        stop = 1.0 - (1.0 - q) ** i
        if predicted_friendly_error(friendly, float(radius), d, k) + stop * ptr_error < gram_error:
            best = float(radius)
    return best


def count_says_friendly(
    data: FloatArray,
    k: int,
    counted: CountPath,
    errors: tuple[float, float],
    clip_norm: float,
    rng: np.random.Generator,
    units: npt.NDArray[np.int64] | None = None,
) -> tuple[bool, dict[str, Any]]:
    """Whether the noisy count of blocks predicting a loss is below ``t/2``: a block loses if
    its predicted search radius ``RADIUS_RATIO r_b`` (in friendly's metric) is above
    :func:`threshold_radius` against ``errors`` (the Gram candidate's predicted error at
    ``counted.default``'s budget and after a failed test); with what the extras show (the
    count's epsilon, ``t`` and ``r'``)."""
    friendly = counted.path.run
    params: Any = friendly.params
    t, d = int(params.t), data.shape[1]
    # friendly's own metric: reference points scale distances by sqrt(q)
    scale = 1.0 if params.aggregator == "projection" else math.sqrt(params.q or 2 * k)
    r_star = threshold_radius(friendly, *errors, d, k)
    radii = RADIUS_RATIO * scale * block_radii(data, k, t, clip_norm, rng, units)
    losing = int(np.count_nonzero(radii > r_star))
    noisy = losing + float(laplace(1.0 / counted.epsilon, rng))
    # as for the weight check, only the decision leaves (no noisy statistic is released)
    shown = {
        "count_epsilon": counted.epsilon,
        "blocks": t,
        "threshold_radius": float(f"{r_star:.3g}"),
    }
    return noisy < t / 2.0, shown


def count_sentence(counted: CountPath, gram: str) -> str:
    """The dry run's account of the count (friendly wins only at the tail's optimistic end)."""
    params: Any = counted.path.run.params
    t = int(params.t)
    return (
        f" unless friendly_aggregate wins at the optimistic end: then a count of {t} blocks of "
        f"rows whose own tail predicts friendly loses, with Laplace noise of scale "
        f"{1.0 / counted.epsilon:.4g} (epsilon {counted.epsilon:.4g}, pure), decides: below "
        f"{t / 2:g}, friendly_aggregate with epsilon {counted.path.run.epsilon:.4g}, else {gram} "
        f"with epsilon {counted.default.epsilon:.4g}."
    )
