"""Nothing an analyst can call about a release changes before its ``visible_at`` when the job
finishes (issue 22, item 0): every release route (enumerated from the app, so a new one fails
here until it is covered), its answers (status, headers, body), its long polls, and the SQL an
analyst's read runs (no basis, no continual state: a read takes the same time)."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy import event, update
from sqlalchemy.orm import Session, sessionmaker

from service import continual
from service.app import create_app
from service.config import Settings
from service.db.models import Release, ReleaseEpoch, utcnow
from service.store import DatasetStore
from service.worker import Outcome, Worker
from tests.api.conftest import Service
from tests.conftest import bearer, npy_bytes
from tests.factories import near_subspace

HOUR = 3600.0
ONE_SHOT = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.1", "delta": "1e-7"}
CONTINUAL = {"mechanism": "continual_gauss", "k": 2, "epsilon": "0.5", "delta": "1e-6"}
#: Headers that differ between any two answers whatever the release (or that other layers add
#: per request, such as rate-limit counters).
PER_REQUEST_HEADERS = ("date", "x-request-id")
#: Where a release's large values live (patterns): an analyst's read of a hidden release
#: touches none.
BASES = (r"release_bases", r"result_basis", r"\.basis\b")
LARGE = (*BASES, r"release_states", r"continual_state", r"continual_key")
#: The columns whose size depends on the outcome (an ``analyze_gauss`` centre alone is ``d``
#: numbers): loading them for a hidden release made its read slower once the job had stored
#: them (a single GET told a succeeded release from a queued one with advantage 0.19 at
#: d = 2,000); an analyst's read of a hidden release selects neither.
OUTCOME = (r"result_extras", r"releases\.reason\b")

Call = tuple[str, str, dict[str, Any]]
OCTETS = "application/octet-stream"


def release_routes(app: Any) -> set[tuple[str, str]]:
    """Every (method, path) of the app about releases or epochs: its routes, those of the
    routers it includes, and (for any route built otherwise) its OpenAPI document."""
    found: set[tuple[str, str]] = set()

    def walk(routes: list[Any]) -> None:
        for route in routes:
            if hasattr(route, "original_router"):
                walk(route.original_router.routes)
            elif isinstance(route, APIRoute):
                found.update((method, route.path) for method in route.methods - {"HEAD"})

    walk(app.routes)
    for path, operations in app.openapi()["paths"].items():
        found.update((method.upper(), path) for method in operations)
    return {(m, p) for m, p in found if "releases" in p or "epochs" in p}


def calls(dataset: str, release: str, idempotency: str, body: dict[str, Any]) -> list[Call]:
    """Analyst calls about ``release`` covering every release route, with the parameters that
    could show its state (status filters, totals, cursors, bases, waits, retries)."""
    one = f"/v1/releases/{release}"
    lists = [
        {},
        {"with_basis": "true"},
        {"limit": "1"},
        {"dataset_id": dataset},
        {"mechanism": body["mechanism"]},
    ] + [{"status": status} for status in ("queued", "running", "succeeded", "no_result", "failed")]
    return [
        ("GET", one, {}),
        ("GET", one, {"params": {"wait": "0"}}),
        ("GET", f"{one}/epochs", {}),
        ("GET", f"{one}/epochs", {"params": {"after": "0", "limit": "1"}}),
        *[("GET", "/v1/releases", {"params": params}) for params in lists],
        *[("GET", f"/v1/datasets/{dataset}/releases", {"params": params}) for params in lists],
        ("POST", f"/v1/datasets/{dataset}/releases", {"json": body, "key": idempotency}),
        ("POST", f"/v1/datasets/{dataset}/releases", {"json": body, "dry": True}),
        ("GET", f"/v1/datasets/{dataset}", {}),
        ("GET", f"/v1/datasets/{dataset}/budget", {}),
    ]


COVERED = {
    ("GET", "/v1/releases"),
    ("GET", "/v1/releases/{release_id}"),
    ("GET", "/v1/releases/{release_id}/epochs"),
    ("GET", "/v1/datasets/{dataset_id}/releases"),
    ("POST", "/v1/datasets/{dataset_id}/releases"),
}


def answer(client: TestClient, key: str, call: Call) -> tuple[int, dict[str, str], bytes]:
    method, path, options = call
    headers = bearer(key)
    if "key" in options:
        headers["Idempotency-Key"] = options["key"]
    params = dict(options.get("params", {}))
    if options.get("dry"):
        params["dry_run"] = "true"
    response = client.request(
        method, path, headers=headers, params=params, json=options.get("json")
    )
    kept = {
        name: value
        for name, value in response.headers.items()
        if name not in PER_REQUEST_HEADERS and "ratelimit" not in name
    }
    return response.status_code, kept, response.content


@pytest.fixture
def padded_settings(settings: Settings) -> Settings:
    # No reuse of key checks (DPSS_AUTH_CACHE_SECONDS): whether a read re-checks its key
    # depends on the clock, not on the release, and would change the SQL compared below.
    return settings.model_copy(
        update={
            "release_padding_floor_seconds": HOUR,
            "release_padding_multiplier": 1.0,
            "auth_cache_seconds": 0,
        }
    )


@pytest.fixture
def padded(
    padded_settings: Settings, session_factory: sessionmaker[Session]
) -> Iterator[TestClient]:
    with TestClient(create_app(padded_settings, session_factory=session_factory)) as client:
        yield client


@pytest.fixture
def run_padded(
    padded_settings: Settings, session_factory: sessionmaker[Session], store: DatasetStore
) -> Callable[[], int]:
    """A worker with the same padding as the app (it pads each continual epoch)."""
    return Worker(session_factory, store, padded_settings, worker_id="padded").run_pending


def test_every_release_route_is_covered(padded: TestClient) -> None:
    assert release_routes(padded.app) == COVERED


@pytest.mark.parametrize(
    "body",
    [ONE_SHOT, {**CONTINUAL, "params": {"horizon": 1}}, {**CONTINUAL, "params": {"horizon": 3}}],
    ids=["one-shot", "continual-ended", "continual-running"],
)
def test_no_answer_changes_when_the_job_finishes_before_visible_at(
    padded: TestClient,
    keys: Any,
    upload_dataset: Callable[..., dict[str, Any]],
    run_padded: Callable[[], int],
    session_factory: sessionmaker[Session],
    body: dict[str, Any],
) -> None:
    dataset, release = requested(padded, keys, upload_dataset, body, np.random.default_rng(5))
    assert_unchanged(padded, keys, session_factory, dataset, release, body, run_padded)


def requested(
    client: TestClient,
    keys: Any,
    upload_dataset: Callable[..., dict[str, Any]],
    body: dict[str, Any],
    rng: np.random.Generator,
) -> tuple[str, str]:
    """A new dataset and the analyst's release of it (with an ``Idempotency-Key``)."""
    rows = near_subspace(rng, 120, 5, 2)[0]
    dataset = str(upload_dataset(client, keys.owner, rows, row_norm_bound=1.0)["id"])
    made = client.post(
        f"/v1/datasets/{dataset}/releases",
        headers={**bearer(keys.analyst), "Idempotency-Key": "hidden-1"},
        json=body,
    )
    assert made.status_code == 202, made.text
    return dataset, str(made.json()["id"])


def stored_state(session_factory: sessionmaker[Session], release: str) -> tuple[str, int]:
    """The release's stored status and epochs, as the worker wrote them (what no analyst or
    owner sees before ``visible_at``)."""
    with session_factory() as session:
        row = session.get(Release, uuid.UUID(release))
        assert row is not None
        return row.status, row.epochs_done


def assert_unchanged(
    client: TestClient,
    keys: Any,
    session_factory: sessionmaker[Session],
    dataset: str,
    release: str,
    body: dict[str, Any],
    finish: Callable[[], int],
    shown_bases: bool = False,
) -> None:
    """Every analyst call about ``release`` answers the same, with the same SQL reading no
    large value (but the bases already shown, if ``shown_bases``), before and after
    ``finish()`` runs the job (which changes its stored row)."""
    every = calls(dataset, release, "hidden-1", body)
    assert {(m, p.replace(dataset, "{dataset_id}").replace(release, "{release_id}"))
            for m, p, _ in every} >= COVERED  # fmt: skip
    stored_before = stored_state(session_factory, release)

    statements: list[str] = []
    bind = session_factory.kw["bind"]

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(re.sub(r"sa_savepoint_\d+", "sa_savepoint", statement))

    event.listen(bind.engine, "before_cursor_execute", seen)
    try:
        before = [answer(client, keys.analyst, call) for call in every]
        before_sql = list(statements)
        assert finish() == 1
        statements.clear()
        after = [answer(client, keys.analyst, call) for call in every]
        after_sql = list(statements)
    finally:
        event.remove(bind.engine, "before_cursor_execute", seen)

    # The job did finish (stored; no analyst or owner sees it yet), so the comparison could fail.
    assert stored_state(session_factory, release) != stored_before
    for call, was, now in zip(every, before, after, strict=True):
        assert now == was, call
    # The same statements, none of which reads a basis, the continual state or a column whose
    # size depends on the outcome: a read costs the same before and after the job stores them.
    assert after_sql == before_sql
    never = [name for name in LARGE if not (shown_bases and name in BASES)] + list(OUTCOME)
    assert [s for s in after_sql if any(re.search(name, s) for name in never)] == []


def test_a_continual_end_without_a_new_epoch_shows_at_that_epochs_visible_at(
    padded: TestClient,
    keys: Any,
    upload_dataset: Callable[..., dict[str, Any]],
    run_padded: Callable[[], int],
    session_factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The release is visible, epoch 1 too; a new batch's epoch ends it (no_result) at once:
    analysts see it running, unchanged, until the epoch would have shown."""
    body = {**CONTINUAL, "params": {"horizon": 3}}
    rng = np.random.default_rng(6)
    dataset, release = requested(padded, keys, upload_dataset, body, rng)
    assert run_padded() == 1
    past = utcnow() - timedelta(seconds=1)
    with session_factory.begin() as session:
        session.execute(
            update(Release).where(Release.id == uuid.UUID(release)).values(visible_at=past)
        )
        session.execute(update(ReleaseEpoch).values(visible_at=past))
    added = padded.post(
        f"/v1/datasets/{dataset}/rows",
        headers=bearer(keys.owner),
        files={
            "file": (
                "more.npy",
                npy_bytes(near_subspace(rng, 40, 5, 2)[0]),
                "application/octet-stream",
            )
        },
    )
    assert added.status_code == 201, added.text
    shown = padded.get(f"/v1/releases/{release}", headers=bearer(keys.analyst)).json()
    assert (shown["status"], shown["epochs_done"]) == ("running", 1)

    def no_result(*args: Any, **kwargs: Any) -> continual.EpochOutput:
        return continual.EpochOutput(None, Outcome(status="no_result", reason="x", extras={}))

    monkeypatch.setattr(continual, "compute_epoch", no_result)
    assert_unchanged(
        padded, keys, session_factory, dataset, release, body, run_padded, shown_bases=True
    )
    with session_factory.begin() as session:
        ended = session.get(Release, uuid.UUID(release))
        assert ended is not None and ended.outcome_visible_at is not None
        assert ended.outcome_visible_at >= utcnow() + timedelta(seconds=HOUR / 2)
        ended.outcome_visible_at = past
    shown = padded.get(f"/v1/releases/{release}", headers=bearer(keys.analyst)).json()
    assert shown["status"] == "no_result"
    listed = padded.get(
        "/v1/releases", params={"status": "no_result"}, headers=bearer(keys.analyst)
    )
    assert [item["id"] for item in listed.json()["items"]] == [release]


# -- long polls: real commits, the worker in another thread ---------------------------------------


def _paths(*releases: str) -> list[str]:
    return [f"/v1/releases/{r}{tail}" for r in releases for tail in ("", "/epochs")]


def _polls(service: Service, paths: list[str], wait: float) -> list[tuple[httpx.Response, float]]:
    """Start a long poll on each path, then run the worker until the queue is empty while they
    wait; each answer with the wall-clock moment it came."""
    headers = bearer(service.keys["analyst"])

    async def run() -> list[tuple[httpx.Response, float]]:
        transport = httpx.ASGITransport(app=service.client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:

            async def poll(path: str) -> tuple[httpx.Response, float]:
                response = await http.get(path, headers=headers, params={"wait": str(wait)})
                return response, time.time()

            tasks = [asyncio.create_task(poll(path)) for path in paths]
            await asyncio.sleep(0.2)  # every poll is waiting
            while await asyncio.to_thread(service.worker.run_pending):
                pass
            return list(await asyncio.gather(*tasks))

    return asyncio.run(run())


def test_long_polls_do_not_answer_when_the_job_finishes_before_visible_at(
    make_service: Callable[..., Service],
) -> None:
    service = make_service(release_padding_floor_seconds=HOUR, release_padding_multiplier=1.0)
    one_shot = service.request(ONE_SHOT)
    running = service.request({**CONTINUAL, "params": {"horizon": 3}})
    paths = _paths(one_shot, running)
    headers = bearer(service.keys["analyst"])
    before = [service.client.get(path, headers=headers).content for path in paths]
    start = time.time()
    answers = _polls(service, paths, wait=2.0)
    assert stored_state(service.factory, one_shot) == ("succeeded", 0)
    assert stored_state(service.factory, running)[1] == 1
    for path, was, (response, at) in zip(paths, before, answers, strict=True):
        # Answered at the wait's end (never earlier, however fast or slow this machine is),
        # with what it showed before the job ran.
        assert response.status_code == 200, response.text
        assert at - start >= 2.0, path
        assert response.content == was, path


def test_long_polls_answer_at_visible_at_not_before(
    make_service: Callable[..., Service],
) -> None:
    service = make_service(release_padding_floor_seconds=1.5, release_padding_multiplier=1.0)
    one_shot = service.request(ONE_SHOT)
    continual = service.request({**CONTINUAL, "params": {"horizon": 1}})
    paths = _paths(one_shot, continual)
    answers = _polls(service, paths, wait=20.0)
    headers = bearer(service.keys["analyst"])
    for path, (response, at) in zip(paths, answers, strict=True):
        shown = service.client.get(path.removesuffix("/epochs"), headers=headers).json()
        visible_at = datetime.fromisoformat(shown["visible_at"]).timestamp()
        assert at >= visible_at, path
        assert response.status_code == 200
        if path.endswith("/epochs"):
            expected = [] if path.startswith(f"/v1/releases/{one_shot}") else [1]
            assert [e["epoch"] for e in response.json()["items"]] == expected
        else:
            assert response.json()["status"] == "succeeded"


def test_a_list_loads_the_outcomes_of_the_ends_it_shows_and_no_other(
    padded: TestClient,
    keys: Any,
    upload_dataset: Callable[..., dict[str, Any]],
    run_padded: Callable[[], int],
    session_factory: sessionmaker[Session],
) -> None:
    """``reason`` and ``result_extras`` are read for a release whose end the caller sees, all
    of a page's in one statement, and never for a release whose outcome is hidden (an analyst's
    before ``visible_at``, or a late one before its ``outcome_visible_at``)."""
    rows = near_subspace(np.random.default_rng(8), 120, 5, 2)[0]
    dataset = str(upload_dataset(padded, keys.owner, rows, row_norm_bound=1.0)["id"])
    made = []
    for _ in range(4):
        response = padded.post(
            f"/v1/datasets/{dataset}/releases", headers=bearer(keys.analyst), json=ONE_SHOT
        )
        assert response.status_code == 202, response.text
        made.append(uuid.UUID(response.json()["id"]))
    assert run_padded() == 4
    past = utcnow() - timedelta(seconds=1)
    shown, late, hidden = made[:2], made[2], made[3]
    with session_factory.begin() as session:
        session.execute(
            update(Release)
            .where(Release.id.in_([*shown, late]))
            .values(created_at=past - timedelta(seconds=10), visible_at=past)
        )
        session.execute(
            update(Release).where(Release.id.in_(shown)).values(outcome_visible_at=past)
        )
        session.execute(
            update(Release)
            .where(Release.id == late)
            .values(outcome_visible_at=utcnow() + timedelta(seconds=HOUR))
        )

    loads: list[tuple[str, Any]] = []
    bind = session_factory.kw["bind"]

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if re.search(OUTCOME[0], statement) or re.search(OUTCOME[1], statement):
            loads.append((statement, parameters))

    expected = {
        "analyst": {str(i): "succeeded" for i in shown} | {str(late): "running"}
        | {str(hidden): "queued"},
    }  # fmt: skip
    # The owner is shown what the analyst is (service.visibility).
    expected["owner"] = expected["analyst"]
    paths = {"analyst": "/v1/releases", "owner": f"/v1/datasets/{dataset}/releases"}
    for role, path in paths.items():
        loads.clear()
        event.listen(bind.engine, "before_cursor_execute", seen)
        try:
            listed = padded.get(path, headers=bearer(getattr(keys, role)))
        finally:
            event.remove(bind.engine, "before_cursor_execute", seen)
        assert listed.status_code == 200, listed.text
        items = listed.json()["items"]
        assert {item["id"]: item["status"] for item in items} == expected[role]
        for item in items:
            assert (item["result"] is not None) == (item["status"] == "succeeded")
            if item["result"] is not None:
                assert "eigenvalues" in item["result"]["extras"]
        # One statement for the page, naming exactly the releases whose end is shown.
        assert len(loads) == 1, role
        named = {str(value) for value in _flat(loads[0][1])}
        ends = {id_ for id_, status in expected[role].items() if status == "succeeded"}
        assert {
            id_ for id_ in map(str, made) if id_ in named or id_.replace("-", "") in named
        } == ends


def _flat(parameters: Any) -> list[Any]:
    """The values of a statement's parameters (a tuple, a dict, or nested sequences)."""
    if isinstance(parameters, dict):
        parameters = list(parameters.values())
    if isinstance(parameters, (list, tuple)):
        return [value for item in parameters for value in _flat(item)]
    return [parameters]
