"""What every dashboard route uses: the templates, the session check and rendering."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import jinja2
from fastapi import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from pgqueue import JobState, Queue
from pgqueue_api.settings import ApiSettings
from pgqueue_api.ui import security, views

HERE = Path(__file__).parent
TEMPLATES = Jinja2Templates(
    env=jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        # Everything a template prints is escaped: payloads, errors and names are data.
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
)
TEMPLATES.env.filters.update(
    age=views.age,
    when=views.when,
    until=views.until,
    local_time=views.local_time,
    limit_value=views.limit_value,
)
STATES = [state.value for state in JobState]
FRAGMENT_PREFIX = "/ui/fragments/"


class LoginRequired(Exception):
    """The request needs a session it does not have."""

    def __init__(self, fragment: bool, target: str) -> None:
        super().__init__("log in to the dashboard")
        self.fragment = fragment
        self.target = target


def queue_controls() -> dict[str, bool]:
    """Which optional Queue operations this pgqueue has (queue pause and limits, the
    worker registry): the dashboard shows their pages and controls only when it does."""
    return {
        "pause": hasattr(Queue, "pause_queue") and hasattr(Queue, "resume_queue"),
        "limits": hasattr(Queue, "update_queue"),
        "workers": hasattr(Queue, "workers"),
        "schedules": hasattr(Queue, "schedules") and hasattr(Queue, "set_schedule_enabled"),
    }


def require_session(request: Request) -> None:
    """Dependency of every dashboard route but the login page: with API tokens
    configured, a valid session cookie is required."""
    settings: ApiSettings = request.app.state.settings
    if not settings.auth_required:
        return
    if security.valid_session(request.cookies.get(security.SESSION_COOKIE), settings.tokens):
        return
    path = request.url.path
    target = path + (f"?{request.url.query}" if request.url.query else "")
    fragment = path.startswith(FRAGMENT_PREFIX) or "hx-request" in request.headers
    if path.startswith(FRAGMENT_PREFIX):
        # After logging in, the page that polled the fragment, not the fragment.
        target = "/ui/" + path.removeprefix(FRAGMENT_PREFIX)
        target = "/ui" if target == "/ui/queues" else target
    raise LoginRequired(fragment, target)


def login_required_response(request: Request, exc: Exception) -> Response:
    """A page goes to the login page (and back after it); a fragment, fetched by a page
    that is still open, answers 401 and tells htmx to go to the login page."""
    assert isinstance(exc, LoginRequired)
    login = f"/ui/login?next={quote(exc.target, safe='')}"
    if exc.fragment:
        return Response("Log in again.", status_code=401, headers={"HX-Redirect": login})
    return RedirectResponse(login, status_code=303)


def render(request: Request, template: str, status_code: int = 200, **context: object) -> Response:
    """``template`` with ``context`` and what every page needs."""
    settings: ApiSettings = request.app.state.settings
    response = TEMPLATES.TemplateResponse(
        request,
        template,
        {
            "open_dashboard": not settings.auth_required,
            "auth_required": settings.auth_required,
            "csrf_token": security.csrf_token(request),
            "controls": queue_controls(),
            "states": STATES,
            **context,
        },
        status_code=status_code,
    )
    return security.finish(request, response)


def queue_of(request: Request) -> Queue:
    """The app's Queue."""
    queue: Queue = request.app.state.queue
    return queue
