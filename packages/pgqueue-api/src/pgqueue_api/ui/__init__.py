"""The dashboard: server-rendered pages under ``/ui``, served by the API process.

Jinja2 templates, htmx (vendored in ``static/``) for the parts that refresh
themselves, and every read and action through the same :class:`~pgqueue.Queue` calls as
the JSON API. ``pgqueue-api --no-ui`` leaves it out.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from pgqueue_api.ui import actions, common, pages, partitions, queue_actions, security, views
from pgqueue_api.ui.finished import FinishedHistory

PUBLIC_PREFIXES = (security.UI_PREFIX,)
"""Paths the bearer-token middleware leaves to the dashboard, which checks sessions."""


def install_ui(app: FastAPI) -> None:
    """Add the dashboard's routes, static files and security headers to ``app``."""
    app.state.ui_finished = FinishedHistory(views.CHART_MINUTES)
    app.mount("/ui/static", StaticFiles(directory=common.HERE / "static"), name="ui-static")
    app.include_router(actions.router)
    app.include_router(actions.protected)
    app.include_router(queue_actions.router)
    app.include_router(pages.router)
    app.include_router(partitions.router)
    app.add_exception_handler(common.LoginRequired, common.login_required_response)
    app.add_exception_handler(actions.CsrfRefused, actions.csrf_refused_response)
    app.add_middleware(security.SecurityHeadersMiddleware)


__all__ = ["PUBLIC_PREFIXES", "install_ui"]
