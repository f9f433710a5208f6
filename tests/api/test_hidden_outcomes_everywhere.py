"""An outside audit's probe of the padding promise (``service.visibility``): before a release's
``visible_at``, nothing its analyst, another analyst or the owner of another dataset can call
depends on whether the job ran, how it ended or its refund.

Where ``tests/api/test_hidden_outcomes.py`` covers the release routes for one succeeded job,
this enumerates **every GET route of the app** (so a new route is probed the day it exists),
fills each path parameter with every id the probe holds, adds the query variants that could
show a status or a refund (status and mechanism filters, page sizes and the cursor's next
page, bases, dry runs priced at and past the budget left, ``forecast_from`` each release),
and a real request that only a refund would admit; then runs the worker on six jobs (one-shot:
succeeded, no_result, failed and refunded; continual: ended, running, failed and refunded at
its first epoch) and compares every answer, byte for byte, for each of them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from service import auth, continual, oneshot
from service.app import create_app
from service.auth import Role
from service.config import Settings
from service.db.models import Release
from service.jobs import REFUSED_AT_RUN_REASON, Outcome
from service.store import DatasetStore
from service.worker import Worker
from tests.conftest import bearer
from tests.factories import near_subspace

HOUR = 3600.0
#: Headers that differ between any two answers whatever the release.
PER_REQUEST_HEADERS = ("date", "x-request-id")
ONE_SHOT = {"mechanism": "analyze_gauss", "k": 2, "delta": "1e-7"}
CONTINUAL = {"mechanism": "continual_gauss", "k": 2, "epsilon": "0.5", "delta": "1e-6"}
#: The releases and how each ends: one-shot releases three ways, and continual ones ended at
#: their horizon, still running after their first epoch, and failed (refunded) at their first.
REQUESTS: list[tuple[dict[str, Any], str]] = [
    ({**ONE_SHOT, "epsilon": "0.1"}, "succeeded"),
    ({**ONE_SHOT, "epsilon": "0.2"}, "no_result"),
    ({**ONE_SHOT, "epsilon": "0.3"}, "failed"),
    ({**CONTINUAL, "params": {"horizon": 1}}, "succeeded"),
    ({**CONTINUAL, "params": {"horizon": 3}}, "running"),
    ({**CONTINUAL, "params": {"horizon": 2}}, "failed"),
]
#: Who must see nothing change: the releases' analyst, another analyst, the owner of another
#: dataset, and the dataset's own owner (whose releases' real state would tell when the job
#: ahead of them in the queue, on any dataset, ended: service.visibility).
WATCHERS = ("a", "b", "another owner", "owner")
#: The grant: exactly the charges, so only a refund could admit another request.
GRANT_EPSILON = "2.1"


@pytest.fixture
def padded_settings(settings: Settings) -> Settings:
    # No reuse of key checks: whether a read re-checks its key depends on the clock.
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
    with TestClient(
        create_app(padded_settings, session_factory=session_factory),
        raise_server_exceptions=False,
    ) as client:
        yield client


def get_routes(app: Any) -> list[str]:
    """Every GET path of the app (its routers' too), but the static files and the docs."""
    found: set[str] = set()

    def walk(routes: list[Any]) -> None:
        for route in routes:
            if hasattr(route, "original_router"):
                walk(route.original_router.routes)
            else:
                methods: Any = getattr(route, "methods", None) or ()
                if "GET" in methods and getattr(route, "path", None):
                    found.add(route.path)

    walk(app.routes)
    return sorted(found)


def fill(path: str, ids: dict[str, list[str]]) -> list[str]:
    """``path`` with each ``{name}`` replaced by every id the probe holds for it (an unknown
    name by a random UUID)."""
    names = re.findall(r"{(\w+)(?::\w+)?}", path)
    paths = [path]
    for name in names:
        values = ids.get(name, [str(uuid.uuid4())])
        paths = [re.sub(r"{" + name + r"(?::\w+)?}", value, p) for p in paths for value in values]
    return paths


Call = tuple[str, str, dict[str, Any]]


def probe_calls(
    app: Any, ids: dict[str, list[str]], dataset: str, real_request: bool
) -> list[Call]:
    calls: list[Call] = []
    lists = [{}, {"limit": "1"}, {"limit": "2"}, {"with_basis": "true"}, {"dataset_id": dataset}]
    lists += [{"mechanism": "analyze_gauss"}, {"mechanism": "spectrum"}]
    lists += [
        {"status": status} for status in ("queued", "running", "succeeded", "no_result", "failed")
    ]
    for route in get_routes(app):
        if route.startswith(("/docs", "/redoc", "/openapi")):
            continue
        for path in fill(route, ids):
            calls.append(("GET", path, {}))
            if path.endswith("/releases"):
                calls += [("GET", path, {"params": params, "follow": True}) for params in lists]
            if re.fullmatch(r"/v1/releases/[0-9a-f-]{36}", path):
                calls += [
                    ("GET", path, {"params": {"wait": "0"}}),
                    ("GET", path, {"params": {"basis_format": "base64"}}),
                ]
            if path.endswith("/epochs"):
                calls.append(("GET", path, {"params": {"after": "0", "limit": "1"}}))
            if path in ("/v1/audit", f"/v1/datasets/{dataset}/ledger"):
                calls.append(("GET", path, {"params": {"limit": "1"}}))
    body = {"mechanism": "analyze_gauss", "k": 2, "delta": "1e-7"}
    releases = f"/v1/datasets/{dataset}/releases"
    for epsilon in ("0.01", "0.3", "0.6", "1"):
        calls.append(("POST", releases, {"json": {**body, "epsilon": epsilon}, "dry": True}))
    for release in ids["release_id"]:
        calls.append(
            (
                "POST",
                releases,
                {"json": {**body, "epsilon": "0.01"}, "dry": True, "forecast_from": release},
            )
        )
    if real_request:
        # A real request that only a refund would admit: refused, before and after.
        calls.append(("POST", releases, {"json": {**body, "epsilon": "0.05"}}))
    return calls


def answer(client: TestClient, key: str, call: Call) -> list[tuple[int, dict[str, str], bytes]]:
    method, path, options = call
    params = dict(options.get("params", {}))
    if options.get("dry"):
        params["dry_run"] = "true"
    if "forecast_from" in options:
        params["forecast_from"] = options["forecast_from"]
    pages = []
    while True:
        response = client.request(
            method, path, headers=bearer(key), params=params, json=options.get("json")
        )
        kept = {
            name: value
            for name, value in response.headers.items()
            if name not in PER_REQUEST_HEADERS and "ratelimit" not in name
        }
        pages.append((response.status_code, kept, response.content))
        following = (
            response.json().get("next")
            if options.get("follow") and response.status_code == 200
            else None
        )
        if not following:
            return pages
        params = {**params, "cursor": following}


@pytest.mark.parametrize(
    ("accounting", "late"),
    [("basic", False), ("hybrid", False), ("basic", True)],
    ids=["basic", "hybrid", "late"],
)
def test_nothing_an_analyst_calls_changes_when_jobs_end_in_any_way_before_visible_at(
    accounting: str,
    late: bool,
    padded: TestClient,
    padded_settings: Settings,
    session_factory: sessionmaker[Session],
    store: DatasetStore,
    upload_dataset: Callable[..., dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids: dict[str, list[str]] = {}
    keys: dict[str, str] = {}
    people: list[tuple[Role, str]] = [
        ("owner", "owner"),
        ("analyst", "a"),
        ("analyst", "b"),
        ("owner", "another owner"),
    ]
    with session_factory.begin() as session:
        for role, name in people:
            key, keys[name] = auth.create_key(session, role, name, actor_key_id=None)
            ids.setdefault("key_id", []).append(str(key.id))
    rows = near_subspace(np.random.default_rng(8), 150, 5, 2)[0]
    dataset = str(
        upload_dataset(padded, keys["owner"], rows, row_norm_bound=1.0, accounting=accounting)["id"]
    )
    ids["dataset_id"] = [dataset]
    upload_dataset(padded, keys["another owner"], rows, row_norm_bound=1.0)
    granted = padded.post(
        f"/v1/datasets/{dataset}/grants",
        headers=bearer(keys["owner"]),
        json={"epsilon": GRANT_EPSILON, "delta": "1e-4"},
    )
    assert granted.status_code == 201, granted.text
    ids["grant_id"] = [str(granted.json()["id"])]
    ids["release_id"] = []
    ends: dict[str, str] = {}
    for body, end in REQUESTS:
        made = padded.post(f"/v1/datasets/{dataset}/releases", headers=bearer(keys["a"]), json=body)
        assert made.status_code == 202, made.text
        ids["release_id"].append(str(made.json()["id"]))
        ends[str(made.json()["id"])] = end
    ids["view"] = ["analyst", "owner", "admin", "auditor", "help"]
    if late:
        # Requested one and a half paddings ago (an hour's, and for a release requested after
        # a continual one, plus the wait for that one's first epoch: service.padding_epochs):
        # past visible_at, the jobs end late, and their outcomes (and the refund) show only at
        # the late schedule's next step, created_at + 2 paddings: until then every answer
        # stays as it was (``running``).
        with session_factory.begin() as session:
            for row in session.scalars(select(Release)):
                assert row.visible_at is not None
                back = (row.visible_at - row.created_at) * 1.5
                assert back >= timedelta(minutes=90)
                row.created_at -= back
                row.visible_at -= back

    real = oneshot.execute

    def ending(job: Any, context: Any, prior: Any = None) -> Outcome:
        end = ends[str(job.release_id)]
        if end == "no_result":
            return Outcome(status="no_result", reason="no gap found", extras={})
        if end == "failed":
            return Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
        return real(job, context, prior)

    monkeypatch.setattr(oneshot, "execute", ending)
    epoch = continual.compute_epoch

    def epoch_ending(*args: Any, **kwargs: Any) -> continual.EpochOutput:
        if args[3].horizon == 2:  # the continual release that fails at its first epoch
            outcome = Outcome.failed(REFUSED_AT_RUN_REASON, refund=True)
            return continual.EpochOutput(None, outcome)
        return epoch(*args, **kwargs)

    monkeypatch.setattr(continual, "compute_epoch", epoch_ending)

    # basic: the grant is spent exactly, so a real request is refused unless the refund counts
    # (the other accountings convert: the dry runs price requests at and past what is left).
    exact = accounting == "basic"
    every = probe_calls(padded.app, ids, dataset, real_request=exact)
    # The statements each answer runs, too: a read whose statements depend on what a worker
    # stored takes a time that does (service.visibility); none may, for anyone.
    executed: list[str] = []
    bind = session_factory.kw["bind"]

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        many = len(parameters) if isinstance(parameters, (list, tuple, dict)) else 0
        executed.append(f"{re.sub(r'sa_savepoint_[0-9]+', 'sp', statement)} ({many})")

    def answer_and_statements(name: str, call: Call) -> tuple[Any, list[str]]:
        executed.clear()
        return answer(padded, keys[name], call), list(executed)

    event.listen(bind.engine, "before_cursor_execute", seen)
    try:
        before = {name: [answer_and_statements(name, c) for c in every] for name in WATCHERS}
    finally:
        event.remove(bind.engine, "before_cursor_execute", seen)

    def stored() -> list[tuple[str, bool]]:
        with session_factory() as session:
            rows = {str(r.id): (r.status, r.refunded) for r in session.scalars(select(Release))}
        return [rows[r] for r in ids["release_id"]]

    stored_before = stored()
    worker = Worker(session_factory, store, padded_settings, worker_id="probe")
    # A claim each, or more: a continual release waits (a claim of its own again) when a job
    # comes before its next epoch in the workers' order (service.continual.work_ahead).
    assert worker.run_pending() >= len(REQUESTS)
    event.listen(bind.engine, "before_cursor_execute", seen)
    try:
        after = {name: [answer_and_statements(name, c) for c in every] for name in WATCHERS}
    finally:
        event.remove(bind.engine, "before_cursor_execute", seen)

    # The jobs did end three ways, refunded once, as stored (so the probe could fail).
    assert [status for status, _ in stored_before] == ["queued"] * len(REQUESTS)
    if late:
        shown = [padded.get(f"/v1/releases/{r}", headers=bearer(keys["a"])).json()["status"]
                 for r in ids["release_id"]]  # fmt: skip
        assert shown == ["running"] * len(REQUESTS)
    assert stored() == [(end, end == "failed") for _, end in REQUESTS]
    assert len(every) > 60
    changed = [
        (name, call[0], call[1], call[2])
        for name in WATCHERS
        for call, was, now in zip(every, before[name], after[name], strict=True)
        if was != now
    ]
    assert changed == []
    if exact:
        # The real request was refused (the grant was spent, the refund not yet in effect).
        assert before["a"][-1][0][0][0] == 409
    # The statements were seen (so their comparison above could fail).
    assert sum(bool(statements) for _, statements in before["a"]) > len(every) // 2
