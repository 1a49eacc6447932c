"""Every error the API answers, as one JSON shape: ``{"detail": ..., "errors": [...]}``.

Client mistakes are 4xx naming the field; a database that cannot be reached is 503 with
``Retry-After``; nothing a client sends may turn into a 500 or a traceback. Error bodies
are rendered as ASCII JSON, so even input that is not valid Unicode (a lone surrogate
echoed in a field name) cannot make the error response itself fail to render.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg_pool
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from pgqueue import (
    AsyncProducer,
    DatabaseUnavailable,
    DependenciesFailed,
    IdempotencyConflict,
    InvalidTransition,
    JobNotFound,
    Queue,
    ValidationError,
)

log = logging.getLogger("pgqueue.api")

RETRY_AFTER_SECONDS = 5
"""What 503 answers tell clients to wait: about as long as a request waits for the pool."""
UNAVAILABLE_DETAIL = "database unavailable; retry later"
_FIELD_MAX_CHARS = 200
_ERRORS_MAX = 50


class ErrorJSONResponse(JSONResponse):
    """A JSON response that renders whatever text it carries (ASCII escapes throughout)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(
    status_code: int,
    detail: str,
    errors: Sequence[Mapping[str, str]] = (),
    headers: Mapping[str, str] | None = None,
) -> Response:
    """The API's error body with ``status_code``."""
    body: dict[str, Any] = {"detail": detail, "errors": list(errors)}
    return ErrorJSONResponse(body, status_code=status_code, headers=dict(headers or {}))


def unavailable_response() -> Response:
    """503 for a database that cannot be reached or will not take writes."""
    return error_response(
        503, UNAVAILABLE_DETAIL, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
    )


def conflict_response(exc: IdempotencyConflict, *, in_batch: bool) -> Response:
    """409 for an enqueue whose idempotency key belongs to a different job: one error per
    field that differs, named as in the request (``payload``, or ``jobs[2].payload`` in a
    batch)."""
    errors = [
        {
            "field": f"jobs[{conflict.index}].{name}" if in_batch else name,
            "message": f"differs from that of job {conflict.job_id}, "
            f"which holds idempotency key {conflict.key!r}",
        }
        for conflict in exc.conflicts
        for name in conflict.fields
    ][:_ERRORS_MAX]
    first = exc.conflicts[0]
    where = f"jobs[{first.index}]: " if in_batch else ""
    more = f" (and {len(exc.conflicts) - 1} more)" if len(exc.conflicts) > 1 else ""
    detail = f"{where}{first.describe()}; nothing was enqueued{more}"
    return error_response(409, detail, errors)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn exceptions into the API's error responses."""
    app.state.pool_repair = _PoolRepair()
    app.add_exception_handler(RequestValidationError, _request_invalid)
    app.add_exception_handler(ValidationError, _value_invalid)
    app.add_exception_handler(JobNotFound, _job_not_found)
    app.add_exception_handler(InvalidTransition, _invalid_transition)
    app.add_exception_handler(IdempotencyConflict, _idempotency_conflict)
    app.add_exception_handler(DatabaseUnavailable, _database_unavailable)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)


def field_errors(errors: Sequence[Mapping[str, Any]], request: Request) -> list[dict[str, str]]:
    """Pydantic/FastAPI validation errors as ``{"field", "message"}`` pairs."""
    out = []
    for error in errors[:_ERRORS_MAX]:
        # A JSON syntax error's location is a character offset into the body, not a field.
        loc = ("body",) if error.get("type") == "json_invalid" else error.get("loc", ())
        out.append({"field": _field_name(loc), "message": _message(error, request)})
    return out


def _field_name(loc: Sequence[Any]) -> str:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    name = ""
    for part in parts:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part == "[key]":
            name += " (key)"
        else:
            name += f".{part}" if name else str(part)
    name = name or "body"
    return name if len(name) <= _FIELD_MAX_CHARS else name[:_FIELD_MAX_CHARS] + "..."


def _message(error: Mapping[str, Any], request: Request) -> str:
    kind = error.get("type")
    if kind == "json_invalid":
        reason = (error.get("ctx") or {}).get("error", "not valid JSON")
        offset = error.get("loc", ("body", 0))[-1]
        where = f" at character {offset}" if isinstance(offset, int) and offset > 0 else ""
        return f"malformed JSON{where}: {reason}"
    if kind == "model_attributes_type" and tuple(error.get("loc", ())) == ("body",):
        if "json" not in request.headers.get("content-type", ""):
            return "the body must be JSON, sent with Content-Type: application/json"
        return "the body must be a JSON object"
    if kind == "missing" and tuple(error.get("loc", ())) == ("body",):
        return "a JSON body is required"
    message = str(error.get("msg", "is invalid"))
    return message.removeprefix("Value error, ")


def _summary(errors: list[dict[str, str]]) -> str:
    if not errors:
        return "invalid request"
    first = f"{errors[0]['field']}: {errors[0]['message']}"
    return first if len(errors) == 1 else f"{first} (and {len(errors) - 1} more)"


async def _request_invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = field_errors(exc.errors(), request)
    return error_response(422, _summary(errors), errors)


async def _value_invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ValidationError)
    errors = [{"field": exc.field, "message": exc.message}]
    return error_response(422, _summary(errors), errors)


async def _job_not_found(request: Request, exc: Exception) -> Response:
    return error_response(404, str(exc))


async def _invalid_transition(request: Request, exc: Exception) -> Response:
    if isinstance(exc, DependenciesFailed):
        # One error per dependency that will not succeed, for a client to retry them.
        errors = [
            {"field": "depends_on", "message": f"job {job_id} ended {state}"}
            for job_id, state in exc.failed[:_ERRORS_MAX]
        ]
        return error_response(409, str(exc), errors)
    return error_response(409, str(exc))


async def _idempotency_conflict(request: Request, exc: Exception) -> Response:
    # The enqueue routes answer with field names of their own (conflict_response);
    # this covers any other route.
    assert isinstance(exc, IdempotencyConflict)
    return conflict_response(exc, in_batch=False)


class _ThrottledWarning:
    """Logs a repeated warning at most once per ``interval`` seconds: an outage fails
    every request, and the log should say so without repeating it thousands of times."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self.last = float("-inf")

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            log.warning("%s", message)


warn_unavailable = _ThrottledWarning()


class _PoolRepair:
    """Tests the pools' idle connections once a request found the database unavailable,
    replacing the dead ones, one check per pool at a time.

    After a server restart every pooled connection is dead, and a pool learns that of
    each one only when a request fails on it: without this, a pool of ten would answer
    ten 503s after a restart that lasted a second. Both pools are checked, the Queue's
    and the AsyncProducer's (``POST /jobs``), whichever one the failed request used: a
    restart killed the connections of both. The checks run beside the answer, so they
    delay none; a hung server only keeps one check per pool busy.
    """

    def __init__(self) -> None:
        self._running = threading.Lock()
        self._async_check: asyncio.Task[None] | None = None

    def start(self, queue: Queue) -> None:
        """Start checking ``queue``'s pool on a thread of its own, unless a check is
        running. Started before the 503 is sent, not after it: the check takes the idle
        connections out of the pool at once, so the client's next request, which may be
        read before a task run after the answer has begun, gets a tested connection."""
        if not self._running.acquire(blocking=False):
            return
        threading.Thread(
            target=self._check, args=(queue,), name="pgqueue-pool-repair", daemon=True
        ).start()

    def start_async(self, pool: psycopg_pool.AsyncConnectionPool) -> None:
        """Start checking the async ``pool`` on the running event loop, unless a check
        of it is running. Its first step, taking the idle connections out, runs before
        the loop reads another request."""
        if self._async_check is not None and not self._async_check.done():
            return
        self._async_check = asyncio.get_running_loop().create_task(self._check_async(pool))

    def _check(self, queue: Queue) -> None:
        try:
            queue.pool.check()
        except Exception:
            log.debug("checking the pool's connections failed", exc_info=True)
        finally:
            self._running.release()

    @staticmethod
    async def _check_async(pool: psycopg_pool.AsyncConnectionPool) -> None:
        try:
            await pool.check()
        except Exception:
            log.debug("checking the async pool's connections failed", exc_info=True)


async def _database_unavailable(request: Request, exc: Exception) -> Response:
    # Clients get a generic answer; the reason (hosts, ports) stays in the server's log.
    warn_unavailable(f"answering 503: {exc}")
    response = unavailable_response()
    repair: _PoolRepair = request.app.state.pool_repair
    queue: Queue | None = getattr(request.app.state, "queue", None)
    if queue is not None:
        repair.start(queue)
    producer: AsyncProducer | None = getattr(request.app.state, "producer", None)
    if producer is not None:
        repair.start_async(producer.pool)
    return response


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, str(exc.detail), headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    # The traceback is logged by the server; the client learns nothing about internals.
    return error_response(500, "internal server error")
