"""``basis_format=base64``: a finished release's basis as its stored bytes, the same numbers as
the JSON lists, hidden exactly when they are; the Python client asks for it and hands callers
the lists as before."""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from tests.api.conftest import BODY, Service
from tests.conftest import bearer


def test_base64_is_the_stored_bytes_of_the_json_basis(
    make_service: Callable[..., Service],
) -> None:
    service = make_service()
    release = service.request()
    assert service.worker.run_pending() == 1
    lists = service.get(release).json()["result"]
    packed = service.get(release, basis_format="base64").json()["result"]
    assert lists["basis_base64"] is None and lists["basis_shape"] is None
    assert packed["basis"] is None and packed["basis_shape"] == [6, 2]
    data = base64.b64decode(packed["basis_base64"], validate=True)
    assert hashlib.sha256(data).hexdigest() == packed["basis_sha256"] == lists["basis_sha256"]
    decoded = np.frombuffer(data, dtype="<f8").reshape(6, 2)
    assert np.array_equal(decoded, np.asarray(lists["basis"]))  # bit for bit
    assert packed["extras"] == lists["extras"]


def test_base64_on_the_creating_long_poll_and_nothing_before_visible_at(
    make_service: Callable[..., Service],
) -> None:
    service = make_service(release_padding_floor_seconds=30)
    made = service.client.post(
        f"/v1/datasets/{service.dataset}/releases",
        headers=bearer(service.keys["analyst"]),
        json=BODY,
        params={"basis_format": "base64"},
    )
    assert made.status_code == 202
    release = made.json()["id"]
    assert service.worker.run_pending() == 1
    # Stored, but before visible_at the analyst sees no result in either format.
    hidden = service.get(release, basis_format="base64").json()
    assert hidden["status"] == "queued" and hidden["result"] is None
    # Its owner too: only admins and auditors see a release's real state before visible_at
    # (service.auth.sees_real_state), and they read no basis.
    owner = service.get(release, role="owner", basis_format="base64").json()
    assert owner["status"] == "queued" and owner["result"] is None


def test_an_unknown_basis_format_is_a_422(make_service: Callable[..., Service]) -> None:
    service = make_service()
    release = service.request()
    answer = service.get(release, basis_format="npy")
    assert answer.status_code == 422 and "basis_format" in answer.text


def test_the_client_reads_base64_and_shows_the_lists(
    make_service: Callable[..., Service],
) -> None:
    from dpss_client import Client

    service = make_service()
    asked: list[str | None] = []
    service.client.event_hooks["request"].append(
        lambda request: asked.append(request.url.params.get("basis_format"))
    )
    analyst = Client(str(service.client.base_url), service.keys["analyst"], http=service.client)
    handle = analyst.release(service.dataset, "analyze_gauss", 2, "0.1", "1e-7")
    assert service.worker.run_pending() == 1
    expected = service.get(str(handle.id)).json()["result"]["basis"]
    reads = {  # the handle is still queued before the first: wait long-polls once
        "wait": lambda: (handle.wait(), handle)[1],
        "get_release": lambda: analyst.get_release(handle.id),
        "refresh": lambda: (handle.refresh(), handle)[1],
    }
    for read in reads.values():
        asked.clear()
        shown = read()
        assert asked == ["base64"]
        assert shown.info.result is not None and shown.info.result.basis == expected
        assert shown.info.result.basis_base64 is None
        assert np.array_equal(shown.basis(), np.asarray(expected))  # hash-checked too


def _older_service(service: Service, refused: set[str], sent: list[httpx.Request]) -> httpx.Client:
    """The service as a version without the query parameters ``refused`` answers: 422 naming
    the unknown parameter, before anything is charged."""

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        for name in refused:
            if name in request.url.params:
                detail = f"query.{name}: unknown parameter (known: limit)"
                return httpx.Response(422, json={"error": "invalid_parameter", "detail": detail})
        answer = service.client.request(
            request.method,
            request.url.path,
            params=request.url.params,
            headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
            content=request.content,
        )
        return httpx.Response(answer.status_code, content=answer.content)

    return httpx.Client(transport=httpx.MockTransport(handle), base_url="http://older")


@pytest.mark.parametrize("refused", [{"basis_format"}, {"wait", "basis_format"}])
def test_the_client_works_with_a_service_without_the_parameters(
    make_service: Callable[..., Service], refused: set[str]
) -> None:
    from dpss_client import Client

    service = make_service()
    sent: list[httpx.Request] = []
    older = _older_service(service, refused, sent)
    analyst = Client("http://older", service.keys["analyst"], http=older)
    finished = threading.Event()

    def work() -> None:
        # Until the release has run, however long the refused requests took to make it (one
        # run_pending after a fixed pause found nothing on a busy machine, and the release
        # stayed queued).
        while not finished.is_set():
            if service.worker.run_pending():
                return
            time.sleep(0.05)

    worker = threading.Thread(target=work)
    worker.start()
    try:
        handle = analyst.release(service.dataset, "analyze_gauss", 2, "0.1", "1e-7", wait=20)
        basis = handle.wait(timeout=20)
    finally:
        finished.set()
        worker.join()
    assert basis.shape == (6, 2)
    # Charged once: one release made, whatever was refused on the way.
    listed = service.client.get("/v1/releases", headers=bearer(service.keys["analyst"])).json()
    assert [item["id"] for item in listed["items"]] == [str(handle.id)]
    # A service names one unknown parameter per answer: the client drops each as it is named,
    # once for the request and once for the read of a release, and asks no more.
    asking = [i for i, r in enumerate(sent) if refused & set(r.url.params)]
    assert len(asking) <= 2 * len(refused), [str(r.url) for r in sent]
    assert asking[-1] < len(sent) - 1
