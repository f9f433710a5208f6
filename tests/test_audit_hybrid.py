"""The audit re-checks hybrid spend (follow-up 2 of issue 31 item 5): every charge of a hybrid
dataset, replayed in ledger order through the ledger's own rule (HybridState), was admitted by
one of its filters; a ledger row inflated in the database so that no filter admits it is named
by ``audit verify``, and an honest sequence passes."""

from __future__ import annotations

import uuid
from decimal import Decimal

import numpy as np
from sqlalchemy import select, update

from service import accounting, audit, audit_hybrid, grants
from service.db.models import Dataset, LedgerEntry
from tests.conftest import bearer, post_release


def hybrid_dataset(client, keys, upload_dataset) -> str:
    rng = np.random.default_rng(5)
    return upload_dataset(
        client,
        keys.owner,
        rng.normal(size=(200, 3)) * 0.1,
        accounting="hybrid",
        epsilon_budget="1",
        delta_budget="1e-5",
        row_norm_bound=1.0,
    )["id"]


GAUSS = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.4", "delta": "1e-6"}


def charges(session_factory, dataset_id: str) -> list[int]:
    with session_factory() as session:
        return list(
            session.scalars(
                select(LedgerEntry.id)
                .where(
                    LedgerEntry.dataset_id == uuid.UUID(dataset_id),
                    LedgerEntry.kind == "charge",
                )
                .order_by(LedgerEntry.id)
            )
        )


def problems(session_factory) -> list[str]:
    with session_factory() as session:
        return audit.verify(session).problems


def test_an_honest_hybrid_sequence_verifies_clean(client, keys, upload_dataset, session_factory):
    dataset_id = hybrid_dataset(client, keys, upload_dataset)
    for _ in range(3):
        post_release(client, keys.analyst, dataset_id, **GAUSS)
    # a pure step (A') and an approximate-free Laplace release, then until the budget refuses
    refused = client.post(
        f"/v1/datasets/{dataset_id}/releases",
        headers=bearer(keys.analyst),
        json={**GAUSS, "epsilon": "0.9"},
    )
    assert refused.status_code == 409
    assert len(charges(session_factory, dataset_id)) == 3
    assert problems(session_factory) == []


def test_an_inflated_ledger_row_is_named(client, keys, upload_dataset, session_factory):
    dataset_id = hybrid_dataset(client, keys, upload_dataset)
    for _ in range(2):
        post_release(client, keys.analyst, dataset_id, **GAUSS)
    first, second = charges(session_factory, dataset_id)
    with session_factory.begin() as session:
        # past every filter: A''s mu_total^2 (~0.07), B's rho (~0.02), C's epsilon 1
        session.execute(
            update(LedgerEntry)
            .where(LedgerEntry.id == second)
            .values(gdp=Decimal(5), rho=Decimal(5), epsilon=Decimal(5))
        )
    found = problems(session_factory)
    with session_factory() as session:
        budget_seq = max(
            event.seq
            for event in session.scalars(select(audit.AuditEvent))
            if event.event_type == "budget_set" and str(event.dataset_id) == dataset_id
        )
    expected = f"ledger_entries {second}: a charge that no filter of budget_set event {budget_seq}"
    assert f"{expected} admits" in found
    assert not any(f"ledger_entries {first}:" in problem for problem in found)
    # the row no longer matches its event either (each charge is still reconciled)
    assert f"ledger_entries {second}: gdp differs from" in " ".join(found)


def test_the_replay_decides_as_the_ledger(client, keys, upload_dataset, session_factory):
    # The ledger's sums and the replay's agree charge by charge: what the ledger would admit
    # next is what the replay admits after the same charges.
    dataset_id = hybrid_dataset(client, keys, upload_dataset)
    for _ in range(2):
        post_release(client, keys.analyst, dataset_id, **GAUSS)
    with session_factory() as session:
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert dataset is not None
        entries = audit_hybrid.ledger_entries(session, [dataset.id])[dataset.id]
        filters = grants.hybrid_grant_budget(dataset, dataset.epsilon_total, dataset.delta_total)
        state = accounting.HybridState(filters)
        for entry in entries:
            assert entry.kind == "charge" and state.admits(entry.cost)
            state = state.after(entry.cost)
        assert audit_hybrid.refused(filters, audit_hybrid.steps_of(entries)) == []
        from service import ledger

        assert ledger.budget_of(session, dataset).hybrid() == state


def test_a_grant_charge_past_the_grants_filters_is_named(
    client, keys, upload_dataset, session_factory
):
    from service import auth

    with session_factory.begin() as session:
        key, alice = auth.create_key(session, "analyst", "alice", actor_key_id=None)
        alice_id = str(key.id)
    dataset_id = hybrid_dataset(client, keys, upload_dataset)
    made = client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=bearer(keys.owner),
        json={"analyst_key_id": alice_id, "epsilon": "0.5", "delta": "1e-5"},
    )
    assert made.status_code == 201, made.text
    grant_id = made.json()["id"]
    post_release(client, alice, dataset_id, **{**GAUSS, "epsilon": "0.3"})
    assert problems(session_factory) == []
    (entry,) = charges(session_factory, dataset_id)
    with session_factory.begin() as session:
        # within the dataset's filters (its C: epsilon 1), past the grant's (epsilon 0.5; A'
        # and B closed by a charge without GDP figure or profile)
        session.execute(
            update(LedgerEntry)
            .where(LedgerEntry.id == entry)
            .values(gdp=None, zcdp_delta=None, epsilon=Decimal("0.8"), delta=Decimal("1e-8"))
        )
    found = problems(session_factory)
    assert any(
        problem.startswith(f"ledger_entries {entry}: a charge that no filter of grant_created")
        for problem in found
    ), found
    assert grant_id not in " ".join(p for p in found if p.startswith("grants "))
    assert not any(
        problem.startswith(f"ledger_entries {entry}: a charge that no filter of budget_set")
        for problem in found
    ), found


def test_the_replay_counts_a_refund_as_the_ledger_does():
    # mu 0.25 twice does not fit A''s mu_total 0.2674 at (1, 1e-5); with the first refunded
    # in between, it does: the replay admits what the ledger admitted, and names the second
    # charge only if the refund is left out.
    budget = accounting.hybrid_budget(Decimal(1), Decimal("1e-5"))
    square = Decimal("0.0625")
    gaussian = accounting.ReleaseCost(
        Decimal("0.9"), Decimal("1e-8"), square / 2, Decimal(0), square
    )
    with_refund = [("1", 1, gaussian), ("r", -1, gaussian), ("2", 1, gaussian)]
    assert audit_hybrid.refused(budget, with_refund) == []
    assert audit_hybrid.refused(budget, [("1", 1, gaussian), ("2", 1, gaussian)]) == ["2"]


def test_a_grants_gaussian_releases_past_its_epsilon_sum_verify_clean(
    client, keys, upload_dataset, session_factory
):
    # Under hybrid (the default) a grant's Gaussian releases are admitted by its Gaussian-DP
    # filter long after their epsilons sum past the grant's epsilon: that is what the filter is
    # for. The audit's sum check for grants (epsilon, delta, rho against grant_created) flagged
    # every such grant; a hybrid grant is replayed through its filters instead.
    dataset_id = hybrid_dataset(client, keys, upload_dataset)
    made = client.post(
        f"/v1/datasets/{dataset_id}/grants",
        headers=bearer(keys.owner),
        json={"epsilon": "0.7", "delta": "4e-6"},
    )
    assert made.status_code == 201, made.text
    for _ in range(8):  # 1.6 in epsilons, within the grant's mu
        post_release(
            client, keys.analyst, dataset_id, **{**GAUSS, "epsilon": "0.2", "delta": "1e-8"}
        )
    budget = client.get(f"/v1/datasets/{dataset_id}/grants", headers=bearer(keys.owner)).json()
    assert Decimal(budget["items"][0]["epsilon_spent"]) < Decimal("0.7")
    assert problems(session_factory) == []
