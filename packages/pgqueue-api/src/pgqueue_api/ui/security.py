"""The dashboard's sessions, CSRF tokens and security headers.

Sessions are stateless, so that every worker process of the API accepts the sessions of
the others with no shared store: the cookie holds an expiry and a nonce, signed with
HMAC-SHA256 keyed by the API token that logged in. Removing a token from the
configuration therefore ends the sessions it opened.

Every browser gets a random CSRF cookie (HttpOnly, SameSite=Strict). The CSRF token that
forms carry is an HMAC of the session cookie keyed by it, so a token is worth nothing
without both cookies, which another site can neither read nor send (SameSite=Strict).
All comparisons of secrets are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Collection
from typing import Literal, TypedDict

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SESSION_COOKIE = "pgqueue_session"
CSRF_COOKIE = "pgqueue_csrf"
SESSION_SECONDS = 12 * 3600
"""A session lasts a working day; then the dashboard asks for the token again."""
UI_PREFIX = "/ui"

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "object-src 'none'",
        "frame-ancestors 'none'",
    ]
)
"""Only the dashboard's own files: no inline script, so markup that escaping missed
still could not run, and no framing (clickjacking)."""


def _sign(key: str, message: str) -> str:
    return hmac.new(key.encode(), message.encode(), hashlib.sha256).hexdigest()


def matching_token(presented: str, tokens: Collection[str]) -> str | None:
    """The configured token equal to ``presented``, compared with every one of them in
    constant time (the timing says neither how much matched nor which one did)."""
    found = None
    for token in tokens:
        if hmac.compare_digest(token.encode(), presented.encode()):
            found = token
    return found


def new_session(token: str, now: float | None = None) -> str:
    """A session cookie's value for a login with ``token``."""
    expires = int((time.time() if now is None else now) + SESSION_SECONDS)
    body = f"{expires}.{secrets.token_urlsafe(16)}"
    return f"{body}.{_sign(token, body)}"


def valid_session(value: str | None, tokens: Collection[str], now: float | None = None) -> bool:
    """True for an unexpired session cookie signed by one of ``tokens``."""
    if not value or value.count(".") != 2:
        return False
    body, _, signature = value.rpartition(".")
    expires, _, _nonce = body.partition(".")
    if not expires.isdigit() or int(expires) < (time.time() if now is None else now):
        return False
    valid = False
    for token in tokens:
        valid |= hmac.compare_digest(_sign(token, body), signature)
    return valid


def csrf_secret(request: Request) -> str:
    """This browser's CSRF cookie, or a new one (which :func:`finish` then sets)."""
    secret = request.cookies.get(CSRF_COOKIE) or getattr(request.state, "new_csrf", None)
    if not secret:
        secret = request.state.new_csrf = secrets.token_urlsafe(32)
    return secret


def csrf_token(request: Request) -> str:
    """The CSRF token forms of this page carry."""
    session = request.cookies.get(SESSION_COOKIE, "")
    return _sign(csrf_secret(request), f"csrf:{session}")


def csrf_valid(request: Request, presented: str | None) -> bool:
    """True when ``presented`` is this browser's CSRF token for its current session."""
    secret = request.cookies.get(CSRF_COOKIE)
    if not secret or not presented:
        return False
    session = request.cookies.get(SESSION_COOKIE, "")
    return hmac.compare_digest(_sign(secret, f"csrf:{session}"), presented)


class CookieOptions(TypedDict):
    """The attributes of the dashboard's cookies, for ``set_cookie`` and ``delete_cookie``."""

    httponly: bool
    samesite: Literal["lax", "strict", "none"]
    secure: bool
    path: str


def _cookie_options(request: Request) -> CookieOptions:
    # Secure whenever the page came over TLS (uvicorn sets the scheme from the proxy's
    # X-Forwarded-Proto when it trusts the proxy).
    return {
        "httponly": True,
        "samesite": "strict",
        "secure": request.url.scheme == "https",
        "path": UI_PREFIX,
    }


def finish(request: Request, response: Response) -> Response:
    """Set the CSRF cookie on ``response`` if this request made a new one."""
    new: str | None = getattr(request.state, "new_csrf", None)
    if new:
        response.set_cookie(CSRF_COOKIE, new, **_cookie_options(request))
    return response


def set_session(request: Request, response: Response, token: str) -> None:
    """Log the browser in: the session cookie for ``token``."""
    response.set_cookie(
        SESSION_COOKIE, new_session(token), max_age=SESSION_SECONDS, **_cookie_options(request)
    )


def clear_session(request: Request, response: Response) -> None:
    """Log the browser out."""
    options = _cookie_options(request)
    response.delete_cookie(SESSION_COOKIE, **options)


class SecurityHeadersMiddleware:
    """Adds the dashboard's headers (CSP, no framing, no sniffing, no caching of pages
    that show job data) to every response under ``/ui``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != UI_PREFIX and not path.startswith(UI_PREFIX + "/"):
            await self.app(scope, receive, send)
            return
        static = path.startswith(UI_PREFIX + "/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
                    (b"x-frame-options", b"DENY"),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"same-origin"),
                ]
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
