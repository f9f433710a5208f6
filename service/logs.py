"""Structured logs: one JSON object per line, safe by construction.

A log line is built from an allow-list of fields, never from what a library chooses to attach:
the message, the request's id and key id, and the access fields (method, path template,
status, duration). An exception is logged as its type and location only
(:func:`service.errors.safe_traceback`): its message, its traceback text and any SQL parameters
SQLAlchemy put into it are dropped, since they may quote data values or secrets. No record
carries a request body or a key: the key id (a UUID) identifies the caller.

Every process configures logging through :func:`log_config` (uvicorn's own handlers, its access
log and SQLAlchemy's statement echo are replaced or silenced there). What Python would print
around the handlers (an uncaught exception's traceback, in a thread or a forked run, and a
warning's text) goes through them too, as type and location only (:func:`log_what_python_prints`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import types
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from service.errors import safe_traceback
from service.keyformat import looks_like_key

REQUEST_ID_HEADER = "X-Request-ID"
#: An incoming request id is reused only if it is short and plain (and not shaped like a key,
#: :func:`service.keyformat.looks_like_key`), so that a client cannot write arbitrary text, or
#: a key sent there by mistake, into the log and the response through it.
_WELL_FORMED_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
#: Fields a call may attach with ``extra=`` that reach the log line; anything else is dropped.
EXTRA_FIELDS = ("method", "path", "status", "duration_ms", "release_id", "worker_id")


@dataclass
class RequestLogContext:
    """What every log line of one request carries. Mutable: the key id is learnt after
    authentication, possibly in another thread that shares this object."""

    request_id: str
    key_id: str | None = None


_current: ContextVar[RequestLogContext | None] = ContextVar("dpss_request_log", default=None)


def request_id_from(header: str | None) -> str:
    """The client's ``X-Request-ID`` if well formed, else a fresh random one (the refused value
    is neither logged nor echoed)."""
    if (
        header is not None
        and _WELL_FORMED_REQUEST_ID.fullmatch(header)
        and not looks_like_key(header)
    ):
        return header
    return uuid.uuid4().hex


@contextmanager
def request_context(request_id: str) -> Iterator[RequestLogContext]:
    """Make ``request_id`` part of every log line emitted while the block runs."""
    context = RequestLogContext(request_id=request_id)
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def bind_key_id(key_id: uuid.UUID) -> None:
    """Record the authenticated key's id (never the key) for the current request's log lines.

    Sync dependencies run in a worker thread with a copy of the request's context; the copy
    refers to the same :class:`RequestLogContext`, so the middleware sees the id afterwards.
    """
    context = _current.get()
    if context is not None:
        context.key_id = str(key_id)


def current_key_id() -> str | None:
    context = _current.get()
    return context.key_id if context is not None else None


class JsonFormatter(logging.Formatter):
    """One JSON object per record, from an allow-list of fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = _current.get()
        if context is not None:
            entry["request_id"] = context.request_id
            if context.key_id is not None:
                entry["key_id"] = context.key_id
        for name in EXTRA_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = value
        if record.exc_info and record.exc_info[1] is not None:
            entry["exception"] = safe_traceback(record.exc_info[1])
        return json.dumps(entry, default=str, ensure_ascii=True)


_uncaught = logging.getLogger("dpss.uncaught")


def log_exception(
    what: str, exc_type: type[BaseException], exc: BaseException | None, tb: Any
) -> None:
    """Log an exception nobody caught as one JSON line: its type and location, never its
    message or traceback text (both may quote data values)."""
    if exc is None:
        exc = exc_type()
    if exc.__traceback__ is None and isinstance(tb, types.TracebackType):
        exc = exc.with_traceback(tb)
    _uncaught.error("%s: %s", what, safe_traceback(exc))


def _excepthook(
    exc_type: type[BaseException], exc: BaseException, tb: types.TracebackType | None
) -> None:
    log_exception("uncaught exception", exc_type, exc, tb)


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    log_exception(
        "uncaught exception in a thread", args.exc_type, args.exc_value, args.exc_traceback
    )


def _showwarning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    # A warning's text may quote a value computed from data (SciPy's "Ill-conditioned matrix
    # (rcond=...)"): its category and location only.
    where = f"{filename.rsplit('/', 1)[-1]}:{lineno}"
    logging.getLogger("py.warnings").warning("%s at %s", category.__name__, where)


@contextmanager
def forked_child_failures(what: str) -> Iterator[None]:
    """The body of a forked child (a worker's isolated run): whatever escapes it is logged as
    the parent logs (one JSON line, type and location), and the child ends with exit code 1
    and no outcome, which the parent reports. Otherwise multiprocessing would print the raw
    traceback, message included, to stderr."""
    try:
        yield
    except BaseException as exc:
        logging.getLogger("dpss.worker").error(
            "BUG: %s: the run's process failed: %s", what, safe_traceback(exc)
        )
        logging.shutdown()
        os._exit(1)


def log_what_python_prints() -> None:
    """Route what Python writes to stderr by itself (uncaught exceptions in the main thread and
    in other threads, warnings, a failing handler's report) through the logging configuration,
    as type and location only (or not at all).
    Called with :func:`log_config` in every process the CLI starts; a forked child inherits it."""
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook
    warnings.showwarning = _showwarning
    # A handler that fails would print "--- Logging error ---" with a raw traceback and the
    # record's arguments: drop the record instead.
    logging.raiseExceptions = False


def log_config(level: str = "INFO") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` dictionary: JSON lines on stderr for every logger.

    Passed to uvicorn as ``log_config`` (so each API process, ``--workers`` included, applies
    it), together with ``access_log=False``: the service writes its own access line with the
    path template instead of the raw path. SQLAlchemy's loggers stay at WARNING, so no
    statement or parameter is logged even at DEBUG.
    """
    level = level.upper()
    quiet = {"level": "WARNING", "handlers": [], "propagate": True}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "service.logs.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            "dpss": {"level": level, "handlers": [], "propagate": True},
            "uvicorn": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.error": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.access": {"level": "CRITICAL", "handlers": [], "propagate": False},
            "sqlalchemy": quiet,
            "sqlalchemy.engine": quiet,
            "sqlalchemy.pool": quiet,
            "alembic": quiet,
        },
    }
