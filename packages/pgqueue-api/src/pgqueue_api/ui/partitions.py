"""The dashboard's page of a queue's partition keys: busiest first (running plus queued
jobs), with each key's queued and running jobs and its throttle, a page at a time
(``Queue.partitions``), under the queue's partition limits and its own throttle."""

from __future__ import annotations

from typing import Annotated, TypedDict

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from pgqueue import PartitionInfo, Queue, ValidationError, validation
from pgqueue.queue_metrics import QueueStats
from pgqueue_api.ui.common import queue_of, render, require_session

PAGE_SIZE = 50
"""Keys one page shows."""
CURSOR_MAX_LENGTH = 4096
"""Longer than any cursor a page gives (it encodes a key of up to 200 characters),
short enough to refuse junk before the database sees it."""

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_session)])

QueueName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=validation.NAME_MAX_LENGTH,
        pattern=validation.NAME_PATTERN.pattern,
    ),
]


class PartitionsContext(TypedDict):
    """What the partitions page shows."""

    stats: QueueStats | None
    partitions: list[PartitionInfo]
    next_after: str | None
    invalid: str | None


def partitions_context(queue: Queue, name: str, after: str | None) -> PartitionsContext:
    """The queue's stats (None for a queue that has neither jobs nor settings) and one
    page of its keys; a cursor that is not one is said, above an empty page."""
    stats = next((s for s in queue.stats() if s.queue == name), None)
    if stats is None:
        return {"stats": None, "partitions": [], "next_after": None, "invalid": None}
    try:
        page = queue.partitions(name, limit=PAGE_SIZE, after=after)
    except ValidationError as exc:
        return {"stats": stats, "partitions": [], "next_after": None, "invalid": exc.message}
    return {
        "stats": stats,
        "partitions": page.partitions,
        "next_after": page.next_after,
        "invalid": None,
    }


@router.get("/ui/queues/{name}/partitions")
async def partitions_page(
    request: Request,
    name: QueueName,
    after: Annotated[str | None, Query(max_length=CURSOR_MAX_LENGTH)] = None,
) -> Response:
    """A queue's partition keys, busiest first, a page at a time (``after``: the cursor
    the page before gave), each linked to its jobs."""
    context = await run_in_threadpool(partitions_context, queue_of(request), name, after or None)
    if context["stats"] is None:
        return render(request, "not_found.html", status_code=404, job_id=None)
    return render(request, "partitions.html", queue_name=name, after=after, **context)
