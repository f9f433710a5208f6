"""What every section of the harness shares: data, one mechanism call, metrics, results, stats.

Mechanisms are called only through their public interface (the registry, ``parse_params``,
``prepare``, ``memory_bytes``, ``run``), as the worker does, so the harness measures whatever
the registry holds after a merge: a new mechanism appears in every table without a change here.
"""

from __future__ import annotations

import csv
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from service.config import Settings
from service.mechanisms.base import (
    InvalidParameter,
    Mechanism,
    MechanismOutput,
    PublicContext,
    ReleaseSpec,
)
from service.mechanisms.linalg import subspace_distance
from service.mechanisms.registry import MECHANISMS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs"
IMG = DOCS / "img"

#: The row norm bound of every synthetic dataset (rows are generated with norm <= 1).
CLIP = 1.0
#: Name of the non-private floor in the tables (exact top-k eigenvectors of ``X^T X``).
NONPRIVATE = "nonprivate_pca"

FloatArray = np.ndarray[Any, np.dtype[np.float64]]


# ---------------------------------------------------------------------------------------------
# Data


def near_subspace(
    n: int, d: int, k: int, distance: float, seed: int, mean_norm: float = 0.0
) -> tuple[FloatArray, FloatArray]:
    """``n x d`` rows within exactly ``distance`` of a random ``k``-dim subspace (seed 001, Sec. 6).

    Each row is a point of the subspace (a random direction, norm uniform in [0.2, 0.9], times
    ``1 - mean_norm``, plus a fixed point of the subspace of norm ``mean_norm``, so that the
    data's mean is not ~0 when ``mean_norm > 0``) plus a residual orthogonal to the subspace of
    norm exactly ``distance``: every row has norm below 1 = the public bound ``CLIP``. Returns
    the rows and the planted ``d x k`` orthonormal basis.
    """
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((d, k)))
    coords = rng.standard_normal((n, k))
    radius = rng.uniform(0.2, 0.9, (n, 1)) * (1.0 - mean_norm)
    coords *= radius / np.linalg.norm(coords, axis=1, keepdims=True)
    if mean_norm > 0:
        centre = rng.standard_normal(k)
        coords += mean_norm * centre / np.linalg.norm(centre)
    rows = rng.standard_normal((n, d))
    rows -= (rows @ basis) @ basis.T
    rows *= distance / np.linalg.norm(rows, axis=1, keepdims=True)
    rows += coords @ basis.T
    return rows, basis


@dataclass
class Reference:
    """Non-private facts about a dataset, for scoring only (never passed to a mechanism)."""

    top: FloatArray  # d x k top eigenvectors of X^T X
    captured_top: float  # ||X V_k||_F^2
    gamma: float  # sqrt(lambda_{k+1} / lambda_k): the "true gap" histogram_aggregate may need


def reference(data: FloatArray, k: int) -> Reference:
    """Exact top-k of ``X^T X`` (the floor all private mechanisms are compared with)."""
    gram = data.T @ data
    values, vectors = np.linalg.eigh(gram)
    order = np.argsort(values)[::-1]
    values, vectors = values[order], vectors[:, order]
    top = vectors[:, :k]
    lam_k, lam_next = float(values[k - 1]), float(values[k]) if len(values) > k else 0.0
    gamma = math.sqrt(max(lam_next, 0.0) / lam_k) if lam_k > 0 else 1.0
    return Reference(top=top, captured_top=float(np.sum(values[:k])), gamma=gamma)


def captured(data: FloatArray, basis: FloatArray) -> float:
    """``||X U||_F^2``: the variance (second moment) a basis captures."""
    projected = data @ basis
    return float(np.einsum("ij,ij->", projected, projected))


# ---------------------------------------------------------------------------------------------
# One mechanism call through the public interface


@dataclass
class Outcome:
    """What one call of a mechanism gave."""

    status: str  # succeeded | no_result | refused | failed | timeout | unavailable | skipped
    basis: FloatArray | None = None
    seconds: float = float("nan")
    reason: str = ""
    params: str = ""
    memory_bytes: int | None = None


#: ``--mechanisms``: run only these in the accuracy sections (``None``: every one), e.g. to
#: re-measure one changed mechanism and splice its rows into an earlier run's CSVs.
ONLY_MECHANISMS: frozenset[str] | None = None


def basis_mechanisms() -> dict[str, Mechanism[Any]]:
    """Registered mechanisms that release a basis from one dataset (the accuracy tables)."""
    return {
        name: mech
        for name, mech in MECHANISMS.items()
        if mech.releases_basis
        and not getattr(mech, "continual", False)
        and (ONLY_MECHANISMS is None or name in ONLY_MECHANISMS)
    }


def skipped_mechanisms() -> dict[str, str]:
    """Registered mechanisms the accuracy tables cannot score, with the reason shown instead."""
    notes: dict[str, str] = {}
    for name, mech in MECHANISMS.items():
        if getattr(mech, "continual", False):
            notes[name] = "continual release over a growing dataset: not a one-shot release"
        elif not mech.releases_basis:
            notes[name] = "releases no basis (timed in the speed tables)"
    return notes


#: Params a mechanism gets in the benchmark beyond its defaults, tried in order: the first the
#: mechanism accepts runs. Empty since ``histogram_aggregate`` searches its cell width privately
#: when no ``gamma`` is given: it used to get the *true* gap here (an oracle a user does not
#: have); rows from those runs say ``oracle gamma`` in their params column and the report labels
#: them ``histogram_aggregate (oracle gamma)``.
FALLBACK_PARAMS: dict[str, Callable[[Reference], dict[str, Any]]] = {}


def worker_memory() -> int:
    """The service's per-release memory limit (``DPSS_WORKER_MEMORY_MB``), in bytes."""
    return int(Settings().worker_memory_mb * 2**20)


def prepare(
    mech: Mechanism[Any],
    ctx: PublicContext,
    k: int,
    epsilon: float,
    delta: float,
    raw: dict[str, Any],
) -> tuple[ReleaseSpec[Any] | None, str]:
    """``(spec, "")``, or ``(None, reason)`` where the service would answer 422 (refused)."""
    try:
        params = mech.prepare(ctx, k, epsilon, delta, mech.parse_params(raw))
    except InvalidParameter as error:
        return None, f"{error.field}: {error.message}"
    except ValidationError as error:
        first = error.errors()[0]
        return None, f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    spec = ReleaseSpec(k=k, epsilon=epsilon, delta=delta, params=params)
    try:
        memory = mech.memory_bytes(ctx, spec)
    except NotImplementedError:
        memory = 0
    if memory > worker_memory():
        return None, f"memory estimate {memory / 2**20:.0f} MiB > DPSS_WORKER_MEMORY_MB"
    return spec, ""


def call(
    name: str,
    data: FloatArray,
    k: int,
    epsilon: float,
    delta: float,
    seed: int,
    ref: Reference | None = None,
    clip: float = CLIP,
    extra: dict[str, Any] | None = None,
) -> Outcome:
    """Run registered mechanism ``name`` on ``data`` as a release would, timed.

    A refusal at ``prepare`` (the service's 422, before any charge) is ``refused``; an
    exception inside ``run`` is ``failed`` (a mechanism must be total, so that is a bug to
    report, not a figure).
    """
    mech = MECHANISMS[name]
    n, d = data.shape
    ctx = PublicContext(n_rows=n, n_cols=d, row_norm_bound=clip)
    candidates: list[tuple[dict[str, Any], str]] = [(dict(extra or {}), "defaults")]
    if name in FALLBACK_PARAMS and ref is not None:
        oracle = FALLBACK_PARAMS[name](ref)
        candidates.append(({**(extra or {}), **oracle}, "oracle " + ",".join(oracle)))
    spec, reason, label = None, "", ""
    for raw, tried in candidates:
        spec, reason = prepare(mech, ctx, k, epsilon, delta, raw)
        label = tried
        if spec is not None:
            break
    if spec is None:
        return Outcome("refused", reason=reason, params=label)
    try:
        memory: int | None = mech.memory_bytes(ctx, spec)
    except NotImplementedError:
        memory = None
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    try:
        out: MechanismOutput = mech.run(data, spec, rng)
    except Exception as error:  # a bug in a mechanism: reported, never hidden
        return Outcome("failed", reason=f"{type(error).__name__}: {error}", params=label)
    seconds = time.perf_counter() - start
    if out.basis is None:
        status = "no_result" if mech.releases_basis else "succeeded"
        return Outcome(
            status, seconds=seconds, reason=out.no_result_reason or "", params=label,
            memory_bytes=memory,
        )  # fmt: skip
    return Outcome("succeeded", out.basis, seconds, params=label, memory_bytes=memory)


class SlowGuard:
    """Keeps one slow, fruitless mechanism from eating the run's time budget.

    When a mechanism's first repetition in a cell took longer than ``limit`` seconds and gave no
    basis (``exact_gapmax`` on data that is not exactly low-rank spends its whole compute cap to
    end ``no_result``), its later repetitions of that cell are recorded as ``skipped`` with the
    reason, not run. The tables show the split (for example ``1/3 no_result, 2/3 skipped``).
    """

    #: ``--quick`` sets one guard for the whole run that ignores cells: a slow, fruitless
    #: mechanism then runs once per run, not once per cell.
    shared: SlowGuard | None = None

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._slow: dict[tuple[object, ...], str] = {}

    @classmethod
    def for_section(cls, limit: float) -> SlowGuard:
        return cls.shared or cls(limit)

    def _key(self, name: str, cell: tuple[object, ...]) -> tuple[object, ...]:
        return (name,) if self is SlowGuard.shared else (name, *cell)

    def skip(self, name: str, cell: tuple[object, ...]) -> str:
        """Why ``name`` is not run again in ``cell`` (empty: run it)."""
        return self._slow.get(self._key(name, cell), "")

    def record(self, name: str, cell: tuple[object, ...], outcome: Outcome) -> Outcome:
        if outcome.status != "succeeded" and outcome.seconds > self.limit:
            self._slow[self._key(name, cell)] = (
                f"not repeated: the first run took {outcome.seconds:.0f} s and ended "
                f"{outcome.status}"
            )
        return outcome

    def call(self, name: str, cell: tuple[object, ...], *args: Any, **kwargs: Any) -> Outcome:
        """:func:`call`, unless this cell already showed ``name`` slow and fruitless."""
        reason = self.skip(name, cell)
        if reason:
            return Outcome("skipped", reason=reason)
        return self.record(name, cell, call(name, *args, **kwargs))


# ---------------------------------------------------------------------------------------------
# Results: one row per (section, cell, mechanism, repetition)


@dataclass
class Row:
    """One result; the CSV columns (``bench/results/*.csv``) are these fields, in this order."""

    section: str
    mechanism: str
    dataset: str
    d: int
    n: int
    distance: float
    epsilon: float
    delta: float
    k: int
    rep: int
    status: str
    error_planted: float = float("nan")
    error_nonprivate: float = float("nan")
    captured: float = float("nan")
    seconds: float = float("nan")
    ratio: float = float("nan")
    memory_ratio: float = float("nan")
    centered: str = ""
    params: str = ""
    reason: str = ""


COLUMNS = [f.name for f in fields(Row)]


def score(
    row: Row,
    outcome: Outcome,
    data: FloatArray,
    ref: Reference,
    planted: FloatArray | None,
) -> Row:
    """Fill ``row``'s accuracy columns from ``outcome`` (a no-result leaves them empty)."""
    row.status, row.seconds, row.params, row.reason = (
        outcome.status,
        outcome.seconds,
        outcome.params,
        outcome.reason[:200],
    )
    if outcome.basis is not None:
        if planted is not None:
            row.error_planted = subspace_distance(outcome.basis, planted)
        row.error_nonprivate = subspace_distance(outcome.basis, ref.top)
        row.captured = captured(data, outcome.basis) / ref.captured_top
    return row


def write_csv(path: Path, rows: Iterable[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: _fmt(value) for key, value in asdict(row).items()})


def read_csv(path: Path) -> list[Row]:
    out = []
    with path.open() as handle:
        for record in csv.DictReader(handle):
            values: dict[str, Any] = {}
            for f in fields(Row):
                raw = record[f.name]
                if f.type == "int":
                    values[f.name] = int(raw)
                elif f.type == "float":
                    values[f.name] = float(raw) if raw else math.nan
                else:
                    values[f.name] = raw
            out.append(Row(**values))
    return out


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


# ---------------------------------------------------------------------------------------------
# Statistics and display


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """``(median, low, high)``: the median and the interquartile range (min-max below 4 values)."""
    finite = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if finite.size == 0:
        return math.nan, math.nan, math.nan
    if finite.size < 4:
        return float(np.median(finite)), float(finite.min()), float(finite.max())
    q1, q2, q3 = np.percentile(finite, [25, 50, 75])
    return float(q2), float(q1), float(q3)


def show(values: Sequence[float], digits: int = 2, unit: str = "") -> str:
    """``median [low, high]`` of finite values, or an em dash."""
    median, low, high = spread(values)
    if math.isnan(median):
        return "—"
    if len([v for v in values if not math.isnan(v)]) == 1:
        return f"{median:.{digits}g}{unit}"
    return f"{median:.{digits}g}{unit} [{low:.{digits}g}, {high:.{digits}g}]"


def cell_summary(rows: Sequence[Row], metric: str) -> str:
    """A table cell: the metric's median [spread] over the succeeded runs, and what else ran."""
    ok = [getattr(r, metric) for r in rows if r.status == "succeeded"]
    counts: dict[str, int] = {}
    for r in rows:
        if r.status != "succeeded":
            counts[r.status] = counts.get(r.status, 0) + 1
    text = show(ok) if ok else ""
    reasons = {r.reason for r in rows if r.status != "succeeded"}
    if not ok and len(counts) == 1 and len(reasons) == 1 and 0 < len(next(iter(reasons))) <= 20:
        return next(iter(reasons))  # e.g. "cannot centre": clearer than "5/5 skipped"
    others = ", ".join(f"{c}/{len(rows)} {s}" for s, c in sorted(counts.items()))
    if others:
        text = f"{text} ({others})" if text else others
    return text or "—"


def table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (also readable in a terminal)."""
    lines = ["| " + " | ".join(str(h) for h in header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines.extend("| " + " | ".join(str(c) for c in line) + " |" for line in body)
    return "\n".join(lines)


@dataclass
class Progress:
    """One line per finished cell on stderr: where the run is, and how long it has taken."""

    total: int
    label: str
    done: int = 0
    started: float = field(default_factory=time.perf_counter)

    def step(self, what: str) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.started
        print(
            f"[{self.label} {self.done}/{self.total} {elapsed:6.1f}s] {what}",
            file=sys.stderr,
            flush=True,
        )
