"""``GET /v1/releases/{id}?wait=``: the long poll returns when the release finishes (as the
caller may see it), honours its bound and ``visible_at``, and holds no database slot while it
waits. Real commits (``committed_db``): the worker runs in another thread, as it would run in
another process."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from service import waiters, wake
from service.db.models import Release
from tests.api.conftest import BODY, Service
from tests.conftest import bearer, npy_bytes
from tests.factories import near_subspace

#: Within this a long poll of 30 s (the most) that should end early must have ended: far from
#: its bound, far beyond any delay a loaded machine adds. No test here asserts a speed.
EARLY = 20.0


def no_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiting requests re-read their release only at their bound, so that one answered early
    was answered by a hint."""
    import service.api.releases

    for module in (waiters, service.api.releases):
        monkeypatch.setattr(module, "RECHECK_SECONDS", waiters.MAX_WAIT_SECONDS, raising=False)


@pytest.mark.parametrize("hint", ["local", "database"])
def test_the_long_poll_returns_when_the_release_finishes(
    make_service: Callable[..., Service], monkeypatch: pytest.MonkeyPatch, hint: str
) -> None:
    service = make_service()
    if hint == "database":
        # Only what a worker in another process sends: NOTIFY (PostgreSQL) or the wake file.
        monkeypatch.setattr(wake, "_local_listeners", [])
    no_recheck(monkeypatch)
    release = service.request()
    worker = service.run_later(0.4)
    start = time.monotonic()
    answer = service.get(release, wait=30)
    elapsed = time.monotonic() - start
    worker.join()
    assert answer.status_code == 200
    assert answer.json()["status"] == "succeeded"
    assert answer.json()["result"]["basis"] is not None
    # Woken by the hint (no re-read before the bound), long before the 30 s bound.
    assert 0.35 <= elapsed < EARLY, elapsed


def test_the_long_poll_answers_at_its_bound(make_service: Callable[..., Service]) -> None:
    service = make_service()
    release = service.request()
    start = time.monotonic()
    answer = service.get(release, wait=0.5)
    elapsed = time.monotonic() - start
    assert answer.status_code == 200
    assert answer.json()["status"] == "queued"
    assert elapsed >= 0.5, elapsed
    # A finished release is answered at once, wait or not.
    service.worker.run_pending()
    start = time.monotonic()
    assert service.get(release, wait=30).json()["status"] == "succeeded"
    assert time.monotonic() - start < EARLY
    assert service.client.app.state.release_waiters.count == 0  # every waiter left


def _stored_status(service: Service, release: str) -> str:
    """The status the worker stored (no analyst or owner sees it before ``visible_at``)."""
    with service.factory() as session:
        row = session.get(Release, uuid.UUID(release))
        assert row is not None
        return row.status


def test_the_analyst_sees_nothing_before_visible_at(make_service: Callable[..., Service]) -> None:
    service = make_service(release_padding_floor_seconds=1.5)
    release = service.request()
    service.worker.run_pending()
    # Stored at once; the analyst (and the owner) see it only from visible_at on.
    assert _stored_status(service, release) == "succeeded"
    early = service.get(release, wait=0.3).json()
    assert early["status"] == "queued" and early["result"] is None
    answer = service.get(release, wait=10)
    seen_at = time.time()
    body = answer.json()
    assert body["status"] == "succeeded"
    visible_at = np.datetime64(body["visible_at"].replace("Z", "")).astype("datetime64[us]")
    assert np.datetime64(int(seen_at * 1e6), "us") >= visible_at


@pytest.mark.parametrize("wait", ["31", "-1", "soon", "nan", "inf"])
def test_a_bad_wait_is_a_422_naming_the_field(
    make_service: Callable[..., Service], wait: str
) -> None:
    service = make_service()
    release = service.request()
    answer = service.get(release, wait=wait)
    assert answer.status_code == 422
    assert "wait" in answer.text


def test_beyond_the_waiter_limit_the_answer_comes_at_once(
    make_service: Callable[..., Service],
) -> None:
    service = make_service(release_wait_max_waiters=0)
    release = service.request()
    start = time.monotonic()
    assert service.get(release, wait=30).json()["status"] == "queued"
    assert time.monotonic() - start < EARLY


def test_a_waiting_long_poll_holds_no_database_slot(
    make_service: Callable[..., Service],
) -> None:
    # One slot in all: a waiting long poll that held it would make the other request wait
    # db_wait_seconds and get 503.
    service = make_service(db_pool_size=1, db_max_overflow=0, db_wait_seconds=3)
    release = service.request()
    app = service.client.app
    headers = bearer(service.keys["analyst"])

    async def both() -> tuple[httpx.Response, httpx.Response, bool]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            waiting = asyncio.create_task(
                http.get(f"/v1/releases/{release}", headers=headers, params={"wait": "30"})
            )
            await asyncio.sleep(0.3)
            other = await http.get(
                f"/v1/datasets/{service.dataset}", headers=bearer(service.keys["owner"])
            )
            # Answered while the long poll still waits: it did not need the poll's slot (had
            # the poll held it, the other request would have had 503 after db_wait_seconds).
            still_waiting = not waiting.done()
            app.state.release_waiters.begin_shutdown()  # ends the poll now (queued)
            return await waiting, other, still_waiting

    waited, other, still_waiting = asyncio.run(both())
    assert other.status_code == 200, other.text  # answered, not 503
    assert still_waiting
    assert waited.status_code == 200 and waited.json()["status"] == "queued"


def test_the_client_waits_with_the_long_poll(make_service: Callable[..., Service]) -> None:
    from dpss_client import Client

    service = make_service()
    gets: list[httpx.Request] = []
    service.client.event_hooks["request"].append(
        lambda request: gets.append(request) if request.method == "GET" else None
    )
    analyst = Client(str(service.client.base_url), service.keys["analyst"], http=service.client)
    handle = analyst.release(service.dataset, "analyze_gauss", 2, "0.1", "1e-7")
    worker = service.run_later(0.3)
    basis = handle.wait()
    worker.join()
    assert basis.shape == (6, 2)
    # One long poll, answered when the worker stored the outcome.
    assert [request.url.params.get("wait") for request in gets] == ["25"]


def test_wait_is_described_in_the_openapi_document(make_service: Callable[..., Service]) -> None:
    service = make_service()
    operation = service.client.get("/openapi.json").json()["paths"]["/v1/releases/{release_id}"]
    (wait,) = [p for p in operation["get"]["parameters"] if p["name"] == "wait"]
    assert wait["in"] == "query" and not wait.get("required", False)
    assert "long poll" in wait["description"].lower()
    schema = wait["schema"]
    bounds = [s for s in schema.get("anyOf", [schema]) if s.get("type") == "number"]
    assert bounds and bounds[0]["maximum"] == 30 and bounds[0]["minimum"] == 0


def test_a_stopping_process_answers_its_long_polls_at_once(
    make_service: Callable[..., Service],
) -> None:
    # What the SIGTERM/SIGINT handler chained in front of uvicorn's does (service/waiters.py).
    service = make_service()
    release = service.request()
    hub = service.client.app.state.release_waiters
    threading.Timer(0.3, hub.begin_shutdown).start()
    start = time.monotonic()
    answer = service.get(release, wait=30)
    assert answer.status_code == 200 and answer.json()["status"] == "queued"
    assert time.monotonic() - start < EARLY
    start = time.monotonic()
    assert service.get(release, wait=30).status_code == 200  # no new wait begins
    assert time.monotonic() - start < EARLY


# ---------------------------------------------------------------------------------------------
# The creating request's own long poll: POST /v1/datasets/{id}/releases?wait=


def _run_once_queued(service: Service, after: float) -> threading.Thread:
    """A worker that runs one release once one is queued (the creating request commits it
    while this already runs)."""

    def run() -> None:
        time.sleep(after)
        deadline = time.monotonic() + EARLY
        while service.worker.run_pending() == 0 and time.monotonic() < deadline:
            time.sleep(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _create(service: Service, **params: Any) -> httpx.Response:
    return service.client.post(
        f"/v1/datasets/{service.dataset}/releases",
        headers=bearer(service.keys["analyst"]),
        json=BODY,
        params=params,
    )


@pytest.mark.parametrize("hint", ["local", "database"])
def test_the_creating_request_answers_with_the_finished_release(
    make_service: Callable[..., Service], monkeypatch: pytest.MonkeyPatch, hint: str
) -> None:
    service = make_service()
    if hint == "database":
        monkeypatch.setattr(wake, "_local_listeners", [])
    no_recheck(monkeypatch)
    worker = _run_once_queued(service, 0.4)
    start = time.monotonic()
    answer = _create(service, wait=30)
    elapsed = time.monotonic() - start
    worker.join()
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "succeeded"
    assert np.asarray(body["result"]["basis"]).shape == (6, 2)
    # Woken by the worker's hint (no re-read before the bound), long before the bound.
    assert 0.35 <= elapsed < EARLY, elapsed
    # Charged once, as without wait: the same release as a GET shows.
    assert service.get(body["id"]).json() == body
    assert service.client.app.state.release_waiters.count == 0


def test_a_hint_between_the_creating_commit_and_the_wait_is_not_lost(
    make_service: Callable[..., Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = make_service()
    no_recheck(monkeypatch)
    hub = service.client.app.state.release_waiters
    bind = hub.bind

    def late_bind(waiter: waiters.Waiter, release_id: Any) -> None:
        # The worker stores the outcome (and hints) after the commit, before the bind.
        assert service.worker.run_pending() == 1
        bind(waiter, release_id)

    monkeypatch.setattr(hub, "bind", late_bind)
    start = time.monotonic()
    answer = _create(service, wait=30)
    assert answer.status_code == 200 and answer.json()["status"] == "succeeded"
    assert time.monotonic() - start < EARLY  # woken by the hint, not a re-read at the bound


def test_the_creating_request_answers_202_at_its_bound(
    make_service: Callable[..., Service],
) -> None:
    service = make_service()
    start = time.monotonic()
    answer = _create(service, wait=0.5)
    assert time.monotonic() - start >= 0.5
    assert answer.status_code == 202 and answer.json()["status"] == "queued"
    assert answer.json()["result"] is None
    # Without wait (or 0), and beyond the waiter limit: 202 at once, as ever.
    assert _create(service).status_code == 202
    assert _create(service, wait=0).status_code == 202
    limited = make_service(release_wait_max_waiters=0)
    start = time.monotonic()
    assert _create(limited, wait=30).status_code == 202
    assert time.monotonic() - start < EARLY


def test_a_retry_with_the_idempotency_key_waits_for_the_same_release(
    make_service: Callable[..., Service],
) -> None:
    service = make_service()
    headers = {**bearer(service.keys["analyst"]), "Idempotency-Key": "retry-1"}
    path = f"/v1/datasets/{service.dataset}/releases"
    first = service.client.post(path, headers=headers, json=BODY, params={"wait": "0.2"})
    assert first.status_code == 202
    spent = service.client.get(f"/v1/datasets/{service.dataset}", headers=headers).json()
    service.run_later(0.3)
    again = service.client.post(path, headers=headers, json=BODY, params={"wait": "30"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert again.json()["status"] == "succeeded"
    after = service.client.get(f"/v1/datasets/{service.dataset}", headers=headers).json()
    assert after["budget"] == spent["budget"]  # charged once


def test_the_creating_long_poll_shows_nothing_before_visible_at(
    make_service: Callable[..., Service],
) -> None:
    service = make_service(release_padding_floor_seconds=1.5)
    worker = _run_once_queued(service, 0.1)  # stored long before visible_at
    answer = _create(service, wait=0.8)
    worker.join()
    # The wait ended before visible_at: queued with nothing, as a GET shows it, though the
    # outcome was stored.
    assert answer.status_code == 202
    assert answer.json()["status"] == "queued" and answer.json()["result"] is None
    assert _stored_status(service, answer.json()["id"]) == "succeeded"
    worker = _run_once_queued(service, 0.1)
    answer = _create(service, wait=10)
    seen_at = time.time()
    worker.join()
    body = answer.json()
    assert answer.status_code == 200 and body["status"] == "succeeded"
    visible_at = np.datetime64(body["visible_at"].replace("Z", "")).astype("datetime64[us]")
    assert np.datetime64(int(seen_at * 1e6), "us") >= visible_at


def test_the_client_and_private_pca_take_one_request(
    make_service: Callable[..., Service],
) -> None:
    from dpss_client import Client, PrivatePCA

    service = make_service()
    sent: list[httpx.Request] = []
    service.client.event_hooks["request"].append(sent.append)
    analyst = Client(str(service.client.base_url), service.keys["analyst"], http=service.client)
    worker = _run_once_queued(service, 0.3)
    handle = analyst.release(service.dataset, "analyze_gauss", 2, "0.1", "1e-7", wait=30)
    worker.join()
    assert handle.done and handle.basis().shape == (6, 2)
    assert [(r.method, r.url.params.get("wait")) for r in sent] == [("POST", "25")]
    sent.clear()
    worker = _run_once_queued(service, 0.3)
    pca = PrivatePCA(analyst, service.dataset, 2, "0.1", "1e-7", center="none").fit()
    worker.join()
    assert pca.components_.shape == (2, 6)
    # One request for the release: no long poll after it (other requests may read the dataset).
    releases = [r for r in sent if "releases" in r.url.path]
    assert [(r.method, r.url.params.get("wait")) for r in releases] == [("POST", "25")]


def test_the_client_resends_a_lost_waiting_request_with_its_key(
    make_service: Callable[..., Service],
) -> None:
    from dpss_client import Client

    service = make_service()
    sent: list[httpx.Request] = []

    def drop_the_first_answer(response: httpx.Response) -> None:
        sent.append(response.request)
        if len(sent) == 1:
            raise httpx.ReadError("lost on the way back", request=response.request)

    service.client.event_hooks["response"].append(drop_the_first_answer)
    analyst = Client(str(service.client.base_url), service.keys["analyst"], http=service.client)
    handle = analyst.release(service.dataset, "analyze_gauss", 2, "0.1", "1e-7", wait=0.2)
    first, second = sent
    assert first.url.params.get("wait") == "0.2" and "wait" not in second.url.params
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]
    # The same release, charged once: one release in the ledger.
    listed = service.client.get("/v1/releases", headers=bearer(service.keys["analyst"]))
    assert [item["id"] for item in listed.json()["items"]] == [str(handle.id)]


def test_wait_with_dry_run_is_refused(make_service: Callable[..., Service]) -> None:
    service = make_service()
    answer = _create(service, wait=5, dry_run="true")
    assert answer.status_code == 422 and "wait" in answer.text
    for bad in ("31", "-1", "soon"):
        refused = _create(service, wait=bad)
        assert refused.status_code == 422 and "wait" in refused.text


def test_the_creating_wait_is_described_in_the_openapi_document(
    make_service: Callable[..., Service],
) -> None:
    service = make_service()
    paths = service.client.get("/openapi.json").json()["paths"]
    operation = paths["/v1/datasets/{dataset_id}/releases"]["post"]
    (wait,) = [p for p in operation["parameters"] if p["name"] == "wait"]
    assert wait["in"] == "query" and "long poll" in wait["description"].lower()
    assert "visible_at" in operation["description"]


# ---------------------------------------------------------------------------------------------
# Continual releases: GET /v1/releases/{id}/epochs?after=N&wait=


def _continual(service: Service, horizon: int = 3) -> str:
    body = {"mechanism": "continual_gauss", "k": 2, "epsilon": "0.5", "delta": "1e-6",
            "params": {"horizon": horizon}}  # fmt: skip
    made = service.client.post(
        f"/v1/datasets/{service.dataset}/releases",
        headers=bearer(service.keys["analyst"]),
        json=body,
    )
    assert made.status_code == 202, made.text
    return str(made.json()["id"])


def _epochs(service: Service, release: str, **params: Any) -> httpx.Response:
    return service.client.get(
        f"/v1/releases/{release}/epochs", headers=bearer(service.keys["analyst"]), params=params
    )


def _append(service: Service) -> None:
    rows = near_subspace(np.random.default_rng(4), 50, 6, 2)[0]
    added = service.client.post(
        f"/v1/datasets/{service.dataset}/rows",
        headers=bearer(service.keys["owner"]),
        files={"file": ("more.npy", npy_bytes(rows), "application/octet-stream")},
    )
    assert added.status_code == 201, added.text


@pytest.mark.parametrize("hint", ["local", "database"])
def test_the_epoch_long_poll_returns_when_the_next_epoch_is_stored(
    make_service: Callable[..., Service], monkeypatch: pytest.MonkeyPatch, hint: str
) -> None:
    service = make_service()
    if hint == "database":
        monkeypatch.setattr(wake, "_local_listeners", [])
    no_recheck(monkeypatch)
    release = _continual(service)
    worker = service.run_later(0.4)
    start = time.monotonic()
    first = _epochs(service, release, after=0, wait=30)
    elapsed = time.monotonic() - start
    worker.join()
    assert first.status_code == 200, first.text
    assert [e["epoch"] for e in first.json()["items"]] == [1]
    assert 0.35 <= elapsed < EARLY, elapsed  # woken by the epoch's announcement
    # The next epoch needs a batch: appended, then the worker runs again, a little later.
    _append(service)
    worker = service.run_later(0.4)
    start = time.monotonic()
    second = _epochs(service, release, after=1, wait=30)
    elapsed = time.monotonic() - start
    worker.join()
    assert [e["epoch"] for e in second.json()["items"]] == [2]
    assert 0.35 <= elapsed < EARLY, elapsed


def test_the_epoch_long_poll_answers_at_its_bound_and_at_once_with_a_cursor(
    make_service: Callable[..., Service],
) -> None:
    service = make_service()
    release = _continual(service)
    service.worker.run_pending()
    start = time.monotonic()
    empty = _epochs(service, release, after=1, wait=0.5)
    assert time.monotonic() - start >= 0.45
    assert empty.status_code == 200 and empty.json()["items"] == []
    # Epochs already there: at once, whatever the wait.
    start = time.monotonic()
    assert len(_epochs(service, release, after=0, wait=30).json()["items"]) == 1
    assert time.monotonic() - start < EARLY


@pytest.mark.parametrize("bad", ["31", "-1", "soon", "nan"])
def test_a_bad_epoch_wait_is_a_422_naming_the_field(
    make_service: Callable[..., Service], bad: str
) -> None:
    service = make_service()
    release = _continual(service)
    answer = _epochs(service, release, after=0, wait=bad)
    assert answer.status_code == 422
    assert "wait" in answer.text
