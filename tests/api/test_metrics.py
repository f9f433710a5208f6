"""/metrics: the Prometheus text, parsed with prometheus_client's own parser, for admin keys
only; counters checked against the traffic the test made."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.config import Settings
from service.worker import Worker
from tests.conftest import Keys, bearer, post_release

RELEASE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}


def scrape(client: TestClient, key: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of one scrape."""
    response = client.get("/metrics", headers=bearer(key))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_known_traffic(
    client: TestClient,
    keys: Keys,
    upload_dataset: Callable[..., dict[str, Any]],
    run_worker: Callable[[], int],
    worker: Worker,
) -> None:
    budget_route = "/v1/datasets/{dataset_id}/budget"
    before = scrape(client, keys.admin)
    dataset = upload_dataset(client, keys.owner, np.eye(4), row_norm_bound="1")["id"]
    for _ in range(3):
        assert client.get(f"/v1/datasets/{dataset}/budget", headers=bearer(keys.owner)).is_success
    assert client.get(f"/v1/datasets/{dataset}/budget").status_code == 401
    post_release(client, keys.analyst, dataset, **RELEASE)
    refused = client.post(
        f"/v1/datasets/{dataset}/releases", headers=bearer(keys.analyst), json={**RELEASE, "k": 9}
    )
    assert refused.status_code == 422  # k > d
    queued = scrape(client, keys.admin)
    assert value(queued, "dpss_queue_depth", status="queued") == 1
    assert value(queued, "dpss_queue_oldest_age_seconds") >= 0
    run_worker()
    worker.note_alive()
    after = scrape(client, keys.admin)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("dpss_http_requests_total", method="GET", route=budget_route, status="200") == 3
    assert delta("dpss_http_requests_total", method="GET", route=budget_route, status="401") == 1
    assert delta("dpss_http_request_duration_seconds_count", method="GET", route=budget_route) == 4
    assert delta("dpss_http_requests_total", method="POST", route="/v1/datasets", status="201") == 1
    releases = "/v1/datasets/{dataset_id}/releases"
    assert delta("dpss_http_requests_total", method="POST", route=releases, status="202") == 1
    assert delta("dpss_http_requests_total", method="POST", route=releases, status="422") == 1
    # The scrapes themselves are counted (before this one answered).
    assert delta("dpss_http_requests_total", method="GET", route="/metrics", status="200") == 2
    assert value(after, "dpss_releases", mechanism="analyze_gauss", status="succeeded") == 1
    assert value(after, "dpss_queue_depth", status="queued") == 0
    assert value(after, "dpss_ledger_entries", kind="charge") == 1
    assert abs(value(after, "dpss_ledger_epsilon", kind="charge") - 0.1) < 1e-12
    assert value(after, "dpss_workers_alive") == 1
    # Path templates only: no id, key or raw path in any label.
    text = client.get("/metrics", headers=bearer(keys.admin)).text
    for secret in (dataset, keys.owner, keys.analyst, keys.admin):
        assert secret not in text


def test_only_admins_read_metrics(client: TestClient, keys: Keys) -> None:
    assert client.get("/metrics").status_code == 401
    for role in ("owner", "analyst", "auditor"):
        response = client.get("/metrics", headers=bearer(getattr(keys, role)))
        assert response.status_code == 403 and response.json()["error"] == "forbidden"


def test_rate_limited_answers_are_counted(
    settings: Settings, session_factory: sessionmaker[Session], keys: Keys
) -> None:
    limited = settings.model_copy(update={"rate_limit_per_second": 0.01, "rate_limit_burst": 2})
    with TestClient(create_app(limited, session_factory)) as client:
        before = scrape(client, keys.admin)
        statuses = [
            client.get("/v1/mechanisms", headers=bearer(keys.owner)).status_code for _ in range(4)
        ]
        after = scrape(client, keys.admin)
    assert statuses == [200, 200, 429, 429]
    refused = value(after, "dpss_http_refused_total", reason="rate_limited")
    assert refused - value(before, "dpss_http_refused_total", reason="rate_limited") == 2
    label = {"method": "GET", "route": "/v1/mechanisms", "status": "429"}
    assert (
        value(after, "dpss_http_requests_total", **label)
        - value(before, "dpss_http_requests_total", **label)
        == 2
    )


def test_pool_figures_when_the_app_owns_its_engine(
    tmp_path: Path, committed_db: tuple[str, sessionmaker[Session]]
) -> None:
    # The app's own engine commits (its admin key and that key's audit event): on a database
    # emptied after the test, not the shared one later tests' audit chains start from.
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=committed_db[0],
        admin_api_key="metrics-admin",
        rate_limit_per_second=0,
        db_pool_size=3,
    )
    with TestClient(create_app(settings)) as client:
        samples = scrape(client, "metrics-admin")
    assert value(samples, "dpss_db_pool_size") == 3
    assert value(samples, "dpss_db_slots") == settings.db_slots
    assert value(samples, "dpss_db_pool_checked_out") >= 0


COUNT_ONE = """
import sys
from service import metrics
metrics.observe_request("GET", "/v1/mechanisms", int(sys.argv[1]), 0.01)
"""
SHOW = """
from service import metrics
from service.operations import Figures
print(metrics.exposition(Figures(), None).decode())
"""


def test_several_api_processes_add_up_in_multiprocess_mode(tmp_path: Path) -> None:
    """With PROMETHEUS_MULTIPROC_DIR (what `dpss api --workers N` sets), a scrape answered by
    one process counts the requests of all."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for status in ("200", "200", "429"):
        subprocess.run([sys.executable, "-c", COUNT_ONE, status], env=env, check=True)
    shown = subprocess.run(
        [sys.executable, "-c", SHOW], env=env, check=True, capture_output=True, text=True
    ).stdout
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(shown)
        for s in family.samples
    }
    route = {"method": "GET", "route": "/v1/mechanisms"}
    assert value(samples, "dpss_http_requests_total", status="200", **route) == 2
    assert value(samples, "dpss_http_requests_total", status="429", **route) == 1
    assert value(samples, "dpss_http_refused_total", reason="rate_limited") == 1
    assert value(samples, "dpss_http_request_duration_seconds_count", **route) == 3


def test_unavailable_answers_are_counted(settings: Settings) -> None:
    """A database that refuses connections: every request is a 503, counted as `unavailable`
    (read from the registry: the scrape itself needs the database)."""
    from service import metrics
    from service.db.engine import make_engine, make_session_factory

    down = "postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=1"
    factory = make_session_factory(make_engine(down))
    app = create_app(settings.model_copy(update={"database_url": down}), factory)

    def unavailable() -> float:
        sample = metrics.REGISTRY.get_sample_value(
            "dpss_http_refused_total", {"reason": "unavailable"}
        )
        return sample or 0.0

    before = unavailable()
    with TestClient(app) as client:
        statuses = [client.get("/v1/mechanisms", headers=bearer("k")).status_code for _ in range(2)]
    assert statuses == [503, 503]
    assert unavailable() - before == 2
