"""Response bodies of the HTTP API, and the error answers each route declares in
``/openapi.json``. A job's body carries exactly the fields of :class:`Job`, so its
lease token stays private to the worker."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from pgqueue import Job as StoredJob
from pgqueue import JobDependencies, JobState, QueueStats, Workflow
from pgqueue.job import ERROR_HISTORY_CHARS, ERRORS_KEPT
from pgqueue_api.schemas import ResponseBody


class JobError(ResponseBody):
    """One failed attempt of a job."""

    attempt: int = Field(description="Which attempt failed, counted from 1.")
    failed_at: datetime = Field(description="When the failure was recorded.")
    worker_id: str | None = Field(description="The worker that had claimed the attempt.")
    error: str = Field(
        description=f"What went wrong (at most {ERROR_HISTORY_CHARS} characters of it)."
    )


class JobProgress(ResponseBody):
    """The latest progress a job's handler reported."""

    fraction: float = Field(description="How much of the work is done, from 0 to 1.")
    message: str | None = Field(description="What the handler said with it, if anything.")
    at: datetime = Field(description="When it was written (at most a second after the report).")


class Job(ResponseBody):
    """A job as stored."""

    id: int = Field(description="The job's id; ids grow with enqueue order.")
    queue: str = Field(description="The queue the job is in.")
    task: str = Field(description="The task a worker runs for it.")
    payload: dict[str, Any] = Field(description="The task's arguments.")
    priority: int = Field(description="Higher priorities are claimed first.")
    state: JobState = Field(
        description=(
            "waiting (for the jobs in its depends_on to succeed), queued (waiting for "
            "run_at), running (claimed under a lease), succeeded, dead (failed "
            "max_attempts times) or cancelled."
        )
    )
    attempts: int = Field(description="How many times the job has been claimed.")
    max_attempts: int = Field(description="Claims allowed before the job is dead.")
    timeout_seconds: float | None = Field(description="Time limit of one attempt, if any.")
    idempotency_key: str | None = Field(description="The key it was enqueued with, if any.")
    unique_key: str | None = Field(
        description="The unique key it was enqueued with, if any (held while queued or running)."
    )
    last_error: str | None = Field(
        description="The error of the latest failed attempt; null once the job has succeeded."
    )
    errors: list[JobError] = Field(
        description=(
            f"The failed attempts, oldest first: the latest {ERRORS_KEPT} are kept, also "
            "after the job has succeeded."
        )
    )
    result: Any = Field(description="What the task returned, once the job has succeeded.")
    worker_id: str | None = Field(description="The worker that claimed the latest attempt.")
    enqueued_at: datetime = Field(description="When the job was enqueued.")
    run_at: datetime = Field(description="When the job may run (next, if it is queued).")
    started_at: datetime | None = Field(description="When the latest attempt started.")
    finished_at: datetime | None = Field(description="When the job finished, if it has.")
    lease_expires_at: datetime | None = Field(
        description="While running: when the lease ends unless the worker renews it."
    )
    tags: list[str] = Field(description="The tags it was enqueued with; empty for none.")
    partition_key: str | None = Field(
        description="The partition it takes turns in within its queue; null for none."
    )
    progress: JobProgress | None = Field(
        description=(
            "The latest progress its handler reported (written at most once a second per "
            "worker, the last report always); null until one reports. Kept once the job "
            "has finished, and through a retry until the new attempt reports."
        )
    )


class JobDetail(Job):
    """A job as stored, with the jobs it depends on and the jobs that depend on it
    (listings leave these out: they would cost a query per job)."""

    depends_on: list[int] = Field(
        description="Ids of the jobs it waits (or waited) for, ascending; some may be pruned."
    )
    dependents: list[int] = Field(
        description="Ids of the jobs that wait (or waited) for it, ascending."
    )
    dependency_mode: str = Field(
        description=(
            "What it waits for in `depends_on`: `succeeded` (each must succeed) or "
            "`finished` (each must be final, in any state); `succeeded` without dependencies."
        )
    )


JOB_FIELDS = tuple(Job.model_fields)
_STORED_FIELDS = tuple(name for name in JOB_FIELDS if name != "progress")


def job_body(job: StoredJob) -> dict[str, Any]:
    """The answer body for ``job``: exactly the fields of :class:`Job`, so its lease token
    stays private to the worker. Plain data, not a model: every value already has the
    declared type (it comes from the database), and a batch answer holds a thousand."""
    body = {name: getattr(job, name) for name in _STORED_FIELDS}
    # The field is progress_report on the Job: progress is the handler's method.
    body["progress"] = job.progress_report
    return body


def job_detail_body(job: StoredJob, dependencies: JobDependencies) -> dict[str, Any]:
    """The answer body of :class:`JobDetail` for ``job``."""
    return {
        **job_body(job),
        "depends_on": dependencies.depends_on,
        "dependents": dependencies.dependents,
        "dependency_mode": dependencies.dependency_mode,
    }


class WorkflowNode(ResponseBody):
    """One job of a workflow."""

    id: int = Field(description="The job's id.")
    task: str | None = Field(description="Its task; null for a job pruned since.")
    queue: str | None = Field(description="Its queue; null for a job pruned since.")
    state: JobState | None = Field(description="Its state; null for a job pruned since.")
    depends_on: list[int] = Field(
        description="Ids of its dependencies among the workflow's jobs, ascending."
    )
    more_dependencies: int = Field(
        description="Of an ancestor: its dependencies left out (the graph is cut there)."
    )
    more_dependents: int = Field(
        description="Of a descendant: its dependents left out (the graph is cut there)."
    )


class WorkflowGraph(ResponseBody):
    """The graph of dependencies around a job."""

    job_id: int = Field(description="The job the graph is around.")
    limit: int = Field(description="Ancestors, and descendants, found at most, nearest first.")
    truncated: bool = Field(
        description="True when ancestors or descendants beyond `limit` were left out."
    )
    jobs: list[WorkflowNode] = Field(
        description=(
            "The job, every job it depends on directly or not, and every job that "
            "depends on it directly or not; ids ascending."
        )
    )
    edges: list[tuple[int, int]] = Field(
        description="[dependency, dependent] pairs: the links between the jobs."
    )


def workflow_body(workflow: Workflow) -> dict[str, Any]:
    """The answer body of :class:`WorkflowGraph` for ``workflow``."""
    return {
        "job_id": workflow.job_id,
        "limit": workflow.limit,
        "truncated": workflow.truncated,
        "jobs": [
            {
                "id": job.id,
                "task": job.task,
                "queue": job.queue,
                "state": job.state,
                "depends_on": list(job.depends_on),
                "more_dependencies": job.more_dependencies,
                "more_dependents": job.more_dependents,
            }
            for job in workflow.jobs
        ],
        "edges": [list(edge) for edge in workflow.edges],
    }


class BatchItem(ResponseBody):
    """One job of a batch, in request order."""

    created: bool = Field(
        description=(
            "False when the idempotency key already belonged to a job, or a queued or "
            "running job held the unique key: that job is returned."
        )
    )
    job: Job = Field(description="The job created, or the existing one.")


class BatchCreated(ResponseBody):
    """The outcome of a batch enqueue."""

    items: list[BatchItem] = Field(description="One item per requested job, in request order.")


class JobPage(ResponseBody):
    """One page of jobs, newest first."""

    jobs: list[Job] = Field(description="Up to `limit` jobs, newest first.")
    next_after: int | None = Field(
        description="Pass as `after` to get the next page; null on the last page."
    )


class StateCounts(ResponseBody):
    """Jobs in each state."""

    waiting: int = Field(description="Waiting for the jobs they depend on to succeed.")
    queued: int = Field(description="Waiting to run, now or later.")
    running: int = Field(description="Claimed by a worker.")
    succeeded: int = Field(description="Finished successfully.")
    dead: int = Field(description="Failed every attempt.")
    cancelled: int = Field(description="Cancelled before finishing.")


class QueueSummary(ResponseBody):
    """One queue's jobs by state."""

    queue: str = Field(description="The queue's name.")
    counts: StateCounts = Field(description="How many of its jobs are in each state.")
    oldest_runnable_age_seconds: float | None = Field(
        description="How long the oldest job that could run now has waited; null if none."
    )
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
        description=(
            "Until when the whole queue is throttled (by a handler's `Throttle` with scope "
            "`queue`, or an operator): no job of it starts before; null: not throttled."
        )
    )
    unserved: dict[str, int] = Field(
        description="Per task, the queued jobs that no live worker serves in this queue."
    )

    @classmethod
    def from_stats(cls, stats: QueueStats) -> QueueSummary:
        """The response body for one queue's stats."""
        return cls(
            queue=stats.queue,
            counts=StateCounts(**stats.counts),
            oldest_runnable_age_seconds=stats.oldest_runnable_age_seconds,
            paused=stats.paused,
            concurrency_limit=stats.concurrency_limit,
            rate_limit=stats.rate_limit,
            partition_concurrency_limit=stats.partition_concurrency_limit,
            partition_rate_limit=stats.partition_rate_limit,
            throttled_until=stats.throttled_until,
            unserved=stats.unserved,
        )


class Partition(ResponseBody):
    """One partition key of a queue: its jobs queued and running, and its throttle."""

    partition_key: str = Field(description="The key.")
    queued: int = Field(description="Its queued jobs (runnable now or later).")
    running: int = Field(description="Its jobs claimed by a worker.")
    throttled_until: datetime | None = Field(
        description="Until when no job of this key starts (a throttle); null: not throttled."
    )


class PartitionList(ResponseBody):
    """One page of a queue's partition keys, busiest first."""

    partitions: list[Partition] = Field(
        description="Up to `limit` keys, by running plus queued jobs descending, then by key."
    )
    next_after: str | None = Field(
        description="Pass as `after` to get the next page; null on the last page."
    )


class QueueList(ResponseBody):
    """Every queue that holds jobs or settings."""

    queues: list[QueueSummary] = Field(description="Queues in name order.")


class Health(ResponseBody):
    """Whether this API process can reach its database."""

    status: Literal["ok", "unavailable"] = Field(description="ok when the database answers.")
    detail: str | None = Field(default=None, description="Why the database is unavailable.")


class FieldError(ResponseBody):
    """One thing wrong with a request."""

    field: str = Field(description="Where: a body field like `jobs[2].payload`, or a parameter.")
    message: str = Field(description="What is wrong with it.")


class ErrorResponse(ResponseBody):
    """An error."""

    detail: str = Field(description="What went wrong, in one line.")
    errors: list[FieldError] = Field(
        default_factory=list, description="For invalid requests: each field that is wrong."
    )


# Error answers, for the routes' OpenAPI descriptions.
UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorResponse, "description": "The database is unavailable; retry later."}
}
INVALID: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorResponse, "description": "The request is invalid; `errors` says where."}
}
TOO_LARGE: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorResponse, "description": "The body is larger than the API accepts."}
}
IDEMPOTENCY_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {
        "model": ErrorResponse,
        "description": (
            "The idempotency key belongs to a job with another task, queue or payload; "
            "`errors` names what differs. Nothing was enqueued."
        ),
    }
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No job has this id."}
}
