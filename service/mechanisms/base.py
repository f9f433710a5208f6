"""The contract every mechanism implements.

A release goes through two steps:

1. :meth:`Mechanism.prepare` sees only public facts (``n``, ``d``, the declared row norm bound,
   the request) and either resolves the parameters or raises :class:`InvalidParameter`. It runs
   in the API process before anything is charged, so a refusal costs nothing.
2. :meth:`Mechanism.run` reads the data in a worker and returns a :class:`MechanismOutput`.

The privacy cost of a release is the request's ``(epsilon, delta)``: each mechanism splits it
internally into fixed fractions, so the cost is known before the mechanism runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from service.mechanisms.linalg import FloatArray


class InvalidParameter(ValueError):
    """A request a mechanism refuses before it runs; ``field`` names the offending parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class MechanismParams(BaseModel):
    """Base of every params schema: unknown keys are refused rather than silently ignored, and
    values are strict (JSON ``true`` is not the integer 1, ``"2"`` is not a number)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ClipParams(MechanismParams):
    """Params of mechanisms that clip rows to a public norm bound."""

    clip_norm: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Public row norm bound C; rows are scaled to norm at most C. Defaults to the "
            "dataset's row_norm_bound. Never computed from the data."
        ),
    )


P = TypeVar("P", bound=MechanismParams)
CP = TypeVar("CP", bound=ClipParams)


@dataclass(frozen=True)
class PublicContext:
    """What is public about a dataset: its shape and the owner's declared row norm bound."""

    n_rows: int
    n_cols: int
    row_norm_bound: float | None


@dataclass(frozen=True)
class ReleaseSpec(Generic[P]):
    """Everything a mechanism runs with besides the data and the generator; all public."""

    k: int
    epsilon: float
    delta: float
    params: P


@dataclass
class MechanismOutput:
    """What a run produced.

    ``basis`` is ``d x k`` with orthonormal columns, or ``None`` (no result, or a mechanism such
    as ``spectrum`` that releases no basis). ``extras`` holds further private outputs (JSON
    values). ``no_result_reason`` is set exactly when the mechanism declined to release; that
    outcome is itself a private output and is charged.
    """

    basis: FloatArray | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    no_result_reason: str | None = None

    @classmethod
    def no_result(cls, reason: str, **extras: Any) -> MechanismOutput:
        return cls(basis=None, extras=dict(extras), no_result_reason=reason)


class Mechanism(ABC, Generic[P]):
    """A differentially private release of a subspace (or of a statistic used to choose one)."""

    name: ClassVar[str]
    title: ClassVar[str]
    paper: ClassVar[str]
    summary: ClassVar[str]
    cost_rule: ClassVar[str] = "Charges exactly the requested (epsilon, delta)."
    params_model: ClassVar[type[MechanismParams]]
    allows_pure_dp: ClassVar[bool] = False
    releases_basis: ClassVar[bool] = True

    def parse_params(self, raw: dict[str, Any]) -> P:
        """Validate the raw ``params`` object against this mechanism's schema."""
        return self.params_model.model_validate(raw)  # type: ignore[return-value]

    def check_common(self, ctx: PublicContext, k: int, epsilon: float, delta: float) -> None:
        """Checks shared by every mechanism; raise :class:`InvalidParameter`."""
        if not epsilon > 0:
            raise InvalidParameter("epsilon", "must be > 0")
        if not 0 <= delta < 1:
            raise InvalidParameter("delta", "must be in [0, 1)")
        if delta == 0 and not self.allows_pure_dp:
            raise InvalidParameter(
                "delta", f"{self.name} needs delta > 0 (only smooth_sensitivity has a pure variant)"
            )
        if k < 1:
            raise InvalidParameter("k", "must be >= 1")
        if self.releases_basis and k > ctx.n_cols:
            raise InvalidParameter("k", f"must be <= the number of columns ({ctx.n_cols})")

    def prepare(self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: P) -> P:
        """Resolve defaults from public facts and refuse what cannot run. Never reads data."""
        self.check_common(ctx, k, epsilon, delta)
        return params

    @abstractmethod
    def run(
        self, data: FloatArray, spec: ReleaseSpec[P], rng: np.random.Generator
    ) -> MechanismOutput:
        """Run on ``data`` (``n x d``, possibly a read-only memory map) with randomness ``rng``."""

    def memory_bytes(self, ctx: PublicContext, spec: ReleaseSpec[P]) -> int:
        """Peak working memory of :meth:`run` in bytes, beyond the (memory-mapped) data.

        A function of public facts only (``n``, ``d``, ``k``, resolved params), derived from the
        mechanism's own code: the API refuses a release whose estimate exceeds
        ``DPSS_WORKER_MEMORY_MB`` before charging, so a worker never runs out of memory in a way
        that depends on the data. ``spec.params`` are the params returned by :meth:`prepare`.
        """
        raise NotImplementedError(f"{self.name} has no memory estimate")


def resolve_clip_norm(clip_norm: float | None, ctx: PublicContext) -> float:
    """The public clip norm: the request's, else the dataset's declared bound, else refuse."""
    if clip_norm is not None:
        return clip_norm
    if ctx.row_norm_bound is not None:
        return ctx.row_norm_bound
    raise InvalidParameter(
        "clip_norm",
        "required: this dataset has no row_norm_bound, and the bound must be public "
        "(it is never computed from the data)",
    )


class ClippingMechanism(Mechanism[CP]):
    """A mechanism that clips rows to a public norm ``C``: ``prepare`` resolves ``clip_norm``
    (the request's, else the dataset's declared bound, else a refusal)."""

    def check_specific(self, ctx: PublicContext, k: int, params: CP) -> None:
        """Further public-fact checks of a subclass; raise :class:`InvalidParameter`."""

    def prepare(self, ctx: PublicContext, k: int, epsilon: float, delta: float, params: CP) -> CP:
        self.check_common(ctx, k, epsilon, delta)
        self.check_specific(ctx, k, params)
        return params.model_copy(update={"clip_norm": resolve_clip_norm(params.clip_norm, ctx)})
