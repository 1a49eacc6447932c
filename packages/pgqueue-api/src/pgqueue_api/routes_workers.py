"""The live workers, from the worker registry (see :mod:`pgqueue.registry`)."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Response
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from pgqueue import Queue
from pgqueue_api.responses import (
    UNAVAILABLE,
)
from pgqueue_api.routes_jobs import QueueDep, json_response
from pgqueue_api.schemas import (
    ResponseBody,
)
from pgqueue_api.strict_json import StrictJSONRoute

router = APIRouter(route_class=StrictJSONRoute, tags=["operations"])


class WorkerSummary(ResponseBody):
    """One live worker."""

    id: str = Field(description="The worker's id (host:pid:nonce).")
    host: str = Field(description="The host it runs on.")
    pid: int = Field(description="Its process id on that host.")
    version: str = Field(description="Its pgqueue version.")
    queues: list[str] = Field(description="The queues it serves.")
    tasks: list[str] = Field(description="The tasks it serves.")
    concurrency: int = Field(description="Jobs it can run at once (all its slots).")
    started_at: datetime = Field(description="When it started.")
    last_seen_at: datetime = Field(description="Its last heartbeat.")
    running: int = Field(
        description="Jobs it holds claimed now: running, or claimed ahead of a free slot."
    )


class WorkerList(ResponseBody):
    """Every live worker."""

    workers: list[WorkerSummary] = Field(description="By host and pid.")


def _workers(queue: Queue) -> Response:
    return json_response({"workers": [worker.to_dict() for worker in queue.workers()]})


@router.get("/workers", response_model=WorkerList, summary="Live workers", responses=UNAVAILABLE)
async def list_workers(queue: QueueDep) -> Response:
    """Every live worker: what it serves, how many jobs it holds and when it was last
    seen. A worker that died drops out once its row expires (three heartbeat
    intervals, 30 s by default)."""
    return await run_in_threadpool(_workers, queue)
