"""Release requests and results."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

import anyio
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from api_schemas.common import ErrorBody, IdempotencyKey
from api_schemas.releases import (
    BudgetExceeded,
    EpochList,
    Release,
    ReleasePreview,
    ReleaseRequest,
)
from service import continual, preview, releases
from service.api.deps import Cursor, Limit, SettingsDep, UnitOfWorkDep
from service.api.presenters import epoch_out, release_out
from service.api.routing import GuardedRoute
from service.auth import Principal
from service.db.models import utcnow
from service.mechanisms.continual_gauss import MAX_HORIZON
from service.waiters import MAX_WAIT_SECONDS, RECHECK_SECONDS, ReleaseWaiters

#: How long after ``visible_at`` a long poll looks again at an outcome hidden until then.
VISIBLE_MARGIN_SECONDS = 0.005

router = APIRouter(prefix="/v1", tags=["releases"], route_class=GuardedRoute)


@router.post(
    "/datasets/{dataset_id}/releases",
    status_code=202,
    response_model=Release,
    summary="Request a private release (analyst); charged now, computed by a worker.",
    description=(
        "With `?dry_run=true`, a preview: the request is validated exactly as a real one "
        "(same 4xx), nothing is charged or created, one `release_previewed` audit event is "
        "written, and the answer (200) gives the cost, whether the budget covers it, and the "
        "noise scales the mechanism would use with what they mean."
    ),
    responses={
        200: {
            "model": ReleasePreview,
            "description": "`dry_run=true`: the preview. Nothing was charged or created.",
        },
        401: {"model": ErrorBody, "description": "Missing or invalid API key."},
        403: {
            "model": ErrorBody,
            "description": "Only analysts request releases; `grant_required` when "
            "DPSS_GRANTS_REQUIRED is set and the key has no grant on the dataset; "
            "`grant_revoked` (with its `grant_id`) when the grant that would apply was revoked "
            "and no newer one exists: nothing falls back to another budget.",
        },
        404: {"model": ErrorBody, "description": "No such dataset."},
        409: {
            "model": BudgetExceeded,
            "description": "`budget_exceeded` (which budget, `grant` or `dataset`, and its "
            "remaining), `idempotency_conflict`, or `dataset_deleted`. Nothing is charged. (A "
            "dry run reports an unaffordable cost as `affordable: false` instead.)",
        },
        422: {
            "model": ErrorBody,
            "description": "Invalid mechanism or parameters, or a release whose memory "
            "estimate exceeds the worker limit, or an `Idempotency-Key` sent with "
            "`dry_run=true`. Nothing is charged.",
        },
    },
)
async def create_release(
    dataset_id: uuid.UUID,
    body: ReleaseRequest,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    idempotency_key: IdempotencyKey | None = Header(
        default=None,
        description="Retries with the same key and body return the same release, charged once. "
        "Refused (422) with `dry_run=true`.",
    ),
    dry_run: bool = Query(
        default=False,
        description="Preview only: validate, charge nothing, and answer 200 with the cost and "
        "the noise scales (`ReleasePreview`).",
    ),
) -> Release | JSONResponse:
    if dry_run:

        def preview_work(session: Session, principal: Principal) -> ReleasePreview:
            shown = preview.preview_release(
                session, principal, dataset_id, body, idempotency_key, settings
            )
            return ReleasePreview(dry_run=True, **vars(shown))

        shown = await uow(preview_work)
        return JSONResponse(shown.model_dump(mode="json"), status_code=200)

    def work(session: Session, principal: Principal) -> Release:
        release = releases.request_release(
            session, principal, dataset_id, body, idempotency_key, settings
        )
        return release_out(release, principal)

    return await uow(work)


#: Statuses after which a release changes no more.
FINISHED = frozenset({"succeeded", "no_result", "failed"})

Wait = Annotated[
    float | None,
    Query(
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="Long poll: answer as soon as the release, as you may see it, has finished "
        "(`succeeded`, `no_result` or `failed`), or after this many seconds (at most "
        f"{MAX_WAIT_SECONDS:g}) with its state then, whichever comes first. An analyst's "
        "outcome shows from `visible_at` on, as without `wait`. Omitted or 0: answer at once. "
        "When too many requests already wait, the answer comes at once.",
    ),
]


@dataclass(frozen=True)
class _Read:
    """One read of a release: what the caller sees, and when that may change by itself."""

    shown: Release
    #: Seconds until an outcome stored but not yet visible to the caller becomes visible.
    visible_in: float | None


@router.get(
    "/releases/{release_id}",
    response_model=Release,
    summary="A release's status and, when finished, its result.",
    description=(
        "For a continual release also `epochs_done`, the `latest_epoch` with its basis and "
        "the list of `epochs` (without bases). With `?wait=<seconds>`, a long poll: the answer "
        "comes when the release has finished or the seconds have passed; waiting holds no "
        "database connection."
    ),
    responses={
        404: {"model": ErrorBody, "description": "No such release (or not yours)."},
        422: {"model": ErrorBody, "description": "`wait` is not a number from 0 to 30."},
    },
)
async def get_release(
    release_id: uuid.UUID, uow: UnitOfWorkDep, request: Request, wait: Wait = None
) -> Release:
    def work(session: Session, principal: Principal) -> _Read:
        release = releases.get_release(session, principal, release_id)
        now = utcnow()
        shown = release_out(release, principal, now=now, session=session)
        visible_in = None
        if (
            release.status in FINISHED
            and shown.status not in FINISHED
            and release.visible_at is not None
            and release.visible_at > now
        ):
            visible_in = (release.visible_at - now).total_seconds()
        return _Read(shown, visible_in)

    if not wait:
        return (await uow(work)).shown
    read = await _long_poll(
        request, release_id, wait, lambda: uow(work), lambda r: r.shown.status in FINISHED
    )
    return read.shown


_R = TypeVar("_R", bound="_Read | _EpochRead")


async def _long_poll(
    request: Request,
    release_id: uuid.UUID,
    wait: float,
    read_once: Callable[[], Awaitable[_R]],
    done: Callable[[_R], bool],
) -> _R:
    """Read until ``done`` or ``wait`` seconds have passed, waiting between reads on this
    release's hints (:mod:`service.waiters`) without holding anything.

    Registered before the first read, so that news stored between a read and the wait still
    wakes it. Each read is its own short unit of work; nothing is held between. A read that
    found something stored but hidden until ``visible_at`` (the analyst's padding) is repeated
    just after that moment, so the answer never comes before ``visible_at``.
    """
    hub: ReleaseWaiters = request.app.state.release_waiters
    deadline = anyio.current_time() + wait
    with hub.waiting(release_id) as waiter:
        read = await read_once()
        if waiter is None:
            return read
        while not done(read) and not hub.closing:
            left = deadline - anyio.current_time()
            if left <= 0:
                break
            pause = min(left, RECHECK_SECONDS)
            if read.visible_in is not None:
                pause = min(left, read.visible_in + VISIBLE_MARGIN_SECONDS)
            await waiter.wait(pause)
            read = await read_once()
    return read


EpochWait = Annotated[
    float | None,
    Query(
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="Long poll (with `after`, without `cursor`): when no epoch after `after` "
        "is visible yet, answer as soon as one is, or the release has finished, or after this "
        f"many seconds (at most {MAX_WAIT_SECONDS:g}), whichever comes first. An analyst sees "
        "each epoch from its own `visible_at` on, as without `wait`. Omitted or 0: answer at "
        "once.",
    ),
]


@dataclass(frozen=True)
class _EpochRead:
    """One read of a page of epochs, whether more can come, and when a hidden one shows."""

    page: EpochList
    finished: bool
    #: Seconds until the next stored epoch the caller cannot see yet becomes visible.
    visible_in: float | None


@router.get(
    "/releases/{release_id}/epochs",
    response_model=EpochList,
    summary="The epochs of a continual release, oldest first, with their bases.",
    description=(
        "Pages with `cursor`, or the epochs after epoch number `after`. With `after` and "
        "`?wait=<seconds>`, a long poll for the next epoch: waiting holds no database "
        "connection."
    ),
    responses={
        404: {"model": ErrorBody, "description": "No such release (or not yours)."},
        422: {
            "model": ErrorBody,
            "description": "Not a cursor this service issued, or `wait` not from 0 to 30.",
        },
    },
)
async def list_epochs(
    release_id: uuid.UUID,
    uow: UnitOfWorkDep,
    request: Request,
    limit: Limit = 100,
    cursor: Cursor = None,
    after: Annotated[
        int,
        Query(
            ge=0,
            le=MAX_HORIZON,
            description="Only epochs after this epoch number (ignored with `cursor`): how a "
            "client polling for new epochs asks for those it has not seen.",
        ),
    ] = 0,
    wait: EpochWait = None,
) -> EpochList:
    def work(session: Session, principal: Principal) -> _EpochRead:
        release = releases.get_release(session, principal, release_id)
        now = utcnow()
        finished = release.status in FINISHED
        if not releases.outcome_visible(release, principal, now):
            return _EpochRead(EpochList(items=[], total=0, next=None), finished, None)
        # Analysts see each epoch from its own visible_at on (see service.continual).
        visible_by = now if principal.role == "analyst" else None
        page = continual.page_epochs(session, release.id, limit, cursor, after, visible_by)
        visible_in = None
        if visible_by is not None and not page.items:
            hidden = continual.next_visible_at(session, release.id, after, visible_by)
            visible_in = None if hidden is None else (hidden - now).total_seconds()
        shown = EpochList(
            items=[epoch_out(epoch, principal) for epoch in page.items],
            total=page.total,
            next=page.next,
        )
        return _EpochRead(shown, finished and visible_in is None, visible_in)

    if not wait or cursor is not None:
        return (await uow(work)).page
    # The worker announces every stored epoch as it does an outcome.
    read = await _long_poll(
        request, release_id, wait, lambda: uow(work), lambda r: bool(r.page.items) or r.finished
    )
    return read.page
