"""Request and response bodies of the HTTP API.

Requests are strict: unknown fields, wrong JSON types and out-of-range values are
refused with 422 before anything reaches the database, and the limits here mirror
``pgqueue.validation`` so ``/openapi.json`` tells clients what will be accepted. What
JSON Schema cannot say (NUL characters, both ``delay_seconds`` and ``run_at``) is
checked by ``pgqueue.JobSpec`` and answered with 422 naming the field all the same.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)

from pgqueue import Job as StoredJob
from pgqueue import JobDependencies, JobState, QueueStats, validation
from pgqueue.dependencies import MAX_DEPENDENCIES
from pgqueue.job import ERROR_HISTORY_CHARS, ERRORS_KEPT
from pgqueue.settings import DEFAULT_MAX_ATTEMPTS

MAX_BATCH_JOBS = 1000
LIST_LIMIT_MAX = 1000
JOB_ID_MAX = 2**63 - 1
"""Job ids are PostgreSQL bigints."""

NAME_RULES = (
    f"1 to {validation.NAME_MAX_LENGTH} characters of letters, digits, '_', '.', ':' "
    "and '-', starting with a letter or digit"
)

Name = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=validation.NAME_MAX_LENGTH,
        pattern=validation.NAME_PATTERN.pattern,
    ),
]


JobIdValue = Annotated[StrictInt, Field(ge=1, le=JOB_ID_MAX)]
"""A job id in a request body."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _JobFields(_Request):
    """What a job to enqueue has, both alone and in a batch, but its dependencies."""

    task: Name = Field(description=f"Name of the task a worker runs for this job: {NAME_RULES}.")
    payload: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Arguments for the task: a JSON object of at most "
            f"{validation.PAYLOAD_MAX_BYTES} bytes. Strings must not contain \\u0000, and "
            "numbers must be finite."
        ),
    )
    queue: Name = Field(default="default", description=f"Queue to put the job in: {NAME_RULES}.")
    priority: StrictInt = Field(
        default=0,
        ge=validation.PRIORITY_MIN,
        le=validation.PRIORITY_MAX,
        description="Higher priorities are claimed first.",
    )
    delay_seconds: StrictFloat | None = Field(
        default=None,
        ge=0,
        le=validation.MAX_SECONDS,
        description="Seconds from now before the job may run. Give this or run_at, not both.",
    )
    run_at: AwareDatetime | None = Field(
        default=None,
        description=(
            "When the job may run: an RFC 3339 date-time with a time zone. "
            "Give this or delay_seconds, not both."
        ),
    )
    idempotency_key: StrictStr | None = Field(
        default=None,
        min_length=1,
        max_length=validation.IDEMPOTENCY_KEY_MAX_LENGTH,
        description=(
            "Enqueue at most once per key: while a job with this key is in the table, "
            "enqueueing it again returns that job instead of a new one."
        ),
    )
    unique_key: StrictStr | None = Field(
        default=None,
        min_length=1,
        max_length=validation.IDEMPOTENCY_KEY_MAX_LENGTH,
        description=(
            "At most one queued or running job per key: while one holds it, enqueueing "
            "returns that job (200) instead of a new one, whatever its task, queue and "
            "payload; once it has finished, the key is free again. An idempotency key "
            "is checked first."
        ),
    )
    max_attempts: StrictInt = Field(
        default=DEFAULT_MAX_ATTEMPTS,
        ge=1,
        le=validation.MAX_ATTEMPTS_LIMIT,
        description="How many times the job may be claimed before it is dead.",
    )
    timeout_seconds: StrictFloat | None = Field(
        default=None,
        gt=0,
        le=validation.MAX_SECONDS,
        description="Time limit of one attempt, in seconds; none by default.",
    )

    @field_validator("run_at", mode="before")
    @classmethod
    def _run_at_is_text(cls, value: Any) -> Any:
        # Only RFC 3339 text: a bare number could be seconds or milliseconds.
        if value is not None and not isinstance(value, str):
            raise ValueError("must be an RFC 3339 date-time string with a time zone")
        return value

    @field_validator("run_at")
    @classmethod
    def _run_at_in_range(cls, value: datetime | None) -> datetime | None:
        if value is not None and not validation.RUN_AT_MIN <= value < validation.RUN_AT_MAX:
            raise ValueError("must be between 1970-01-01 and 9999-01-01")
        return value


class JobCreate(_JobFields):
    """A job to enqueue."""

    depends_on: list[JobIdValue] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description=(
            "Ids of jobs that must succeed before this one runs: until then it is "
            "`waiting` (`queued` at once if they all have already succeeded). If one of "
            "them ends dead or cancelled, this job is cancelled too. Ids that are no job "
            "are refused with 422 naming them, and nothing is enqueued."
        ),
    )


class JobFilter(_Request):
    """Query parameters of the job listing."""

    queue: Name | None = Field(default=None, description="Only jobs in this queue.")
    state: JobState | None = Field(default=None, description="Only jobs in this state.")
    task: Name | None = Field(default=None, description="Only jobs of this task.")
    limit: int = Field(default=50, ge=1, le=LIST_LIMIT_MAX, description="Jobs per page.")
    after: int | None = Field(
        default=None,
        ge=1,
        le=JOB_ID_MAX,
        description="The `next_after` of the previous page; omit for the first page.",
    )


class EarlierItem(_Request):
    """In a batch item's ``depends_on``: an earlier item of the same batch."""

    index: StrictInt = Field(
        ge=0,
        le=MAX_BATCH_JOBS - 1,
        description="The item's position in `jobs`, from 0; it must come before this one.",
    )


def _dependency_shape(value: Any) -> Any:
    """Refuse, with one clear message, a batch item's dependency that is neither a job id
    nor ``{"index": N}`` (the union below would otherwise report one error per branch)."""
    if isinstance(value, dict):
        index = value.get("index")
        if set(value) != {"index"} or isinstance(index, bool) or not isinstance(index, int):
            raise ValueError('an earlier item of the batch is given as {"index": N}')
        if not 0 <= index < MAX_BATCH_JOBS:
            raise ValueError(f"index must be from 0 to {MAX_BATCH_JOBS - 1}")
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= JOB_ID_MAX:
        raise ValueError(
            'must be a job id (an integer from 1) or {"index": N} for an earlier item of the batch'
        )
    return value


Dependency = Annotated[JobIdValue | EarlierItem, BeforeValidator(_dependency_shape)]


class BatchJobCreate(_JobFields):
    """A job to enqueue in a batch."""

    depends_on: list[Dependency] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description=(
            'Jobs that must succeed before this one runs: ids, or `{"index": N}` for '
            "the job of the earlier item N of this batch (created or returned). Until "
            "then it is `waiting` (`queued` at once if they all have already succeeded). "
            "If one of them ends dead or cancelled, this job is cancelled too. Ids that "
            "are no job, or an index that is not an earlier item, are refused with 422, "
            "and nothing is enqueued."
        ),
    )


class JobBatchCreate(_Request):
    """Jobs to enqueue together, all or none."""

    jobs: list[BatchJobCreate] = Field(
        min_length=1,
        max_length=MAX_BATCH_JOBS,
        description=f"1 to {MAX_BATCH_JOBS} jobs, inserted in this order in one transaction.",
    )


class JobError(_Response):
    """One failed attempt of a job."""

    attempt: int = Field(description="Which attempt failed, counted from 1.")
    failed_at: datetime = Field(description="When the failure was recorded.")
    worker_id: str | None = Field(description="The worker that had claimed the attempt.")
    error: str = Field(
        description=f"What went wrong (at most {ERROR_HISTORY_CHARS} characters of it)."
    )


class Job(_Response):
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


class JobDetail(Job):
    """A job as stored, with the jobs it depends on and the jobs that depend on it
    (listings leave these out: they would cost a query per job)."""

    depends_on: list[int] = Field(
        description="Ids of the jobs it waits (or waited) for, ascending; some may be pruned."
    )
    dependents: list[int] = Field(
        description="Ids of the jobs that wait (or waited) for it, ascending."
    )


JOB_FIELDS = tuple(Job.model_fields)


def job_body(job: StoredJob) -> dict[str, Any]:
    """The answer body for ``job``: exactly the fields of :class:`Job`, so its lease token
    stays private to the worker. Plain data, not a model: every value already has the
    declared type (it comes from the database), and a batch answer holds a thousand."""
    return {name: getattr(job, name) for name in JOB_FIELDS}


def job_detail_body(job: StoredJob, dependencies: JobDependencies) -> dict[str, Any]:
    """The answer body of :class:`JobDetail` for ``job``."""
    return {
        **job_body(job),
        "depends_on": dependencies.depends_on,
        "dependents": dependencies.dependents,
    }


class BatchItem(_Response):
    """One job of a batch, in request order."""

    created: bool = Field(
        description=(
            "False when the idempotency key already belonged to a job, or a queued or "
            "running job held the unique key: that job is returned."
        )
    )
    job: Job = Field(description="The job created, or the existing one.")


class BatchCreated(_Response):
    """The outcome of a batch enqueue."""

    items: list[BatchItem] = Field(description="One item per requested job, in request order.")


class JobPage(_Response):
    """One page of jobs, newest first."""

    jobs: list[Job] = Field(description="Up to `limit` jobs, newest first.")
    next_after: int | None = Field(
        description="Pass as `after` to get the next page; null on the last page."
    )


class StateCounts(_Response):
    """Jobs in each state."""

    waiting: int = Field(description="Waiting for the jobs they depend on to succeed.")
    queued: int = Field(description="Waiting to run, now or later.")
    running: int = Field(description="Claimed by a worker.")
    succeeded: int = Field(description="Finished successfully.")
    dead: int = Field(description="Failed every attempt.")
    cancelled: int = Field(description="Cancelled before finishing.")


class QueueSummary(_Response):
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
            unserved=stats.unserved,
        )


class QueueList(_Response):
    """Every queue that holds jobs or settings."""

    queues: list[QueueSummary] = Field(description="Queues in name order.")


class Health(_Response):
    """Whether this API process can reach its database."""

    status: Literal["ok", "unavailable"] = Field(description="ok when the database answers.")
    detail: str | None = Field(default=None, description="Why the database is unavailable.")


class FieldError(_Response):
    """One thing wrong with a request."""

    field: str = Field(description="Where: a body field like `jobs[2].payload`, or a parameter.")
    message: str = Field(description="What is wrong with it.")


class ErrorResponse(_Response):
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
