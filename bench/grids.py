"""One cell of ``auto``'s benchmark grid: the data, one release as the service runs it, and the
random baseline.

Shared by the grid (``bench/bench_auto_grid.py``) and the tests that re-run some of its cells
(``tests/mechanisms/test_auto.py``, ``tests/mechanisms/test_auto_staged.py``). ``near_subspace``
is ``bench.core``'s generator (the same draws for the same seed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from bench.core import near_subspace
from service.mechanisms.base import InvalidParameter, PublicContext, ReleaseSpec
from service.mechanisms.linalg import subspace_distance
from service.mechanisms.registry import get_mechanism

__all__ = [
    "CLIP",
    "DELTA",
    "MEMORY_LIMIT_BYTES",
    "K",
    "Outcome",
    "near_subspace",
    "random_error",
    "run_one",
]

K, DELTA, CLIP = 3, 1e-6, 1.0
#: The worker's default memory gate (``DPSS_WORKER_MEMORY_MB`` = 6144).
MEMORY_LIMIT_BYTES = 6144 * 1024 * 1024


@dataclass(frozen=True)
class Outcome:
    status: str  # succeeded, no_result, refused, skipped
    error: float
    seconds: float
    note: str = ""


def run_one(
    name: str,
    params: dict[str, Any],
    data: np.ndarray,
    basis: np.ndarray,
    epsilon: float,
    seed: int,
) -> Outcome:
    """One release through the registry, as the service runs it."""
    mechanism = get_mechanism(name)
    if mechanism is None:
        return Outcome("skipped", float("nan"), 0.0, "not registered")
    n, d = data.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=CLIP)
    try:
        parsed = mechanism.parse_params(params)
        resolved = mechanism.prepare(ctx, K, epsilon, DELTA, parsed)
    except (InvalidParameter, ValidationError) as exc:
        return Outcome("refused", float("nan"), 0.0, str(exc).splitlines()[0][:120])
    spec = ReleaseSpec(k=K, epsilon=epsilon, delta=DELTA, params=resolved)
    if mechanism.memory_bytes(ctx, spec) > MEMORY_LIMIT_BYTES:
        return Outcome("refused", float("nan"), 0.0, "memory gate")
    start = time.perf_counter()
    output = mechanism.run(data, spec, np.random.default_rng(10_000 + seed))
    seconds = time.perf_counter() - start
    # the choice of auto and the released search exponents (for calibrating auto's rule)
    keys = ("auto_choice", "auto_search", "radius_exponent", "width_exponent", "t")
    note = " ".join(f"{key}={output.extras[key]}" for key in keys if key in output.extras)
    if output.basis is None:
        return Outcome("no_result", 1.0, seconds, note)
    return Outcome("succeeded", subspace_distance(output.basis, basis), seconds, note)


def random_error(d: int, basis: np.ndarray, seed: int) -> float:
    """The error of a Haar-random ``K``-dim subspace: what a ``no_result`` leaves an analyst."""
    rng = np.random.default_rng(20_000 + seed)
    q, _ = np.linalg.qr(rng.standard_normal((d, K)))
    return subspace_distance(q, basis)
