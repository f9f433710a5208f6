"""The dashboard in a real browser: Debian's headless chromium, driven by Playwright, through
every view for each role, against one live server (uvicorn on 127.0.0.1) for the module.

Checked: each role's view shows what the API gives that key and the API's refusals elsewhere
(the dashboard has no authorization of its own); the charts are drawn from the API's numbers;
no request leaves the service's origin (every request is intercepted; any other host fails the
test); the key is never in a URL or a cookie. Screenshots of each view are taken (set
``DPSS_DASHBOARD_SCREENSHOTS=docs/img`` to refresh the committed ones).

SQLite only: the views are the API's, whose code paths run on both databases in
tests/api/test_operations.py and the other API tests.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from sqlalchemy import update

from api_schemas.figures import shown as figure
from service.app import create_app
from service.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.db.models import Release, utcnow
from service.migrate import upgrade_to_head
from service.store import DatasetStore
from service.worker import Worker
from tests import browser
from tests.api.live import serving
from tests.browser import Browser, cells

pytestmark = pytest.mark.skipif(
    not browser.available(), reason="chromium or Playwright is not installed"
)
ADMIN = "dashboard-test-admin-key"
SCREENSHOTS = os.environ.get("DPSS_DASHBOARD_SCREENSHOTS")


@dataclass
class World:
    base: str
    keys: dict[str, str]
    key_ids: dict[str, str]
    dataset: str
    grant: str
    releases: dict[str, str] = field(default_factory=dict)
    #: A second dataset named "demo" under zcdp accounting, and bob's epsilon grant on it.
    zcdp: str = ""
    zcdp_grant: str = ""

    def api(self, role: str, path: str) -> Any:
        response = httpx.get(
            self.base + path, headers={"Authorization": f"Bearer {self.keys[role]}"}, timeout=30
        )
        assert response.status_code == 200, (path, response.text)
        return response.json()


def _get(base: str, key: str, path: str) -> Any:
    response = httpx.get(base + path, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert response.status_code == 200, (path, response.text)
    return response.json()


def _post(base: str, key: str, path: str, **kwargs: Any) -> Any:
    response = httpx.post(
        base + path, headers={"Authorization": f"Bearer {key}"}, timeout=30, **kwargs
    )
    assert response.is_success, (path, response.text)
    return response.json()


def _owner_and_analyst(base: str, owner: str, analyst: str) -> tuple[str, Any]:
    """New keys named ``owner`` and ``analyst``: the owner's key, the analyst's body."""
    made = _post(base, ADMIN, "/v1/keys", json={"role": "owner", "name": owner})["key"]
    return made, _post(base, ADMIN, "/v1/keys", json={"role": "analyst", "name": analyst})


def _upload(
    base: str, owner: str, rows: Any, file_name: str, name: str, epsilon: str, **more: str
) -> Any:
    """``owner`` uploads ``rows`` (delta budget 1e-5, row norms bounded by 1, form fields
    ``more``); the dataset's body."""
    buffer = io.BytesIO()
    np.save(buffer, rows)
    return _post(
        base,
        owner,
        "/v1/datasets",
        files={"file": (file_name, buffer.getvalue(), "application/octet-stream")},
        data={
            "name": name,
            "epsilon_budget": epsilon,
            "delta_budget": "1e-5",
            "row_norm_bound": "1",
            **more,
        },
    )


def _grant(base: str, owner: str, dataset_id: str, analyst_id: str, **budget: str) -> Any:
    """``owner`` grants the analyst ``budget`` on the dataset; the grant's body."""
    return _post(
        base,
        owner,
        f"/v1/datasets/{dataset_id}/grants",
        json={"analyst_key_id": analyst_id, **budget},
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("dashboard")
    settings = Settings(
        data_dir=root / "data",
        database_url=f"sqlite:///{root / 'dpss.sqlite3'}",
        admin_api_key=ADMIN,
        release_padding_floor_seconds=0,
        release_padding_multiplier=0,
        rate_limit_per_second=0,
        worker_heartbeat_seconds=3600,
        # The worker noted alive once at set-up stays alive for the whole module, however
        # long a loaded machine takes to reach the admin's test (a lease is the liveness window).
        worker_lease_seconds=7200,
    )
    settings.data_dir.mkdir(mode=0o700, parents=True)
    upgrade_to_head(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    factory = make_session_factory(engine)
    store = DatasetStore(settings.datasets_dir)
    store.ensure()
    worker = Worker(factory, store, settings, worker_id="dashboard-host:4242:abc123")
    with serving(create_app(settings)) as base:
        keys = {"admin": ADMIN}
        key_ids: dict[str, str] = {}
        for role, name in (
            ("owner", "alice"),
            ("analyst", "bob"),
            ("analyst2", "dave"),
            ("auditor", "carol"),
        ):
            made = _post(base, ADMIN, "/v1/keys", json={"role": role.rstrip("2"), "name": name})
            keys[role], key_ids[role] = made["key"], made["id"]
        rng = np.random.default_rng(3)
        basis, _ = np.linalg.qr(rng.normal(size=(6, 2)))
        rows = rng.normal(size=(400, 2)) @ basis.T * 0.3 + rng.normal(size=(400, 6)) * 0.01
        rows /= np.maximum(1, np.linalg.norm(rows, axis=1, keepdims=True))
        owner, bob = keys["owner"], key_ids["analyst"]
        dataset = _upload(base, owner, rows, "demo.npy", "demo", "1.0")["id"]
        grant = _grant(base, owner, dataset, bob, epsilon="0.5", delta="1e-6")["id"]
        world = World(base, keys, key_ids, dataset, grant)
        world.zcdp = _upload(base, owner, rows, "demo.npy", "demo", "1.0", accounting="zcdp")["id"]
        world.zcdp_grant = _grant(base, owner, world.zcdp, bob, epsilon="0.5")["id"]
        _post(
            base,
            keys["analyst"],
            f"/v1/datasets/{world.zcdp}/releases",
            json={"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.25", "delta": "1e-7"},
        )
        releases = f"/v1/datasets/{dataset}/releases"
        for name, role, body in (
            ("spectrum", "analyst", {"mechanism": "spectrum", "k": 3, "epsilon": "0.1"}),
            ("gauss", "analyst", {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.25"}),
            ("other", "analyst2", {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.15"}),
        ):
            made = _post(base, keys[role], releases, json={"delta": "1e-7", **body})
            world.releases[name] = made["id"]
        assert worker.run_pending() == 4
        worker.note_alive()
        # As if the spectrum release's padding ran for another hour: analysts see it queued.
        with factory.begin() as session:
            session.execute(
                update(Release)
                .where(Release.id == uuid.UUID(world.releases["spectrum"]))
                .values(visible_at=utcnow() + timedelta(hours=1))
            )
        queued = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.05", "delta": "1e-7"}
        world.releases["queued"] = _post(base, keys["analyst2"], releases, json=queued)["id"]
        yield world
    engine.dispose()


@pytest.fixture(scope="module")
def chromium(world: World) -> Iterator[Browser]:
    with browser.chromium(world.base, list(world.keys.values())) as driver:
        yield driver


def sign_in(driver: Browser, world: World, role: str) -> Any:
    return driver.sign_in(world.keys[role], role.rstrip("2"))


def screenshot(page: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"dashboard-{name}.png"
    page.screenshot(path=str(path), full_page=True, animations="disabled")
    # A 64-colour palette keeps a page of text and a chart legible at a few tens of kB.
    with Image.open(path) as shot:
        shot.convert("RGB").quantize(colors=64).save(path, optimize=True)
    if SCREENSHOTS:
        shutil.copy(path, Path(SCREENSHOTS) / path.name)
    size = path.stat().st_size
    assert 5_000 < size < 160_000, (name, size)


def test_owner_sees_budget_spending_chart_grants_and_releases(
    chromium: Browser, world: World, tmp_path: Path
) -> None:
    page = sign_in(chromium, world, "owner")
    budget = world.api("owner", f"/v1/datasets/{world.dataset}/budget")
    ledger = world.api("owner", f"/v1/datasets/{world.dataset}/ledger")["items"]
    card = f"section[data-dataset='{world.dataset}']"
    # Two datasets are named "demo": each heading adds its id's start.
    assert page.inner_text(f"{card} h2") == f"demo · {world.dataset[:8]}"
    for name, value in budget.items():
        shown = page.inner_text(f"{card} table.budget tr[data-field={name}] td")
        if value is None:  # a currency this dataset's accounting does not use
            assert shown == "—", name
        elif isinstance(value, str) and not value[:1].isdigit():  # the accounting's name
            assert shown == value, name
        else:  # numbers as the CLI states them: its significant digits, rounded the safe way
            assert shown == figure(value, up=name.endswith("_spent")), name
    assert Decimal(budget["epsilon_spent"]) == Decimal("0.55")
    chart = page.locator(f"{card} svg.spending")
    assert float(chart.get_attribute("data-final")) == pytest.approx(0.55)
    points = [
        float(p)
        for p in chart.locator("circle").evaluate_all("cs => cs.map(c => c.dataset.epsilon)")
    ]
    expected = np.cumsum([float(e["epsilon"]) for e in ledger])
    assert points == pytest.approx(list(expected)) and len(points) == 4
    by_grant = page.locator(f"{card} svg.by-grant")
    granted = by_grant.locator(f"rect[data-grant='{world.grant}']").get_attribute("data-epsilon")
    assert float(granted) == pytest.approx(0.35)
    direct = by_grant.locator("rect[data-grant=none]").get_attribute("data-epsilon")
    assert float(direct) == pytest.approx(0.2)
    assert cells(page, f"{card} table.grants", 4) == ["0.15"]
    statuses = cells(page, f"{card} table.releases", 6)
    api_releases = world.api("owner", f"/v1/datasets/{world.dataset}/releases")["items"]
    assert statuses == [r["status"] for r in api_releases]
    # The padded spectrum release reads queued to its owner too (service.visibility).
    assert sorted(statuses) == ["queued", "queued", "succeeded", "succeeded"]
    screenshot(page, tmp_path, "owner")
    # The zcdp dataset is charted too: the ledger's epsilon_after, not a flat 0.
    zcdp = f"section[data-dataset='{world.zcdp}']"
    assert page.inner_text(f"{zcdp} h2") == f"demo · {world.zcdp[:8]}"
    zcdp_budget = world.api("owner", f"/v1/datasets/{world.zcdp}/budget")
    zcdp_ledger = world.api("owner", f"/v1/datasets/{world.zcdp}/ledger")["items"]
    spent = float(Decimal(zcdp_budget["epsilon_spent"]))
    assert spent > 0.2 and float(Decimal(zcdp_ledger[-1]["epsilon_after"])) == spent
    zcdp_chart = page.locator(f"{zcdp} svg.spending")
    assert float(zcdp_chart.get_attribute("data-final")) == pytest.approx(spent)
    zcdp_bar = page.locator(f"{zcdp} svg.by-grant rect[data-grant='{world.zcdp_grant}']")
    assert float(zcdp_bar.get_attribute("data-epsilon")) == pytest.approx(spent)
    # Grants name their analyst key; the native figure stands beside the epsilon one.
    assert cells(page, f"{zcdp} table.grants", 1) == [f"bob · {world.key_ids['analyst'][:8]}"]
    assert cells(page, f"{zcdp} table.grants", 6)[0].startswith("rho ")
    # What an owner may not read: the API refuses, and the page says so.
    chromium.visit(page, "admin")
    assert "403" in page.inner_text("#keys") and "dashboard-host" not in page.content()
    chromium.visit(page, "auditor")
    assert "403" in page.inner_text("#verification")
    assert page.locator("#audit table").count() == 0


def test_analyst_sees_their_grant_releases_and_downloads_a_basis(
    chromium: Browser, world: World, tmp_path: Path
) -> None:
    page = sign_in(chromium, world, "analyst")
    assert cells(page, "#grants table", 0) == [
        f"demo · {world.dataset[:8]}",
        f"demo · {world.zcdp[:8]}",
    ]
    remaining = cells(page, "#grants table", 5)
    assert remaining[0] == "0.15"  # epsilon remaining: 0.5 - 0.35
    # The epsilon grant on the zcdp dataset is stated in epsilon (not 0 / 0 / 0).
    mine = {g["dataset_id"]: g for g in world.api("analyst", "/v1/grants")["items"]}
    zcdp_grant = mine[world.zcdp]
    assert 0.49 < float(Decimal(zcdp_grant["epsilon_total"])) <= 0.5
    assert 0 < float(remaining[1]) < float(Decimal(zcdp_grant["epsilon_total"]))
    assert remaining[1] == figure(zcdp_grant["epsilon_remaining"])  # the CLI's digits, down
    mine = world.api("analyst", "/v1/releases")["items"]
    assert cells(page, "#releases table", 6) == [r["status"] for r in mine]
    # Exactly as the API shows them: the padded spectrum release reads queued (stored
    # succeeded), with no result and no times.
    assert sorted(r["status"] for r in mine) == ["queued", "succeeded", "succeeded"]
    assert "started" not in page.inner_text("#releases thead")
    assert cells(page, "#releases table", 1) == [r["id"][:8] for r in mine]
    assert world.releases["other"][:8] not in page.inner_text("#releases")
    # A queued (padded) release has nothing to download; the succeeded one has.
    assert (
        page.locator(f"button.download[data-release='{world.releases['spectrum']}']").count() == 0
    )
    screenshot(page, tmp_path, "analyst")
    with page.expect_download() as download_info:
        page.click(f"button.download[data-release='{world.releases['gauss']}']")
    text = Path(download_info.value.path()).read_text()
    downloaded = [[float(x) for x in row] for row in csv.reader(io.StringIO(text))]
    basis = world.api("analyst", f"/v1/releases/{world.releases['gauss']}")["result"]["basis"]
    assert downloaded == basis and len(basis) == 6 and len(basis[0]) == 2
    # An analyst reads no ledger, no audit log, no keys: the API's 403 is shown.
    chromium.visit(page, "owner")
    refused = page.inner_text("#datasets")  # the ledger's 403 or the releases' 404, first
    assert refused.startswith("The API refused: 40") and "svg" not in page.inner_html("#datasets")
    chromium.visit(page, "admin")
    assert "403" in page.inner_text("#keys") and "403" in page.inner_text("#queue")


def test_auditor_sees_the_chain_verified_and_the_log(
    chromium: Browser, world: World, tmp_path: Path
) -> None:
    page = sign_in(chromium, world, "auditor")
    verdict = page.locator("#verification .verdict")
    assert verdict.get_attribute("data-ok") == "true"
    assert page.inner_text("#verification .verdict").startswith("Chain verified")
    verification = world.api("auditor", "/v1/audit/verification")
    assert page.inner_text("#verification code.head") == verification["head"]
    assert "No anchored head configured" in page.inner_text("#verification")
    assert "null" not in page.inner_text("#verification")
    events = world.api("auditor", "/v1/audit?limit=100")
    assert cells(page, "#audit table", 0) == [str(e["seq"]) for e in reversed(events["items"])]
    screenshot(page, tmp_path, "auditor")
    chromium.visit(page, "owner")
    assert "403" in page.inner_text("#datasets")


def test_admin_sees_keys_workers_and_the_queue(
    chromium: Browser, world: World, tmp_path: Path
) -> None:
    page = sign_in(chromium, world, "admin")
    keys = world.api("admin", "/v1/keys")
    assert cells(page, "#keys table", 2) == [k["name"] for k in keys["items"]]
    assert page.locator("#workers .counts").get_attribute("data-alive") == "1"
    assert cells(page, "#workers table", 0) == ["dashboard-host:4242:abc123"]
    assert page.locator("#queue .counts").get_attribute("data-queued") == "1"
    assert cells(page, "#queue table", 0) == [world.releases["queued"][:8]]
    page_text = page.content()
    assert all(key not in page_text for key in world.keys.values())
    screenshot(page, tmp_path, "admin")
    # Signing out forgets the key.
    page.click("#sign-out")
    page.wait_for_url(world.base + "/dashboard")
    assert page.evaluate("sessionStorage.getItem('dpss.apiKey')") is None


def test_a_bad_key_is_refused_and_pages_send_a_strict_policy(
    chromium: Browser, world: World, tmp_path: Path
) -> None:
    page = chromium.page()
    response = page.goto(world.base + "/dashboard")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy and "form-action 'none'" in policy
    page.fill("#api-key", "dpss_not-a-key")
    page.click("#sign-in button[type=submit]")
    page.wait_for_selector("#sign-in-error:not([hidden])")
    assert "not valid" in page.inner_text("#sign-in-error")
    assert page.evaluate("sessionStorage.getItem('dpss.apiKey')") is None
    screenshot(page, tmp_path, "signin")
    # A view without a key sends the visitor to sign in.
    fresh = chromium.page()
    fresh.goto(world.base + "/dashboard/owner")
    fresh.wait_for_url(world.base + "/dashboard")


def test_pages_and_redirect_without_a_browser(world: World) -> None:
    """The shells carry no data and no inline script; unknown views are 404."""
    root = httpx.get(world.base + "/", follow_redirects=False)
    assert root.status_code == 307 and root.headers["location"] == "/dashboard"
    for view in ("", "/owner", "/analyst", "/auditor", "/admin"):
        page = httpx.get(f"{world.base}/dashboard{view}")
        assert page.status_code == 200 and page.headers["cache-control"] == "no-store"
        assert "<script>" not in page.text and "style=" not in page.text
        assert world.dataset not in page.text
    missing = httpx.get(world.base + "/dashboard/nobody")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    script = httpx.get(world.base + "/dashboard/static/dashboard.js")
    assert script.status_code == 200 and "sessionStorage" in script.text
    assert "http://" not in script.text.replace("http://www.w3.org/2000/svg", "")


def test_a_hybrid_grant_and_dataset_show_both_native_figures(
    chromium: Browser, world: World
) -> None:
    # hybrid, the product's default, has two native currencies: its Gaussian-DP filter's mu
    # and its zCDP filter's rho. The page showed mu alone, which reads 0 once an approximate
    # step closed that filter while rho was left. A new owner and analyst: nothing else here
    # shows them.
    owner, analyst = _owner_and_analyst(world.base, "erin", "frank")
    rows = np.eye(6)[:4] * 0.5
    more = {"accounting": "hybrid", "allow_large_delta": "true"}
    dataset = _upload(world.base, owner, rows, "h.npy", "hybrid-demo", "1.0", **more)
    grant = _grant(world.base, owner, dataset["id"], analyst["id"], epsilon="0.5", delta="1e-6")
    page = chromium.sign_in(owner, "owner")
    card = f"section[data-dataset='{dataset['id']}']"
    native = cells(page, f"{card} table.grants", 6)
    mu, rho = Decimal(grant["mu_remaining"]), Decimal(grant["rho_remaining"])
    # Remaining figures are rounded down (the help page's rule; this read nearest before).
    assert native == [f"mu {figure(mu)}, rho {figure(rho)}"], native


def test_every_figure_is_rounded_the_safe_way_on_the_default_accounting(
    chromium: Browser, world: World
) -> None:
    # The dashboard rounded every figure to the nearest 6 digits in float: on the default
    # (hybrid) accounting, after two Gaussian releases of 0.3, epsilon_remaining
    # 0.58936393... read 0.589364 (above what is left) and epsilon_spent 0.41063606... read
    # 0.410636 (below what was spent); delta read "1e-7". The page "Reading a budget" it links
    # to says a shown figure never overstates what is left: spent and costs up, totals and
    # remaining down, in plain notation (api_schemas.figures.shown, to the CLI's digits).
    owner, analyst = _owner_and_analyst(world.base, "gina", "hal")
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(300, 6)) * 0.2
    # hybrid, the service's default (the suite's conftest sets basic for older tests).
    dataset = _upload(world.base, owner, rows, "r.npy", "rounding", "1", accounting="hybrid")["id"]
    grant = _grant(world.base, owner, dataset, analyst["id"], epsilon="0.8", delta="1e-5")
    assert grant["accounting"] == "hybrid"
    for _ in range(2):  # charged when requested: no worker needed for the figures
        _post(
            world.base,
            analyst["key"],
            f"/v1/datasets/{dataset}/releases",
            json={"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.3"},
        )
    headers = {"Authorization": f"Bearer {owner}"}
    budget = httpx.get(f"{world.base}/v1/datasets/{dataset}/budget", headers=headers).json()
    grants = httpx.get(f"{world.base}/v1/datasets/{dataset}/grants", headers=headers).json()
    (mine,) = grants["items"]

    def safe(value: str, up: bool = False) -> str:
        return figure(value, up=up)

    # Nearest rounding would overstate what remains or understate what was spent: the test
    # checks a case that matters.
    remaining, spent = Decimal(budget["epsilon_remaining"]), Decimal(budget["epsilon_spent"])
    nearest = Decimal(f"{float(remaining):.6g}"), Decimal(f"{float(spent):.6g}")
    assert nearest[0] > remaining or nearest[1] < spent
    page = chromium.sign_in(owner, "owner")
    card = f"section[data-dataset='{dataset}']"
    for name, value in budget.items():
        if value is None or not value[:1].isdigit():
            continue
        shown_here = page.inner_text(f"{card} table.budget tr[data-field={name}] td")
        assert shown_here == safe(value, up=name.endswith("_spent")), name
    native = f"mu {safe(mine['mu_remaining'])}, rho {safe(mine['rho_remaining'])}"
    expected_grant = [
        safe(mine["epsilon_total"]),
        safe(mine["epsilon_spent"], up=True),
        safe(mine["epsilon_remaining"]),
        safe(mine["delta_remaining"]),
        native,
    ]
    assert [cells(page, f"{card} table.grants", c)[0] for c in range(2, 7)] == expected_grant
    bar = page.locator(f"{card} svg.bar").get_attribute("aria-label")
    assert bar == (
        f"epsilon spent {safe(budget['epsilon_spent'], True)} of {safe(budget['epsilon_total'])}"
    )
    assert cells(page, f"{card} table.releases", 5) == ["0.0000001", "0.0000001"]
    page = chromium.sign_in(analyst["key"], "analyst")
    assert [cells(page, "#grants table", c)[0] for c in range(3, 8)] == expected_grant
    shown_budget = [cells(page, "#budgets table", c)[0] for c in range(1, 4)]
    assert shown_budget == [
        safe(budget["epsilon_remaining"]),
        safe(budget["delta_remaining"]),
        f"mu {safe(budget['mu_remaining'])}, rho {safe(budget['rho_remaining'])}",
    ]


def test_an_outage_keeps_the_key_and_says_so(chromium: Browser, world: World) -> None:
    # A 503 (database busy, with Retry-After) or no answer at all on the page's first call
    # signed the visitor out: the key was dropped and the sign-in form shown, with no word of
    # what happened. Only a key the service refuses (401) is forgotten now; an outage is said.
    busy = {
        "status": 503,
        "headers": {"Retry-After": "7", "Content-Type": "application/json"},
        "body": '{"error": "unavailable", "detail": "the database is busy", "retry_after": 7}',
    }
    page = sign_in(chromium, world, "owner")
    for name, answer in (
        ("503", lambda route: route.fulfill(**busy)),
        ("none", lambda route: route.abort("connectionrefused")),
    ):
        page.route("**/v1/whoami", answer)
        chromium.visit(page, "owner")
        assert page.url == world.base + "/dashboard/owner"
        assert page.evaluate("sessionStorage.getItem('dpss.apiKey')") == world.keys["owner"]
        notice = page.locator("#notice[role=alert]")
        assert notice.get_attribute("data-status") == name
        text = notice.inner_text()
        assert "Try again in 7 s" in text if name == "503" else "did not answer" in text
        assert page.locator(".loading").count() == 0
        page.unroute("**/v1/whoami")
    # A call of the view itself: the same words where its figures would be.
    page.route("**/budget", lambda route: route.fulfill(**busy))
    chromium.visit(page, "owner")
    assert page.locator("#datasets [role=alert]").get_attribute("data-status") == "503"
    assert "Try again in 7 s" in page.inner_text("#datasets")
    page.unroute("**/budget")
    # A restore held until an admin accepts it is no outage to wait out: its detail is shown.
    held = dict(busy, body='{"error": "restore_unaccepted", "detail": "accept-restore first"}')
    page.route("**/budget", lambda route: route.fulfill(**held))
    chromium.visit(page, "owner")
    text = page.inner_text("#datasets")
    assert "accept-restore first" in text and "Try again" not in text
    page.unroute("**/budget")
    # A revoked key is forgotten, as before.
    page.route("**/v1/whoami", lambda route: route.fulfill(status=401, body="{}"))
    page.goto(world.base + "/dashboard/owner")
    page.wait_for_url(world.base + "/dashboard")
    assert page.evaluate("sessionStorage.getItem('dpss.apiKey')") is None


def test_a_release_shows_its_explained_variance_and_warning_beside_its_basis(
    chromium: Browser, world: World
) -> None:
    # The release tables showed status and reason only: a basis the API flags as
    # indistinguishable from random directions (warning, warning_code) with its explained
    # variance hidden by noise (explained_variance_hidden_by_noise, interval [0, 1]) was offered
    # for download with neither said. Each row now carries the API's own statements; a ratio the
    # noise hides is not shown as a figure.
    def expected(release: dict[str, Any]) -> list[str]:
        extras = (release.get("result") or {}).get("extras") or {}
        notes = []
        interval = extras.get("explained_variance_ratio_interval")
        span = f" (90% interval [{interval[0]:.2f}, {interval[1]:.2f}])" if interval else ""
        if extras.get("explained_variance_hidden_by_noise") is True:
            notes.append(f"explained variance hidden by noise{span}")
        elif extras.get("explained_variance_ratio"):
            notes.append(f"explained variance {sum(extras['explained_variance_ratio']):.2f}{span}")
        if extras.get("warning"):
            notes.append(f"Warning: {extras['warning']}")
        return notes

    def shown_notes(page: Any, selector: str) -> list[list[str]]:
        return [
            [str(t).strip() for t in row]
            for row in page.eval_on_selector_all(
                f"{selector} tbody tr",
                "rows => rows.map(r => [...r.cells[8].querySelectorAll('.notes span')]"
                ".map(s => s.textContent))",
            )
        ]

    mine = world.api("analyst", "/v1/releases")["items"]
    owned = world.api("owner", f"/v1/datasets/{world.dataset}/releases")["items"]
    assert any(expected(r) for r in mine) and any(expected(r) for r in owned)
    page = sign_in(chromium, world, "analyst")
    assert shown_notes(page, "#releases table") == [expected(r) for r in mine]
    # Nothing of a hidden release's result: the padded one reads queued with no notes.
    hidden = [i for i, r in enumerate(mine) if r["id"] == world.releases["spectrum"]]
    assert hidden and shown_notes(page, "#releases table")[hidden[0]] == []
    page = sign_in(chromium, world, "owner")
    card = f"section[data-dataset='{world.dataset}'] table.releases"
    assert shown_notes(page, card) == [expected(r) for r in owned]


def test_a_hybrid_budget_says_epsilon_remaining_is_not_what_every_release_may_ask(
    chromium: Browser, world: World
) -> None:
    # hybrid (the default) states the spend in epsilon_remaining; a pure or approximate
    # release may be refused below it (after two Gaussian 0.3 releases on (1, 1e-5), 0.67
    # remains and a pure 0.3 is refused). The API's descriptions and 409s say so and give
    # epsilon_admissible; the dashboard showed the bare figure, headed "remaining budgets".
    owner, analyst = _owner_and_analyst(world.base, "ivy", "jon")
    rows = np.eye(6)[:5] * 0.5
    dataset = _upload(world.base, owner, rows, "n.npy", "note", "1", accounting="hybrid")["id"]
    _grant(world.base, owner, dataset, analyst["id"], epsilon="0.5", delta="1e-5")
    page = chromium.sign_in(owner, "owner")
    note = page.locator(f"section[data-dataset='{dataset}'] .hybrid-remaining")
    assert "epsilon_admissible" in note.inner_text()
    assert note.locator("a").get_attribute("href") == "/dashboard/reading-a-budget"
    # What a pure release is admitted at (1 of a fresh (1, 1e-5) budget, above its 0.9973 for
    # a Gaussian one): the note about one budget states it; the tables have a column for it.
    budget = _get(world.base, owner, f"/v1/datasets/{dataset}/budget")
    pure = figure(budget["epsilon_remaining_pure"])
    assert pure == "1" and figure(budget["epsilon_remaining"]) != pure
    assert f"epsilon_remaining_pure: {pure} now" in note.inner_text()
    page = chromium.sign_in(analyst["key"], "analyst")
    for where in ("#grants", "#budgets"):
        assert "not what every kind of release" in page.inner_text(f"{where} .hybrid-remaining")
    (grant,) = _get(world.base, analyst["key"], "/v1/grants")["items"]
    assert cells(page, "#grants table", 8) == [figure(grant["epsilon_remaining_pure"])]
    # Not on the other accountings' budgets: bob's grants are on a basic and a zcdp dataset.
    page = sign_in(chromium, world, "analyst")
    assert page.locator("#grants .hybrid-remaining").count() == 0
    page = sign_in(chromium, world, "owner")
    for other in (world.dataset, world.zcdp):
        assert page.locator(f"section[data-dataset='{other}'] .hybrid-remaining").count() == 0
