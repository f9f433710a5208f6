"""The outermost layer: Prometheus request metrics, the request's trace span, and the
dashboard's Content-Security-Policy.

It sits outside :func:`service.api.middleware.harden`'s layers (:class:`ObservedApp`), so it
sees every answer, the rate limiter's 429s and the 500s of Starlette's error middleware
included, labelled by path template (never the raw path; unmatched paths are one label).

The span of a request is named ``METHOD /path/{template}`` and carries the method, the template
and the status code, nothing else: no header (so no ``Authorization``), no query string, no id
from the path. A caller's ``traceparent`` is honoured, so a client's trace can include the call.

The dashboard's pages (:mod:`service.api.dashboard`) run the service's own scripts, so their
policy replaces the API's ``default-src 'none'`` with :data:`DASHBOARD_CSP`.
"""

from __future__ import annotations

import time

from opentelemetry.trace import SpanKind, StatusCode
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import metrics, tracing
from service.api.middleware import PathTemplates, ServiceApp

#: The dashboard's pages: scripts, styles, images and API calls from this origin only.
DASHBOARD_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
DASHBOARD_PREFIX = "/dashboard"


class ObservabilityMiddleware:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, templates: PathTemplates) -> None:
        self.app = app
        self.templates = templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        dashboard = path == DASHBOARD_PREFIX or path.startswith(DASHBOARD_PREFIX + "/")
        method: str = scope["method"]
        status = 500  # what the client gets if the app raises before answering
        start = time.perf_counter()

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if dashboard:
                    MutableHeaders(scope=message)["Content-Security-Policy"] = DASHBOARD_CSP
            await send(message)

        parent = tracing.context_from_headers(Headers(scope=scope))
        with tracing.tracer().start_as_current_span(
            method,
            context=parent,
            kind=SpanKind.SERVER,
            # An exception's message may quote anything: neither it nor its traceback goes in.
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                await self.app(scope, receive, observed_send)
            finally:
                route = self.templates(scope)
                metrics.observe_request(method, route, status, time.perf_counter() - start)
                if span.is_recording():
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.request.method", method)
                    span.set_attribute("http.route", route)
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(StatusCode.ERROR)


class ObservedApp(ServiceApp):
    """:class:`ServiceApp` with :class:`ObservabilityMiddleware` outside its layers."""

    def build_middleware_stack(self) -> ASGIApp:
        return ObservabilityMiddleware(super().build_middleware_stack(), PathTemplates(self))
