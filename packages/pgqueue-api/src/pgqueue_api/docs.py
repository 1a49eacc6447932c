"""``/docs``: Swagger UI from assets shipped in this package, so the page works offline.

FastAPI's own ``/docs`` loads Swagger UI from a CDN, which leaves the page blank on a
network without internet access. The assets in ``static/swagger-ui`` are those of the
``swagger-ui-dist`` npm package (see the VENDORED.txt beside them).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

ASSETS_DIR = Path(__file__).parent / "static" / "swagger-ui"
ASSETS_PATH = "/docs/assets"
DOCS_PATH = "/docs"
OAUTH2_REDIRECT_PATH = "/docs/oauth2-redirect"


def install_docs(app: FastAPI) -> None:
    """Serve Swagger UI at ``/docs`` from local assets (the app is built with
    ``docs_url=None``, so FastAPI's CDN-backed page is not there)."""
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon-32x32.png",
            oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_PATH}",
        )

    @app.get(OAUTH2_REDIRECT_PATH, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
