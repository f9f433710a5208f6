"""Release requests and results."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, TypeVar

import anyio
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator, Field
from sqlalchemy.orm import Session

from api_schemas.common import ErrorBody, IdempotencyKey
from api_schemas.releases import (
    BudgetExceeded,
    EpochList,
    Release,
    ReleasePreview,
    ReleaseRequest,
)
from service import continual, preview, releases, repricing, visibility
from service.api.deps import (
    CanonicalUUID,
    Cursor,
    DatasetId,
    Limit,
    ReleaseId,
    SettingsDep,
    UnitOfWorkDep,
    roles_before_body,
)
from service.api.presenters import BasisFormat, epoch_out, release_out
from service.api.routing import GuardedRoute
from service.auth import Principal
from service.db import models
from service.db.models import utcnow
from service.errors import BudgetExceeded as BudgetRefused
from service.errors import InvalidInput
from service.mechanisms.continual_gauss import MAX_HORIZON
from service.pagination import parse_seq_cursor
from service.visibility import FINISHED
from service.waiters import MAX_WAIT_SECONDS, RECHECK_SECONDS, ReleaseWaiters, Waiter

#: How long after ``visible_at`` a long poll looks again at an outcome hidden until then.
VISIBLE_MARGIN_SECONDS = 0.005

router = APIRouter(prefix="/v1", tags=["releases"], route_class=GuardedRoute)


#: The one sentence for any ``wait`` that is not a number of seconds in range: pydantic reads
#: ``nan`` and ``inf`` as floats and then said "less than or equal to 30" of them.
WAIT_RANGE = (
    f"a number of seconds from 0 to {MAX_WAIT_SECONDS:g} (omitted or 0: answer at once); "
    "nan, inf and negative numbers are not waits"
)


def _wait_seconds(value: object) -> object:
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(WAIT_RANGE) from None
    if not 0 <= seconds <= MAX_WAIT_SECONDS:  # false for nan
        raise ValueError(WAIT_RANGE)
    return seconds


#: A long poll's ``wait``: 422 naming ``wait`` and its range for anything else.
WaitSeconds = Annotated[float, Field(ge=0, le=MAX_WAIT_SECONDS), BeforeValidator(_wait_seconds)]


@router.post(
    "/datasets/{dataset_id}/releases",
    status_code=202,
    dependencies=[roles_before_body("analyst")],
    response_model=Release,
    summary="Request a private release (analyst); charged now, computed by a worker.",
    description=(
        "With `?dry_run=true`, a preview: the request is validated exactly as a real one "
        "(same 4xx), nothing is charged or created, one `release_previewed` audit event is "
        "written, and the answer (200) gives the cost, whether the budget covers it, and the "
        "noise scales the mechanism would use with what they mean.\n\n"
        "With `?wait=<seconds>`, the request is charged and queued exactly as without it "
        "(committed before any waiting), then long-polls its own release as "
        "`GET /v1/releases/{id}?wait=` does: the answer is the release as the caller may see "
        "it when it has finished (200, with its result) or when the seconds have passed (202, "
        "`queued` or `running`; then poll `GET /v1/releases/{id}`). One request instead of "
        "two for a short release. Nothing shows earlier than a `GET` would show it: an "
        "analyst's outcome only from `visible_at` on (the padding), and the moment of the "
        "answer does not depend on when a worker stored it before then. A retry with the same "
        "`Idempotency-Key` waits for the same release. Waiting holds no database connection; "
        "when too many requests already wait, the answer (202) comes at once."
    ),
    responses={
        200: {
            "model": ReleasePreview,
            "description": "`dry_run=true`: the preview (`ReleasePreview`); nothing was charged "
            "or created. With `wait`: the release (`Release`), finished as the caller may see "
            "it (`succeeded`, `no_result` or `failed`), with its result.",
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
    dataset_id: DatasetId,
    body: ReleaseRequest,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    request: Request,
    response: Response,
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
    forecast_from: CanonicalUUID | None = Query(
        default=None,
        description="With `dry_run=true` and `analyze_gauss` (or `auto` for PCA, what "
        "`PrivatePCA` sends: the forecast of the mechanism it runs, from an `auto` release "
        "that ran the same one; "
        "`spatial_sign` forecasts only at the very same settings): an earlier release of this "
        "dataset that the caller may read and sees succeeded (an analyst from its `visible_at` "
        "on; before, it is refused as an unfinished one); the preview adds a forecast of the "
        "share of the centred variance this request keeps, from that release's released figures"
        " (no budget): a range (`scales.forecast_from_release_captured_share_low` and `_high`) "
        "and a point (`scales.forecast_from_release_captured_share`) only where the range is at"
        " most 0.2 wide, the new probe's route is not left to chance and the earlier share was "
        "measured (else null); carried from its measured share, or read from its eigenvalues "
        "and trace where its share was hidden by noise (`scales.forecast_from_release_basis`; "
        "then a range only). Refused (422) without `dry_run=true`.",
    ),
    basis_format: BasisFormatQuery = "json",
    wait: WaitSeconds | None = Query(
        default=None,
        description="Long poll on the created release: answer as soon as it has finished as "
        f"the caller may see it (200), or after this many seconds (at most "
        f"{MAX_WAIT_SECONDS:g}) with its state then (202), whichever comes first; the charge "
        "and the queueing are committed before the wait. An analyst's outcome shows from "
        "`visible_at` on, as with `GET /v1/releases/{id}?wait=`. Omitted or 0: answer at once "
        "(202). Refused (422) with `dry_run=true`.",
    ),
) -> Release | JSONResponse:
    if forecast_from is not None and not dry_run:
        raise InvalidInput("forecast_from", "only with dry_run=true (a preview)")
    if wait and dry_run:
        raise InvalidInput("wait", "not with dry_run=true (a preview is answered at once)")

    def search_inputs(
        session: Session, principal: Principal
    ) -> Callable[[], repricing.Admissible] | None:
        return releases.admissible_search(session, principal, dataset_id, body, settings)

    async def admissible_now() -> repricing.Admissible:
        # Read in a unit of work of its own, searched after it (outside any transaction).
        search = await uow(search_inputs)
        return repricing.Admissible() if search is None else await anyio.to_thread.run_sync(search)

    if dry_run:

        def preview_work(session: Session, principal: Principal) -> ReleasePreview:
            shown = preview.preview_release(
                session, principal, dataset_id, body, idempotency_key, settings, forecast_from
            )
            return ReleasePreview(dry_run=True, **vars(shown))

        shown = await uow(preview_work)
        if not shown.affordable:
            found = await admissible_now()
            shown.epsilon_admissible = found.epsilon
            shown.delta_admissible = found.delta
            shown.delta_admissible_epsilon = found.delta_epsilon
        return JSONResponse(shown.model_dump(mode="json"), status_code=200)

    async def requested(work: Callable[[Session, Principal], _T]) -> _T:
        # A refusal's admissible epsilon is searched in a second transaction, after the first
        # (which held the dataset's lock) has ended.
        try:
            return await uow(work)
        except BudgetRefused as refused:
            found = await admissible_now()
            raise refused.admitting(
                found.epsilon, found.delta, found.delta_epsilon, found.asked_delta
            ) from None

    def work(session: Session, principal: Principal) -> Release:
        release = releases.request_release(
            session, principal, dataset_id, body, idempotency_key, settings
        )
        return release_out(release, principal, session, basis_format=basis_format)

    if not wait:
        return await requested(work)

    def create(session: Session, principal: Principal) -> _Read:
        # ``locked`` is held while the release is read: its dataset is then found in the
        # session, not selected again (releases.queue_release).
        release, locked = releases.queue_release(
            session, principal, dataset_id, body, idempotency_key, settings
        )
        read = _read(session, release, principal, basis_format)
        del locked
        return read

    # Registered before the release exists (bound to it once created): a worker may store the
    # outcome between the creating commit and the wait, and its hint must not be lost. The
    # creating transaction's own view of the release is the wait's first read, made as a
    # GET's reads are (:func:`_read`).
    hub: ReleaseWaiters = request.app.state.release_waiters
    deadline = anyio.current_time() + wait
    with hub.waiting(None) as waiter:
        read = await requested(create)
        if waiter is not None:
            release_id = read.shown.id

            def again(session: Session, principal: Principal) -> _Read:
                found = releases.get_release(session, principal, release_id)
                return _read(session, found, principal, basis_format)

            hub.bind(waiter, release_id)
            reads = uow.reads()  # as a GET's long poll reads (the key was checked at creation)
            read = await _wait_on(hub, waiter, deadline, read, lambda: reads(again), _finished)
    if read.shown.status in FINISHED:
        response.status_code = 200
    return read.shown


BasisFormatQuery = Annotated[
    BasisFormat,
    Query(
        description="How a finished release's basis is written: `json` (default), `result.basis` "
        "as `d` lists of `k` numbers; `base64`, `result.basis_base64`, the stored bytes "
        "(little-endian float64, row-major, `result.basis_shape`; their SHA-256 is "
        "`result.basis_sha256`), exact and cheaper to read into an array.",
    ),
]

Wait = Annotated[
    WaitSeconds | None,
    Query(
        description="Long poll: answer as soon as the release, as you may see it, has finished "
        "(`succeeded`, `no_result` or `failed`), or after this many seconds (at most "
        f"{MAX_WAIT_SECONDS:g}) with its state then, whichever comes first. An analyst's "
        "outcome shows from `visible_at` on, as without `wait`. Omitted or 0: answer at once. "
        "When too many requests already wait, the answer comes at once.",
    ),
]


@dataclass(frozen=True)
class _Read:
    """One read of a release: what the caller sees, and when that may change."""

    shown: Release
    #: When something stored but hidden from the caller becomes visible (a wake-up then).
    shows_at: datetime | None
    #: Until when nothing the caller sees can change, whatever a worker stores: the long poll
    #: sleeps until then without listening to the workers' announcements.
    sealed_until: datetime | None


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
    release_id: ReleaseId,
    uow: UnitOfWorkDep,
    request: Request,
    wait: Wait = None,
    basis_format: BasisFormatQuery = "json",
) -> Release:
    def work(session: Session, principal: Principal) -> _Read:
        found = releases.get_release(session, principal, release_id)
        return _read(session, found, principal, basis_format)

    if not wait:
        return (await uow(work)).shown
    read = await _long_poll(request, release_id, wait, lambda: uow(work), _finished)
    return read.shown


def _read(
    session: Session,
    release: models.Release,
    principal: Principal,
    basis_format: BasisFormat = "json",
) -> _Read:
    """``release`` as ``principal`` sees it now, and when that may change: one read of a long
    poll (the creating request's first included)."""
    now = utcnow()
    seen = visibility.view(session, release, principal, now, with_basis=True)
    shows_at = None
    if not seen.finished:
        shows_at = _shows_at(session, release, seen, len(seen.epochs or ()), now)
    shown = release_out(release, principal, session, now, shown=seen, basis_format=basis_format)
    return _Read(shown, shows_at, seen.sealed_until)


def _finished(read: _Read) -> bool:
    return read.shown.status in FINISHED


def _shows_at(
    session: Session,
    release: models.Release,
    seen: visibility.View,
    after: int,
    now: datetime,
) -> datetime | None:
    """For an analyst after ``visible_at``: when the next thing stored but hidden shows (an
    epoch after ``after``, or the release's end), so that a long poll wakes exactly then and
    not at a moment that depends on when the worker stored it."""
    if seen.sealed_until is not None or seen.epochs_visible_by is None:
        return None
    moments = [release.outcome_visible_at]
    # Epochs are shown up to a deletion only (service.visibility): none hidden after it shows.
    if seen.epochs is not None and seen.epochs_visible_by >= now:
        moments.append(visibility.next_shown_at(session, release, after, now))
    return min((m for m in moments if m is not None and m > now), default=None)


_R = TypeVar("_R", bound="_Read | _EpochRead")
_T = TypeVar("_T")


async def _long_poll(
    request: Request,
    release_id: ReleaseId,
    wait: float,
    read_once: Callable[[], Awaitable[_R]],
    done: Callable[[_R], bool],
) -> _R:
    """Read until ``done`` or ``wait`` seconds have passed, waiting between reads on this
    release's hints (:mod:`service.waiters`) without holding anything.

    Registered before the first read, so that news stored between a read and the wait still
    wakes it. Each read is its own short unit of work; nothing is held between.

    An analyst's answer must not depend on when a worker stored anything before the release's
    ``visible_at`` (its padding), neither in content nor in moment. So while a read is sealed
    (:attr:`service.visibility.View.sealed_until`) the wait does not listen to hints at all: it
    sleeps until the seal ends (or the wait's end, or the process stops) and reads again then.
    After that, a read that found something stored but hidden (a continual epoch before its own
    ``visible_at``) wakes at that moment: hints only tell it when to look, the answer comes
    when the epoch is visible.
    """
    hub: ReleaseWaiters = request.app.state.release_waiters
    deadline = anyio.current_time() + wait
    with hub.waiting(release_id) as waiter:
        read = await read_once()
        if waiter is None:
            return read
        return await _wait_on(hub, waiter, deadline, read, read_once, done)


async def _wait_on(
    hub: ReleaseWaiters,
    waiter: Waiter,
    deadline: float,
    read: _R,
    read_once: Callable[[], Awaitable[_R]],
    done: Callable[[_R], bool],
) -> _R:
    """The loop of :func:`_long_poll` from its first ``read``; ``waiter`` was registered
    before that read was made, so no hint since is lost."""
    while not done(read) and not hub.closing:
        left = deadline - anyio.current_time()
        if left <= 0:
            break
        if read.sealed_until is not None:
            pause = min(left, _seconds_until(read.sealed_until) + VISIBLE_MARGIN_SECONDS)
            await waiter.sleep(pause, until=lambda: hub.closing)
        else:
            pause = min(left, RECHECK_SECONDS)
            if read.shows_at is not None:
                pause = min(pause, _seconds_until(read.shows_at) + VISIBLE_MARGIN_SECONDS)
            await waiter.wait(pause)
        read = await read_once()
    return read


def _seconds_until(moment: datetime) -> float:
    return max((moment - utcnow()).total_seconds(), 0.0)


EpochWait = Annotated[
    WaitSeconds | None,
    Query(
        description="Long poll (with `after`, without `cursor`): when no epoch after `after` "
        "is visible yet, answer as soon as one is, or the release has finished, or after this "
        f"many seconds (at most {MAX_WAIT_SECONDS:g}), whichever comes first. An analyst sees "
        "each epoch from its own `visible_at` on, as without `wait`. Omitted or 0: answer at "
        "once.",
    ),
]


@dataclass(frozen=True)
class _EpochRead:
    """One read of a page of epochs, whether more can come, and when that may change."""

    page: EpochList
    finished: bool
    shows_at: datetime | None
    sealed_until: datetime | None


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
    release_id: ReleaseId,
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
        if cursor is not None:
            # Checked first (once the key is: a 401 before a 422), not only where a page is
            # read: a one-shot or hidden release answers its empty page before reading one,
            # and took any cursor (another list's, or garbage) with 200.
            parse_seq_cursor(cursor, continual.EPOCH_CURSOR, continual.epoch_scope(release_id))
        release = releases.get_release(session, principal, release_id)
        now = utcnow()
        shown = visibility.view(session, release, principal, now)
        if shown.sealed_until is not None or shown.epochs is None:
            # Hidden (or one-shot: no epochs ever): the same empty page before and after the
            # worker stores anything.
            empty = EpochList(items=[], total=0, next=None)
            return _EpochRead(empty, shown.finished, None, shown.sealed_until)
        visible_by = shown.epochs_visible_by
        page = continual.page_epochs(session, release.id, limit, cursor, after, visible_by)
        shows_at = None
        if not page.items and not shown.finished:
            shows_at = _shows_at(session, release, shown, after, now)
        bases = continual.epoch_bases(session, release.id, [epoch.epoch for epoch in page.items])
        listed = EpochList(
            items=[epoch_out(epoch, principal, bases.get(epoch.epoch)) for epoch in page.items],
            total=page.total,
            next=page.next,
        )
        return _EpochRead(listed, shown.finished, shows_at, None)

    if not wait or cursor is not None:
        return (await uow(work)).page
    # The worker announces every stored epoch as it does an outcome.
    read = await _long_poll(
        request, release_id, wait, lambda: uow(work), lambda r: bool(r.page.items) or r.finished
    )
    return read.page
