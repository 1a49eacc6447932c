"""The API's logs: uvicorn's text lines, or one JSON object per line
(``--log-format json``) in the worker's format (:mod:`pgqueue.log_format`).

Every request has an id: the client's ``X-Request-ID`` when it sends a usable one
(1 to 128 visible ASCII characters), otherwise a new one. The answer carries it back
in ``X-Request-ID``, and every line logged while the request is served has it as
``request_id``, and ``job_id`` once a route knows the one job it handles (enqueue, look
up, cancel, retry). The access line of a request has its ``method``, ``path``,
``status`` and ``client`` as keys too.
"""

from __future__ import annotations

import copy
import logging
import re
import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, NotRequired, TypedDict

import uvicorn.config
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgqueue import log_format

log = logging.getLogger("pgqueue.api")

FORMATS = ("text", "json")
REQUEST_ID_HEADER = "X-Request-ID"
_HEADER_KEY = REQUEST_ID_HEADER.lower().encode("latin-1")
# Visible ASCII without spaces: an id that goes into log lines and headers as it is.
_USABLE_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")


class RequestFields(TypedDict):
    """The fields of the request being served, on every line logged while it is."""

    request_id: str
    job_id: NotRequired[int]


# A dict, shared by reference: a route that runs in the thread pool (with a copy of this
# context) adds its job id to the same one.
_request: ContextVar[RequestFields | None] = ContextVar("pgqueue_api_request", default=None)


def request_id() -> str | None:
    """The id of the request being served, if any."""
    fields = _request.get()
    return None if fields is None else fields["request_id"]


def note_job(job_id: int) -> None:
    """Say that the request being served handles job ``job_id`` (its log lines get it)."""
    fields = _request.get()
    if fields is not None:
        fields["job_id"] = job_id


class RequestIdMiddleware:
    """Gives each HTTP request its id (see the module's documentation). Outermost, so
    that answers refused by authentication or the body limit carry it too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((value for key, value in scope["headers"] if key == _HEADER_KEY), None)
        if given is not None and _USABLE_REQUEST_ID.fullmatch(given):
            rid = given.decode("ascii")
        else:
            rid = uuid.uuid4().hex
        header = (_HEADER_KEY, rid.encode("ascii"))

        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        token = _request.set({"request_id": rid})
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # A defect, not a client's mistake: logged here, with the request's id, and
            # answered here, with it too, instead of by Starlette's outermost handler
            # (no id) and uvicorn (which then closes the client's connection).
            if started:
                raise
            log.exception("unexpected error answering %s %s", scope["method"], scope["path"])
            await JSONResponse(
                {"detail": "internal server error", "errors": []},
                status_code=500,
                headers={REQUEST_ID_HEADER: rid},
            )(scope, receive, send)
        finally:
            _request.reset(token)


def context_fields(record: logging.LogRecord) -> Mapping[str, object]:
    """A record's request fields: the request's id and job id, and for uvicorn's access
    line the request's method, path, status and client."""
    fields: dict[str, object] = dict(_request.get() or {})
    if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
        client, method, path, _, status = record.args
        fields.update(method=method, path=path, status=status, client=client)
    return fields


def json_formatter() -> logging.Formatter:
    """The JSON formatter of ``--log-format json`` (named in uvicorn's log config)."""
    return log_format.JsonFormatter(context=context_fields)


def logging_config(level: str = "info", log_format_name: str = "text") -> dict[str, Any]:
    """uvicorn's logging set-up, with pgqueue's own messages printed the same way, at
    the same ``--log-level``; with ``json``, every line is a JSON object."""
    if log_format_name not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}")
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"]["pgqueue"] = {
        "handlers": ["default"],
        "level": level.upper(),
        "propagate": False,
    }
    if log_format_name == "json":
        for name in ("default", "access"):
            config["formatters"][name] = {"()": "pgqueue_api.logs.json_formatter"}
    return config
