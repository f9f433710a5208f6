"""API keys (admin)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response

from api_schemas.keys import KeyCreate, KeyCreated, KeyInfo
from service import auth
from service.api.deps import PrincipalDep, SessionDep

router = APIRouter(prefix="/v1/keys", tags=["keys"])


@router.post(
    "",
    status_code=201,
    response_model=KeyCreated,
    summary="Create a key; the secret is shown once.",
)
def create_key(body: KeyCreate, session: SessionDep, principal: PrincipalDep) -> KeyCreated:
    auth.require_role(principal, "admin")
    key, secret = auth.create_key(session, body.role, body.name, principal.key_id)
    return KeyCreated(id=key.id, role=body.role, name=key.name, key=secret)


@router.get("", response_model=list[KeyInfo], summary="List keys (never their secrets).")
def list_keys(session: SessionDep, principal: PrincipalDep) -> list[KeyInfo]:
    auth.require_role(principal, "admin")
    return [KeyInfo.model_validate(key) for key in auth.list_keys(session)]


@router.delete("/{key_id}", status_code=204, summary="Revoke a key.")
def revoke_key(key_id: uuid.UUID, session: SessionDep, principal: PrincipalDep) -> Response:
    auth.require_role(principal, "admin")
    auth.revoke_key(session, key_id, principal.key_id)
    return Response(status_code=204)
