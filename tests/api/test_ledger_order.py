"""An owner's ledger says when each entry takes effect, never when a worker wrote it.

A refund is written when the worker records its release's end, which follows the end of the
job ahead of it in the shared queue (another dataset's, whose run time may depend on its
rows); it takes effect when the release's outcome shows, a public moment. Before, entries were
listed, paged and numbered by their global ``id`` (write order across every dataset), so a
refund's ``id`` and place told whether the worker wrote it before or after a later charge.
Here two worlds differ only in that write order: the owners' ledgers must read the same.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db.models import LedgerEntry, utcnow
from tests.conftest import Keys, bearer, post_release

RELEASE = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}
#: When the hand-written refund takes effect, after the request of the second charge.
EFFECT = 0.4


def write_refund(factory: sessionmaker[Session], release_id: str, effect: Any) -> None:
    """A refund of ``release_id``'s charge, in effect at ``effect`` (as the worker writes one
    with its release's ``outcome_visible_at``)."""
    with factory.begin() as session:
        charge = session.execute(
            select(LedgerEntry).where(
                LedgerEntry.release_id == uuid.UUID(release_id), LedgerEntry.kind == "charge"
            )
        ).scalar_one()
        session.add(
            LedgerEntry(
                dataset_id=charge.dataset_id,
                release_id=charge.release_id,
                kind="refund",
                epsilon=charge.epsilon,
                delta=charge.delta,
                rho=charge.rho,
                created_at=effect,
            )
        )


def test_a_refunds_place_in_the_ledger_is_when_it_takes_effect_not_when_it_was_written(
    client: TestClient,
    keys: Keys,
    make_key: Callable[[str], str],
    upload_dataset: Callable[..., Any],
    session_factory: sessionmaker[Session],
) -> None:
    seen: dict[str, list[Any]] = {}
    effects = []
    for world in ("written_early", "written_late"):
        owner = make_key("owner")
        dataset = upload_dataset(
            client,
            owner,
            np.random.default_rng(0).normal(size=(100, 3)) / 4,
            row_norm_bound=1.0,
        )["id"]
        first = post_release(client, keys.analyst, dataset, **RELEASE)
        effect = utcnow() + timedelta(seconds=EFFECT)
        effects.append(effect)
        if world == "written_early":
            write_refund(session_factory, first, effect)  # before the second charge
        second = post_release(client, keys.analyst, dataset, **RELEASE)
        if world == "written_late":
            write_refund(session_factory, first, effect)  # after it
        time.sleep(max((effect - utcnow()).total_seconds(), 0) + 0.05)
        names = {first: "first", second: "second"}
        url = f"/v1/datasets/{dataset}/ledger"
        whole = client.get(url, headers=bearer(owner)).json()
        # Paged one by one: the same entries, and cursors naming no global id.
        paged: list[Any] = []
        cursor = None
        while True:
            page = client.get(
                url,
                params={"limit": 1, **({"cursor": cursor} if cursor else {})},
                headers=bearer(owner),
            ).json()
            paged += page["items"]
            cursor = page["next"]
            if cursor is None:
                break
            decoded = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
            assert not any(isinstance(part, int) for part in decoded), decoded
        assert paged == whole["items"]
        seen[world] = [
            (e["id"], names[e["release_id"]], e["kind"], e["epsilon_after"]) for e in whole["items"]
        ]
    assert seen["written_early"] == seen["written_late"], seen
    assert seen["written_late"] == [
        (1, "first", "charge", seen["written_late"][0][3]),
        (2, "second", "charge", seen["written_late"][1][3]),
        (3, "first", "refund", seen["written_late"][2][3]),
    ]
