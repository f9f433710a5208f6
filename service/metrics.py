"""Prometheus metrics (``prometheus-client``), read at ``/metrics`` with an admin key.

Two kinds:

- **Per process**, counted as requests pass (:mod:`service.api.observability`): requests by
  method, route template and status, their latency, and the 429 (rate limit) and 503 (database
  busy or away) answers among them. With several API processes (``dpss api --workers N``) set
  ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory shared by them (``dpss api`` does so itself
  when ``N > 1``): each process writes its counters there and a scrape, answered by any one
  process, adds them all up (``prometheus_client.multiprocess``).
- **From the database**, read at each scrape (:func:`service.operations.figures`): the queue's
  depth and oldest wait, workers alive, releases by mechanism and status, ledger entries and
  their summed costs. The database is shared, so any process answers for all. The connection
  pool and the request slots are those of the process that answers.

Every figure is a count, a time, a declared cost or a pool size: none depends on a dataset's
values (see docs/reliability.md, "What operators can see"). But the figures move when jobs
really start and end (the queue's depth, releases by status, ``dpss_release_late_total``): a
scrape, and any Grafana on it, shows run times that the padding hides from analysts, so it is
as sensitive as those run times (docs/deployment.md, "Metrics").
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    # Only named here: importing them would bring scipy, SQLAlchemy and the mechanisms into
    # every importer of this module (the API middleware, `dpss api`); the scrape imports them.
    from service.operations import Figures

MULTIPROCESS_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_LATEST

#: This process's request metrics (not the library's default registry: no interpreter or
#: process collectors, whose figures differ per process and say nothing about the service).
REGISTRY = CollectorRegistry(auto_describe=True)

HTTP_REQUESTS = Counter(
    "dpss_http_requests",
    "HTTP requests answered, by method, route template and status code.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
HTTP_DURATION = Histogram(
    "dpss_http_request_duration_seconds",
    "Time from the request's arrival to the end of its response, by method and route template.",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
HTTP_REFUSED = Counter(
    "dpss_http_refused",
    "Requests refused before any work: rate_limited (429) or unavailable (503, database busy "
    "or away).",
    ["reason"],
    registry=REGISTRY,
)
REFUSAL_REASONS = {429: "rate_limited", 503: "unavailable"}


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    """Count one answered request."""
    HTTP_REQUESTS.labels(method, route, str(status)).inc()
    HTTP_DURATION.labels(method, route).observe(seconds)
    reason = REFUSAL_REASONS.get(status)
    if reason is not None:
        HTTP_REFUSED.labels(reason).inc()


@dataclass(frozen=True)
class PoolFigures:
    """This process's database pool and request slots (:class:`service.api.deps.Database`)."""

    size: int
    checked_out: int
    overflow: int
    slots: int
    slots_in_use: int


class _Snapshot:
    """A one-off collector of the scrape-time figures."""

    def __init__(self, figures: Figures, pool: PoolFigures | None) -> None:
        self.figures = figures
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        f = self.figures
        depth = GaugeMetricFamily(
            "dpss_queue_depth", "Releases queued or running now.", labels=["status"]
        )
        depth.add_metric(["queued"], f.queued)
        depth.add_metric(["running"], f.running)
        yield depth
        yield GaugeMetricFamily(
            "dpss_queue_oldest_age_seconds",
            "How long the oldest queued release has waited (0 if none waits).",
            value=f.oldest_queued_age_seconds,
        )
        yield GaugeMetricFamily(
            "dpss_workers_alive",
            "Workers whose heartbeat is younger than DPSS_WORKER_LEASE_SECONDS.",
            value=f.workers_alive,
        )
        yield GaugeMetricFamily(
            "dpss_workers_known", "Workers seen in the last day.", value=f.workers_known
        )
        yield GaugeMetricFamily(
            "dpss_reference_recheck_overdue_seconds",
            "How long the earliest pending re-check of a dataset by reference is past its due "
            "moment (0 if none): grows when no worker's re-check thread runs.",
            value=f.recheck_overdue_seconds,
        )
        releases = GaugeMetricFamily(
            "dpss_releases",
            "Releases in the database by mechanism and status (queued, running, succeeded, "
            "no_result, failed).",
            labels=["mechanism", "status"],
        )
        for (mechanism, status), count in sorted(f.releases.items()):
            releases.add_metric([mechanism, status], count)
        yield releases
        late = CounterMetricFamily(
            "dpss_release_late",
            "One-shot releases that ended after their visible_at, by mechanism: shown at the next "
            "step of their public schedule. Moves when a job really ends (as every figure here).",
            labels=["mechanism"],
        )
        for mechanism, count in sorted(f.late.items()):
            late.add_metric([mechanism], count)
        yield late
        entries = GaugeMetricFamily(
            "dpss_ledger_entries", "Ledger entries by kind (charge, refund).", labels=["kind"]
        )
        epsilon = GaugeMetricFamily(
            "dpss_ledger_epsilon", "Epsilon summed over the ledger, by kind.", labels=["kind"]
        )
        delta = GaugeMetricFamily(
            "dpss_ledger_delta", "Delta summed over the ledger, by kind.", labels=["kind"]
        )
        for kind in ("charge", "refund"):
            entries.add_metric([kind], f.ledger_entries.get(kind, 0))
            epsilon.add_metric([kind], f.ledger_epsilon.get(kind, 0.0))
            delta.add_metric([kind], f.ledger_delta.get(kind, 0.0))
        yield from (entries, epsilon, delta)
        yield from self._spend()
        if self.pool is not None:
            pool = self.pool
            for name, help_text, value in (
                ("dpss_db_pool_size", "Connections the pool keeps (this process).", pool.size),
                (
                    "dpss_db_pool_checked_out",
                    "Pooled connections in use now (this process; the scrape's own included).",
                    pool.checked_out,
                ),
                (
                    "dpss_db_pool_overflow",
                    "Connections open beyond the pool's size (this process).",
                    pool.overflow,
                ),
                (
                    "dpss_db_slots",
                    "Units of work that may hold a connection at once (this process).",
                    pool.slots,
                ),
                (
                    "dpss_db_slots_in_use",
                    "Units of work holding or about to hold a connection (this process).",
                    pool.slots_in_use,
                ),
            ):
                yield GaugeMetricFamily(name, help_text, value=value)

    def _spend(self) -> Iterator[Metric]:
        """Spend by accounting, stated as every budget is (:func:`service.spend.statement`):
        epsilon at each dataset's delta_total, with the native rho beside it."""
        from service import spend
        from service.accounting import ACCOUNTINGS

        labels = ["accounting"]
        datasets = GaugeMetricFamily("dpss_datasets", "Datasets by accounting.", labels=labels)
        spent = GaugeMetricFamily(
            "dpss_spent_epsilon",
            "Epsilon spent, summed over datasets, by accounting: each dataset's epsilon_spent "
            "as GET .../budget states it (at its delta_total), net of refunds in effect.",
            labels=labels,
        )
        remaining = GaugeMetricFamily(
            "dpss_remaining_epsilon",
            "Epsilon remaining, summed over datasets, by accounting (as GET .../budget).",
            labels=labels,
        )
        rho = GaugeMetricFamily(
            "dpss_spent_rho",
            "Rho spent (the native figure of gaussian and zcdp, hybrid's zCDP filter's; 0 for "
            "basic), summed over datasets, by accounting.",
            labels=labels,
        )
        sums: dict[str, list[float]] = {kind: [0, 0.0, 0.0, 0.0] for kind in ACCOUNTINGS}
        for state in self.figures.budgets:
            stated = spend.statement(state)
            row = sums.setdefault(state.accounting, [0, 0.0, 0.0, 0.0])
            row[0] += 1
            row[1] += float(stated.epsilon_spent)
            row[2] += float(stated.epsilon_remaining)
            row[3] += float(stated.native.rho_spent or 0)
        for kind, (count, epsilon, left, native) in sorted(sums.items()):
            datasets.add_metric([kind], count)
            spent.add_metric([kind], epsilon)
            remaining.add_metric([kind], left)
            rho.add_metric([kind], native)
        yield from (datasets, spent, remaining, rho)


def _process_registry() -> CollectorRegistry:
    if os.environ.get(MULTIPROCESS_VARIABLE):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY


def exposition(figures: Figures, pool: PoolFigures | None) -> bytes:
    """The text a scrape returns: this process's (or every process's) request metrics, then
    the scrape-time figures. Converts each budget to epsilon (milliseconds each, cached):
    callers run it off the event loop."""
    return generate_latest(_process_registry()) + generate_latest(_Snapshot(figures, pool))
