"""The documentation pages (/docs, /redoc) served from assets installed with the service.

FastAPI's default pages load Swagger UI and ReDoc from a public CDN, so on a machine
without internet (an air-gapped storage network) they render blank. fastapi-offline
ships the same bundles as package data; they are served here under /docs/assets.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs/assets"
ASSETS = files("fastapi_offline") / "static"


def install(app: FastAPI) -> None:
    """Add /docs, /redoc and their assets; call after the routers so data routes match first."""
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API manual",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
            swagger_ui_parameters={"defaultModelsExpandDepth": 0, "tryItOutEnabled": False},
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API manual",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )

    app.mount(ASSETS_URL, StaticFiles(directory=str(ASSETS)), name="docs-assets")
