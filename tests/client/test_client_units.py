"""Client pieces that need no service: the .npy stream, decimal text, error mapping."""

from __future__ import annotations

import io
from decimal import Decimal
from typing import Any

import httpx
import numpy as np
import pytest

from dpss_client.client import (
    AuthError,
    BudgetExceededError,
    Client,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    NpyStream,
    ServerError,
    ServiceUnreachableError,
    _decimal_str,
    error_from_response,
)
from dpss_client.remote_cli import parse_params


def _npy_bytes(array: np.ndarray[Any, Any]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _read_all(stream: NpyStream, chunk: int) -> bytes:
    return b"".join(iter(lambda: stream.read(chunk), b""))


ARRAYS = {
    "c_order": np.arange(35.0).reshape(7, 5),
    "fortran_order": np.asfortranarray(np.arange(35.0).reshape(7, 5)),
    "strided": np.arange(120.0).reshape(12, 10)[::3, ::2],
    "big_endian_f4": np.arange(6, dtype=">f4").reshape(2, 3),
    "int64": np.arange(12, dtype=np.int64).reshape(4, 3),
    "empty": np.zeros((0, 3)),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
@pytest.mark.parametrize("chunk", [1, 7, 65536])
def test_npy_stream_is_byte_for_byte_np_save(name: str, chunk: int) -> None:
    array = ARRAYS[name]
    stream = NpyStream(array)
    expected = _npy_bytes(array)
    assert stream.seek(0, io.SEEK_END) == len(expected)
    stream.seek(0)
    got = _read_all(stream, chunk)
    assert got == expected
    np.testing.assert_array_equal(np.load(io.BytesIO(got)), array)


def test_npy_stream_reads_the_array_in_place() -> None:
    # A change made after the stream exists shows up in what it sends: nothing was copied.
    array = np.zeros((1000, 8))
    stream = NpyStream(array)
    array[999, 7] = 42.0
    assert np.load(io.BytesIO(_read_all(stream, 65536)))[999, 7] == 42.0


def test_npy_stream_refuses_object_arrays() -> None:
    with pytest.raises(ValueError, match="object"):
        NpyStream(np.array([[object()]], dtype=object))


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.1, "0.1"), ("0.1", "0.1"), (Decimal("1e-5"), "0.00001"), (1, "1"), (1e-6, "0.000001")],
)
def test_decimals_are_sent_exactly(value: Any, text: str) -> None:
    assert Decimal(_decimal_str(value, "epsilon")) == Decimal(text)


@pytest.mark.parametrize("value", [float("nan"), "inf", "abc", True])
def test_bad_decimals_are_refused_locally(value: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        _decimal_str(value, "epsilon")


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (401, {"error": "unauthenticated", "detail": "no key"}, AuthError),
        (403, {"error": "forbidden", "detail": "role"}, AuthError),
        (404, {"error": "not_found", "detail": "no dataset"}, NotFoundError),
        (409, {"error": "idempotency_conflict", "detail": "reused"}, ConflictError),
        (413, {"error": "payload_too_large", "detail": "big"}, InvalidRequestError),
        (422, {"error": "invalid_input", "detail": "k: too big"}, InvalidRequestError),
        (500, {"error": "internal", "detail": "oops"}, ServerError),
        (422, {"detail": [{"loc": ["body", "k"]}]}, InvalidRequestError),
    ],
)
def test_error_mapping(status: int, body: dict[str, Any], kind: type[Exception]) -> None:
    error = error_from_response(httpx.Response(status, json=body))
    assert type(error) is kind
    assert error.status == status
    assert error.code == body.get("error", f"http_{status}")


def test_budget_exceeded_carries_remaining_budget() -> None:
    body = {
        "error": "budget_exceeded",
        "detail": "costs more",
        "epsilon_remaining": "0.3",
        "delta_remaining": "0.000001",
    }
    error = error_from_response(httpx.Response(409, json=body))
    assert isinstance(error, BudgetExceededError)
    assert error.epsilon_remaining == Decimal("0.3")
    assert error.delta_remaining == Decimal("0.000001")
    assert error.epsilon_admissible is None


def test_budget_exceeded_carries_the_epsilon_the_request_is_admitted_at() -> None:
    # Under hybrid epsilon_remaining states the spend; the 409 also says what the same
    # request IS admitted at (tests/api/test_hybrid_admissible_epsilon.py).
    body = {
        "error": "budget_exceeded",
        "detail": "costs more",
        "epsilon_remaining": "0.67",
        "delta_remaining": "0",
        "epsilon_admissible": "0.198",
    }
    error = error_from_response(httpx.Response(409, json=body))
    assert isinstance(error, BudgetExceededError)
    assert error.epsilon_admissible == Decimal("0.198")


def test_unreachable_service() -> None:
    with (
        Client("http://127.0.0.1:9", "key", timeout=2) as dpss,
        pytest.raises(ServiceUnreachableError) as caught,
    ):
        dpss.mechanisms()
    assert caught.value.status is None and caught.value.code == "unreachable"


def test_parse_params() -> None:
    assert parse_params(["clip_norm=1.5", "name=abc", "flag=true", "xs=[1,2]"]) == {
        "clip_norm": 1.5,
        "name": "abc",
        "flag": True,
        "xs": [1, 2],
    }


# -- waiting for a release: long polls, and polls against a service without them -------------

RELEASE_ID = "0b0e5a52-4c1e-4a43-9c0e-5d8f0d6c3a11"


def _release_json(status: str) -> dict[str, Any]:
    return {
        "id": RELEASE_ID,
        "dataset_id": "5e0d7b84-7c39-4a3e-9b7e-1f5d29e3a0c2",
        "mechanism": "analyze_gauss",
        "k": 1,
        "epsilon": "1",
        "delta": "1e-6",
        "params": {},
        "status": status,
        "result": {"basis": [[1.0]], "basis_sha256": None, "extras": {}}
        if status == "succeeded"
        else None,
        "created_at": "2026-01-01T00:00:00Z",
    }


def _handle(answer: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[Any], list[float]]:
    import dpss_client.handles as handles_module
    from api_schemas.releases import Release
    from dpss_client.client import ReleaseHandle

    seen: list[httpx.Request] = []
    slept: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer(request, len(seen))

    monkeypatch.setattr(handles_module, "_sleep", slept.append)
    http = httpx.Client(transport=httpx.MockTransport(handler), timeout=60)
    client = Client("http://dpss.test", "key", http=http)
    handle = ReleaseHandle(client, Release.model_validate(_release_json("queued")))
    return handle, seen, slept


def test_wait_uses_the_long_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    def answer(request: httpx.Request, count: int) -> httpx.Response:
        # A long poll that ends at its bound, then one that ends with the outcome.
        return httpx.Response(200, json=_release_json("running" if count == 1 else "succeeded"))

    import dpss_client.handles as handles_module

    handle, seen, slept = _handle(answer, monkeypatch)
    # Each long poll takes its whole 25 s (30 s on this clock): none ended early.
    clock = iter(range(0, 1000, 30))
    monkeypatch.setattr(handles_module, "time", type("Clock", (), {"monotonic": clock.__next__}))
    assert handle.wait_finished().status == "succeeded"
    # Unfinished past NO_WORKER_CHECK_SECONDS, the wait also asked whether a worker is alive.
    assert [r.url.params.get("wait") for r in seen if r.url.path != "/readyz"] == ["25", "25"]
    assert [r.url.path for r in seen].count("/readyz") == 1
    assert slept == []


def test_wait_polls_a_service_without_long_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    def answer(request: httpx.Request, count: int) -> httpx.Response:
        if "wait" in request.url.params:
            return httpx.Response(
                422, json={"error": "invalid_parameter", "detail": "wait: unknown parameter"}
            )
        return httpx.Response(200, json=_release_json("succeeded" if count >= 3 else "queued"))

    handle, seen, slept = _handle(answer, monkeypatch)
    assert handle.wait_finished(poll_interval=0.2).status == "succeeded"
    # One refused long poll, then polls only (the client remembers).
    assert [r.url.params.get("wait") for r in seen] == ["25", None, None]
    assert slept == [0.2, 0.30000000000000004]
    assert handle._client._no_long_poll


def test_a_long_poll_answered_at_once_falls_back_to_a_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def answer(request: httpx.Request, count: int) -> httpx.Response:
        # Too many waiting: the service answers at once, unfinished.
        return httpx.Response(200, json=_release_json("succeeded" if count >= 3 else "queued"))

    handle, seen, slept = _handle(answer, monkeypatch)
    assert handle.wait_finished(poll_interval=0.5).status == "succeeded"
    assert slept == [0.5]
    assert [r.url.params.get("wait") for r in seen] == ["25", None, "25"]


def test_epoch_records_long_poll_for_the_next_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    epoch = {"epoch": 1, "batch_seq": 0, "n_rows_read": 3, "basis": [[1.0]]}

    polls: list[int] = []

    def answer(request: httpx.Request, count: int) -> httpx.Response:
        if request.url.path.endswith("/epochs"):
            # A long poll that ends at its bound empty, then one that brings epoch 1; the
            # release has then finished.
            polls.append(count)
            items = [epoch] if len(polls) == 2 else []
            return httpx.Response(200, json={"items": items, "total": 1, "next": None})
        return httpx.Response(200, json=_release_json("running" if len(polls) < 2 else "succeeded"))

    import dpss_client.handles as handles_module

    handle, seen, slept = _handle(answer, monkeypatch)
    clock = iter(range(0, 1000, 30))  # every request takes 30 s: no long poll ended early
    monkeypatch.setattr(handles_module, "time", type("Clock", (), {"monotonic": clock.__next__}))
    records = list(handle.epoch_records(timeout=None))
    assert [r.epoch for r in records] == [1]
    epochs = [r for r in seen if r.url.path.endswith("/epochs")]
    # The release finished with epoch 1, its total: no poll after it.
    assert [(r.url.params["after"], r.url.params.get("wait")) for r in epochs] == [
        ("0", "25"),
        ("0", "25"),
    ]
    assert slept == []  # held polls, no client-side pauses


def test_budget_exceeded_carries_the_delta_the_request_is_admitted_at() -> None:
    # No epsilon at the request's delta (hybrid's delta filter spent): another delta and the
    # epsilon the same request is admitted at with it.
    body = {
        "error": "budget_exceeded",
        "detail": "costs more",
        "epsilon_remaining": "0.8",
        "delta_remaining": "0.00000003",
        "epsilon_admissible": None,
        "delta_admissible": "0.00000001",
        "delta_admissible_epsilon": "0.662",
    }
    error = error_from_response(httpx.Response(409, json=body))
    assert isinstance(error, BudgetExceededError)
    assert error.epsilon_admissible is None
    assert error.delta_admissible == Decimal("1e-8")
    assert error.delta_admissible_epsilon == Decimal("0.662")
