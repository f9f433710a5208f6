"""The optional monitoring profile of docker-compose.yml: Prometheus and Grafana only under
`--profile monitoring` (the default stack is unchanged), Prometheus scrapes /metrics with the
key its entrypoint writes, and every query of the provisioned Grafana dashboard names a metric
the service exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from service import metrics
from service.operations import Figures

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "monitoring"


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def test_monitoring_is_an_optional_profile() -> None:
    services = compose()["services"]
    assert {name for name, s in services.items() if "profiles" not in s} == {
        "db",
        "migrate",
        "api",
        "worker",
    }
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]
        published = services[name]["ports"][0]
        assert published.startswith("${") and "127.0.0.1" in published  # loopback by default


def test_prometheus_scrapes_the_api_with_the_key_it_writes() -> None:
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"] == [{"targets": ["api:8000"]}]
    key_file = job["authorization"]["credentials_file"]
    command = " ".join(compose()["services"]["prometheus"]["command"])
    assert f"> {key_file}" in command and "umask 077" in command


def exported_samples() -> set[str]:
    metrics.observe_request("GET", "/v1/mechanisms", 429, 0.01)
    pool = metrics.PoolFigures(size=1, checked_out=0, overflow=0, slots=1, slots_in_use=0)
    figures = Figures(releases={("analyze_gauss", "succeeded"): 1})
    text = metrics.exposition(figures, pool).decode()
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


def test_every_dashboard_query_names_an_exported_metric() -> None:
    dashboard = json.loads((MONITORING / "grafana" / "dashboards" / "dpss.json").read_text())
    exported = exported_samples()
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bdpss_[a-z_]+", target["expr"])
    }
    assert queried and queried <= exported, queried - exported
    # The list: requests, latency, refusals, queue, workers, releases, ledger, pool.
    for family in (
        "dpss_http_requests_total",
        "dpss_http_request_duration_seconds_bucket",
        "dpss_http_refused_total",
        "dpss_queue_depth",
        "dpss_queue_oldest_age_seconds",
        "dpss_workers_alive",
        "dpss_releases",
        "dpss_ledger_epsilon",
        "dpss_db_pool_checked_out",
    ):
        assert family in queried, family
    datasource = yaml.safe_load(
        (MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    uid = datasource["datasources"][0]["uid"]
    assert all(panel["datasource"]["uid"] == uid for panel in dashboard["panels"])
