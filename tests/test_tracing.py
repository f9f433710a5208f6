"""Traces: a release's request, queue wait, run and store are one trace (the request's context
travels in the release row), and no span carries a key, a header, a query string or a value
of the data. Recorded with opentelemetry-sdk's in-memory exporter."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote

import numpy as np
import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service import tracing
from service.db.models import Release
from tests.conftest import Keys, bearer, post_release

#: Values no span may carry.
DATA = np.array([[0.123456789, 0.987654321, 0.0, 0.0], [0.0, 0.0, 0.555555555, 0.0]] * 4)
ALLOWED_ATTRIBUTES = {
    "http.request.method",
    "http.route",
    "http.response.status_code",
    "dpss.release.id",
    "dpss.mechanism",
    "dpss.k",
    "dpss.attempt",
    "dpss.release.status",
}


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """A provider of this test's own (the process's global provider stays the no-op one)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(tracing.export_pipeline(exporter, batch=False))
    monkeypatch.setattr(tracing, "tracer", lambda: provider.get_tracer(tracing.TRACER_NAME))
    yield exporter
    provider.shutdown()


def by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in finished}


def test_a_release_is_one_trace_without_keys_or_data(
    spans: InMemorySpanExporter,
    client: TestClient,
    keys: Keys,
    upload_dataset: Callable[..., dict[str, Any]],
    run_worker: Callable[[], int],
    session_factory: sessionmaker[Session],
) -> None:
    dataset = upload_dataset(client, keys.owner, DATA, row_norm_bound="1")["id"]
    spans.clear()
    release_id = post_release(
        client, keys.analyst, dataset, mechanism="analyze_gauss", k=1, epsilon="0.5", delta="1e-6"
    )
    with session_factory() as session:
        traceparent = session.execute(
            select(Release.traceparent).where(Release.id == uuid.UUID(release_id))
        ).scalar_one()
    assert traceparent is not None and traceparent.startswith("00-")
    assert run_worker() == 1
    finished = spans.get_finished_spans()
    named = by_name(finished)
    request = named["POST /v1/datasets/{dataset_id}/releases"]
    assert request.kind is SpanKind.SERVER
    assert request.attributes is not None and request.attributes["http.response.status_code"] == 202
    assert request.context is not None
    trace_id = request.context.trace_id
    assert traceparent.split("-")[1] == f"{trace_id:032x}"
    for name in ("release.queue_wait", "release.job", "release.run", "release.store"):
        span = named[name]
        assert span.context is not None and span.context.trace_id == trace_id, name
    assert named["release.job"].parent is not None
    assert named["release.job"].parent.span_id == request.context.span_id
    assert named["release.run"].parent is not None
    job_context = named["release.job"].context
    assert job_context is not None
    assert named["release.run"].parent.span_id == job_context.span_id
    assert named["release.job"].attributes is not None
    assert named["release.job"].attributes["dpss.release.status"] == "succeeded"
    wait = named["release.queue_wait"]
    assert wait.start_time is not None and wait.end_time is not None
    assert wait.start_time <= wait.end_time
    basis = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)).json()
    forbidden = [keys.analyst, keys.owner, "Bearer", "authorization", "0.123456", "0.98765"]
    forbidden += [repr(x)[:8] for x in np.ravel(basis["result"]["basis"])]
    for span in finished:
        attributes = dict(span.attributes or {})
        assert set(attributes) <= ALLOWED_ATTRIBUTES, (span.name, attributes)
        assert not span.events, span.name  # no exception events with messages
        shown = repr((span.name, attributes, span.resource.attributes))
        for value in forbidden:
            assert value not in shown, (span.name, value)


def test_a_caller_trace_context_is_continued(
    spans: InMemorySpanExporter, client: TestClient, keys: Keys
) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    response = client.get(
        "/v1/mechanisms?", headers={**bearer(keys.analyst), "traceparent": parent}
    )
    assert response.status_code == 200
    (span,) = [s for s in spans.get_finished_spans() if s.name == "GET /v1/mechanisms"]
    assert span.context is not None and f"{span.context.trace_id:032x}" == parent.split("-")[1]


def test_tracing_is_off_without_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in tracing.ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not tracing.enabled_by_environment()
    assert tracing.configure("dpss-test") is False
    assert tracing.current_traceparent() is None
    assert tracing.enabled_by_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})


def test_no_key_leaves_the_process_whatever_a_span_carries(
    spans: InMemorySpanExporter, client: TestClient, keys: Keys
) -> None:
    """What an instrumentation library (``opentelemetry-instrument``, FastAPI's or httpx's
    instrumentor) records of a request: its query, raw path, full URL, headers, an exception
    event quoting the key. None of it may be exported with a key in it."""
    secret = keys.analyst
    bare = secret.removeprefix("dpss_")
    assert client.get(f"/v1/mechanisms?api_key={secret}").status_code == 422
    with tracing.tracer().start_as_current_span(
        f"GET /v1/{secret}",
        kind=SpanKind.SERVER,
        attributes={
            "url.query": f"api_key={secret}",
            "http.query": "token=" + bare,
            "url.path": f"/v1/datasets/{secret}/x",
            "http.target": f"/v1/{bare}?api_key={secret}",
            "url.full": f"http://h/v1/{bare}?k={secret}#{secret}",
            "http.request.header.authorization": [f"Bearer {secret}"],
            "http.request.header.x-api-key": [bare],
            "http.request.header.cookie": "s=1",
            "db.statement.parameters": f"('{bare}',)",
            "http.route": "/v1/mechanisms",
        },
    ) as span:
        span.add_event("exception", {"exception.message": f"bad key {secret}"})
        span.add_event(f"seen {bare}")
        span.set_status(Status(StatusCode.ERROR, f"refused {secret}"))
    finished = spans.get_finished_spans()
    assert finished
    for exported in finished:
        shown = repr(
            (
                exported.name,
                dict(exported.attributes or {}),
                [(event.name, dict(event.attributes or {})) for event in exported.events],
                [dict(link.attributes or {}) for link in exported.links],
                exported.status.description,
            )
        )
        for value in (secret, bare, bare[:16], "api_key=", "token=", "s=1"):
            assert value not in shown, (exported.name, value, shown)
    (instrumented,) = [
        s for s in finished if s.kind is SpanKind.SERVER and "url.path" in (s.attributes or {})
    ]
    attributes = dict(instrumented.attributes or {})
    # What carries no secret is kept, so traces stay useful.
    assert attributes["http.route"] == "/v1/mechanisms"
    assert attributes["url.path"] == "/v1/datasets/[redacted]/x"
    assert attributes["url.full"] == "http://h/v1/[redacted]"


def test_a_percent_encoded_key_is_redacted_too(
    spans: InMemorySpanExporter, client: TestClient, keys: Keys
) -> None:
    """A path, URL or span name carries what the client sent: a key percent-encoded (every
    character, or twice) has no run of key characters for the redaction to see, and was
    exported verbatim, one ``unquote`` from the key."""
    secret = keys.analyst
    once = "".join(f"%{b:02X}" for b in secret.encode())
    twice = once.replace("%", "%25")
    with tracing.tracer().start_as_current_span(
        f"GET /v1/{once}",
        kind=SpanKind.SERVER,
        attributes={
            "url.path": f"/v1/datasets/{once}/x",
            "http.target": f"/v1/{twice}",
            "url.full": f"http://h/v1/{once}",
            "dpss.note": [f"seen {twice}"],
        },
    ) as span:
        span.add_event(f"seen {once}")
        span.set_status(Status(StatusCode.ERROR, f"refused {twice}"))
    for exported in spans.get_finished_spans():
        shown = repr(
            (
                exported.name,
                dict(exported.attributes or {}),
                [(event.name, dict(event.attributes or {})) for event in exported.events],
                exported.status.description,
            )
        )
        decoded = unquote(unquote(shown))
        for value in (secret, secret.removeprefix("dpss_")[:16]):
            assert value not in decoded, (exported.name, shown)
    # A value without a key is exported as it was (encoded or not).
    assert tracing.redact_attributes({"url.path": "/v1/a%20b"}) == {"url.path": "/v1/a%20b"}
