"""Grants: an owner's share of a dataset's budget for one analyst key or for every analyst."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import Field

from api_schemas.common import ExactDecimal, RequestSchema, Schema, StrictDecimal, number_schema


class GrantCreate(RequestSchema):
    """Give an analyst key (or every analyst) a share of the dataset's budget."""

    analyst_key_id: UUID | None = Field(
        default=None,
        description=(
            "The analyst key the grant is for; null or absent: every analyst without a grant "
            "of their own on this dataset."
        ),
    )
    epsilon: Annotated[StrictDecimal, Field(gt=0, le=1000), number_schema(gt=0, le=1000)] | None = (
        Field(
            default=None,
            description=(
                "Epsilon the grant may spend, at most the dataset's total: a JSON number or a "
                "decimal string in ASCII digits, at most 30 decimal places. On gaussian and zcdp "
                "datasets it is converted to the grant's rho (mu), rounded down: the grant's "
                "spend is then (epsilon, delta)-DP, delta being the grant's `delta` (default: "
                "the dataset's delta_total)."
            ),
        )
    )
    delta: Annotated[StrictDecimal, Field(ge=0, lt=1), number_schema(ge=0, lt=1)] | None = Field(
        default=None,
        description=(
            "Delta the grant may spend, at most the dataset's delta_total; at most 30 places. "
            "basic and hybrid: its delta (default: the dataset's delta_total). With epsilon on "
            "gaussian and zcdp: the grant's whole delta, conversion included (zcdp holds the "
            "dataset's delta_conversion of it, or all of it if less, for the conversion; "
            "mechanisms may spend the rest). With rho (zcdp): the delta its mechanisms may "
            "spend, at most the dataset's delta_total - delta_conversion."
        ),
    )
    mu: Annotated[StrictDecimal, Field(gt=0), number_schema(gt=0)] | None = Field(
        default=None,
        description="gaussian datasets: the grant's mu (charged as mu^2/2 of the dataset's rho).",
    )
    rho: Annotated[StrictDecimal, Field(gt=0), number_schema(gt=0)] | None = Field(
        default=None, description="gaussian and zcdp datasets: the grant's rho."
    )


class Grant(Schema):
    """A grant, with what its releases have spent (charges less refunds) and what remains."""

    id: UUID = Field(description="Grant id.")
    dataset_id: UUID = Field(description="The dataset whose budget is shared.")
    analyst_key_id: UUID | None = Field(
        description="The analyst key it is for; null: every analyst without a grant of their own."
    )
    analyst_key_name: str | None = Field(
        default=None, description="That key's name; null for an all-analysts grant."
    )
    epsilon_total: ExactDecimal = Field(
        description=(
            "Epsilon granted, at stated_at_delta (its spent and remaining are at that delta "
            "too). gaussian, zcdp: given in epsilon, that epsilon (its rho or mu is within it at "
            "the delta it was given with); given in rho or mu, what that amounts to at the "
            "dataset's delta_total (rounded down). hybrid: the epsilon given, at most what its "
            "filters (a hybrid sub-budget of (epsilon, delta_total)) admit for a Gaussian "
            "release at its delta_total: 0.9979 of a (1, 1e-6) grant."
        )
    )
    delta_total: ExactDecimal = Field(
        description="Delta granted (gaussian, zcdp: the delta its mechanisms may spend)."
    )
    stated_at_delta: ExactDecimal | None = Field(
        default=None,
        description=(
            "The delta epsilon_total, epsilon_spent and epsilon_remaining are stated at: the "
            "delta the grant was given with (default the dataset's delta_total); given in rho "
            "or mu, the dataset's delta_total."
        ),
    )
    epsilon_spent: ExactDecimal = Field(
        description=(
            "Epsilon charged to the grant, less refunds (gaussian, zcdp: an epsilon at which "
            "what it spent is (epsilon, stated_at_delta)-DP, rounded up, read at the delta it "
            "holds for the conversion; hybrid: the smallest of its still-holding filters' "
            "figures at the grant's own delta_total, the delta its filters enforce)."
        )
    )
    delta_spent: ExactDecimal = Field(
        description=(
            "Delta charged to the grant, less refunds. hybrid: as the dataset's budget states "
            "it (its zCDP filter's share for approximate steps and its basic filter's share, "
            "spent or closed)."
        )
    )
    epsilon_remaining: ExactDecimal = Field(
        description=(
            "What the grant admits next (none once revoked): epsilon_total - epsilon_spent, "
            "but under gaussian, zcdp and hybrid the largest epsilon at which a Gaussian "
            "release asked at (epsilon, the grant's delta) is admitted now (more than total - "
            "spent after a release: the Gaussian-DP filter adds up mu^2, the zCDP filter rho, "
            "not epsilon); epsilon_remaining_pure is a pure release's figure, and a dry run "
            "gives epsilon_admissible for a request neither covers."
        )
    )
    epsilon_remaining_pure: ExactDecimal | None = Field(
        default=None,
        description=(
            "What a pure release (delta = 0: smooth_sensitivity's Cauchy variant, auto at "
            "delta 0) charged to the grant is admitted at now (0 once revoked): the largest "
            "epsilon of such a release, its pure steps' epsilons adding up to it. basic: "
            "epsilon_remaining. zcdp: sqrt(2 rho_remaining) (a pure epsilon step is charged "
            "epsilon^2/2). hybrid: the largest of its filters' figures. Not epsilon_remaining, "
            "a Gaussian release's figure at the grant's delta: under hybrid it is more while "
            "the basic filter holds (a pure release is admitted up to the grant's epsilon: 1 of "
            "a fresh (1, 1e-5) grant whose epsilon_total, the Gaussian figure, is 0.9973), less "
            "once that filter is closed (a pure step costs the Gaussian-DP filter more than a "
            "Gaussian one of the same epsilon). Null for gaussian (Gaussian releases only)."
        ),
    )
    delta_remaining: ExactDecimal = Field(
        description=(
            "Delta the grant could still spend (none once revoked). hybrid: what approximate steps"
            " may still spend under its zCDP filter (of its share for approximate steps, 2% by "
            "default) plus what single releases may still spend under its basic filter (of its "
            "share, 1% by default), each 0 once its filter no longer holds; a Gaussian release "
            "needs none of it (0 here does not mean nothing is admitted)."
        )
    )
    accounting: Literal["basic", "gaussian", "zcdp", "hybrid"] = Field(
        description="The dataset's accounting: the grant's currency."
    )
    rho_total: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian and zcdp: rho granted (gaussian: mu^2/2). hybrid: its zCDP filter's, "
            "at its conversion share of the grant's delta (at most the dataset's)."
        ),
    )
    rho_spent: ExactDecimal | None = Field(
        default=None,
        description="gaussian, zcdp, hybrid: rho charged to the grant, less refunds.",
    )
    rho_remaining: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian, zcdp, hybrid: rho the grant could still spend (hybrid: 0 once its zCDP "
            "filter no longer holds)."
        ),
    )
    mu_total: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian: sqrt(2 rho_total), rounded down. hybrid: its Gaussian-DP filter's, "
            "within its share of the grant's delta (at most the dataset's)."
        ),
    )
    mu_spent: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian: sqrt(2 rho_spent), rounded up. hybrid: sqrt(sum of the releases' mu^2), "
            "rounded up."
        ),
    )
    mu_remaining: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian: sqrt(2 rho_remaining), rounded down. hybrid: sqrt(mu_total^2 - "
            "mu_spent^2), rounded down (0 once its Gaussian-DP filter no longer holds)."
        ),
    )
    delta_reserved_for_conversion: ExactDecimal | None = Field(
        default=None,
        description=(
            "gaussian and zcdp: the dataset's delta held back to convert rho to (epsilon, "
            "delta); no mechanism spends it. hybrid: the grant's Gaussian-DP filter share plus "
            "its zCDP filter's conversion share."
        ),
    )
    privacy_unit: Literal["row", "person"] = Field(
        default="row",
        description=(
            "What the share protects: the dataset's unit, `row` or `person` (the dataset has a "
            "privacy_unit_column: every release's cost is per person)."
        ),
    )
    created_at: datetime = Field(description="Creation time (UTC).")
    revoked_at: datetime | None = Field(
        description=(
            "Revocation time (UTC), if revoked: no further charges (the keys it covered are "
            "refused with 403 `grant_revoked` until a new grant); spent stays spent."
        )
    )


class GrantList(Schema):
    """A dataset's grants, oldest first, revoked ones included."""

    items: list[Grant] = Field(description="The grants.")
    total: int = Field(description="How many grants the dataset has.")
    next: str | None = Field(
        default=None,
        description=(
            "Cursor of the next page, as on every list; always null: a dataset's grants (one "
            "active per key) come in one page."
        ),
    )
