"""The job record and its states, as stored in the ``jobs`` table."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from operator import itemgetter
from typing import Any


class JobState(enum.StrEnum):
    """Where a job is in its life. See ``sql/migrations/0001_jobs.sql`` for who moves it."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True for the states a job stays in until someone retries or prunes it."""
        return self in (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)


FINISHED_STATES = tuple(state for state in JobState if state.finished)
# By value: a dict lookup costs a fraction of calling the enum class, once per row.
_STATES = {state.value: state for state in JobState}


@dataclass(frozen=True)
class Job:
    """One row of the jobs table, as of the statement that returned it."""

    id: int
    queue: str
    task: str
    payload: dict[str, Any]
    priority: int
    state: JobState
    run_at: datetime
    attempts: int
    max_attempts: int
    timeout_seconds: float | None
    lease_token: uuid.UUID | None
    lease_expires_at: datetime | None
    worker_id: str | None
    enqueued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    result: Any
    idempotency_key: str | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        """Build a Job from a dict row; columns this version does not know are ignored."""
        values = {name: row[name] for name in _JOB_FIELDS}
        values["state"] = JobState(values["state"])
        return cls(**values)

    @classmethod
    def from_tuples(cls, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[Job]:
        """Jobs from tuple rows whose column names are ``columns`` (a cursor's
        description); columns this version does not know are ignored.

        The claim path builds thousands of jobs a second: this skips the frozen
        dataclass's ``__init__``, which sets every field through ``object.__setattr__``.
        """
        pick = itemgetter(*[list(columns).index(name) for name in _JOB_FIELDS])
        jobs = []
        for row in rows:
            job = object.__new__(cls)
            values = job.__dict__
            values.update(zip(_JOB_FIELDS, pick(row), strict=True))
            values["state"] = _STATES[values["state"]]
            jobs.append(job)
        return jobs

    def succeeded(self, result: Any, finished_at: datetime) -> Job:
        """This running job as its ack left it: succeeded with ``result``, lease cleared."""
        # A worker acks thousands of jobs a second; dataclasses.replace() re-runs the
        # whole __init__ machinery for each, building the instance dict at once does not.
        job = object.__new__(Job)
        object.__setattr__(
            job,
            "__dict__",
            {
                **self.__dict__,
                "state": JobState.SUCCEEDED,
                "result": result,
                "finished_at": finished_at,
                "lease_token": None,
                "lease_expires_at": None,
            },
        )
        return job

    def to_dict(self) -> dict[str, Any]:
        """The job as plain JSON-friendly values (ISO timestamps, string token)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, (uuid.UUID, JobState)):
                value = value.value if isinstance(value, JobState) else str(value)
            out[f.name] = value
        return out


_JOB_FIELDS = tuple(f.name for f in fields(Job))


@dataclass(frozen=True)
class Lease:
    """A worker's claim on one attempt of a job: the job id and its fencing token."""

    job_id: int
    token: uuid.UUID
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A worker keys its bookkeeping by lease and looks each one up several times
        # per job; UUID.__hash__ is Python code, so hash once.
        object.__setattr__(self, "_hash", hash((self.job_id, self.token)))

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True)
class EnqueueResult:
    """What ``enqueue`` did: the job, and whether this call created it."""

    job: Job
    created: bool
