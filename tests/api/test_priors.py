"""Public priors over HTTP: upload, list and read; refusals naming the field; releases estimated
inside the prior's span, at the cost of the same release without one, the digest recorded."""

from __future__ import annotations

import hashlib
import io
import uuid

import numpy as np
import pytest
from sqlalchemy import select

from service.db.models import AuditEvent, Prior, Release
from tests.conftest import bearer, fetch_release, npy_bytes, post_release, release_and_wait

D, M = 12, 5
BODY = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.5", "delta": "1e-6"}


def random_basis(rng: np.random.Generator, d: int, m: int) -> np.ndarray:
    q, _ = np.linalg.qr(rng.normal(size=(d, m)))
    return q


def sha256_of(matrix: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(matrix, dtype="<f8").tobytes()).hexdigest()


@pytest.fixture
def prior_matrix(rng):
    return random_basis(rng, D, M)


@pytest.fixture
def dataset(client, keys, upload_dataset, prior_matrix, rng):
    # Rows mostly along two directions inside the prior's span, plus noise in all 12.
    inside = prior_matrix[:, :2]
    rows = rng.normal(size=(400, 2)) * [3.0, 2.0] @ inside.T + 0.3 * rng.normal(size=(400, D))
    rows /= np.maximum(1.0, np.linalg.norm(rows, axis=1))[:, None]
    return upload_dataset(
        client, keys.owner, rows, epsilon_budget="10", delta_budget="1e-4", row_norm_bound=1.0
    )


def upload_prior(client, key, matrix, filename="prior.npy", **form):
    return client.post(
        "/v1/priors",
        headers=bearer(key),
        files={"file": (filename, npy_bytes(matrix), "application/octet-stream")},
        data=form,
    )


def request(client, key, dataset_id, dry_run=False, **body):
    return client.post(
        f"/v1/datasets/{dataset_id}/releases",
        params={"dry_run": "true"} if dry_run else None,
        headers=bearer(key),
        json={**BODY, **body},
    )


def spent(client, key, dataset_id):
    return client.get(f"/v1/datasets/{dataset_id}/budget", headers=bearer(key)).json()


def test_upload_list_and_read_a_prior(client, keys, prior_matrix, session_factory):
    made = upload_prior(client, keys.analyst, prior_matrix, name="dct")
    assert made.status_code == 201, made.text
    body = made.json()
    assert (body["d"], body["m"], body["name"], body["source"]) == (D, M, "dct", "upload")
    assert body["sha256"] == sha256_of(prior_matrix)
    # Public data: the owner reads the analyst's prior too; admins and auditors do not use them.
    listed = client.get("/v1/priors", headers=bearer(keys.owner)).json()
    assert listed["total"] == 1 and listed["items"][0]["id"] == body["id"]
    read = client.get(f"/v1/priors/{body['id']}", headers=bearer(keys.owner)).json()
    assert np.array_equal(np.array(read["basis"]), prior_matrix)
    for role in (keys.admin, keys.auditor):
        assert client.get("/v1/priors", headers=bearer(role)).status_code == 403
        assert upload_prior(client, role, prior_matrix).status_code == 403
    with session_factory() as session:
        stored = session.scalars(
            select(AuditEvent).where(AuditEvent.event_type == "prior_stored")
        ).one()
    assert stored.details["sha256"] == body["sha256"] and stored.details["prior_id"] == body["id"]
    missing = client.get(
        f"/v1/priors/{'0' * 8}-0000-0000-0000-{'0' * 12}", headers=bearer(keys.owner)
    )
    assert missing.status_code == 404


@pytest.mark.parametrize(
    ("make", "filename", "message"),
    [
        (lambda p: p, "prior.csv", ".npy"),
        (lambda p: p[:, 0], "prior.npy", "2-D"),
        (lambda p: np.where(np.arange(D)[:, None] == 0, np.nan, p), "prior.npy", "finite"),
        (lambda p: 2.0 * p, "prior.npy", "orthonormal"),
        (lambda p: np.eye(4, 6), "prior.npy", "m <= d"),
        (lambda p: p.astype(np.complex128), "prior.npy", "real numbers"),
    ],
)
def test_an_upload_that_is_not_an_orthonormal_basis_is_refused_naming_file(
    client, keys, prior_matrix, make, filename, message
):
    refused = upload_prior(client, keys.analyst, make(prior_matrix), filename=filename)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"].startswith("file: ")
    assert message in refused.json()["detail"]
    assert client.get("/v1/priors", headers=bearer(keys.analyst)).json()["total"] == 0


def test_release_refusals_name_the_prior_field_and_charge_nothing(
    client, keys, dataset, prior_matrix, rng
):
    stored = upload_prior(client, keys.analyst, prior_matrix).json()["id"]
    narrow = upload_prior(client, keys.analyst, random_basis(rng, D, 1)).json()["id"]
    other_d = upload_prior(client, keys.analyst, random_basis(rng, D + 1, 3)).json()["id"]
    cases = [
        ({"prior_id": "00000000-0000-0000-0000-000000000000"}, "params.prior_id", "no prior"),
        ({"prior_id": "not-a-uuid"}, "params.prior_id", "UUID"),
        ({"prior_id": 7}, "params.prior_id", "UUID"),
        ({"prior_id": other_d}, "params.prior_id", "d=13"),
        ({"prior_id": narrow}, "params.prior_id", "m >= k"),
        ({"prior_basis": (2 * prior_matrix).tolist()}, "params.prior_basis", "orthonormal"),
        ({"prior_basis": [[1.0, 0.0], [0.0]]}, "params.prior_basis", "same number"),
        ({"prior_basis": [[True]]}, "params.prior_basis", "numbers"),
        ({"prior_basis": "eye"}, "params.prior_basis", "numbers"),
        ({"prior_basis": [[1.0]] * D}, "params.prior_basis", "orthonormal"),
        (
            {"prior_basis": prior_matrix.tolist(), "prior_id": stored},
            "params.prior_id",
            "not both",
        ),
        ({"prior_id": stored, "prior_sha256": "0" * 64}, "params.prior_sha256", "set by"),
    ]
    for params, field, message in cases:
        for dry_run in (False, True):
            refused = request(client, keys.analyst, dataset["id"], dry_run, params=params)
            assert refused.status_code == 422, (params, refused.text)
            assert refused.json()["detail"].startswith(f"{field}: "), params
            assert message in refused.json()["detail"], (params, refused.json())
    assert spent(client, keys.analyst, dataset["id"])["epsilon_spent"] == "0"


def test_a_release_inside_a_prior_is_in_its_span_and_records_its_digest(
    client, keys, dataset, prior_matrix, run_worker, session_factory
):
    prior_id = upload_prior(client, keys.analyst, prior_matrix).json()["id"]
    body = release_and_wait(
        client, keys.analyst, dataset["id"], run_worker, **BODY, params={"prior_id": prior_id}
    )
    assert body["status"] == "succeeded", body
    basis = np.array(body["result"]["basis"])
    assert basis.shape == (D, 2)
    assert np.allclose(basis.T @ basis, np.eye(2), atol=1e-10)
    # Inside span(P): nothing left after projecting onto it (a basis from the 12-dimensional
    # noisy rows would leave about sqrt(7/12) of each column outside).
    outside = basis - prior_matrix @ (prior_matrix.T @ basis)
    assert np.linalg.norm(outside) < 1e-9
    assert body["params"]["prior_id"] == prior_id
    assert body["params"]["prior_sha256"] == sha256_of(prior_matrix)
    assert body["result"]["extras"]["prior"]["dimension"] == M
    with session_factory() as session:
        event = session.scalars(
            select(AuditEvent).where(AuditEvent.event_type == "release_requested")
        ).one()
    assert event.details["params"]["prior_sha256"] == sha256_of(prior_matrix)
    assert event.details["params"]["prior_id"] == prior_id


def test_the_private_centre_is_estimated_inside_the_span(
    client, keys, dataset, prior_matrix, run_worker
):
    body = release_and_wait(
        client,
        keys.analyst,
        dataset["id"],
        run_worker,
        **BODY,
        params={"prior_basis": prior_matrix.tolist(), "center": "private", "clip_quantile": "none"},
    )
    assert body["status"] == "succeeded", body
    center = np.array(body["result"]["extras"]["center"])
    assert center.shape == (D,)
    assert np.linalg.norm(center - prior_matrix @ (prior_matrix.T @ center)) < 1e-9


@pytest.mark.parametrize("accounting", ["basic", "zcdp"])
def test_a_prior_costs_nothing(
    client, keys, upload_dataset, prior_matrix, rng, session_factory, accounting
):
    rows = rng.normal(size=(300, D)) / np.sqrt(D) / 2
    dataset = upload_dataset(
        client,
        keys.owner,
        rows,
        epsilon_budget="10",
        delta_budget="1e-4",
        row_norm_bound=1.0,
        accounting=accounting,
    )
    prior_id = upload_prior(client, keys.analyst, prior_matrix).json()["id"]
    params = {"center": "private"}
    plain = post_release(client, keys.analyst, dataset["id"], **BODY, params=params)
    with_prior = post_release(
        client, keys.analyst, dataset["id"], **BODY, params={**params, "prior_id": prior_id}
    )
    with session_factory() as session:
        costs = {
            release.id.hex: (release.epsilon, release.delta, release.cost_rho, release.cost_delta)
            for release in session.scalars(select(Release))
        }
    plain_cost = costs[plain.replace("-", "")]
    assert plain_cost == costs[with_prior.replace("-", "")]
    assert plain_cost[0] > 0
    preview = request(client, keys.analyst, dataset["id"], True, params={"prior_id": prior_id})
    assert preview.status_code == 200, preview.text
    shown = preview.json()
    assert shown["scales"]["prior_dimension"] == M
    assert shown["scales"]["prior_sha256"] == sha256_of(prior_matrix)
    assert shown["params"]["prior_id"] == prior_id


def test_an_inline_prior_is_stored_once_and_a_dry_run_stores_nothing(
    client, keys, dataset, prior_matrix, run_worker, session_factory
):
    inline = {"prior_basis": prior_matrix.tolist()}
    preview = request(client, keys.analyst, dataset["id"], True, params=inline)
    assert preview.status_code == 200, preview.text
    assert preview.json()["params"]["prior_id"] is None
    assert preview.json()["params"]["prior_sha256"] == sha256_of(prior_matrix)
    with session_factory() as session:
        assert session.scalars(select(Prior)).all() == []
    first = post_release(client, keys.analyst, dataset["id"], **BODY, params=inline)
    second = post_release(client, keys.analyst, dataset["id"], **BODY, params=inline)
    assert run_worker() == 2
    ids = {
        fetch_release(client, keys.analyst, made)["params"]["prior_id"] for made in (first, second)
    }
    listed = client.get("/v1/priors", headers=bearer(keys.analyst)).json()
    assert listed["total"] == 1 and {listed["items"][0]["id"]} == ids
    assert listed["items"][0]["source"] == "inline"
    for made in (first, second):
        assert fetch_release(client, keys.analyst, made)["status"] == "succeeded"


@pytest.mark.parametrize("mechanism", ["auto", "gap_perturbation", "spectrum"])
def test_other_mechanisms_run_inside_the_prior_too(
    client, keys, dataset, prior_matrix, run_worker, mechanism
):
    body = release_and_wait(
        client,
        keys.analyst,
        dataset["id"],
        run_worker,
        **{**BODY, "mechanism": mechanism, "epsilon": "2"},
        params={"prior_basis": prior_matrix.tolist()},
    )
    assert body["status"] in ("succeeded", "no_result"), body
    assert body["params"]["prior_sha256"] == sha256_of(prior_matrix)
    if body["status"] == "succeeded" and body["result"].get("basis") is not None:
        basis = np.array(body["result"]["basis"])
        assert np.linalg.norm(basis - prior_matrix @ (prior_matrix.T @ basis)) < 1e-9


def test_an_inline_prior_above_the_json_limit_is_refused_413(client, keys, dataset):
    big = np.eye(D, M).tolist() * 300  # far above DPSS_MAX_JSON_BYTES (64 KiB)
    refused = request(client, keys.analyst, dataset["id"], params={"prior_basis": big})
    assert refused.status_code == 413, refused.text
    assert spent(client, keys.analyst, dataset["id"])["epsilon_spent"] == "0"


def test_a_prior_changed_after_the_request_fails_the_release_unread(
    client, keys, dataset, prior_matrix, run_worker, session_factory
):
    prior_id = upload_prior(client, keys.analyst, prior_matrix).json()["id"]
    made = post_release(client, keys.analyst, dataset["id"], **BODY, params={"prior_id": prior_id})
    with session_factory.begin() as session:
        row = session.scalars(select(Prior)).one()
        row.basis = np.ascontiguousarray(prior_matrix[:, ::-1], dtype="<f8").tobytes()
    assert run_worker() == 1
    body = fetch_release(client, keys.analyst, made)
    # The digest recorded at the request no longer matches: no row is read with another prior.
    assert body["status"] == "failed", body
    # Nothing was read, on a public fact (the prior's digest): the charge is given back.
    assert body["refunded"] is True, body
    assert spent(client, keys.analyst, dataset["id"])["epsilon_spent"] == "0"


def test_a_prior_gone_after_the_request_fails_the_release_unread_and_refunded(
    client, keys, dataset, prior_matrix, run_worker, session_factory
):
    prior_id = upload_prior(client, keys.analyst, prior_matrix).json()["id"]
    made = post_release(client, keys.analyst, dataset["id"], **BODY, params={"prior_id": prior_id})
    with session_factory.begin() as session:
        session.delete(session.scalars(select(Prior)).one())
    assert run_worker() == 1
    body = fetch_release(client, keys.analyst, made)
    assert (body["status"], body["refunded"]) == ("failed", True), body
    assert spent(client, keys.analyst, dataset["id"])["epsilon_spent"] == "0"


def prior_problems(session_factory):
    from service import audit

    with session_factory() as session:
        return [p for p in audit.verify(session).problems if "prior" in p]


@pytest.mark.parametrize("tamper", ["rewritten", "removed"])
def test_audit_verify_checks_every_stored_prior_against_its_event(
    client, keys, dataset, prior_matrix, run_worker, session_factory, tamper
):
    """A prior's bytes are what a released basis's coordinates mean. Before, ``dpss audit
    verify`` read no prior: its bytes rewritten with the ``sha256`` column to match (or the row
    removed) after a release used it left the chain "OK" while a reader of the prior got
    another basis than the one released."""
    prior_id = upload_prior(client, keys.analyst, prior_matrix).json()["id"]
    done = release_and_wait(
        client, keys.analyst, dataset["id"], run_worker, **BODY, params={"prior_id": prior_id}
    )
    inline = release_and_wait(
        client,
        keys.analyst,
        dataset["id"],
        run_worker,
        **BODY,
        params={"prior_basis": prior_matrix[:, ::-1].tolist()},
    )
    assert (done["status"], inline["status"]) == ("succeeded", "succeeded")
    assert prior_problems(session_factory) == []
    with session_factory.begin() as session:
        row = session.get(Prior, uuid.UUID(prior_id))
        if tamper == "rewritten":
            other = np.ascontiguousarray(-prior_matrix, dtype="<f8")
            row.basis = other.tobytes()
            row.sha256 = sha256_of(other)
        else:
            session.delete(row)
    problems = prior_problems(session_factory)
    assert problems, "verify said OK"
    if tamper == "rewritten":
        assert any(f"priors {prior_id}: sha256 differs" in p for p in problems), problems
        assert any("basis does not hash" in p for p in problems), problems
    else:
        assert any(f"priors {prior_id}: the row is missing" in p for p in problems), problems
    # A problem names the table and id, never a stored value.
    assert not any(sha256_of(prior_matrix) in p for p in problems), problems


class _Canary:
    """Unpickling this writes a file: the upload must never unpickle."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_prior_uploads_in_every_npy_layout_never_unpickle(
    client, keys, prior_matrix, tmp_path, session_factory
):
    """An object array (a pickle inside the .npy) is refused without being unpickled; Fortran
    order, big-endian, float32 and int layouts store the canonical little-endian float64
    row-major bytes (the digest is theirs); float16 rounds a basis past the tolerance."""
    canary = tmp_path / "unpickled"
    buffer = io.BytesIO()
    np.save(buffer, np.array([[_Canary(str(canary))]], dtype=object), allow_pickle=True)
    refused = client.post(
        "/v1/priors",
        headers=bearer(keys.analyst),
        files={"file": ("prior.npy", buffer.getvalue(), "application/octet-stream")},
    )
    assert refused.status_code == 422 and refused.json()["detail"].startswith("file: ")
    assert "pickles" in refused.json()["detail"]
    assert not canary.exists()
    for layout in (
        np.asfortranarray(prior_matrix),
        prior_matrix.astype(">f8"),
        prior_matrix.astype(np.float32),
    ):
        stored = upload_prior(client, keys.analyst, layout)
        assert stored.status_code == 201, stored.text
        expected = np.asarray(layout, dtype=np.float64)
        assert stored.json()["sha256"] == sha256_of(expected)
        read = client.get(f"/v1/priors/{stored.json()['id']}", headers=bearer(keys.analyst))
        np.testing.assert_array_equal(np.array(read.json()["basis"]), expected)
    eye = upload_prior(client, keys.analyst, np.eye(D, M, dtype=np.int64))
    assert eye.status_code == 201 and eye.json()["sha256"] == sha256_of(np.eye(D, M))
    half = upload_prior(client, keys.analyst, prior_matrix.astype(np.float16))
    assert half.status_code == 422 and "not orthonormal" in half.json()["detail"]
