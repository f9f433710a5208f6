"""OpenTelemetry traces of the API and the worker, on only when ``OTEL_EXPORTER_OTLP_ENDPOINT``
(or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set.

Without an endpoint nothing is configured: ``opentelemetry-api``'s tracer is a no-op and no span
is recorded or exported. With one, each process exports its spans over OTLP/HTTP (the standard
``OTEL_*`` variables configure the exporter: headers, timeouts, ``OTEL_SERVICE_NAME``).

One release is one trace: the request's server span (``POST
/v1/datasets/{dataset_id}/releases``), then, in the worker, ``release.job`` with its children
``release.queue_wait`` (from the request to the claim), ``release.run`` and ``release.store``.
The link is the release row's ``traceparent`` column: the W3C trace context of the request,
two random ids and a flag, written with the release and read by the worker's claim.

What spans carry: method, path *template*, status code, mechanism name, ``k``, attempt and the
release's status. Never a header (no ``Authorization``), a query string, a parameter value, a
budget, a dataset value or a key. Span timings show how long a run took, which the padding hides
from analysts: traces are for operators (see docs/reliability.md, "What operators can see").
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, Span, SpanKind, Status, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes, AttributeValue

from service.keyformat import REDACTED, redact_keys

TRACER_NAME = "dpss"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_propagator = TraceContextTextMapPropagator()
_configured = False


def enabled_by_environment(environ: Mapping[str, str] | None = None) -> bool:
    """Whether an OTLP endpoint is configured."""
    environ = os.environ if environ is None else environ
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def configure(service_name: str) -> bool:
    """Export this process's spans over OTLP/HTTP if an endpoint is set; once per process.
    Returns whether tracing is on."""
    global _configured
    if _configured:
        return True
    if not enabled_by_environment():
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        # Someone configured the SDK first (``opentelemetry-instrument``): its exporters are
        # not ours to wrap, and spans would leave unredacted. Say so rather than pretend.
        logging.getLogger("dpss.tracing").warning(
            "a tracer provider was configured outside the service (opentelemetry-instrument?); "
            "its spans are not redacted: run the service without it"
        )
        return False
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(export_pipeline(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _configured = True
    return True


def export_pipeline(exporter: SpanExporter, batch: bool = True) -> SpanProcessor:
    """The processor through which every span of the service leaves the process: ``exporter``
    sees only redacted copies (:class:`RedactingSpanExporter`). ``batch=False`` exports each
    span as it ends (tests)."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    redacting = RedactingSpanExporter(exporter)
    return BatchSpanProcessor(redacting) if batch else SimpleSpanProcessor(redacting)


#: Attributes that hold a query string: dropped whole (any parameter may be a secret).
_QUERY_ATTRIBUTES = frozenset({"url.query", "http.query", "http.query_string"})
#: Attributes that hold a URL or request target: kept without their query and fragment.
_URL_ATTRIBUTES = frozenset({"url.full", "http.url", "http.target", "url.original"})
#: Words naming an attribute whose value is a credential (headers, cookies, parameters).
_SECRET_NAME = re.compile(r"authorization|cookie|key|token|secret|password|session", re.I)


#: Rounds of percent-decoding tried on a value before its keys are looked for (a key sent
#: percent-encoded twice is still a key).
_DECODE_ROUNDS = 3


def _redact_text(value: str) -> str:
    """``value`` with its keys redacted, also those written percent-encoded (a path or URL
    carries what the client sent: ``%64%70%73%73%5F...`` is a key with none of its runs
    visible). A value holding an encoded key is exported decoded, with the key redacted."""
    decoded = value
    for _ in range(_DECODE_ROUNDS):
        if "%" not in decoded:
            break
        decoded = unquote(decoded)
    if decoded != value and redact_keys(decoded) != decoded:
        return redact_keys(decoded)
    return redact_keys(value)


def _redact_value(name: str, value: AttributeValue) -> AttributeValue:
    if name in _QUERY_ATTRIBUTES or (_SECRET_NAME.search(name) and not name.startswith("dpss.")):
        return REDACTED
    if isinstance(value, str):
        if name in _URL_ATTRIBUTES:
            value = value.split("?", 1)[0].split("#", 1)[0]
        return _redact_text(value)
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return [_redact_text(str(item)) for item in value]
    return value


def redact_attributes(attributes: Attributes) -> dict[str, AttributeValue]:
    """``attributes`` safe to export (see the module docstring)."""
    return {
        _redact_text(name): _redact_value(name, value) for name, value in (attributes or {}).items()
    }


def redact_span(span: ReadableSpan) -> ReadableSpan:
    """A copy of ``span`` with its name, status, attributes, events and links redacted."""
    status = span.status
    if status.description:
        status = Status(status.status_code, _redact_text(status.description))
    return ReadableSpan(
        name=_redact_text(span.name),
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=redact_attributes(span.attributes),
        events=[
            Event(_redact_text(event.name), redact_attributes(event.attributes), event.timestamp)
            for event in span.events
        ],
        links=[Link(link.context, redact_attributes(link.attributes)) for link in span.links],
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class RedactingSpanExporter(SpanExporter):
    """Hands ``exporter`` redacted copies of the spans (:func:`redact_span`)."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.exporter.export([redact_span(span) for span in spans])

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


def tracer() -> Tracer:
    """The service's tracer (a no-op until a provider is set)."""
    return trace.get_tracer(TRACER_NAME)


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span; ``None`` when no span is being recorded."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def context_from_headers(headers: Mapping[str, str]) -> Context:
    """The caller's trace context (``traceparent`` and ``tracestate`` only), if it sent one."""
    carrier = {name: headers[name] for name in ("traceparent", "tracestate") if name in headers}
    return _propagator.extract(carrier)


def context_from_traceparent(traceparent: str | None) -> Context | None:
    """The context a stored ``traceparent`` names; ``None`` without one."""
    if not traceparent:
        return None
    return _propagator.extract({"traceparent": traceparent})


def _nanoseconds(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


class JobSpans:
    """The spans of one claimed job (see :func:`job_spans`)."""

    def __init__(self, span: Span, attributes: dict[str, str | int]) -> None:
        self.span = span
        self.attributes = attributes

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A child span of ``release.job`` (``release.run``, ``release.store``)."""
        with tracer().start_as_current_span(
            name, attributes=self.attributes, record_exception=False, set_status_on_exception=False
        ):
            yield

    def finished(self, status: str) -> None:
        self.span.set_attribute("dpss.release.status", status)


@contextmanager
def job_spans(job: Any) -> Iterator[JobSpans]:
    """``release.queue_wait`` (request to claim, recorded now with its real times) and
    ``release.job`` around the processing, both in the trace of the request that queued the
    job (its ``traceparent``), or in a trace of their own for a job queued untraced."""
    parent = context_from_traceparent(job.traceparent)
    attributes: dict[str, str | int] = {
        "dpss.release.id": str(job.release_id),
        "dpss.mechanism": job.mechanism,
        "dpss.k": job.k,
        "dpss.attempt": job.attempt,
    }
    if job.queued_at is not None and job.claimed_at is not None:
        wait = tracer().start_span(
            "release.queue_wait",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            start_time=_nanoseconds(job.queued_at),
        )
        wait.end(end_time=_nanoseconds(max(job.claimed_at, job.queued_at)))
    with tracer().start_as_current_span(
        "release.job",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield JobSpans(span, attributes)
