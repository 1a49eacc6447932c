"""Bearer-token authentication, checked before a request's body is read or parsed.

It is middleware rather than a FastAPI dependency because FastAPI parses and validates
the body before it runs dependencies: a caller without a token would learn about its
malformed JSON (422) instead of being told to authenticate (401).
"""

from __future__ import annotations

import hmac
from collections.abc import Collection, Iterable

from fastapi.security import HTTPBearer
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from pgqueue_api.errors import error_response

BEARER_SCHEME = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="A token from PGQUEUE_API_TOKENS or the --token-file.",
)
"""Declares the scheme in ``/openapi.json`` (so ``/docs`` can send a token); the
middleware below is what enforces it."""


class BearerAuthMiddleware:
    """Pure ASGI middleware: 401 with ``WWW-Authenticate: Bearer`` unless the request
    carries one of ``tokens``, except on the ``public_paths`` and the paths under the
    ``public_prefixes`` (the dashboard, which checks sessions of its own)."""

    def __init__(
        self,
        app: ASGIApp,
        tokens: Collection[str],
        public_paths: Collection[str],
        public_prefixes: Collection[str] = (),
    ):
        self.app = app
        self.tokens = [token.encode() for token in tokens]
        self.public_paths = frozenset(public_paths)
        self.public_prefixes = tuple(public_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._public(scope["path"]):
            await self.app(scope, receive, send)
            return
        presented = _bearer_token(scope)
        if presented is None:
            await _unauthorized("a bearer token is required", 'Bearer realm="pgqueue"')(
                scope, receive, send
            )
            return
        if not self._known(presented):
            await _unauthorized(
                "the bearer token is not valid", 'Bearer realm="pgqueue", error="invalid_token"'
            )(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _public(self, path: str) -> bool:
        if path in self.public_paths:
            return True
        return any(
            path == prefix or path.startswith(prefix + "/") for prefix in self.public_prefixes
        )

    def _known(self, presented: bytes) -> bool:
        # Compare with every token, each in constant time, so the answer's timing says
        # neither how much of a token matched nor which one did.
        matched = False
        for token in self.tokens:
            matched |= hmac.compare_digest(token, presented)
        return matched


def _bearer_token(scope: Scope) -> bytes | None:
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers", ())
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


def _unauthorized(detail: str, challenge: str) -> Response:
    return error_response(401, detail, headers={"WWW-Authenticate": challenge})
