"""Grants through the Python client and the remote ``dpss grants`` commands."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from dpss_client import cli_common, remote_cli
from dpss_client.client import BudgetExceededError, Client
from dpss_client.remote_cli import ExitCode
from service import auth
from service.cli import app

GAUSS: dict[str, Any] = {"mechanism": "analyze_gauss", "k": 1, "epsilon": "0.1", "delta": "1e-7"}


def _key(factory: sessionmaker[Session], role: str) -> tuple[str, str]:
    with factory.begin() as session:
        key, secret = auth.create_key(session, role, role, actor_key_id=None)  # type: ignore[arg-type]
        return str(key.id), secret


def test_client_creates_lists_and_revokes_grants(
    client: TestClient, session_factory: sessionmaker[Session]
) -> None:
    _, owner_key = _key(session_factory, "owner")
    analyst_id, analyst_key = _key(session_factory, "analyst")
    owner = Client(str(client.base_url), owner_key, http=client)
    analyst = Client(str(client.base_url), analyst_key, http=client)
    ds = owner.upload(np.eye(4), name="d", epsilon_budget=1, delta_budget="1e-5", row_norm_bound=1)
    grant = owner.create_grant(ds.id, "0.15", "1e-6", analyst_key_id=analyst_id)
    assert str(grant.analyst_key_id) == analyst_id and grant.epsilon_remaining == Decimal("0.15")
    analyst.release(ds.id, **GAUSS)
    with pytest.raises(BudgetExceededError) as refused:
        analyst.release(ds.id, **GAUSS)
    assert refused.value.budget == "grant" and refused.value.grant_id == grant.id
    assert refused.value.epsilon_remaining == Decimal("0.05")
    (listed,) = owner.list_grants(ds.id)
    assert listed.epsilon_spent == Decimal("0.1")
    revoked = owner.revoke_grant(ds.id, grant.id)
    assert revoked.revoked_at is not None and revoked.epsilon_spent == Decimal("0.1")
    assert owner.budget(ds.id).epsilon_spent == Decimal("0.1")


def test_dpss_grants_commands(
    client: TestClient, session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_common, "make_http_client", lambda url, timeout: client)
    owner_key_id, owner_key = _key(session_factory, "owner")
    analyst_id, _ = _key(session_factory, "analyst")
    ds = Client(str(client.base_url), owner_key, http=client).upload(
        np.eye(4), name="d", epsilon_budget=1, delta_budget="1e-5", row_norm_bound=1
    )
    runner = CliRunner()
    env = {"DPSS_URL": str(client.base_url), "DPSS_API_KEY": owner_key, "COLUMNS": "200"}

    def dpss(*args: str) -> Any:
        return runner.invoke(app, ["grants", *args], env=env)

    created = dpss(
        "create", str(ds.id), "--epsilon", "0.5", "--delta", "1e-6",
        "--analyst-key-id", analyst_id, "--json",
    )  # fmt: skip
    assert created.exit_code == ExitCode.OK, created.output
    grant = json.loads(created.stdout)
    assert grant["epsilon_total"] == "0.5" and grant["analyst_key_id"] == analyst_id
    table = dpss("list", str(ds.id))
    assert table.exit_code == ExitCode.OK and grant["id"] in table.stdout
    listed = json.loads(dpss("list", str(ds.id), "--json").stdout)
    assert listed["total"] == 1 and listed["items"][0]["id"] == grant["id"]
    revoked = dpss("revoke", str(ds.id), grant["id"], "--json")
    assert revoked.exit_code == ExitCode.OK and json.loads(revoked.stdout)["revoked_at"]
    too_big = dpss("create", str(ds.id), "--epsilon", "2", "--delta", "1e-6")
    assert too_big.exit_code == ExitCode.REFUSED and "epsilon" in too_big.stderr
    # Refusals name the command's options (dpss_client.spelling.CLI_GRANT), not JSON fields.
    assert "[invalid_input] --epsilon: must not exceed" in " ".join(too_big.stderr.split())
    nobody = dpss("create", str(ds.id), "--epsilon", "0.1", "--analyst-key-id", owner_key_id)
    assert nobody.exit_code == ExitCode.REFUSED, nobody.output
    assert "--analyst-key-id: must be the id of an active analyst key" in nobody.stderr
    as_json = dpss("create", str(ds.id), "--epsilon", "2", "--json")
    assert json.loads(as_json.stdout)["detail"].startswith("--epsilon: "), as_json.stdout


def test_dpss_grants_list_shows_both_native_figures_of_a_hybrid_grant(
    client: TestClient, session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    # hybrid (the default) has two native currencies: its Gaussian-DP filter's mu and its zCDP
    # filter's rho, either of which may admit the next release. The table showed mu alone,
    # which reads 0 once an approximate step closed that filter while rho was left.
    monkeypatch.setattr(cli_common, "make_http_client", lambda url, timeout: client)
    _, owner_key = _key(session_factory, "owner")
    analyst_id, _ = _key(session_factory, "analyst")
    owner = Client(str(client.base_url), owner_key, http=client)
    ds = owner.upload(
        np.eye(4), name="d", epsilon_budget=1, delta_budget="1e-5", row_norm_bound=1,
        accounting="hybrid",
    )  # fmt: skip
    grant = owner.create_grant(ds.id, "0.5", "1e-6", analyst_key_id=analyst_id)
    assert grant.mu_remaining is not None and grant.rho_remaining is not None
    env = {"DPSS_URL": str(client.base_url), "DPSS_API_KEY": owner_key, "COLUMNS": "250"}
    table = CliRunner().invoke(app, ["grants", "list", str(ds.id)], env=env)
    assert table.exit_code == ExitCode.OK, table.output
    mu = remote_cli._figure(grant.mu_remaining)
    rho = remote_cli._figure(grant.rho_remaining)
    assert f"mu {mu}, rho {rho}" in table.stdout, table.stdout
