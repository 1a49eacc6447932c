"""The dashboard's pages and the fragments they poll (every read goes through
``Queue``; each is bounded: see the statements behind ``stats``, ``finished_per_minute``,
``list``, ``get``, ``get_by_idempotency_key`` and ``get_by_unique_key``)."""

from __future__ import annotations

import json
from typing import Annotated, Literal, TypedDict

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from pgqueue import (
    Job,
    JobNeighbours,
    JobNotFound,
    JobState,
    Queue,
    ValidationError,
    WorkerInfo,
    validation,
)
from pgqueue.queue import JobPage
from pgqueue.queue_metrics import QueueStats
from pgqueue.schedules import ScheduleInfo
from pgqueue_api.schemas import (
    JOB_ID_MAX,
)
from pgqueue_api.ui import graph, views
from pgqueue_api.ui.common import queue_controls, queue_of, render, require_session
from pgqueue_api.ui.finished import FinishedHistory

PAGE_SIZE = 50
TASK_SCAN_IDS = 20_000
"""Ids a page of jobs filtered by task looks at, at most (see _listing)."""
JobId = Annotated[int, Path(ge=1, le=JOB_ID_MAX)]

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_session)])


class QueuesContext(TypedDict):
    """What the queues page and its fragment show."""

    queues: list[QueueStats]
    charts: dict[str, views.Chart]
    empty_chart: views.Chart


class JobContext(TypedDict):
    """What a job's page and its fragment show."""

    job: Job
    dependencies: JobNeighbours
    events: list[views.Event]
    payload: views.ShownJson
    result: views.ShownJson | None
    errors_json: views.ShownJson | None


class WorkersContext(TypedDict):
    """What the workers page and its fragment show."""

    workers: list[WorkerInfo]


class SchedulesContext(TypedDict):
    """What the schedules page and its fragment show."""

    schedules: list[ScheduleInfo]


def queues_context(request: Request) -> QueuesContext:
    """What the queues page shows (run in a worker thread: the reads block)."""
    queue = queue_of(request)
    stats: list[QueueStats] = queue.stats()
    history: FinishedHistory = request.app.state.ui_finished
    charts = views.finished_charts(history.rows(queue))
    return {"queues": stats, "charts": charts, "empty_chart": views.Chart()}


@router.get("/ui")
async def queues_page(request: Request) -> Response:
    """Every queue: counts by state, finished per minute, the oldest runnable job."""
    context = await run_in_threadpool(queues_context, request)
    return render(request, "queues.html", **context)


@router.get("/ui/fragments/queues")
async def queues_fragment(request: Request) -> Response:
    """The queues table, polled by the queues page."""
    context = await run_in_threadpool(queues_context, request)
    return render(request, "_queues.html", **context)


def _blank(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


def _find(queue: Queue, text: str) -> int | None:
    """The id of the job that ``text`` names: by id, by idempotency key, or by unique key
    (held, and so found, only while its job is queued or running)."""
    if text.isdigit() and 1 <= int(text) <= JOB_ID_MAX:
        try:
            return queue.get(int(text)).id
        except JobNotFound:
            pass
    try:
        job = queue.get_by_idempotency_key(text) or queue.get_by_unique_key(text)
    except ValidationError:
        return None
    return job.id if job else None


State = Annotated[
    Literal["", "waiting", "queued", "running", "succeeded", "dead", "cancelled"] | None, Query()
]
Name = Annotated[str | None, Query(max_length=200)]
After = Annotated[int | None, Query(ge=1, le=JOB_ID_MAX)]
PartitionKey = Annotated[str | None, Query(max_length=validation.PARTITION_KEY_MAX_LENGTH)]


FILTER_NAMES = {"tag": "Tag", "partition_key": "Partition key"}
"""What the jobs page calls a filter whose value the listing refused."""


def _tags(text: str | None) -> list[str]:
    """The tags of the tag filter: separated by commas, each trimmed."""
    return [tag.strip() for tag in (text or "").split(",") if tag.strip()]


def _listing(
    store: Queue, filters: dict[str, str | None], after: int | None
) -> tuple[JobPage, int | None, tuple[int, int] | None]:
    """A page of jobs, the ``after`` of the next one, and, for a task filter, the window
    of ids the page looked at when it was not filled. Raises ValidationError for a tag
    or a payload filter that is not one."""
    above = window = None
    searching = bool(filters.get("tag") or filters.get("contains"))
    if filters["task"] and not searching:
        # No index serves a task filter: look at a window of TASK_SCAN_IDS ids at a
        # time, so that a page reads that many jobs at most, however rare the task.
        if after is not None:
            top = after - 1
        else:
            newest = store.list(limit=1).jobs
            top = newest[0].id if newest else 0
        above = max(0, top - TASK_SCAN_IDS)
        window = (above + 1, top)
    page = store.list(
        queue=filters["queue"],
        task=filters["task"],
        state=filters["state"],
        tags=_tags(filters.get("tag")),
        payload_contains=filters.get("contains"),
        partition_key=filters.get("partition_key"),
        limit=PAGE_SIZE,
        after=after,
        above=above or None,
    )
    if page.next_after is None and window and window[0] > 1:
        return page, window[0], window  # the window held fewer: go on below it
    return page, page.next_after, None


@router.get("/ui/jobs")
async def jobs_page(
    request: Request,
    queue: Name = None,
    task: Name = None,
    state: State = None,
    q: Annotated[str | None, Query(max_length=300)] = None,
    tag: Annotated[str | None, Query(max_length=1200)] = None,
    partition_key: PartitionKey = None,
    contains: Annotated[str | None, Query(max_length=2000)] = None,
    after: After = None,
    bulk: Annotated[Literal["cancel", "retry"] | None, Query()] = None,
    done: Annotated[int | None, Query(ge=0)] = None,
    skipped: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """Jobs newest first, filtered by queue, task, state, tags (``tag``, separated by
    commas: jobs with all of them) and partition key, a page at a time (keyset: ``after`` is the last id
    of the page before); ``q`` finds one job by id, by idempotency key or by the unique
    key of a queued or running job, or, given a JSON object, lists the jobs whose
    payload contains it (``contains``, as ``GET /jobs?payload_contains=``)."""
    store = queue_of(request)
    search = _blank(q)
    if search and search.startswith("{"):
        contains, search = search, None
    filters = {
        "queue": _blank(queue),
        "task": _blank(task),
        "state": _blank(state),
        "tag": _blank(tag),
        "partition_key": partition_key or None,  # a key is taken as it is, spaces too
        "contains": _blank(contains),
    }
    not_found = None
    if search:
        found = await run_in_threadpool(_find, store, search)
        if found is not None:
            return RedirectResponse(f"/ui/jobs/{found}", status_code=303)
        not_found = search

    def read() -> tuple[tuple[JobPage, int | None, tuple[int, int] | None], list[str]]:
        stats: list[QueueStats] = store.stats()
        return _listing(store, filters, after), sorted(s.queue for s in stats)

    invalid: str | None = None
    try:
        (page, next_after, window), queue_names = await run_in_threadpool(read)
    except ValidationError as exc:
        # A tag or a payload filter that is not one: say so above an empty page.
        invalid = f"{FILTER_NAMES.get(exc.field, 'Payload filter')} {exc.message}."
        page, next_after, window = JobPage(jobs=[], next_after=None), None, None
        queue_names = sorted(s.queue for s in await run_in_threadpool(store.stats))
    return render(
        request,
        "jobs.html",
        page=page,
        next_after=next_after,
        window=window,
        filters=filters,
        query={name: value for name, value in filters.items() if value},
        after=after,
        queue_names=queue_names,
        not_found=not_found,
        invalid=invalid,
        message=_bulk_message(bulk, done or 0, skipped or 0),
    )


@router.get("/ui/fragments/jobs")
async def jobs_fragment(
    request: Request,
    queue: Name = None,
    task: Name = None,
    state: State = None,
    tag: Annotated[str | None, Query(max_length=1200)] = None,
    partition_key: PartitionKey = None,
    contains: Annotated[str | None, Query(max_length=2000)] = None,
    after: After = None,
) -> Response:
    """The rows of a page of jobs, polled by the jobs page (which morphs them in, so
    that the jobs ticked stay ticked)."""
    filters = {
        "queue": _blank(queue),
        "task": _blank(task),
        "state": _blank(state),
        "tag": _blank(tag),
        "partition_key": partition_key or None,  # a key is taken as it is, spaces too
        "contains": _blank(contains),
    }
    try:
        page, _, _ = await run_in_threadpool(_listing, queue_of(request), filters, after)
    except ValidationError:
        page = JobPage(jobs=[], next_after=None)
    return render(request, "_job_rows.html", page=page)


def _bulk_message(verb: str | None, done: int, skipped: int) -> str | None:
    if verb is None:
        return None
    past = "cancelled" if verb == "cancel" else "retried"
    text = f"{done} job{'s' if done != 1 else ''} {past}"
    if skipped:
        text += f"; {skipped} skipped (their state does not allow it to be {past})"
    return text + "."


def _job_context(queue: Queue, job_id: int) -> JobContext:
    job = queue.get(job_id)
    return {
        "job": job,
        "dependencies": queue.neighbours(job_id),
        "events": views.timeline(job),
        "payload": views.pretty_json(job.payload),
        "result": None if job.result is None else views.pretty_json(job.result),
        "errors_json": views.pretty_json(job.errors) if job.errors else None,
    }


@router.get("/ui/jobs/{job_id}")
async def job_page(
    request: Request,
    job_id: JobId,
    done: Annotated[Literal["cancel", "retry"] | None, Query()] = None,
    refused: Annotated[Literal["cancel", "retry"] | None, Query()] = None,
    failed: Annotated[str | None, Query(max_length=400, pattern=r"^[0-9]+(,[0-9]+)*$")] = None,
) -> Response:
    """One job: its fields, the jobs it depends on and those that depend on it, payload,
    result, timeline and error history. After an action, what became of it: ``failed``
    names the dependencies that refused a retry."""
    try:
        context = await run_in_threadpool(_job_context, queue_of(request), job_id)
    except JobNotFound:
        return render(request, "not_found.html", status_code=404, job_id=job_id)
    message = None
    if done == "cancel":
        message = "Job cancelled."
    elif done == "retry" and context["job"].state is JobState.WAITING:
        message = "Job retried: waiting for its dependencies."
    elif done == "retry":
        message = "Job put back to queued."
    elif refused == "retry" and failed:
        names = ", ".join(failed.split(","))
        message = (
            f"Not retried: the jobs it depends on ({names}) ended dead or cancelled."
            " Retry them first."
        )
    elif refused:
        past = "cancelled" if refused == "cancel" else "retried"
        message = f"Not {past}: the job's state does not allow it."
    return render(request, "job.html", message=message, refused=bool(refused), **context)


@router.get("/ui/fragments/jobs/{job_id}")
async def job_fragment(request: Request, job_id: JobId) -> Response:
    """The live part of a job's page (state, timeline, result, actions)."""
    try:
        context = await run_in_threadpool(_job_context, queue_of(request), job_id)
    except JobNotFound:
        return Response("This job no longer exists (pruned).", status_code=404)
    return render(request, "_job.html", **context)


@router.get("/ui/jobs/{job_id}/workflow")
async def workflow_page(request: Request, job_id: JobId) -> Response:
    """The graph around a job: every job it depends on, directly or not, and every job
    that depends on it, up to ``Queue.workflow``'s limit each way, drawn as SVG in
    columns, each job coloured by its state and linked to its page."""
    try:
        workflow = await run_in_threadpool(queue_of(request).workflow, job_id)
    except JobNotFound:
        return render(request, "not_found.html", status_code=404, job_id=job_id)
    counts: dict[str, int] = {}
    for job in workflow.jobs:
        state = job.state.value if job.state else "pruned"
        counts[state] = counts.get(state, 0) + 1
    order = [*(state.value for state in JobState), "pruned"]
    return render(
        request,
        "workflow.html",
        workflow=workflow,
        drawing=graph.draw(workflow),
        counts=[(state, counts[state]) for state in order if state in counts],
    )


@router.get("/ui/jobs/{job_id}/{part}.json")
async def job_json(request: Request, job_id: JobId, part: Literal["payload", "result"]) -> Response:
    """All of a job's payload or result, pretty, for values too long for its page."""
    try:
        job = await run_in_threadpool(queue_of(request).get, job_id)
    except JobNotFound:
        return Response(f"no job {job_id}", status_code=404, media_type="text/plain")
    value = job.payload if part == "payload" else job.result
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return Response(text, media_type="application/json")


def _workers_context(queue: Queue) -> WorkersContext:
    return {"workers": queue.workers()}


@router.get("/ui/workers")
async def workers_page(request: Request) -> Response:
    """Live workers from the registry."""
    if not queue_controls()["workers"]:
        return render(request, "not_found.html", status_code=404, job_id=None)
    context = await run_in_threadpool(_workers_context, queue_of(request))
    return render(request, "workers.html", **context)


@router.get("/ui/fragments/workers")
async def workers_fragment(request: Request) -> Response:
    """The workers table, polled by the workers page."""
    if not queue_controls()["workers"]:
        return Response(status_code=404)
    context = await run_in_threadpool(_workers_context, queue_of(request))
    return render(request, "_workers.html", **context)


def schedules_context(queue: Queue) -> SchedulesContext:
    return {"schedules": queue.schedules()}


@router.get("/ui/schedules")
async def schedules_page(request: Request) -> Response:
    """Every schedule: cron, time zone, next and last run, enabled or not."""
    if not queue_controls()["schedules"]:
        return render(request, "not_found.html", status_code=404, job_id=None)
    context = await run_in_threadpool(schedules_context, queue_of(request))
    return render(request, "schedules.html", error=None, **context)


@router.get("/ui/fragments/schedules")
async def schedules_fragment(request: Request) -> Response:
    """The schedules table, polled by the schedules page."""
    if not queue_controls()["schedules"]:
        return Response(status_code=404)
    context = await run_in_threadpool(schedules_context, queue_of(request))
    return render(request, "_schedules.html", **context)
