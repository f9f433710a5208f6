"""A ``.npy`` upload whose header is not what its body holds: every endpoint that takes one
(a dataset, a batch of rows, a prior) answers 422 naming ``file`` and keeps nothing.

The prior upload read the header with ``np.load`` and no check: a header numpy's parser could not
tokenize ended 500, and a declared shape of 10^15 values made the API allocate for it (500 on a
MemoryError; a smaller lie would have been allocated). A dataset file with bytes past its declared
shape was taken as the shorter matrix, silently dropping rows the owner sent."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from sqlalchemy import func, select

from service.db.models import AuditEvent, Dataset, DatasetBatch, LedgerEntry, Prior
from tests.conftest import bearer

ROWS = np.linalg.qr(np.random.default_rng(4).normal(size=(6, 2)))[0]


def npy(header: str, body: bytes) -> bytes:
    """A version 1.0 ``.npy`` file with this header text and body, padded as numpy pads."""
    text = header.encode("latin1")
    text += b" " * (16 - (10 + len(text) + 1) % 16) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + body


def header(shape: str) -> str:
    return f"{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}"


CASES = {
    # numpy's header parser raises tokenize.TokenError here, not ValueError
    "unclosed-header": npy("{'descr': '<f8', 'shape': (6, 2)", ROWS.tobytes()),
    "header-not-a-dict": npy("(6, 2)", ROWS.tobytes()),
    "huge-declared-shape": npy(header("(10000000000, 100000)"), ROWS.tobytes()),
    "negative-shape": npy(header("(-6, 2)"), ROWS.tobytes()),
    "truncated-body": npy(header("(60, 2)"), ROWS.tobytes()),
    "bytes-past-the-shape": npy(header("(2, 2)"), ROWS.tobytes()),
}


def counts(session_factory):
    with session_factory() as session:
        return [
            session.execute(select(func.count()).select_from(model)).scalar_one()
            for model in (Dataset, DatasetBatch, LedgerEntry, AuditEvent, Prior)
        ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_npy_header_that_lies_about_its_body_is_a_422_on_file(
    client, keys, upload_dataset, session_factory, case
):
    dataset = upload_dataset(client, keys.owner, np.random.default_rng(1).normal(size=(20, 2)))
    targets = [
        (keys.owner, "/v1/datasets", {"name": "n", "epsilon_budget": "1", "delta_budget": "0"}),
        (keys.owner, f"/v1/datasets/{dataset['id']}/rows", {}),
        (keys.analyst, "/v1/priors", {}),
    ]
    for key, path, form in targets:
        before = counts(session_factory)
        response = client.post(
            path,
            headers=bearer(key),
            files={"file": ("data.npy", CASES[case], "application/octet-stream")},
            data=form,
        )
        assert response.status_code == 422, (path, response.text)
        assert response.json()["detail"].startswith("file: "), (path, response.text)
        assert counts(session_factory) == before, path


def test_the_same_file_with_an_honest_header_is_accepted(client, keys, upload_dataset):
    dataset = upload_dataset(client, keys.owner, np.random.default_rng(1).normal(size=(20, 2)))
    honest = npy(header("(6, 2)"), ROWS.tobytes())
    targets = [
        (keys.owner, "/v1/datasets", {"name": "n", "epsilon_budget": "1", "delta_budget": "0"}),
        (keys.owner, f"/v1/datasets/{dataset['id']}/rows", {}),
        (keys.analyst, "/v1/priors", {}),
    ]
    for key, path, form in targets:
        response = client.post(
            path,
            headers=bearer(key),
            files={"file": ("data.npy", honest, "application/octet-stream")},
            data=form,
        )
        assert response.status_code == 201, (path, response.text)
