"""The operator's queue controls: change a queue's settings, pause and resume it.

Every claim reads a queue's settings (see :mod:`pgqueue.queue_control`), so a change
holds for every worker from its next claim on: a pause within a second, and a resume
(or a higher limit) at once, as it notifies the waiting workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ParamSpec

from fastapi import APIRouter, Path, Response
from pydantic import Field, StrictBool, StrictFloat, StrictInt
from starlette.concurrency import run_in_threadpool

from pgqueue import UNSET, QueueInfo, QueueNotFound, validation
from pgqueue.queue_control import CONCURRENCY_LIMIT_MAX, RATE_LIMIT_MAX
from pgqueue_api.errors import error_response
from pgqueue_api.responses import (
    INVALID,
    UNAVAILABLE,
    ErrorResponse,
)
from pgqueue_api.routes_jobs import QueueDep, json_response, queue_links
from pgqueue_api.schemas import (
    NAME_RULES,
    RequestBody,
    ResponseBody,
)
from pgqueue_api.strict_json import StrictJSONRoute

router = APIRouter(route_class=StrictJSONRoute, tags=["operations"])

QueueName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=validation.NAME_MAX_LENGTH,
        pattern=validation.NAME_PATTERN.pattern,
        description=f"The queue's name: {NAME_RULES}.",
    ),
]

QUEUE_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {
        "model": ErrorResponse,
        "description": "No queue has this name: it never had a job, nor settings.",
    }
}


class QueueUpdate(RequestBody):
    """Settings to change; those left out stay as they are."""

    paused: StrictBool = Field(
        default=False, description="Paused: workers start none of its jobs (enqueues land)."
    )
    concurrency_limit: StrictInt | None = Field(
        default=None,
        ge=0,
        le=CONCURRENCY_LIMIT_MAX,
        description="Jobs running at once across every worker, at most; null: no limit.",
    )
    rate_limit: StrictFloat | None = Field(
        default=None,
        gt=0,
        le=RATE_LIMIT_MAX,
        description=(
            "Jobs started per second across every worker, at most (bursts of up to a "
            "tenth of a second's worth, at least one job); null: no limit."
        ),
    )


class QueueSettings(ResponseBody):
    """A queue's settings."""

    queue: str = Field(description="The queue's name.")
    paused: bool = Field(description="Paused: workers start none of its jobs.")
    concurrency_limit: int | None = Field(
        description="Jobs running at once across every worker, at most; null: no limit."
    )
    rate_limit: float | None = Field(
        description="Jobs started per second across every worker, at most; null: no limit."
    )


RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"links": queue_links("/queue")},
    **QUEUE_NOT_FOUND,
    **INVALID,
    **UNAVAILABLE,
}


_Change = ParamSpec("_Change")


def _answer(
    change: Callable[_Change, QueueInfo], *args: _Change.args, **kwargs: _Change.kwargs
) -> Response:
    try:
        info = change(*args, **kwargs)
    except QueueNotFound as exc:
        return error_response(404, str(exc))
    return json_response(info.to_dict())


@router.patch(
    "/queues/{name}",
    response_model=QueueSettings,
    summary="Change a queue's settings",
    responses=RESPONSES,
)
async def update_queue(name: QueueName, update: QueueUpdate, queue: QueueDep) -> Response:
    """Change any of `paused`, `concurrency_limit` and `rate_limit` (null removes a
    limit); the others stay. Workers follow from their next claim; a queue left
    unpaused wakes its waiting workers at once."""
    given = update.model_fields_set
    return await run_in_threadpool(
        _answer,
        queue.update_queue,
        name,
        paused=update.paused if "paused" in given else UNSET,
        concurrency_limit=update.concurrency_limit if "concurrency_limit" in given else UNSET,
        rate_limit=update.rate_limit if "rate_limit" in given else UNSET,
    )


@router.post(
    "/queues/{name}/pause",
    response_model=QueueSettings,
    summary="Pause a queue",
    responses=RESPONSES,
)
async def pause_queue(name: QueueName, queue: QueueDep) -> Response:
    """No worker starts a job of the queue from its next claim on (within a second);
    enqueues still land, and jobs already claimed finish."""
    return await run_in_threadpool(_answer, queue.pause_queue, name)


@router.post(
    "/queues/{name}/resume",
    response_model=QueueSettings,
    summary="Resume a queue",
    responses=RESPONSES,
)
async def resume_queue(name: QueueName, queue: QueueDep) -> Response:
    """Workers start the queue's jobs again; waiting workers are woken at once."""
    return await run_in_threadpool(_answer, queue.resume_queue, name)
