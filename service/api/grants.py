"""Grants: an owner shares a dataset's budget with analyst keys."""

from __future__ import annotations

from decimal import Decimal

from fastapi import APIRouter
from sqlalchemy.orm import Session

from api_schemas.common import ErrorBody
from api_schemas.grants import Grant, GrantCreate, GrantList
from service import grants, spend
from service.api.deps import DatasetId, GrantId, UnitOfWorkDep, roles_before_body
from service.api.routing import GuardedRoute
from service.auth import Principal

router = APIRouter(prefix="/v1/datasets", tags=["grants"], route_class=GuardedRoute)


def grant_out(view: grants.GrantView) -> Grant:
    """A grant stated as every budget is (:func:`service.spend.statement`): ``(epsilon, delta)``
    at the delta it was given with (``stated_at_delta``) with the native figures beside them;
    nothing remains once revoked."""
    grant = view.grant
    stated = spend.statement(view.budget)
    native = stated.native
    revoked = grant.revoked_at is not None
    zero = Decimal(0)
    non_basic = stated.accounting != "basic"
    return Grant(
        id=grant.id,
        dataset_id=grant.dataset_id,
        analyst_key_id=grant.analyst_key_id,
        analyst_key_name=view.key_name,
        privacy_unit=view.privacy_unit,
        epsilon_total=stated.epsilon_total,
        delta_total=stated.delta_total,
        stated_at_delta=stated.stated_at_delta,
        epsilon_spent=stated.epsilon_spent,
        delta_spent=stated.delta_spent,
        epsilon_remaining=zero if revoked else stated.epsilon_remaining,
        epsilon_remaining_pure=(
            zero
            if revoked and stated.epsilon_remaining_pure is not None
            else stated.epsilon_remaining_pure
        ),
        delta_remaining=zero if revoked else stated.delta_remaining,
        accounting=stated.accounting,
        rho_total=native.rho_total,
        rho_spent=native.rho_spent,
        rho_remaining=zero if revoked and non_basic else native.rho_remaining,
        mu_total=native.mu_total,
        mu_spent=native.mu_spent,
        mu_remaining=zero if revoked and native.mu_remaining is not None else native.mu_remaining,
        delta_reserved_for_conversion=stated.delta_reserved_for_conversion,
        created_at=grant.created_at,
        revoked_at=grant.revoked_at,
    )


@router.post(
    "/{dataset_id}/grants",
    status_code=201,
    dependencies=[roles_before_body("owner")],
    response_model=Grant,
    summary="Grant an analyst key (or every analyst) a share of the dataset's budget (owner).",
    responses={
        404: {"model": ErrorBody, "description": "No such dataset of yours."},
        409: {
            "model": ErrorBody,
            "description": "`conflict`: the key (or every analyst) already has an active grant "
            "here; `dataset_deleted`: the dataset's rows were deleted.",
        },
        422: {
            "model": ErrorBody,
            "description": "Not an active analyst key, or a share above the dataset's total.",
        },
    },
)
async def create_grant(dataset_id: DatasetId, body: GrantCreate, uow: UnitOfWorkDep) -> Grant:
    def work(session: Session, principal: Principal) -> Grant:
        view = grants.create_grant(
            session,
            principal,
            dataset_id,
            body.analyst_key_id,
            body.epsilon,
            body.delta,
            rho=body.rho,
            mu=body.mu,
        )
        return grant_out(view)

    return await uow(work)


@router.get(
    "/{dataset_id}/grants",
    response_model=GrantList,
    summary="A dataset's grants with what each spent and has left (owner).",
    responses={404: {"model": ErrorBody, "description": "No such dataset of yours."}},
)
async def list_grants(dataset_id: DatasetId, uow: UnitOfWorkDep) -> GrantList:
    def work(session: Session, principal: Principal) -> GrantList:
        views = grants.list_grants(session, principal, dataset_id)
        return GrantList(items=[grant_out(view) for view in views], total=len(views))

    return await uow(work)


@router.delete(
    "/{dataset_id}/grants/{grant_id}",
    response_model=Grant,
    summary="Revoke a grant (owner): no further charges; what it spent stays spent.",
    description=(
        "The keys the grant covered are refused (403 `grant_revoked`) from now on, until a new "
        "grant covers them: they do not fall back to the dataset's budget or, for a personal "
        "grant, to the all-analysts grant. Repeating the revocation changes nothing."
    ),
    responses={404: {"model": ErrorBody, "description": "No such grant on a dataset of yours."}},
)
async def revoke_grant(dataset_id: DatasetId, grant_id: GrantId, uow: UnitOfWorkDep) -> Grant:
    def work(session: Session, principal: Principal) -> Grant:
        return grant_out(grants.revoke_grant(session, principal, dataset_id, grant_id))

    return await uow(work)
