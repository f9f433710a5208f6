"""Accuracy sections: the synthetic grid, real datasets, and the downstream mean task.

Every registered mechanism that releases a basis runs through its public interface at the same
``(epsilon, delta)``; the non-private top-k of ``X^T X`` is the floor, the peers (pure DP) run on
the cells listed in the config. Scores: ``||Pi_hat - Pi||_2`` against the planted subspace and
against the non-private top-k, and the variance captured relative to non-private PCA.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.core import (
    CLIP,
    NONPRIVATE,
    FloatArray,
    Outcome,
    Progress,
    Reference,
    Row,
    SlowGuard,
    basis_mechanisms,
    captured,
    near_subspace,
    reference,
    score,
)
from bench.peers import Fit, PeerEnvs, fit_all
from service.mechanisms.linalg import subspace_distance
from service.mechanisms.noise import analytic_gaussian_sigma


def seed_of(*parts: object) -> int:
    """A fixed seed per cell (stable across runs and Python versions).

    The mechanisms' seeds leave out the mechanism's name (common random numbers): in one cell
    and repetition every mechanism gets the same generator, so differences between them are
    the mechanisms', not their draws' (``auto`` running ``analyze_gauss`` with the whole budget
    releases exactly what ``analyze_gauss`` does).
    """
    return zlib.crc32("-".join(str(p) for p in parts).encode())


@dataclass(frozen=True)
class SyntheticGrid:
    ds: tuple[int, ...]
    distances: tuple[float, ...]
    ns: tuple[int, ...]
    epsilons: tuple[float, ...]
    reps: int
    k: int = 3
    delta: float = 1e-6
    #: ``(d, n)`` cells where the peers also run (all distances and epsilons of the grid).
    peer_cells: tuple[tuple[int, int], ...] = ()
    peer_limit: float = 60.0
    #: Repetitions on which the peers run (their fits are slow; all of ``reps`` when larger).
    peer_reps: int = 1
    #: See :class:`bench.core.SlowGuard`.
    slow_limit: float = 5.0
    #: Only the peers (no floor, no registered mechanism): their rows alone, for a
    #: ``synthetic_<tag>.csv`` next to the mechanisms' (``--peers-only``).
    peers_only: bool = False
    #: Which peers run (``--peers``).
    peers: tuple[str, ...] = ("diffprivlib", "opendp")


def synthetic(grid: SyntheticGrid, peers: PeerEnvs | None) -> list[Row]:
    """The grid of issue 16: error and captured variance per mechanism, epsilon and repetition."""
    mechanisms = {} if grid.peers_only else basis_mechanisms()
    cells = [(d, n, dist) for d in grid.ds for n in grid.ns for dist in grid.distances]
    progress = Progress(len(cells) * grid.reps, "synthetic")
    rows: list[Row] = []
    pending: list[tuple[Row, Fit, str, FloatArray, Reference, FloatArray | None]] = []
    guard = SlowGuard.for_section(grid.slow_limit)
    for d, n, dist in cells:
        for rep in range(grid.reps):
            data, planted = near_subspace(n, d, grid.k, dist, seed_of("syn", d, n, dist, rep))
            ref = reference(data, grid.k)

            def row(
                mechanism: str, epsilon: float, status: str = "",
                d: int = d, n: int = n, dist: float = dist, rep: int = rep,
            ) -> Row:  # fmt: skip
                return Row(
                    "synthetic", mechanism, "near_subspace", d, n, dist, epsilon, grid.delta,
                    grid.k, rep, status,
                )  # fmt: skip

            if not grid.peers_only:
                floor = row(NONPRIVATE, math.nan, "succeeded")
                floor.error_planted = subspace_distance(ref.top, planted)
                floor.error_nonprivate, floor.captured = 0.0, 1.0
                rows.append(floor)
            for epsilon in grid.epsilons:
                for name in mechanisms:
                    seed = seed_of("run", d, n, dist, rep, epsilon)
                    # The guard's cell leaves out the repetition: a mechanism that spent its
                    # compute cap on a fruitless run is run once per (d, n, distance, eps).
                    outcome = guard.call(
                        name, (d, n, dist, epsilon), data, grid.k, epsilon, grid.delta, seed, ref
                    )
                    rows.append(score(row(name, epsilon), outcome, data, ref, planted))
                if peers is not None and (d, n) in grid.peer_cells and rep < grid.peer_reps:
                    for peer in grid.peers:
                        fit = Fit(
                            data, grid.k, epsilon, CLIP, True, seed_of(peer, rep),
                            group=f"{d}-{n}-{dist}-{epsilon}",
                        )  # fmt: skip
                        peer_row = row(peer, epsilon)
                        peer_row.delta = 0.0
                        pending.append((peer_row, fit, peer, data, ref, planted))
            progress.step(f"d={d} n={n} distance={dist:g} rep={rep}")
    rows.extend(_run_peers(pending, peers, grid.peer_limit))
    return rows


def _run_peers(
    pending: list[tuple[Row, Fit, str, FloatArray, Reference, FloatArray | None]],
    peers: PeerEnvs | None,
    limit: float,
) -> list[Row]:
    """Run the queued peer fits (one subprocess per peer) and score them."""
    if peers is None or not pending:
        return []
    out: list[Row] = []
    for peer in ("diffprivlib", "opendp"):
        mine = [p for p in pending if p[2] == peer]
        if not mine:
            continue
        progress = Progress(1, "peers")
        outcomes = fit_all(peers.get(peer), peer, [p[1] for p in mine], limit)
        for (row, _, _, data, ref, planted), outcome in zip(mine, outcomes, strict=True):
            out.append(score(row, outcome, data, ref, planted))
        statuses = sorted({o.status for o in outcomes})
        progress.step(f"{peer}: {len(mine)} fits ({', '.join(statuses)})")
    return out


# ---------------------------------------------------------------------------------------------
# Real data that ships inside scikit-learn


def real_datasets(names: tuple[str, ...]) -> dict[str, tuple[FloatArray, float]]:
    """Each dataset scaled into ``[0, 1]`` per feature, with its public row norm bound.

    digits: pixel values are 0..16 by construction (public), divided by 16. breast_cancer and
    wine: min-max scaled with the features' ranges, which the benchmark treats as public
    bounds (as diffprivlib's ``bounds`` do); a real deployment would declare them. Every row then
    has norm at most ``sqrt(d)``, the bound ``C`` the mechanisms clip to.
    """
    from sklearn import datasets  # type: ignore[import-untyped]

    out: dict[str, tuple[FloatArray, float]] = {}
    for name in names:
        raw = np.asarray(getattr(datasets, f"load_{name}")().data, dtype=float)
        if name == "digits":
            scaled = raw / 16.0
        else:
            low, high = raw.min(axis=0), raw.max(axis=0)
            scaled = (raw - low) / np.where(high > low, high - low, 1.0)
        out[name] = (scaled, math.sqrt(raw.shape[1]))
    return out


#: The real section's baseline: a Haar-random ``k``-dim subspace (no data, no budget).
RANDOM = "random"


def haar_basis(d: int, k: int, seed: int) -> FloatArray:
    """An orthonormal ``d x k`` basis of a uniformly (Haar) distributed ``k``-dim subspace.

    ``Q`` of the QR of a standard Gaussian ``d x k`` matrix, with the signs of ``R``'s diagonal
    moved into ``Q``'s columns, is Haar-distributed on the Stiefel manifold; its span is then
    uniform on the Grassmannian.
    """
    gauss = np.random.default_rng(seed).standard_normal((d, k))
    q, r = np.linalg.qr(gauss)
    return np.asarray(q * np.where(np.diag(r) < 0, -1.0, 1.0))


def supports_centring(name: str) -> bool:
    from service.mechanisms.registry import MECHANISMS

    return "center" in MECHANISMS[name].params_model.model_fields


def real(
    names: tuple[str, ...],
    epsilons: tuple[float, ...],
    reps: int,
    peers: PeerEnvs | None,
    peer_epsilons: tuple[float, ...],
    peer_limit: float,
    k: int = 3,
    delta: float = 1e-6,
    peer_reps: int = 1,
    peers_only: bool = False,
    peer_names: tuple[str, ...] = ("diffprivlib", "opendp"),
) -> list[Row]:
    """Captured variance against epsilon on real data, centred (PCA) and not (second moment).

    Centred: the mechanisms that can centre get ``center: "private"`` (a share of the budget on
    a private mean); the reference is the non-private PCA of the data centred on its own mean.
    A mechanism without centring is ``skipped`` there. Uncentred: the top-k of ``X^T X``.
    ``peers_only``: the peers' rows alone (no floor, no registered mechanism).
    """
    mechanisms = {} if peers_only else basis_mechanisms()
    rows: list[Row] = []
    pending: list[tuple[Row, Fit, str, FloatArray, Reference, FloatArray | None]] = []
    sets = real_datasets(names)
    guard = SlowGuard.for_section(5.0)
    progress = Progress(len(sets) * 2, "real")
    for dataset, (data, clip) in sets.items():
        n, d = data.shape
        for centred in (False, True):
            scored = data - data.mean(axis=0) if centred else data
            ref = reference(scored, k)
            tag = "yes" if centred else "no"

            def row(
                mechanism: str, epsilon: float, rep: int, status: str = "",
                dataset: str = dataset, d: int = d, n: int = n, tag: str = tag,
            ) -> Row:  # fmt: skip
                return Row(
                    "real", mechanism, dataset, d, n, math.nan, epsilon, delta, k, rep, status,
                    centered=tag,
                )  # fmt: skip

            if not peers_only:
                floor = row(NONPRIVATE, math.nan, 0, "succeeded")
                floor.error_nonprivate, floor.captured = 0.0, 1.0
                rows.append(floor)
            for epsilon in epsilons:
                for rep in range(reps):
                    if not peers_only:
                        # The baseline a mechanism must beat: a subspace drawn without looking
                        # at the data (free of privacy cost), the same draw at every epsilon.
                        basis = haar_basis(d, k, seed_of("random", dataset, tag, rep))
                        rows.append(
                            score(
                                row(RANDOM, epsilon, rep),
                                Outcome("succeeded", basis, params="Haar-random"),
                                scored, ref, None,
                            )
                        )  # fmt: skip
                    for name in mechanisms:
                        if centred and not supports_centring(name):
                            rows.append(skipped(row(name, epsilon, rep), "cannot centre"))
                            continue
                        extra: dict[str, Any] = {"center": "private"} if centred else {}
                        seed = seed_of("real", dataset, tag, epsilon, rep)
                        outcome = guard.call(
                            name, (dataset,), data, k, epsilon, delta, seed, ref,
                            clip, extra,
                        )  # fmt: skip
                        # Scored on the data as the reference sees it (centred on its mean).
                        rows.append(score(row(name, epsilon, rep), outcome, scored, ref, None))
                    if peers is not None and epsilon in peer_epsilons and rep < peer_reps:
                        for peer in peer_names:
                            if peer == "opendp" and not centred:
                                rows.append(skipped(row(peer, epsilon, rep), "always centres"))
                                continue
                            # diffprivlib: centered=True means "already centred": no mean is
                            # spent, the uncentred second moment; False: a private mean first.
                            fit = Fit(
                                data, k, epsilon, clip, not centred, seed_of(peer, rep),
                                group=f"{dataset}-{tag}-{epsilon}",
                            )  # fmt: skip
                            peer_row = row(peer, epsilon, rep)
                            peer_row.delta = 0.0
                            pending.append((peer_row, fit, peer, scored, ref, None))
            progress.step(f"{dataset} ({n} x {d}) centred={tag}")
    rows.extend(_run_peers(pending, peers, peer_limit))
    return rows


def skipped(row: Row, reason: str) -> Row:
    """``row`` marked as not run, with why."""
    row.status, row.reason = "skipped", reason
    return row


# ---------------------------------------------------------------------------------------------
# The downstream task of seed 001, Section 6: a private mean of points near a subspace


def gaussian_mean(
    points: FloatArray, clip: float, epsilon: float, delta: float, rng: np.random.Generator
) -> FloatArray:
    """Mean of rows of norm ``<= clip`` plus Gaussian noise for l2 sensitivity ``2 clip / n``.

    Replacing one row moves the mean by ``(a - b)/n``, of norm ``<= 2 clip / n``; ``sigma`` is
    the analytic-Gaussian scale for that sensitivity at ``(epsilon, delta)`` (ALGORITHMS.md).
    """
    n, dim = points.shape
    norms = np.linalg.norm(points, axis=1, keepdims=True)
    clipped = points * np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    sigma = analytic_gaussian_sigma(2.0 * clip / n, epsilon, delta)
    return np.asarray(clipped.mean(axis=0) + rng.normal(0.0, sigma, dim))


def downstream(
    ds: tuple[int, ...],
    reps: int,
    n: int = 30_000,
    distance: float = 1e-5,
    k: int = 3,
    epsilon: float = 1.0,
    delta: float = 1e-6,
) -> list[Row]:
    """Private mean of ``n`` points within ``distance`` of a ``k``-dim subspace of ``R^d``.

    Pipeline per mechanism: its basis ``U`` with ``(eps/2, delta/2)``, then the Gaussian mean of
    the coordinates ``X U`` (rows of norm ``<= C`` since ``U`` is orthonormal) with
    ``(eps/2, delta/2)``, mapped back by ``U``; basic composition gives ``(eps, delta)``.
    Against ``plain`` (the Gaussian mean in ``R^d`` with all of ``(eps, delta)``) and ``oracle``
    (the true subspace, the mean in it with all of ``(eps, delta)``; not private about the
    subspace, a lower reference). The score, in ``error_planted``, is ``||mu_hat - mean(X)||_2``.
    """
    mechanisms = basis_mechanisms()
    rows: list[Row] = []
    progress = Progress(len(ds) * reps, "downstream")
    guard = SlowGuard.for_section(5.0)
    for d in ds:
        for rep in range(reps):
            # A mean of norm 0.5 inside the subspace: with a mean near 0 (the grid's data) any
            # basis gives a good mean, and the task would not show the subspace's quality.
            data, planted = near_subspace(n, d, k, distance, seed_of("mean", d, rep), mean_norm=0.5)
            truth = data.mean(axis=0)
            ref = reference(data, k)
            rng = np.random.default_rng(seed_of("mean-noise", d, rep))

            def row(
                mechanism: str, status: str, error: float, seconds: float = math.nan,
                d: int = d, rep: int = rep,
            ) -> Row:  # fmt: skip
                made = Row(
                    "downstream", mechanism, "near_subspace", d, n, distance, epsilon, delta,
                    k, rep, status,
                )  # fmt: skip
                made.error_planted, made.seconds = error, seconds
                return made

            plain = gaussian_mean(data, CLIP, epsilon, delta, rng)
            rows.append(row("plain_gaussian", "succeeded", float(np.linalg.norm(plain - truth))))
            inside = gaussian_mean(data @ planted, CLIP, epsilon, delta, rng)
            oracle = planted @ inside
            rows.append(row("oracle", "succeeded", float(np.linalg.norm(oracle - truth))))
            for name in mechanisms:
                seed = seed_of("mean-run", d, rep)
                outcome: Outcome = guard.call(
                    name, (d,), data, k, epsilon / 2, delta / 2, seed, ref
                )
                if outcome.basis is None:
                    made = row(name, outcome.status, math.nan, outcome.seconds)
                    made.reason, made.params = outcome.reason[:200], outcome.params
                    rows.append(made)
                    continue
                basis = outcome.basis
                inside = gaussian_mean(data @ basis, CLIP, epsilon / 2, delta / 2, rng)
                error = float(np.linalg.norm(basis @ inside - truth))
                made = row(name, "succeeded", error, outcome.seconds)
                made.params = outcome.params
                rows.append(made)
            progress.step(f"d={d} rep={rep}")
    return rows


__all__ = [
    "RANDOM",
    "SyntheticGrid",
    "captured",
    "downstream",
    "haar_basis",
    "real",
    "synthetic",
]
