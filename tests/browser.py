"""Debian's headless chromium driven by Playwright, for the dashboard's tests: one browser,
a fresh context (its own sessionStorage) per tab, every request intercepted so that any request
off the service's origin is recorded and refused."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def available() -> bool:
    """Whether chromium and Playwright for Python are both installed."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return CHROMIUM is not None


@dataclass
class Browser:
    browser: Any
    base: str
    off_origin: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def page(self) -> Any:
        """A fresh tab in its own context; every request intercepted."""
        context = self.browser.new_context(
            viewport={"width": 1100, "height": 900}, accept_downloads=True
        )

        def route(route: Any) -> None:
            url = route.request.url
            self.urls.append(url)
            if url.startswith(self.base + "/") or url.startswith("blob:" + self.base):
                route.continue_()
            else:
                self.off_origin.append(url)
                route.abort()

        context.route("**/*", route)
        return context.new_page()

    def sign_in(self, key: str, view: str) -> Any:
        """Open ``/``, sign in with ``key`` and wait until ``view`` has rendered."""
        page = self.page()
        page.goto(self.base + "/")
        assert page.url == self.base + "/dashboard"
        page.fill("#api-key", key)
        page.click("#sign-in button[type=submit]")
        page.wait_for_url(f"{self.base}/dashboard/{view}")
        page.wait_for_selector("body[data-ready=true]")
        assert page.evaluate("document.cookie") == ""
        assert page.evaluate("sessionStorage.getItem('dpss.apiKey')") == key
        return page

    def visit(self, page: Any, view: str) -> None:
        page.goto(f"{self.base}/dashboard/{view}")
        page.wait_for_selector("body[data-ready=true]")


@contextmanager
def chromium(base: str, keys: list[str]) -> Iterator[Browser]:
    """A browser for the service at ``base``; on exit, no request may have left its origin
    and no URL may have carried one of ``keys``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        driver = Browser(browser, base)
        try:
            yield driver
        finally:
            browser.close()
    assert driver.off_origin == []
    for url in driver.urls:
        assert all(key not in url for key in keys), url


def cells(page: Any, selector: str, column: int) -> list[str]:
    """The text of one column of a rendered table's body."""
    return [
        str(text).strip()
        for text in page.eval_on_selector_all(
            f"{selector} tbody tr", f"rows => rows.map(r => r.cells[{column}].textContent)"
        )
    ]


def check_walkthrough_dashboard(base: str, owner: str, auditor: str, admin: str) -> None:
    """The issue's "done when", after the README's walkthrough: the owner opens ``/`` and sees
    the dataset's budget (0.6 of 1.0 spent), its spending chart and its releases; the auditor
    sees the chain verified; ``/metrics`` answers the admin key."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    with chromium(base, [owner, auditor, admin]) as driver:
        page = driver.sign_in(owner, "owner")
        # The name, and the start of its id (datasets with the same name are told apart).
        heading = page.inner_text("section.dataset h2")
        dataset_id = page.locator("section.dataset").get_attribute("data-dataset")
        assert heading == f"demo · {dataset_id[:8]}"
        spent = page.inner_text("table.budget tr[data-field=epsilon_spent] td")
        assert spent == "0.6"
        chart = page.locator("svg.spending")
        assert float(chart.get_attribute("data-final")) == 0.6
        assert chart.locator("circle").count() == 2
        assert sorted(cells(page, "table.releases", 2)) == ["auto", "spectrum"]
        assert cells(page, "table.releases", 6) == ["succeeded", "succeeded"]
        page = driver.sign_in(auditor, "auditor")
        assert page.locator(".verdict").get_attribute("data-ok") == "true"
    scraped = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {admin}"})
    assert scraped.status_code == 200
    names = {family.name for family in text_string_to_metric_families(scraped.text)}
    assert {
        "dpss_http_requests",
        "dpss_queue_depth",
        "dpss_releases",
        "dpss_workers_alive",
    } <= names
