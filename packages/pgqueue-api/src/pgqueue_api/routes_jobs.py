"""The producer's routes: enqueue (one or a batch), look up, list, cancel and retry jobs.

``POST /jobs`` enqueues through the app's :class:`~pgqueue.AsyncProducer`, on the event
loop: one request per job is what most applications send, and a thread hop would cost
it more CPU than the enqueue itself. ``Queue`` is synchronous, so every other route
runs its Queue call, and the conversion of the result to JSON, in the thread pool with
``run_in_threadpool``: one trip per request (a plain ``def`` route would take a second
one for FastAPI's response check). Routes
declare ``response_model`` for the OpenAPI document but answer with a ready
:class:`Response` of plain data: a 1,000-job answer built from database rows is encoded
once, without a model per job and without being validated again first. A route answers
only after its statement has committed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic_core import to_json
from starlette.concurrency import run_in_threadpool

from pgqueue import (
    AsyncProducer,
    BatchItem,
    EnqueueResult,
    IdempotencyConflict,
    JobSpec,
    Queue,
    UnknownDependencies,
    ValidationError,
    validation,
)
from pgqueue import Job as StoredJob
from pgqueue.dependencies import WORKFLOW_LIMIT
from pgqueue_api import responses
from pgqueue_api.errors import conflict_response
from pgqueue_api.logs import note_job
from pgqueue_api.responses import (
    IDEMPOTENCY_CONFLICT,
    INVALID,
    NOT_FOUND,
    TOO_LARGE,
    UNAVAILABLE,
    BatchCreated,
    ErrorResponse,
    JobPage,
    job_body,
    job_detail_body,
)
from pgqueue_api.schemas import (
    JOB_ID_MAX,
    BatchJobCreate,
    EarlierItem,
    JobBatchCreate,
    JobCreate,
    JobFilter,
    JobWait,
)
from pgqueue_api.strict_json import StrictJSONRoute
from pgqueue_api.unserved import refuse_unserved


async def current_queue(request: Request) -> Queue:
    """The app's Queue (``async`` so FastAPI does not spend a thread on it)."""
    queue: Queue = request.app.state.queue
    return queue


QueueDep = Annotated[Queue, Depends(current_queue)]
JobId = Annotated[int, Path(ge=1, le=JOB_ID_MAX, description="The job's id.")]
WORKFLOW_LIMIT_MAX = 1_000
"""The most ancestors (and descendants) a workflow request may ask for."""


router = APIRouter(route_class=StrictJSONRoute, tags=["jobs"])


def job_links(pointer: str) -> dict[str, dict[str, Any]]:
    """OpenAPI links from an answer holding a job at JSON pointer ``pointer`` (``""``:
    the body is the job) to what can be done with that job next, and with its queue.
    Links name their target by ``operationRef``: FastAPI derives operation ids from
    function names and paths, which are no part of the API."""
    job_id = {"job_id": f"$response.body#{pointer}/id"}
    return {
        "GetJob": {
            "operationRef": "#/paths/~1jobs~1{job_id}/get",
            "parameters": job_id,
            "description": "The job's state and dependencies.",
        },
        "CancelJob": {
            "operationRef": "#/paths/~1jobs~1{job_id}~1cancel/post",
            "parameters": job_id,
            "description": "Cancel the job.",
        },
        "RetryJob": {
            "operationRef": "#/paths/~1jobs~1{job_id}~1retry/post",
            "parameters": job_id,
            "description": "Retry the job once it is dead or cancelled.",
        },
        **queue_links(f"{pointer}/queue"),
    }


def queue_links(pointer: str) -> dict[str, dict[str, Any]]:
    """OpenAPI links from an answer holding a queue's name at JSON pointer ``pointer``
    to that queue's jobs and controls."""
    name = {"name": f"$response.body#{pointer}"}
    return {
        "ListQueueJobs": {
            "operationRef": "#/paths/~1jobs/get",
            "parameters": {"query.queue": f"$response.body#{pointer}"},
            "description": "The queue's jobs.",
        },
        "UpdateQueue": {
            "operationRef": "#/paths/~1queues~1{name}/patch",
            "parameters": name,
            "description": "Change the queue's settings.",
        },
        "PauseQueue": {
            "operationRef": "#/paths/~1queues~1{name}~1pause/post",
            "parameters": name,
            "description": "Pause the queue.",
        },
        "ResumeQueue": {
            "operationRef": "#/paths/~1queues~1{name}~1resume/post",
            "parameters": name,
            "description": "Resume the queue.",
        },
    }


def job_spec(job: JobCreate | BatchJobCreate) -> JobSpec:
    """The core's JobSpec for a request's job; raises pgqueue.ValidationError naming the
    field for what the request schema cannot express (NUL characters, delay and run_at).
    A batch item's ``{"index": N}`` dependency becomes ``pgqueue.BatchItem(N)``."""
    return JobSpec(
        task=job.task,
        payload=job.payload,
        queue=job.queue,
        priority=job.priority,
        delay_seconds=job.delay_seconds,
        run_at=job.run_at,
        idempotency_key=job.idempotency_key,
        max_attempts=job.max_attempts,
        timeout_seconds=job.timeout_seconds,
        unique_key=job.unique_key,
        tags=job.tags,
        partition_key=job.partition_key,
        depends_on=[
            BatchItem(item.index) if isinstance(item, EarlierItem) else item
            for item in job.depends_on
        ],
        dependency_mode=job.dependency_mode,
    )


def _unknown_dependencies(exc: UnknownDependencies, field: str) -> ValidationError:
    """``exc`` (naming every unknown id) as the error of the request field ``field``."""
    return ValidationError(field, UnknownDependencies(exc.job_ids).message)


def json_response(body: Any, status_code: int = 200) -> Response:
    """``body`` (dicts, lists, datetimes, enums) as JSON, written by pydantic's encoder,
    which formats every value exactly as the response models would."""
    return Response(to_json(body), status_code=status_code, media_type="application/json")


def _job_response(action: Callable[[int], StoredJob], job_id: int) -> Response:
    note_job(job_id)
    return json_response(job_body(action(job_id)))


@router.post(
    "/jobs",
    status_code=201,
    response_model=responses.Job,
    summary="Enqueue a job",
    responses={
        201: {"description": "The job was created.", "links": job_links("")},
        200: {
            "model": responses.Job,
            "description": (
                "The idempotency key belongs to this job, which has the same task, queue "
                "and payload; or this queued or running job holds the unique key."
            ),
            "links": job_links(""),
        },
        **IDEMPOTENCY_CONFLICT,
        **TOO_LARGE,
        **INVALID,
        **UNAVAILABLE,
    },
)
async def enqueue_job(job: JobCreate, queue: QueueDep, request: Request) -> Response:
    """Add a job. With an `idempotency_key` that a job in the table already has, that job
    is returned with 200 instead, also when the duplicates arrive at the same time;
    if that job has another task, queue or payload, the answer is 409 naming what
    differs (priority and timing are not compared). With a `unique_key` that a queued or
    running job holds, that job is returned with 200, not compared; a finished job
    holds no unique key.

    With `depends_on`, the job is `waiting` until those jobs have succeeded (`queued`
    at once if they already have), and `cancelled` if one of them ends dead or
    cancelled; ids that are no job are refused with 422 naming them."""
    spec = job_spec(job)
    producer: AsyncProducer | None = getattr(request.app.state, "producer", None)
    try:
        if request.app.state.settings.reject_unserved_tasks:
            await run_in_threadpool(refuse_unserved, queue, [(job.queue, job.task)], in_batch=False)
        if producer is None:  # an app whose lifespan has not run
            outcome = await run_in_threadpool(queue.enqueue_spec, spec)
        else:
            outcome = await producer.enqueue_spec(spec)
    except UnknownDependencies as exc:
        raise _unknown_dependencies(exc, "depends_on") from None
    except IdempotencyConflict as exc:
        return conflict_response(exc, in_batch=False)
    return enqueued_response(outcome)


def enqueued_response(outcome: EnqueueResult) -> Response:
    """The answer of ``POST /jobs`` for an enqueue's ``outcome``: the job, with 201 if it
    was created, 200 if an idempotency or unique key found it."""
    note_job(outcome.job.id)
    return json_response(job_body(outcome.job), 201 if outcome.created else 200)


@router.post(
    "/jobs/batch",
    status_code=201,
    response_model=BatchCreated,
    summary="Enqueue many jobs",
    responses={
        201: {"links": job_links("/items/0/job")},
        **IDEMPOTENCY_CONFLICT,
        **TOO_LARGE,
        **INVALID,
        **UNAVAILABLE,
    },
)
async def enqueue_jobs(batch: JobBatchCreate, queue: QueueDep, request: Request) -> Response:
    """Add up to 1,000 jobs in one transaction: all of them or, on any error, none. Items
    come back in request order, each saying whether it was created or its idempotency
    key already belonged to a job (or a queued or running job held its unique key). An
    item whose idempotency key belongs to a job with another task, queue or payload
    makes the answer 409, naming it, and nothing is enqueued.

    An item's `depends_on` may name the job of an earlier item of the batch as
    `{"index": N}`; an index that is not an earlier item, or ids that are no job, make
    the answer 422, and nothing is enqueued."""
    reject: bool = request.app.state.settings.reject_unserved_tasks
    return await run_in_threadpool(_enqueue_many, queue, batch, reject)


def _enqueue_many(queue: Queue, batch: JobBatchCreate, reject_unserved: bool = False) -> Response:
    if reject_unserved:
        refuse_unserved(queue, [(job.queue, job.task) for job in batch.jobs], in_batch=True)
    specs = []
    for index, job in enumerate(batch.jobs):
        for item in job.depends_on:
            if isinstance(item, EarlierItem) and item.index >= index:
                raise ValidationError(
                    f"jobs[{index}].depends_on",
                    f"index {item.index} is not an earlier item of the batch",
                )
        try:
            specs.append(job_spec(job))
        except ValidationError as exc:
            raise ValidationError(f"jobs[{index}].{exc.field}", exc.message) from None
    try:
        outcomes = queue.enqueue_many(specs)
    except validation.TooLarge as exc:
        raise ValidationError(f"jobs[{exc.index}].payload", exc.message) from None
    except UnknownDependencies as exc:
        # A batch of one names no item; its item is the first.
        raise _unknown_dependencies(exc, f"jobs[{exc.index or 0}].depends_on") from None
    except IdempotencyConflict as exc:
        return conflict_response(exc, in_batch=True)
    items = [{"created": outcome.created, "job": job_body(outcome.job)} for outcome in outcomes]
    return json_response({"items": items}, 201)


@router.get(
    "/jobs",
    response_model=JobPage,
    summary="List jobs",
    responses={200: {"links": job_links("/jobs/0")}, **INVALID, **UNAVAILABLE},
)
async def list_jobs(filters: Annotated[JobFilter, Query()], queue: QueueDep) -> Response:
    """Jobs newest first, optionally filtered, one page at a time (keyset pagination, so
    pages stay fast and stable however deep they go). The `tag` and `payload_contains`
    filters find queued and running jobs through indexes, in milliseconds however large
    the backlog; finished jobs have no such index and are read newest first until the
    page is full (add `state` to read only that state's jobs)."""
    return await run_in_threadpool(_list_jobs, queue, filters)


def _list_jobs(queue: Queue, filters: JobFilter) -> Response:
    page = queue.list(
        queue=filters.queue,
        state=filters.state,
        task=filters.task,
        limit=filters.limit,
        after=filters.after,
        tags=filters.tag,
        payload_contains=filters.payload_contains,
        partition_key=filters.partition_key,
    )
    jobs = [job_body(job) for job in page.jobs]
    return json_response({"jobs": jobs, "next_after": page.next_after})


@router.get(
    "/jobs/{job_id}",
    response_model=responses.JobDetail,
    summary="Get a job",
    responses={200: {"links": job_links("")}, **NOT_FOUND, **INVALID, **UNAVAILABLE},
)
async def get_job(job_id: JobId, queue: QueueDep, options: Annotated[JobWait, Query()]) -> Response:
    """The job's state, attempts, last error, result and timestamps, and the ids of the
    jobs it depends on (`depends_on`) and of those that depend on it (`dependents`).

    With `wait`, the answer comes as soon as the job is final, or after `wait` seconds
    with the job as it is then. The request waits on the event loop, woken by the API
    process's one listening connection (see pgqueue.job_watch): waiting requests take
    neither a thread nor a pooled connection until they answer."""
    if options.wait is None:
        response, _ = await run_in_threadpool(_job_detail, queue, job_id)
        return response
    deadline = time.monotonic() + options.wait
    watcher = queue.job_watcher()
    while True:
        woken = await watcher.wait_async(job_id, deadline - time.monotonic())
        response, finished = await run_in_threadpool(_job_detail, queue, job_id)
        # A job retried after it was announced is waited for again, until the deadline.
        if finished or not woken or time.monotonic() >= deadline:
            return response


def _job_detail(queue: Queue, job_id: int) -> tuple[Response, bool]:
    """The answer of ``GET /jobs/{id}``, and whether the job is final."""
    note_job(job_id)
    job = queue.get(job_id)
    return json_response(job_detail_body(job, queue.dependencies(job_id))), job.state.finished


@router.get(
    "/jobs/{job_id}/workflow",
    response_model=responses.WorkflowGraph,
    summary="Get the workflow around a job",
    responses={**NOT_FOUND, **INVALID, **UNAVAILABLE},
)
async def get_workflow(
    job_id: JobId,
    queue: QueueDep,
    limit: Annotated[
        int,
        Query(
            ge=1,
            le=WORKFLOW_LIMIT_MAX,
            description="Ancestors, and descendants, to find at most, nearest first.",
        ),
    ] = WORKFLOW_LIMIT,
) -> Response:
    """The graph of dependencies around a job: the job, every job it depends on directly
    or not, and every job that depends on it directly or not (up to `limit` each way,
    nearest first; `truncated` says when some were left out), with their states and the
    links between them. Active and finished jobs alike; a job pruned since, still named
    by a link, has a null task and state. The dashboard's workflow page draws it."""
    return await run_in_threadpool(_workflow, queue, job_id, limit)


def _workflow(queue: Queue, job_id: int, limit: int) -> Response:
    note_job(job_id)
    return json_response(responses.workflow_body(queue.workflow(job_id, limit)))


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=responses.Job,
    summary="Cancel a job",
    responses={
        200: {"links": job_links("")},
        **NOT_FOUND,
        409: {"model": ErrorResponse, "description": "The job has already finished."},
        **TOO_LARGE,
        **INVALID,
        **UNAVAILABLE,
    },
)
async def cancel_job(job_id: JobId, queue: QueueDep) -> Response:
    """Cancel a waiting, queued or running job. A running job's lease is revoked: its
    worker's outcome is discarded and it is not retried. The jobs waiting for it are
    cancelled too, and theirs in turn."""
    return await run_in_threadpool(_job_response, queue.cancel, job_id)


@router.post(
    "/jobs/{job_id}/retry",
    response_model=responses.Job,
    summary="Retry a job",
    responses={
        200: {"links": job_links("")},
        **NOT_FOUND,
        409: {
            "model": ErrorResponse,
            "description": (
                "The job is neither dead nor cancelled, another queued or running job "
                "holds its unique key, or a job it depends on ended dead or cancelled "
                "(each named in `errors`, field `depends_on`: retry them first)."
            ),
        },
        **TOO_LARGE,
        **INVALID,
        **UNAVAILABLE,
    },
)
async def retry_job(job_id: JobId, queue: QueueDep) -> Response:
    """Put a dead or cancelled job back to queued, runnable now, with its attempts reset.
    A job with dependencies is `waiting` again for those that have not succeeded (queued
    at once if they all have)."""
    return await run_in_threadpool(_job_response, queue.retry, job_id)
