"""The mechanisms the service offers."""

from __future__ import annotations

from fastapi import APIRouter

from api_schemas.mechanisms import MechanismInfo, MechanismList
from service.api.deps import UnitOfWorkDep
from service.api.routing import GuardedRoute
from service.mechanisms.registry import MECHANISMS

router = APIRouter(prefix="/v1", tags=["mechanisms"], route_class=GuardedRoute)


@router.get(
    "/mechanisms",
    response_model=MechanismList,
    summary="Each mechanism's paper, cost rule and parameter schema (see docs/mechanisms.md).",
)
async def list_mechanisms(uow: UnitOfWorkDep) -> MechanismList:
    await uow.principal()
    return MechanismList(
        items=[
            MechanismInfo(
                name=mechanism.name,
                title=mechanism.title,
                paper=mechanism.paper,
                summary=mechanism.summary,
                cost_rule=mechanism.cost_rule,
                allows_pure_dp=mechanism.allows_pure_dp,
                releases_basis=mechanism.releases_basis,
                # hybrid admits every mechanism: its filter C (basic) charges any release;
                # which of its filters admits a given request, the dry run says (admitted_by).
                accountings=sorted(mechanism.accountings | {"hybrid"}),
                params_schema=mechanism.params_model.model_json_schema(),
            )
            for mechanism in MECHANISMS.values()
        ],
        total=len(MECHANISMS),
    )
