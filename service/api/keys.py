"""API keys (admin)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from sqlalchemy.orm import Session

from api_schemas.keys import KeyCreate, KeyCreated, KeyInfo, KeyPage
from service import auth
from service.api.deps import Cursor, KeyId, Limit, UnitOfWorkDep, roles_before_body
from service.api.routing import GuardedRoute
from service.auth import Principal

router = APIRouter(prefix="/v1/keys", tags=["keys"], route_class=GuardedRoute)


@router.post(
    "",
    status_code=201,
    dependencies=[roles_before_body("admin")],
    response_model=KeyCreated,
    summary="Create a key; the secret is shown once.",
)
async def create_key(body: KeyCreate, uow: UnitOfWorkDep) -> KeyCreated:
    def work(session: Session, principal: Principal) -> KeyCreated:
        auth.require_role(principal, "admin")
        key, secret = auth.create_key(session, body.role, body.name, principal.key_id)
        return KeyCreated(id=key.id, role=body.role, name=key.name, key=secret)

    created = await uow(work)
    # Committed: the rate limiter treats the new key as valid from its first request.
    uow.database.key_directory.add(auth.hash_secret(created.key))
    return created


@router.get(
    "",
    response_model=KeyPage,
    summary="List keys (never their secrets), oldest first, with a cursor and a total.",
)
async def list_keys(uow: UnitOfWorkDep, limit: Limit = 100, cursor: Cursor = None) -> KeyPage:
    def work(session: Session, principal: Principal) -> KeyPage:
        auth.require_role(principal, "admin")
        page = auth.page_keys(session, limit, cursor)
        return KeyPage(
            items=[KeyInfo.model_validate(key) for key in page.items],
            total=page.total,
            next=page.next,
        )

    return await uow(work)


@router.delete("/{key_id}", status_code=204, summary="Revoke a key.")
async def revoke_key(key_id: KeyId, uow: UnitOfWorkDep) -> Response:
    def work(session: Session, principal: Principal) -> None:
        auth.require_role(principal, "admin")
        auth.revoke_key(session, key_id, principal.key_id)

    await uow(work)
    # This process stops accepting the key at once; others within DPSS_AUTH_CACHE_SECONDS.
    uow.database.verified_keys.clear()
    return Response(status_code=204)
