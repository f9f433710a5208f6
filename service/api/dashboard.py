"""The dashboard at ``/dashboard``: server-rendered page shells (Jinja2) and one same-origin
script that fills them from the JSON API.

Why this shape: every figure a page shows is what ``GET /v1/...`` answers to the signed-in key,
so the dashboard has no authorization code of its own (the API's is the only one) and an
analyst sees releases exactly as the API shows them (padding and hidden times included). The
key is typed into the sign-in form, kept in the tab's ``sessionStorage`` and sent as a bearer
header by the script's ``fetch`` calls: never in a URL (the form is never submitted; the page's
policy has ``form-action 'none'``), a cookie or a log line (the access log has the key's id).

The pages load only ``/dashboard/static/*`` (policy ``'self'``, see
:mod:`service.api.observability`), so they work offline.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, select_autoescape

from api_schemas.figures import READING_A_BUDGET, SIGNIFICANT
from service.errors import NotFound, printable

DASHBOARD_URL = "/dashboard"
STATIC_URL = "/dashboard/static"

#: Role views, in the navigation's order.
VIEWS: dict[str, str] = {
    "owner": "Owner: budgets",
    "analyst": "Analyst: grants and releases",
    "auditor": "Auditor: audit log",
    "admin": "Admin: keys, workers, queue",
}

_environment = Environment(
    loader=PackageLoader("service.dashboard", "templates"),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def static_dir() -> Path:
    return Path(str(files("service.dashboard") / "static"))


#: The page that explains rho, mu and the delta held for the conversion (one text:
#: :data:`api_schemas.figures.READING_A_BUDGET`); every page's navigation links to it.
HELP_VIEW = "reading-a-budget"


def render(view: str, title: str) -> HTMLResponse:
    page = _environment.get_template("signin.html" if view == "signin" else f"{view}.html")
    html = page.render(
        view=view,
        title=title,
        views=[(name, label.split(":")[0]) for name, label in VIEWS.items()],
        static=STATIC_URL,
        help_url=f"{DASHBOARD_URL}/{HELP_VIEW}",
        sections=READING_A_BUDGET,
        # Figures to the CLI's significant digits (dashboard.js reads it from the body).
        significant=SIGNIFICANT,
    )
    # The shells hold no data, but a shared cache has no business keeping them either.
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


def install_dashboard(app: FastAPI) -> None:
    """Serve ``/`` (a redirect), ``/dashboard``, one page per role view and the static files."""
    app.mount(STATIC_URL, StaticFiles(directory=static_dir()), name="dashboard-assets")

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(DASHBOARD_URL, status_code=307)

    @app.get(DASHBOARD_URL, include_in_schema=False)
    async def sign_in() -> HTMLResponse:
        return render("signin", "Sign in")

    @app.get(DASHBOARD_URL + "/{view}", include_in_schema=False)
    async def role_view(view: str) -> HTMLResponse:
        if view == HELP_VIEW:
            return render(HELP_VIEW, "Reading a budget")
        if view not in VIEWS:
            shown = printable(view, 40)
            raise NotFound(f"no dashboard view '{shown}'; the views are {', '.join(VIEWS)}")
        return render(view, VIEWS[view])
