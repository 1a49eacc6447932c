"""The job record and its states, as stored in the ``jobs`` table."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
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
    def from_tuples(
        cls,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
        shared: Mapping[str, Any] | None = None,
    ) -> list[Job]:
        """Jobs from tuple rows whose column names are ``columns`` (a cursor's
        description); columns this version does not know are ignored. ``shared`` gives
        fields whose value is the same for every row (a claim's state and start time),
        which the rows then need not carry.

        The claim path builds thousands of jobs a second: this skips the frozen
        dataclass's ``__init__``, which sets every field through ``object.__setattr__``,
        and when the columns are the remaining fields in order (as the claim returns
        them), it takes each row as it is.
        """
        shared = dict(shared or {})
        names = tuple(name for name in _JOB_FIELDS if name not in shared)
        values_of: Callable[[Sequence[Any]], Iterable[Any]]
        if tuple(columns) == names:
            values_of = iter
        else:
            values_of = itemgetter(*[list(columns).index(name) for name in names])
        jobs = []
        for row in rows:
            job = object.__new__(cls)
            values = job.__dict__
            values.update(zip(names, values_of(row), strict=True))
            values.update(shared)
            values["state"] = _STATES[values["state"]]
            jobs.append(job)
        return jobs

    def succeeded(self, result: Any, finished_at: datetime) -> Job:
        """This running job as its ack left it: succeeded with ``result``, lease cleared."""
        # A worker acks thousands of jobs a second; dataclasses.replace() re-runs the
        # whole __init__ machinery for each, copying the instance dict does not.
        job = object.__new__(Job)
        values = job.__dict__
        values.update(self.__dict__)
        values.update(
            state=JobState.SUCCEEDED,
            result=result,
            finished_at=finished_at,
            lease_token=None,
            lease_expires_at=None,
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

    def __hash__(self) -> int:
        # A worker keys its bookkeeping by lease and looks each one up several times
        # per job. UUID.__hash__ is Python code; the job id alone tells apart the
        # leases a worker holds (two leases of one job differ only while a stale one
        # is being settled, and equality still compares the tokens).
        return hash(self.job_id)


@dataclass(frozen=True)
class EnqueueResult:
    """What ``enqueue`` did: the job, and whether this call created it."""

    job: Job
    created: bool
