"""Request-scoped dependencies: one session per request, committed in one place."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from service.auth import Principal, authenticate
from service.config import Settings
from service.store import DatasetStore


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_store(request: Request) -> DatasetStore:
    store: DatasetStore = request.app.state.store
    return store


def get_session(request: Request) -> Iterator[Session]:
    """The request's session: committed when the route returns, rolled back if it raises.

    Used with ``scope="function"`` so the commit happens before the response is sent: a client
    told 201/202 can rely on the upload or the charge being durable, and a failed commit is
    answered as an error instead of a success.
    """
    factory: sessionmaker[Session] = request.app.state.session_factory
    with factory() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
StoreDep = Annotated[DatasetStore, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_principal(request: Request, session: SessionDep) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    return authenticate(session, secret.strip() if scheme.lower() == "bearer" else None)


PrincipalDep = Annotated[Principal, Depends(get_principal)]
