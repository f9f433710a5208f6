"""Any mechanism, run inside the span of a public prior (issue 32, item 2).

An analyst may name a public basis ``P`` (``d x m``, orthonormal columns: from public data or a
fixed transform such as a 2-D DCT). The release then runs the requested mechanism, unchanged, on
the projected rows ``Y = X P`` (``n x m``) and returns its basis in the original coordinates.

**Privacy.** ``P`` is public and fixed before the data is read, so ``x -> x P`` is a fixed map
applied to each row: neighbouring datasets (one row added, removed or replaced) map to
neighbouring projected datasets, and the mechanism's guarantee on ``Y`` is the release's
guarantee on ``X`` (post-processing of a per-row map). The map does not grow norms:
``||x P||^2 = x P P^T x <= sigma_max(P)^2 ||x||^2``, and :func:`contraction` divides ``P`` by its
largest singular value when rounding left it above 1, so ``||x P|| <= ||x||`` holds exactly and
the dataset's declared row norm bound, every clip norm and every sensitivity the mechanism
derives from them stay valid in ``m`` dimensions. The cost is the mechanism's own at ``(n, m)``,
charged in full; the prior itself costs nothing. It must not be derived from the private rows:
then it is not public and this argument does not apply.

**Utility.** The mechanism's noise is ``m``-dimensional instead of ``d``-dimensional (an
``m x m`` Gram matrix instead of ``d x d``), at the price of losing whatever of the private
subspace lies outside ``span(P)``.

**Outputs.** A released basis ``W`` (``m x k``) becomes ``P W`` (``d x k``; orthonormal up to
rounding, re-orthonormalised by a QR step that keeps its span and column order); a released
centre ``c`` (``m``) becomes ``P c``, the centre of the projected rows in the original
coordinates. Eigenvalues, the trace and explained-variance figures stay those of the projected
rows: they describe the variance inside ``span(P)``, which ``extras.prior`` says.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from service.mechanisms.base import (
    Mechanism,
    MechanismOutput,
    Preview,
    PrivacyStep,
    PublicContext,
    ReleaseSpec,
)
from service.mechanisms.linalg import DEFAULT_CHUNK_ROWS, FloatArray

#: Largest projected row norm handed to a mechanism: a row whose projection's norm is larger
#: (or not a finite double: raw entries near 1e308) is scaled down to it along its direction.
#: Every clip norm is far below it (``C^2`` stays under ``2^960``), so after clipping the row is
#: what it would have been with the exact, unrepresentable norm.
MAX_PROJECTED_NORM = 1e300


def contraction(prior: FloatArray) -> FloatArray:
    """``P`` divided by its largest singular value when that exceeds 1 (by rounding only: the
    prior was checked orthonormal to :data:`service.priors.ORTHONORMAL_TOLERANCE`), so that
    ``||x P|| <= ||x||`` for every ``x``. Public: a function of the public prior alone."""
    largest = float(np.linalg.norm(prior, 2))
    return prior / largest if largest > 1.0 else prior


def project_rows(data: Any, prior: FloatArray, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> FloatArray:
    """``X P`` (``n x m``, float64) for ``X`` (``n x d``, possibly a read-only memory map),
    one chunk of rows at a time.

    Each row is divided by its largest absolute entry before the product and multiplied back
    after, so finite rows of any magnitude (1e-300..1e300) project without overflow or loss to
    subnormals; zero rows stay zero; a row whose projection's norm exceeds
    :data:`MAX_PROJECTED_NORM` (or overflows) is scaled to it (see there). Never raises on
    finite data."""
    n = int(data.shape[0])
    out = np.empty((n, prior.shape[1]), dtype=np.float64)
    for start in range(0, n, chunk_rows):
        block = np.asarray(data[start : start + chunk_rows], dtype=np.float64)
        scale = np.max(np.abs(block), axis=1) if block.shape[1] else np.zeros(len(block))
        scale[~(scale > 0)] = 1.0
        unit = (block / scale[:, None]) @ prior
        unit_norms = np.linalg.norm(unit, axis=1)
        with np.errstate(over="ignore", invalid="ignore"):
            projected = unit * scale[:, None]
            # Rows whose norm is not a finite double, or past the cap: along their direction.
            bad = ~(unit_norms * scale <= MAX_PROJECTED_NORM)
        if np.any(bad):
            norms = unit_norms[bad]
            norms[~(norms > 0)] = 1.0
            projected[bad] = unit[bad] / norms[:, None] * MAX_PROJECTED_NORM
        out[start : start + len(block)] = projected
    return out


def lift_basis(prior: FloatArray, basis: FloatArray) -> FloatArray:
    """``P W`` with orthonormal columns: a QR step keeps the span of each leading set of columns
    and, with the signs fixed so that ``R`` has a positive diagonal, is ``P W`` itself when that
    is already orthonormal."""
    lifted = prior @ basis
    q, r = np.linalg.qr(lifted)
    signs = np.sign(np.diag(r))
    signs[signs == 0] = 1.0
    return np.ascontiguousarray(q * signs)


class _OnPrior(Mechanism[Any]):
    """The wrapper; built by :func:`on_prior`, which gives it the inner mechanism's names."""

    def __init__(self, inner: Mechanism[Any], prior: FloatArray, sha256: str) -> None:
        self.inner = inner
        self.prior = contraction(np.asarray(prior, dtype=np.float64))
        self.sha256 = sha256
        self.dimension = int(self.prior.shape[1])

    def inside(self, ctx: PublicContext) -> PublicContext:
        """The public facts of the projected rows: ``m`` columns, the same ``n`` and bound."""
        return replace(ctx, n_cols=self.dimension)

    def parse_params(self, raw: dict[str, Any]) -> Any:
        return self.inner.parse_params(raw)

    def for_accounting(self, accounting: str, params: Any) -> Any:
        return self.inner.for_accounting(accounting, params)

    def prepare(self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: Any) -> Any:
        return self.inner.prepare(self.inside(ctx), k, epsilon, delta, params)

    def privacy_steps(self, ctx: PublicContext, spec: ReleaseSpec[Any]) -> list[PrivacyStep] | None:
        return self.inner.privacy_steps(self.inside(ctx), spec)

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[Any]) -> int:
        # The projected rows are held in memory (n x m doubles) with one chunk of raw rows.
        projected = 8 * ctx.n_rows * self.dimension
        chunk = 8 * min(ctx.n_rows, DEFAULT_CHUNK_ROWS) * (ctx.n_cols + self.dimension)
        return self.inner.memory_bytes(self.inside(ctx), spec) + projected + chunk

    def preview(self, ctx: PublicContext, spec: ReleaseSpec[Any]) -> Preview:
        shown = self.inner.preview(self.inside(ctx), spec)
        scales = {**shown.scales, "prior_dimension": self.dimension, "prior_sha256": self.sha256}
        meaning = [
            f"Public prior (sha256 {self.sha256[:12]}...): the rows are projected onto its "
            f"{self.dimension} orthonormal columns and the subspace is estimated inside their "
            f"span, with noise in {self.dimension} dimensions instead of {ctx.n_cols}; the "
            "prior costs nothing, and what lies outside its span is not found.",
            *shown.meaning,
        ]
        return Preview(scales=scales, meaning=meaning)

    def run(self, data: Any, spec: ReleaseSpec[Any], rng: np.random.Generator) -> MechanismOutput:
        return self.around(data, lambda projected: self.inner.run(projected, spec, rng))

    def around(
        self, data: Any, run_inner: Callable[[FloatArray], MechanismOutput]
    ) -> MechanismOutput:
        """``run_inner`` on the rows projected onto the prior (``n x m``), its basis and centre
        lifted back to ``d`` dimensions: how :meth:`run` runs the inner mechanism, and how a
        caller that runs it its own way (per person: :func:`run_inside`) does."""
        projected = project_rows(data, self.prior)
        output = run_inner(projected)
        extras = dict(output.extras)
        center = extras.get("center")
        if isinstance(center, list) and len(center) == self.dimension:
            extras["center"] = (self.prior @ np.asarray(center, dtype=np.float64)).tolist()
        extras["prior"] = {
            "sha256": self.sha256,
            "dimension": self.dimension,
            "variance_figures": "of the rows projected onto the prior's span",
        }
        basis = None if output.basis is None else lift_basis(self.prior, output.basis)
        return MechanismOutput(basis=basis, extras=extras, no_result_reason=output.no_result_reason)


def columns_inside(mechanism: Mechanism[Any], n_cols: int) -> int:
    """The number of columns ``mechanism`` runs in: the prior's ``m`` for a mechanism from
    :func:`on_prior`, else the dataset's ``n_cols`` (what a caller stating figures of the run
    outside the mechanism's own preview must use)."""
    return mechanism.dimension if isinstance(mechanism, _OnPrior) else n_cols


def unwrapped(mechanism: Mechanism[Any]) -> tuple[Mechanism[Any], str | None]:
    """The mechanism that runs inside a prior and the prior's SHA-256 (``mechanism`` from
    :func:`on_prior`), or ``mechanism`` itself and ``None`` without a prior: for a caller that
    dispatches on the mechanism's type (the dry run's forecast from an earlier release)."""
    if isinstance(mechanism, _OnPrior):
        return mechanism.inner, mechanism.sha256
    return mechanism, None


def run_inside(
    mechanism: Mechanism[Any],
    data: Any,
    run: Callable[[Mechanism[Any], Any], MechanismOutput],
) -> MechanismOutput:
    """``run(inner, rows)`` for a caller that runs a mechanism its own way (the per-person runs
    of :mod:`service.oneshot`, which dispatch on the mechanism's type or name): with a prior
    (``mechanism`` from :func:`on_prior`), the inner mechanism on the projected rows and the
    output lifted, as :meth:`_OnPrior.run` does; otherwise ``run(mechanism, data)``. The
    projection is a public per-row map (``y = P^T x``, ``||y|| <= ||x||``), so a per-person
    argument on the rows holds on the projected rows."""
    if isinstance(mechanism, _OnPrior):
        inner = mechanism.inner
        return mechanism.around(data, lambda projected: run(inner, projected))
    return run(mechanism, data)


def on_prior(inner: Mechanism[Any], prior: FloatArray, sha256: str) -> Mechanism[Any]:
    """``inner`` run inside ``span(prior)`` (see the module docstring); same name, cost rule
    and accountings, so requests, audit events and the ledger read as the inner mechanism's."""
    names = {
        attribute: getattr(inner, attribute)
        for attribute in (
            "name",
            "title",
            "paper",
            "summary",
            "cost_rule",
            "params_model",
            "allows_pure_dp",
            "releases_basis",
            "accountings",
            "continual",
        )
    }
    wrapper = type(f"{type(inner).__name__}OnPrior", (_OnPrior,), names)
    made: Mechanism[Any] = wrapper(inner, prior, sha256)
    return made


def is_orthonormal(prior: FloatArray, tolerance: float) -> tuple[bool, float]:
    """Whether ``max |P^T P - I| <= tolerance``, and that deviation (``inf`` if not finite)."""
    # Entries near the largest double overflow P^T P to inf: not orthonormal (refused), and no
    # RuntimeWarning on the API's stderr for an analyst's input.
    with np.errstate(over="ignore", invalid="ignore"):
        gram = prior.T @ prior
    deviation = float(np.max(np.abs(gram - np.eye(prior.shape[1])))) if prior.size else 0.0
    if not math.isfinite(deviation):
        return False, math.inf
    return deviation <= tolerance, deviation
