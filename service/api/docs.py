"""The API manual (Swagger UI at ``/docs``, ReDoc at ``/redoc``) served by the service itself.

FastAPI's default pages load Swagger UI and ReDoc from a CDN, so they are blank on a network
without internet. The assets come instead from the ``fastapi-offline`` distribution (MIT; it
ships ``swagger-ui-bundle.js``, ``swagger-ui.css``, ``redoc.standalone.js`` and a favicon as
package data) and are served under :data:`STATIC_URL`; the pages are FastAPI's own HTML
builders pointed at them. Nothing is copied into this repository, and the pages' policy
(:mod:`service.api.middleware`) allows scripts and styles from ``'self'`` only.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
STATIC_URL = "/static/docs"

#: Page path -> kind, for the Content-Security-Policy of each page.
DOCS_PAGES = {DOCS_URL: "swagger", REDOC_URL: "redoc", OAUTH2_REDIRECT_URL: "oauth2_redirect"}


def assets_dir() -> Path:
    """The directory of the packaged Swagger UI and ReDoc assets."""
    return Path(str(files("fastapi_offline") / "static"))


def install_docs(app: FastAPI) -> None:
    """Mount the assets and serve the three pages (the app is built with its default docs
    routes disabled: ``docs_url=None, redoc_url=None``)."""
    app.mount(STATIC_URL, StaticFiles(directory=assets_dir()), name="docs-assets")
    title = app.title
    openapi_url = app.openapi_url or "/openapi.json"
    favicon = f"{STATIC_URL}/favicon.png"

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            oauth2_redirect_url=OAUTH2_REDIRECT_URL,
            swagger_js_url=f"{STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=favicon,
            # No badge from validator.swagger.io: the page makes no request off this host.
            swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False},
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title} - ReDoc",
            redoc_js_url=f"{STATIC_URL}/redoc.standalone.js",
            redoc_favicon_url=favicon,
            with_google_fonts=False,
        )
