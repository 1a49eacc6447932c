"""The operator's routes: queue overview, Prometheus metrics and the health check.

They are separate routers because authentication differs: ``/healthz`` is always
public, ``/metrics`` may be (``--public-metrics``), ``/queues`` never is.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request, Response
from prometheus_client import CollectorRegistry
from starlette.concurrency import run_in_threadpool

from pgqueue import DatabaseUnavailable, Queue, QueueStats
from pgqueue_api.errors import RETRY_AFTER_SECONDS, warn_unavailable
from pgqueue_api.metrics import CONTENT_TYPE, render
from pgqueue_api.responses import (
    UNAVAILABLE,
    Health,
    QueueList,
    QueueSummary,
)
from pgqueue_api.routes_jobs import QueueDep, queue_links
from pgqueue_api.strict_json import StrictJSONRoute

HEALTH_CHECKS_AT_ONCE = 4
"""Threads that may run health checks at once: with a hung database, probes that keep
coming must not pile up threads or take them from the request thread pool."""

queues_router = APIRouter(route_class=StrictJSONRoute, tags=["operations"])
metrics_router = APIRouter(route_class=StrictJSONRoute, tags=["operations"])
health_router = APIRouter(route_class=StrictJSONRoute, tags=["operations"])


@queues_router.get(
    "/queues",
    response_model=QueueList,
    summary="Queue overview",
    responses={200: {"links": queue_links("/queues/0/queue")}, **UNAVAILABLE},
)
async def list_queues(queue: QueueDep) -> QueueList:
    """Every queue that holds jobs or settings: how many jobs are in each state, how long
    the oldest job that could run now has waited, whether it is paused, its limits
    (partition limits too), until when it is throttled, and its queued jobs per task
    that no live worker serves."""
    stats: list[QueueStats] = await run_in_threadpool(queue.stats)
    return QueueList(queues=[QueueSummary.from_stats(queue_stats) for queue_stats in stats])


@metrics_router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {
            "content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
            "description": "Prometheus text format.",
        },
        **UNAVAILABLE,
    },
)
async def metrics(request: Request) -> Response:
    """`pgqueue_jobs{queue,state}`, `pgqueue_jobs_completed_total`,
    `pgqueue_job_failures_total`, `pgqueue_queue_oldest_runnable_age_seconds{queue}`,
    the `pgqueue_job_run_seconds{queue,task}` histogram of succeeded attempts' run
    times and the `pgqueue_enqueue_to_start_seconds{queue}` histogram of every attempt's
    wait to start (from when its job became runnable to its claim), all read from the
    database; then, from the worker registry,
    `pgqueue_unserved_jobs{queue,task}` (queued jobs whose task no live worker serves in
    their queue) and `pgqueue_workers{queue}` (live workers serving each queue); and
    `pgqueue_throttled_partitions{queue}` (partition keys throttled now)."""
    registry: CollectorRegistry = request.app.state.metrics_registry
    text = await run_in_threadpool(render, registry)
    return Response(text, media_type=CONTENT_TYPE)


@health_router.get(
    "/healthz",
    response_model=Health,
    summary="Health check",
    responses={503: {"model": Health, "description": "The database does not answer."}},
)
async def healthz(request: Request) -> Response | Health:
    """200 when the database answers a query; 503 within about two seconds when not."""
    state = request.app.state
    timeout: float = state.settings.health_timeout
    if getattr(state, "health_limiter", None) is None:
        state.health_limiter = anyio.CapacityLimiter(HEALTH_CHECKS_AT_ONCE)
    queue: Queue = state.queue
    limiter: anyio.CapacityLimiter = state.health_limiter
    try:
        with anyio.fail_after(timeout):
            # An abandoned check finishes on its own: connecting gives up after the timeout.
            await anyio.to_thread.run_sync(
                queue.ping,
                timeout,
                abandon_on_cancel=True,
                limiter=limiter,
            )
    except (DatabaseUnavailable, TimeoutError) as exc:
        reason = str(exc) or f"no answer within {timeout:g} s"
        warn_unavailable(f"health check failed: {reason}")
        return _unhealthy("the database does not answer")
    return Health(status="ok")


def _unhealthy(detail: str) -> Response:
    body = Health(status="unavailable", detail=detail).model_dump_json()
    return Response(
        body,
        status_code=503,
        media_type="application/json",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )
