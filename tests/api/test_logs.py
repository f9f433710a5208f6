"""Logs are JSON lines with a request id and never carry keys, bodies, exception messages,
SQL parameters or data values: every error case below runs with the service's own logging
configuration at DEBUG, and everything written to stdout and stderr is scanned."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import logging.config
import uuid

import numpy as np
import pytest
from sqlalchemy import text

from service import releases as releases_module
from service.logs import log_config, request_id_from
from service.mechanisms.analyze_gauss import AnalyzeGauss
from tests.conftest import bearer, fetch_release, install_log_config, post_release

FAKE_SECRET = "dpss_NOT-A-REAL-KEY-but-secret-9f8e7d"
EXCEPTION_MESSAGE = "boom-message-with-secret-77aa"
SQL_PARAMETER = "sql-parameter-secret-3141"
DATA_VALUE = "271828.18284"
DATASET_NAME = "jane-doe-ssn-078-05-1120"
RAW_PATH_SEGMENT = "patient-4711-record"
CSV_VALUE = "12345.6789012"
BODY_VALUE = "1.6180339887"


@pytest.fixture
def service_logging():
    """The service's logging configuration (as ``dpss api`` installs it) at DEBUG, writing to
    the returned buffer instead of stderr; restored afterwards. Tests also capture the file
    descriptors (``capfd``) for anything written around the handlers."""
    names = [None, "httpx", *log_config()["loggers"]]
    saved = {}
    for name in names:
        logger = logging.getLogger(name)
        saved[name] = (logger.level, list(logger.handlers), logger.propagate, logger.disabled)
    buffer = io.StringIO()
    config = log_config("DEBUG")
    config["handlers"]["stderr"]["stream"] = buffer
    install_log_config(config)
    # The test's HTTP client logs the URLs it requests: client output, not the service's.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    yield buffer
    for name, (level, handlers, propagate, disabled) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate = propagate
        logger.disabled = disabled


def csv_bytes() -> bytes:
    rows = np.full((20, 3), float(CSV_VALUE))
    buffer = io.StringIO()
    np.savetxt(buffer, rows, delimiter=",", fmt="%.7f")
    return buffer.getvalue().encode()


def test_error_cases_log_no_secret_body_message_or_parameter(
    client, keys, upload_dataset, run_worker, service_logging, capfd, monkeypatch, rng
):
    responses = []
    # 401 with a secret-looking bad key, and a raw path with a data-like segment.
    responses.append(client.get("/v1/datasets", headers=bearer(FAKE_SECRET)))
    responses.append(client.get(f"/v1/datasets/{RAW_PATH_SEGMENT}", headers=bearer(keys.analyst)))
    # 404.
    responses.append(client.get(f"/v1/releases/{uuid.uuid4()}", headers=bearer(keys.analyst)))
    # 422 upload: the rows and the name are in the body, the budget is invalid.
    responses.append(
        client.post(
            "/v1/datasets",
            headers=bearer(keys.owner),
            files={"file": ("data.csv", csv_bytes(), "text/csv")},
            data={"name": DATASET_NAME, "epsilon_budget": f"-{BODY_VALUE}", "delta_budget": "0"},
        )
    )
    # 422 release request with data-like values in params.
    dataset = upload_dataset(client, keys.owner, rng.normal(size=(30, 3)) * 0.1, row_norm_bound=1.0)
    responses.append(
        client.post(
            f"/v1/datasets/{dataset['id']}/releases",
            headers=bearer(keys.analyst),
            json={
                "mechanism": "analyze_gauss",
                "k": 2,
                "epsilon": BODY_VALUE,
                "delta": "1e-6",
                "params": {"clip_norm": f"{BODY_VALUE} {DATA_VALUE}"},
            },
        )
    )

    # A mechanism fault whose message quotes a data value.
    def faulty_run(self, data, spec, rng):
        raise ValueError(f"row 17 has value {DATA_VALUE}")

    monkeypatch.setattr(AnalyzeGauss, "run", faulty_run)
    release_id = post_release(
        client,
        keys.analyst,
        dataset["id"],
        mechanism="analyze_gauss",
        k=2,
        epsilon="0.1",
        delta="1e-6",
    )
    assert run_worker() == 1
    # A mechanism that raises is a bug: logged, and recorded as a charged no_result.
    assert fetch_release(client, keys.owner, release_id)["status"] == "no_result"

    # Forced internal errors: one with a message, one a SQL error carrying its parameters.
    def raising(session, principal, release_id):
        raise RuntimeError(f"{EXCEPTION_MESSAGE} {FAKE_SECRET}")

    monkeypatch.setattr(releases_module, "get_release", raising)
    forced = client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst))
    responses.append(forced)

    def bad_sql(session, principal, release_id):
        session.execute(text("SELECT * FROM no_such_table WHERE x = :p"), {"p": SQL_PARAMETER})

    monkeypatch.setattr(releases_module, "get_release", bad_sql)
    responses.append(client.get(f"/v1/releases/{release_id}", headers=bearer(keys.analyst)))

    assert [r.status_code for r in responses] == [401, 422, 404, 422, 422, 500, 500]
    captured = capfd.readouterr()
    logged = service_logging.getvalue()
    output = logged + captured.out + captured.err
    secrets = [
        *vars(keys).values(),
        *(hashlib.sha256(s.encode()).hexdigest() for s in vars(keys).values()),
        FAKE_SECRET,
        EXCEPTION_MESSAGE,
        SQL_PARAMETER,
        DATA_VALUE,
        DATASET_NAME,
        RAW_PATH_SEGMENT,
        CSV_VALUE,
        BODY_VALUE,
        "no_such_table",  # the SQL text itself
        "Traceback",
    ]
    leaked = [secret for secret in secrets if secret in output]
    assert leaked == [], leaked

    lines = [json.loads(line) for line in logged.splitlines()]
    assert lines and captured.out == captured.err == ""
    access = [line for line in lines if line["logger"] == "dpss.access"]
    by_id = {line["request_id"]: line for line in access}
    for response in responses:
        line = by_id[response.headers["X-Request-ID"]]
        assert line["status"] == response.status_code and line["duration_ms"] >= 0
        assert line["method"] in ("GET", "POST")
    templates = {line["path"] for line in access}
    assert "/v1/releases/{release_id}" in templates
    assert "/v1/datasets/{dataset_id}" in templates
    # The key id (not the key) is on authenticated requests' lines.
    forced_line = by_id[forced.headers["X-Request-ID"]]
    assert uuid.UUID(forced_line["key_id"])
    # Internal errors: the exception's type and location, on a line with the request id.
    errors = [line for line in lines if "exception" in line or "internal error" in line["message"]]
    assert any(
        "RuntimeError at" in line["message"]
        and line.get("request_id") == forced.headers["X-Request-ID"]
        for line in errors
    )
    assert any("ValueError at" in line["message"] for line in lines)  # the mechanism fault


def test_a_well_formed_request_id_is_kept_and_anything_else_replaced(client):
    kept = client.get("/healthz", headers={"X-Request-ID": "trace-abc.123"})
    assert kept.headers["X-Request-ID"] == "trace-abc.123"
    for bad in ("has spaces", "x" * 65, "", "tab\tin", "ünïcode"):
        response = client.get("/healthz", headers={"X-Request-ID": bad.encode()})
        assert response.headers["X-Request-ID"] != bad
        assert len(response.headers["X-Request-ID"]) == 32
    assert request_id_from(None) != request_id_from(None)


def test_the_formatter_keeps_only_type_and_location_of_an_exception(service_logging):
    try:
        raise KeyError(f"{DATA_VALUE} {FAKE_SECRET}")
    except KeyError:
        logging.getLogger("some.library").exception("failed while doing %s", "work")
    err = service_logging.getvalue()
    line = json.loads(err.strip().splitlines()[-1])
    assert line["message"] == "failed while doing work"
    assert line["exception"].startswith("KeyError at test_logs.py:")
    assert DATA_VALUE not in err and FAKE_SECRET not in err and "Traceback" not in err


@pytest.mark.parametrize(
    "refused",
    [
        "dpss_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v",  # a whole key
        "DPSS_anything",  # the prefix, any case
        "req.dpss_x",
        "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v",  # a key's secret part, prefix cut
        "trace-Zq8_rT2mW9xYv4Lk",  # a 16-character mixed-case base64 run
        "trace:abc",  # a colon is not plain
        "x" * 65,
    ],
)
def test_a_request_id_shaped_like_a_key_or_not_plain_is_replaced_never_logged(
    client, service_logging, capfd, refused
):
    response = client.get("/v1/mechanisms", headers={"X-Request-ID": refused})
    assert response.headers["X-Request-ID"] != refused
    assert len(response.headers["X-Request-ID"]) == 32
    out, err = capfd.readouterr()
    assert refused not in service_logging.getvalue() + out + err + response.text


@pytest.mark.parametrize(
    "kept",
    [
        "3f2b9c4e-8d1a-4b7e-9f0c-2a6d5e8b1c3f",  # a UUID
        "4bf92f3577b34da6a3ce929d0e0e4736",  # a hex trace id
        "01ARZ3NDEKTSV4RRFFQ69G5FAV",  # a ULID
        "req-42.retry_1",
        "a" * 64,
    ],
)
def test_plain_request_ids_are_kept(client, kept):
    assert client.get("/healthz", headers={"X-Request-ID": kept}).headers["X-Request-ID"] == kept
