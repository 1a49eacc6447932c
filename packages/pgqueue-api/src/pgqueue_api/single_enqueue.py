"""``POST /jobs`` answered without FastAPI's per-request machinery, for the requests most
clients send: one job without an idempotency key, a unique key or dependencies.

Routing, the request object, dependency injection, the exception middleware and its
exit stack cost a request of ``POST /jobs`` about as much CPU as everything else the
API does for it. This middleware, innermost but for the app itself (so authentication,
the body limit and the request id have already run), answers such a request with the
same parsing (:func:`~pgqueue_api.strict_json.parse_strict_json`), the same model
(:class:`~pgqueue_api.schemas.JobCreate`), the same :class:`~pgqueue.JobSpec` and the same
:class:`~pgqueue.AsyncProducer` as the route, and the same answer.

Every other request goes on to the app untouched, with the body it sent. So does every
request this path cannot answer before it touches the database: JSON that does not
parse, a body the model refuses, a job with keys or dependencies, an app that rejects
unserved tasks. The route then answers it, errors included, exactly as it always has;
only the common case is served here, and it is served the route's way.
"""

from __future__ import annotations

import json

import pydantic
from starlette.datastructures import State
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from pgqueue import AsyncProducer, DatabaseUnavailable, JobSpec
from pgqueue import ValidationError as JobValidationError
from pgqueue_api.body_limit import replay_body
from pgqueue_api.routes_jobs import enqueued_response, job_spec
from pgqueue_api.schemas import JobCreate
from pgqueue_api.strict_json import parse_strict_json

PATH = "/jobs"


class SingleEnqueueMiddleware:
    """Pure ASGI middleware serving the common ``POST /jobs`` (see the module's
    documentation); ``state`` is the app's, which holds its settings and producer."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != PATH
            or scope["method"] != "POST"
            or not _json_content(scope)
        ):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client left; nobody is waiting for an answer
        producer: AsyncProducer | None = getattr(self.state, "producer", None)
        spec = None if producer is None else self._simple_spec(body)
        if producer is None or spec is None:
            await self.app(scope, replay_body(body, receive), send)
            return
        try:
            outcome = await producer.enqueue_spec(spec)
        except (DatabaseUnavailable, JobValidationError) as exc:
            # The app's own handlers answer these, as they would the route's.
            response = await _handled(scope, exc)
        else:
            response = enqueued_response(outcome)
        await response(scope, receive, send)

    def _simple_spec(self, body: bytes) -> JobSpec | None:
        """The JobSpec of a body this path serves, or None: the route's to answer."""
        if self.state.settings.reject_unserved_tasks:
            return None
        try:
            job = JobCreate.model_validate(parse_strict_json(body))
        except (json.JSONDecodeError, pydantic.ValidationError):
            return None
        if job.idempotency_key is not None or job.unique_key is not None or job.depends_on:
            return None
        try:
            spec = job_spec(job)
        except JobValidationError:
            return None
        return spec if spec.single_statement else None


def _json_content(scope: Scope) -> bool:
    """Whether the request says its body is JSON, as FastAPI reads it as JSON."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            media_type: bytes = value.partition(b";")[0].strip().lower()
            return media_type == b"application/json"
    return False


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body (the body limit, outside, has bounded it), or None if the client
    disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _handled(scope: Scope, exc: Exception) -> Response:
    """The answer of the app's exception handler for ``exc``'s class."""
    request = Request(scope)
    handlers = request.app.exception_handlers
    handler = next(handlers[kind] for kind in type(exc).__mro__ if kind in handlers)
    response: Response = await handler(request, exc)
    return response
