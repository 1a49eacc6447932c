"""Exceptions pgqueue raises, each saying what went wrong in words a user can act on,
and the two ways pgqueue puts any exception's message on one line: :func:`error_line`
(every part of it) and :func:`first_line` (its first line)."""

from __future__ import annotations

from dataclasses import dataclass


class PgQueueError(Exception):
    """Base class of every error pgqueue raises on purpose."""


class ValidationError(PgQueueError, ValueError):
    """A value given to pgqueue is not acceptable; ``field`` names which one."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class JobNotFound(PgQueueError, LookupError):
    """No job has this id (it never existed, or it was pruned)."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} not found")
        self.job_id = job_id


class QueueNotFound(PgQueueError, LookupError):
    """No queue has this name: it never had a job, and no operator configured it."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"queue {queue!r} not found")
        self.queue = queue


class InvalidTransition(PgQueueError):
    """The job is not in a state the requested change can leave (cancel a finished job)."""

    def __init__(self, job_id: int, state: str, action: str) -> None:
        super().__init__(f"cannot {action} job {job_id}: it is {state}")
        self.job_id = job_id
        self.state = state
        self.action = action


class UniqueKeyHeld(InvalidTransition):
    """A finished job cannot be retried while another queued or running job holds its
    unique key: the retry is refused (nothing changes), naming that job."""

    def __init__(self, job_id: int, state: str, unique_key: str, holder_id: int | None) -> None:
        holder = f"job {holder_id}" if holder_id is not None else "another job"
        PgQueueError.__init__(
            self,
            f"cannot retry job {job_id}: its unique key {unique_key!r} is held by {holder},"
            " which is queued or running",
        )
        self.job_id = job_id
        self.state = state
        self.action = "retry"
        self.unique_key = unique_key
        self.holder_id = holder_id


class DependenciesFailed(InvalidTransition):
    """A job cannot be retried while a job it depends on has ended dead or cancelled: it
    would be cancelled again at once. The retry is refused (nothing changes), naming
    them; retry them first, and the job then waits for them again."""

    def __init__(self, job_id: int, state: str, failed: list[tuple[int, str]]) -> None:
        each = [f"{dependency} ({ended})" for dependency, ended in failed]
        names = each[-1] if len(each) == 1 else f"{', '.join(each[:-1])} and {each[-1]}"
        many = len(failed) > 1
        PgQueueError.__init__(
            self,
            f"cannot retry job {job_id}: its {'dependencies' if many else 'dependency'} "
            f"{names} will not succeed; retry {'them' if many else 'it'} first",
        )
        self.job_id = job_id
        self.state = state
        self.action = "retry"
        self.failed = failed
        """The dependencies that ended dead or cancelled: (id, state), ids ascending."""


class LeaseLost(PgQueueError):
    """The lease token no longer matches: the job was reaped, cancelled or re-claimed.

    The caller's outcome for this attempt was not written, and must not be.
    """

    def __init__(self, job_id: int, consequence: str = "outcome discarded") -> None:
        super().__init__(
            f"lease on job {job_id} was lost (reaped, cancelled or claimed again); {consequence}"
        )
        self.job_id = job_id


class NotAnAttempt(PgQueueError):
    """``job.complete``, ``fence``, ``effect_key``, ``set_result`` or ``transaction``
    was called on a job that is not a running attempt handed out by a claim (one read
    back with ``Queue.get``, say), or ``transaction`` on one whose worker lends no
    connections."""

    def __init__(self, job_id: int, method: str, why: str) -> None:
        super().__init__(f"job.{method}() on job {job_id}: {why}")
        self.job_id = job_id
        self.method = method


@dataclass(frozen=True)
class IdempotencyMismatch:
    """One enqueued item whose idempotency key belongs to a job that differs from it."""

    index: int
    """The item's position in the ``enqueue_many`` input, from 0."""
    key: str
    job_id: int
    """The job that holds the key."""
    fields: tuple[str, ...]
    """Which of ``task``, ``queue`` and ``payload`` differ, in that order."""

    def describe(self) -> str:
        """'idempotency key 'k' belongs to job 42, whose task and payload differ'."""
        differ = " and ".join(self.fields)
        verb = "differs" if len(self.fields) == 1 else "differ"
        return (
            f"idempotency key {self.key!r} belongs to job {self.job_id}, whose {differ} {verb}"
            " from this one's"
        )


class IdempotencyConflict(PgQueueError):
    """An idempotency key is already taken by a job with a different task, queue or
    payload: the enqueue is refused (nothing is written) instead of answering with a job
    that is not the one asked for. Repeats with the same task, queue and payload still
    return the existing job.

    ``conflicts`` lists every such item of the call, in input order; ``job_id``,
    ``key`` and ``fields`` are the first one's.
    """

    def __init__(self, conflicts: list[IdempotencyMismatch], *, items: int = 1) -> None:
        first = conflicts[0]
        where = f"item {first.index}: " if items > 1 else ""
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        super().__init__(f"{where}{first.describe()}; use a new key for a different job{more}")
        self.conflicts = conflicts
        self.job_id = first.job_id
        self.key = first.key
        self.fields = first.fields


class UnknownDependencies(ValidationError):
    """An enqueue named dependencies (``depends_on``) that are no job: nothing is
    enqueued. ``job_ids`` lists them all, ascending; ``index`` is the position of the
    first item naming one, in a batch."""

    def __init__(self, job_ids: list[int], *, index: int | None = None) -> None:
        where = f"item {index}: " if index is not None else ""
        names = ", ".join(str(job_id) for job_id in job_ids)
        noun = "jobs" if len(job_ids) > 1 else "job"
        super().__init__("depends_on", f"{where}no {noun} with id {names}")
        self.job_ids = job_ids
        self.index = index


class DatabaseUnavailable(PgQueueError):
    """PostgreSQL could not be reached, or refused writes (read-only, shutting down)."""


class NoDatabaseConfigured(PgQueueError):
    """No database URL was given and no embedded PostgreSQL is running."""

    def __init__(self) -> None:
        super().__init__(
            "no database: pass --database-url, set DATABASE_URL, "
            "or start the embedded PostgreSQL with `pgqueue db start`"
        )


def error_line(exc: BaseException) -> str:
    """``exc``'s message on one line, with every part of it; its type's name if it has
    no message.

    libpq spreads a connection failure over several lines (the host and port, the
    cause, a hint; again for each address it tried): any one line alone leaves out
    something a user needs, so they are joined, each said once."""
    lines = dict.fromkeys(line.strip() for line in str(exc).splitlines() if line.strip())
    return "; ".join(lines) or type(exc).__name__


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message; its type's name if it has no message.

    For a reason that must stay short (a log line repeated while a fault lasts, a field
    of a record): the first line of a database error says what failed, the rest where
    and why (see :func:`error_line` for all of it)."""
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__
