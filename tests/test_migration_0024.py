"""Migration 0024 keeps the delta a grant's epsilon figures are stated at
(``grants.stated_delta``) and fills it for the grants made before it: ``basic`` and ``hybrid``
their ``delta``; ``gaussian`` and ``zcdp`` grants given in epsilon the delta they were asked
with (exact where the row keeps it, else derived from their native budget, within 1e-13 of
it and never below what their rho needs); grants given in rho the dataset's ``delta_total``.
The downgrade removes the column."""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path

from alembic import command
from sqlalchemy import MetaData, create_engine, insert, select, text

from api_schemas.common import BUDGET_CONTEXT
from service import accounting
from service.migrate import alembic_config
from tests.factories import old_schema_with_release

ASKED = Decimal("0.000001")
HALF = Decimal("5e-6")


def test_0024_fills_the_delta_grants_are_stated_at_and_downgrades(tmp_path: Path) -> None:
    old = old_schema_with_release(tmp_path, "0023")
    datasets, grants = old.tables.tables["datasets"], old.tables.tables["grants"]
    with old.engine.begin() as connection:
        base = dict(connection.execute(select(datasets)).mappings().one())
    one = Decimal(1)
    mu = accounting.mu_budget(one, ASKED)
    cases = {
        # (accounting, dataset delta_conversion, grant epsilon, delta, rho): expected
        "basic": ("basic", None, one, ASKED, Decimal(0)),
        "hybrid": ("hybrid", Decimal("1e-7"), one, ASKED, Decimal("0.01")),
        "gaussian": ("gaussian", None, one, Decimal(0), accounting.budget_rho_of_mu(mu)),
        "zcdp": ("zcdp", Decimal("5e-6"), one, Decimal(0), accounting.rho_budget(one, ASKED)),
        "zcdp_mechanisms": (
            "zcdp", HALF, one, HALF, accounting.rho_budget(one, HALF)
        ),
        "zcdp_native": ("zcdp", Decimal("5e-6"), Decimal(0), Decimal("1e-6"), Decimal("0.01")),
    }  # fmt: skip
    ids: dict[str, uuid.UUID] = {}
    with old.engine.begin() as connection:
        for name, (kind, conversion, epsilon, delta, rho) in cases.items():
            dataset_id = uuid.uuid4()
            row = {**base, "id": dataset_id.hex, "accounting": kind, "epsilon_total": "3"}
            row.update(
                delta_total="0.00001",
                delta_conversion=None if conversion is None else str(conversion),
            )
            connection.execute(insert(datasets).values(**row))
            ids[name] = uuid.uuid4()
            connection.execute(
                insert(grants).values(
                    id=ids[name].hex, dataset_id=dataset_id.hex, epsilon=str(epsilon),
                    delta=str(delta), rho=str(rho), created_at=old.created_at,
                )
            )  # fmt: skip
    old.engine.dispose()
    command.upgrade(alembic_config(old.url), "0024")
    engine = create_engine(old.url)
    with engine.connect() as connection:
        stated = {
            row[0]: Decimal(row[1])
            for row in connection.execute(text("SELECT id, stated_delta FROM grants"))
        }
    engine.dispose()
    found = {name: stated[grant_id.hex] for name, grant_id in ids.items()}
    assert found["basic"] == found["hybrid"] == ASKED
    assert found["zcdp_mechanisms"] == Decimal("0.00001")  # 5e-6 + the 5e-6 conversion held
    assert found["zcdp_native"] == Decimal("0.00001")  # the dataset's delta_total
    for name in ("gaussian", "zcdp"):
        # Derived from the native budget: within 1e-13 of the asked delta, and at least the
        # delta its rho needs at its epsilon (so the grant's spend is within what is stated).
        assert abs(found[name] - ASKED) <= ASKED * Decimal("1e-13"), (name, found[name])
    needs = accounting.gdp_delta(
        accounting.sqrt_up(BUDGET_CONTEXT.multiply(2, cases["gaussian"][4])), one
    )
    assert accounting.round_up(needs) <= found["gaussian"]
    assert accounting.round_up(accounting.cks_delta(cases["zcdp"][4], one)) <= found["zcdp"]
    command.downgrade(alembic_config(old.url), "0023")
    engine = create_engine(old.url)
    tables = MetaData()
    tables.reflect(engine)
    assert "stated_delta" not in tables.tables["grants"].columns
    engine.dispose()
