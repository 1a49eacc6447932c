"""Request bodies of the HTTP API, and what they share with the answers
(:mod:`pgqueue_api.responses`).

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
    StringConstraints,
    field_validator,
)

from pgqueue import JobState, validation
from pgqueue.dependencies import MAX_DEPENDENCIES
from pgqueue.settings import DEFAULT_MAX_ATTEMPTS

MAX_BATCH_JOBS = 1000
LIST_LIMIT_MAX = 1000
JOB_ID_MAX = 2**63 - 1
"""Job ids are PostgreSQL bigints."""

NAME_RULES = (
    f"1 to {validation.NAME_MAX_LENGTH} characters of letters, digits, '_', '.', ':' "
    "and '-', starting with a letter or digit"
)

Tag = Annotated[StrictStr, StringConstraints(min_length=1, max_length=validation.TAG_MAX_LENGTH)]
"""A job's tag (see pgqueue.validation.tags for the rest of the rules)."""

Name = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=validation.NAME_MAX_LENGTH,
        pattern=validation.NAME_PATTERN.pattern,
    ),
]


PARTITION_KEY_RULES = f"1 to {validation.PARTITION_KEY_MAX_LENGTH} characters"

PartitionKey = Annotated[
    StrictStr, StringConstraints(min_length=1, max_length=validation.PARTITION_KEY_MAX_LENGTH)
]
"""A job's partition key: the lane it takes turns in within its queue."""

JobIdValue = Annotated[StrictInt, Field(ge=1, le=JOB_ID_MAX)]
"""A job id in a request body."""


class RequestBody(BaseModel):
    """The base of every request body: unknown fields and NaN or infinite numbers are
    refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ResponseBody(BaseModel):
    """The base of every answer body: exactly its declared fields."""

    model_config = ConfigDict(extra="forbid")


class _JobFields(RequestBody):
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
    tags: list[Tag] = Field(
        default_factory=list,
        max_length=validation.TAGS_MAX,
        description=(
            f"Labels to find the job by (`GET /jobs?tag=`): at most {validation.TAGS_MAX} "
            f"strings of 1 to {validation.TAG_MAX_LENGTH} characters; each is kept once."
        ),
    )
    partition_key: PartitionKey | None = Field(
        default=None,
        description=(
            f"The job's partition ({PARTITION_KEY_RULES}), such as a tenant or customer: "
            "within a priority, workers take one job per partition in turn, so one "
            "partition's backlog does not hold up the others, and the queue's "
            "partition limits hold per partition. Null: the jobs without a key, one "
            "lane of their own."
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


DependencyMode = Literal["succeeded", "finished"]
_DEPENDENCY_MODE = (
    "What `depends_on` waits for: `succeeded` (the default: each must succeed, and one "
    "that ends dead or cancelled cancels this job) or `finished` (each must be final in "
    "any state, succeeded, dead or cancelled; this job then runs, and is never cancelled "
    "by them: a callback for a group). Its handler finds their states and results in "
    "`job.dependencies`."
)


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
    dependency_mode: DependencyMode = Field(default="succeeded", description=_DEPENDENCY_MODE)


class JobFilter(RequestBody):
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
    tag: list[Tag] = Field(
        default_factory=list,
        max_length=validation.TAGS_MAX,
        description="Only jobs carrying this tag; repeat it for jobs carrying all of them.",
    )
    partition_key: PartitionKey | None = Field(
        default=None, description="Only jobs with this partition key."
    )
    payload_contains: str | None = Field(
        default=None,
        max_length=validation.PAYLOAD_MAX_BYTES,
        description=(
            "Only jobs whose payload contains this JSON object (PostgreSQL's `@>`): "
            '`{"customer": 7}` finds every payload whose `customer` is 7. Queued and '
            "running jobs are found through an index; finished ones are read newest "
            "first until the page is full."
        ),
    )


WAIT_MAX_SECONDS = 60.0
"""The longest ``GET /jobs/{id}?wait=S`` may wait: a request held longer is cut off by
proxies and load balancers more often than not."""


class JobWait(RequestBody):
    """Query parameters of ``GET /jobs/{id}``."""

    wait: float | None = Field(
        default=None,
        gt=0,
        le=WAIT_MAX_SECONDS,
        description=(
            "Answer as soon as the job is final (succeeded, dead or cancelled), or after "
            "this many seconds (0 < wait <= 60) with its current state: check `state`. "
            "The wait holds no database connection."
        ),
    )


class EarlierItem(RequestBody):
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
    dependency_mode: DependencyMode = Field(default="succeeded", description=_DEPENDENCY_MODE)


class JobBatchCreate(RequestBody):
    """Jobs to enqueue together, all or none."""

    jobs: list[BatchJobCreate] = Field(
        min_length=1,
        max_length=MAX_BATCH_JOBS,
        description=f"1 to {MAX_BATCH_JOBS} jobs, inserted in this order in one transaction.",
    )
