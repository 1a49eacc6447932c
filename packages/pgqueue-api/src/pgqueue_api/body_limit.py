"""413 for request bodies over the limit, decided before anything parses them.

A declared ``Content-Length`` over the limit is refused without reading a byte. Other
bodies (chunked ones have no length) are read here as they stream in, counting bytes,
and refused the moment the count passes the limit; a body within the limit is then
handed to the app whole. So a client can make a process hold at most ``max_bytes`` of
its body in memory, whatever it declares.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgqueue_api.errors import error_response


class BodyLimitMiddleware:
    """Pure ASGI middleware answering 413 for bodies larger than ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._too_large(scope, receive, send)
            return

        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left; nobody is waiting for an answer
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break

        await self.app(scope, replay_body(b"".join(chunks), receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        # No "Connection: close": closing with the client's bytes still unread makes the
        # kernel send a reset, which can destroy this answer before the client reads it.
        # The server discards the rest of the body instead, until its keep-alive timeout.
        response = error_response(413, f"request body is larger than {self.max_bytes} bytes")
        await response(scope, receive, send)


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app ``body`` whole, once, then waits on the
    client's (for its disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server rejects a malformed length before we see it
    return None
