"""The operator's queue controls: change a queue's settings, pause and resume it.

Every claim reads a queue's settings (see :mod:`pgqueue.queue_control`), so a change
holds for every worker from its next claim on: a pause within a second, and a resume
(or a higher limit) at once, as it notifies the waiting workers.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Annotated, Any, ParamSpec

from fastapi import APIRouter, Path, Query, Response
from pydantic import Field, StrictBool, StrictFloat, StrictInt
from starlette.concurrency import run_in_threadpool

from pgqueue import UNSET, Queue, QueueInfo, QueueNotFound, validation
from pgqueue.queue_control import CONCURRENCY_LIMIT_MAX, PARTITIONS_PAGE_MAX, RATE_LIMIT_MAX
from pgqueue_api.errors import error_response
from pgqueue_api.responses import (
    INVALID,
    UNAVAILABLE,
    ErrorResponse,
    PartitionList,
    QueueSummary,
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
    partition_concurrency_limit: StrictInt | None = Field(
        default=None,
        ge=0,
        le=CONCURRENCY_LIMIT_MAX,
        description=(
            "Jobs of one partition key running at once across every worker, at most "
            "(keys at it are skipped, the others go on); null: no limit."
        ),
    )
    partition_rate_limit: StrictFloat | None = Field(
        default=None,
        gt=0,
        le=RATE_LIMIT_MAX,
        description=(
            "Jobs of one partition key started per second across every worker, at most "
            "(each key has a bucket of its own); null: no limit."
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
    partition_concurrency_limit: int | None = Field(
        description="Jobs of one partition key running at once, at most; null: no limit."
    )
    partition_rate_limit: float | None = Field(
        description="Jobs of one partition key started per second, at most; null: no limit."
    )
    throttled_until: datetime | None = Field(
        description="Until when the whole queue is throttled; null: not throttled."
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
    """Change any of `paused`, `concurrency_limit`, `rate_limit`,
    `partition_concurrency_limit` and `partition_rate_limit` (null removes a limit); the
    others stay. Workers follow from their next claim; a queue left unpaused wakes its
    waiting workers at once."""
    changes: dict[str, Any] = {
        setting: getattr(update, setting) if setting in update.model_fields_set else UNSET
        for setting in QueueUpdate.model_fields
    }
    return await run_in_threadpool(_answer, partial(queue.update_queue, name, **changes))


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


@router.get(
    "/queues/{name}",
    response_model=QueueSummary,
    summary="One queue",
    responses=RESPONSES,
)
async def get_queue(name: QueueName, queue: QueueDep) -> Response:
    """What `GET /queues` shows of this one queue: its jobs by state, the oldest
    runnable job's wait, its settings and throttle, and its unserved jobs."""
    return await run_in_threadpool(_one_queue, queue, name)


def _one_queue(queue: Queue, name: str) -> Response:
    for stats in queue.stats():
        if stats.queue == name:
            return json_response(QueueSummary.from_stats(stats).model_dump())
    return error_response(404, str(QueueNotFound(name)))


CURSOR_MAX_LENGTH = 4096
"""Longer than any cursor a page gives (it encodes a key of up to 200 characters),
short enough to refuse junk before the database sees it."""


@router.get(
    "/queues/{name}/partitions",
    response_model=PartitionList,
    summary="A queue's partition keys",
    responses={**QUEUE_NOT_FOUND, **INVALID, **UNAVAILABLE},
)
async def list_partitions(
    name: QueueName,
    queue: QueueDep,
    limit: Annotated[int, Query(ge=1, le=PARTITIONS_PAGE_MAX, description="Keys per page.")] = 100,
    after: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=CURSOR_MAX_LENGTH,
            description="The `next_after` of the previous page; omit for the first page.",
        ),
    ] = None,
) -> Response:
    """The partition keys that have queued or running jobs, or a throttle, busiest first
    (running plus queued jobs, descending, then by key), one page at a time: how many
    of each key's jobs are queued and running, and until when it is throttled. A cursor
    that is not one a page gave is refused with 422."""
    return await run_in_threadpool(_partitions, queue, name, limit, after)


def _partitions(queue: Queue, name: str, limit: int, after: str | None) -> Response:
    try:
        page = queue.partitions(name, limit=limit, after=after)
    except QueueNotFound as exc:
        return error_response(404, str(exc))
    if not page.partitions and after is None and not _queue_exists(queue, name):
        return error_response(404, str(QueueNotFound(name)))
    return json_response(
        {
            "partitions": [partition.to_dict() for partition in page.partitions],
            "next_after": page.next_after,
        }
    )


def _queue_exists(queue: Queue, name: str) -> bool:
    """Whether ``name`` has jobs or settings (asked only when it shows no partition)."""
    return any(stats.queue == name for stats in queue.stats())
