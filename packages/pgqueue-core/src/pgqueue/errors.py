"""Exceptions pgqueue raises. Each says what went wrong in words a user can act on."""

from __future__ import annotations


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


class InvalidTransition(PgQueueError):
    """The job is not in a state the requested change can leave (cancel a finished job)."""

    def __init__(self, job_id: int, state: str, action: str) -> None:
        super().__init__(f"cannot {action} job {job_id}: it is {state}")
        self.job_id = job_id
        self.state = state
        self.action = action


class LeaseLost(PgQueueError):
    """The lease token no longer matches: the job was reaped, cancelled or re-claimed.

    The caller's outcome for this attempt was not written, and must not be.
    """

    def __init__(self, job_id: int) -> None:
        super().__init__(
            f"lease on job {job_id} was lost (reaped, cancelled or claimed again); outcome discarded"
        )
        self.job_id = job_id


class DatabaseUnavailable(PgQueueError):
    """PostgreSQL could not be reached, or refused writes (read-only, shutting down)."""


class NoDatabaseConfigured(PgQueueError):
    """No database URL was given and no embedded PostgreSQL is running."""

    def __init__(self) -> None:
        super().__init__(
            "no database: pass --database-url, set DATABASE_URL, "
            "or start the embedded PostgreSQL with `pgqueue db start`"
        )
