"""The job record and its states, as stored in the ``jobs`` table."""

from __future__ import annotations

import enum
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field, fields
from datetime import datetime
from operator import itemgetter
from typing import TYPE_CHECKING, Any, overload

import psycopg

from pgqueue.errors import ValidationError

if TYPE_CHECKING:
    from pgqueue.dependencies import Dependency


class JobState(enum.StrEnum):
    """Where a job is in its life. See ``sql/schema.sql`` for who moves it."""

    WAITING = "waiting"
    """Enqueued with dependencies that have not all succeeded (see
    :mod:`pgqueue.dependencies`)."""
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
ERRORS_KEPT = 20
"""How many failed attempts a job's ``errors`` history keeps (the latest ones); each
entry's error is cut to ERROR_HISTORY_CHARS characters. Both are applied by the SQL
statement that records failures (``job_finish_many``)."""
ERROR_HISTORY_CHARS = 2000
PROGRESS_MESSAGE_CHARS = 1000
"""How many characters of a progress message are kept (see :meth:`Job.progress`)."""
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
    """The error of the latest failed attempt, until the job succeeds."""
    errors: list[dict[str, Any]]
    """The failed attempts, oldest first, the latest ERRORS_KEPT of them: each a dict
    with ``attempt``, ``failed_at`` (ISO 8601 text), ``worker_id`` and ``error``."""
    result: Any
    idempotency_key: str | None
    trace_context: dict[str, str] | None = None
    """The W3C trace context (``traceparent``, ``tracestate``) of the span that
    enqueued the job, when the producer was tracing (see :mod:`pgqueue.tracing`)."""
    unique_key: str | None = None
    """The unique key it was enqueued with, if any: while the job is queued or running,
    no other job with this key can be enqueued (see :mod:`pgqueue.keyed`)."""
    tags: list[str] = field(default_factory=list)
    """The tags it was enqueued with (empty for none), to find it by."""
    progress_report: dict[str, Any] | None = None
    """The latest progress its handler reported (see :meth:`progress`) as the database
    holds it: ``fraction``, ``message`` and ``at`` (ISO 8601 text, when it was
    written), or None until a handler reports. Column ``progress``; kept once the job
    has finished."""
    partition_key: str | None = None
    """The tenant, customer or account it was enqueued for, if any: jobs with a key are
    claimed round-robin across keys, and the queue's partition limits hold per key (see
    docs/operating-queues.md)."""

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        """Build a Job from a dict row; columns this version does not know are ignored."""
        values = {name: row[name] for name in _JOB_FIELDS if name in row}
        values["state"] = JobState(values["state"])
        # NULL in the table: no attempt has failed (the column has no default).
        values["errors"] = values["errors"] or []
        # NULL in the table: no tags (storing nothing for most jobs).
        values["tags"] = values.get("tags") or []
        values["progress_report"] = row.get("progress")
        return cls(**values)

    @classmethod
    def from_fields(cls, values: dict[str, Any]) -> Job:
        """The Job whose fields are ``values``: every field, each already of its type
        (``state`` a JobState, ``errors`` a list). Nothing is checked or converted.

        ``values`` becomes the job's own ``__dict__``: pass a dict that nothing else
        holds or changes afterwards.

        The frozen dataclass's ``__init__`` sets each field through
        ``object.__setattr__``, about 4 us a job; handing the new instance a dict costs
        a tenth of that, half of what filling its own dict does. Claims, acks and large
        enqueues build thousands of jobs a second, so they build them here, and this is
        the one place that skips ``__init__``.
        """
        job = object.__new__(cls)
        object.__setattr__(job, "__dict__", values)
        return job

    @classmethod
    def from_tuples(
        cls,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
        shared: Mapping[str, Any] | None = None,
        payloads: Sequence[Any] | None = None,
    ) -> list[Job]:
        """Jobs from tuple rows whose column names are ``columns`` (a cursor's
        description); columns this version does not know are ignored. ``shared`` gives
        fields whose value is the same for every row (a claim's state and start time),
        which the rows then need not carry. ``payloads``, one per row, replace the rows'
        payload column (a claim returns payloads as text, to be loaded all at once).

        The claim path builds thousands of jobs a second: this builds them with
        :meth:`from_fields`, and when the columns are the remaining fields in order (as
        the claim returns them), it takes each row as it is.
        """
        shared = dict(shared or {})
        # The column is progress; the field is progress_report (progress is the method).
        columns = [PROGRESS_FIELD if name == "progress" else name for name in columns]
        names = tuple(name for name in _JOB_FIELDS if name not in shared)
        values_of: Callable[[Sequence[Any]], Iterable[Any]]
        # Columns after the fields (a claim's pending_dependencies) are left out by zip,
        # which stops at the last name.
        extra = len(columns) > len(names)
        if tuple(columns[: len(names)]) == names:
            values_of = iter
        else:
            values_of = itemgetter(*[list(columns).index(name) for name in names])
        jobs = []
        loaded = iter(()) if payloads is None else iter(payloads)
        for row in rows:
            values = dict(zip(names, values_of(row), strict=not extra))
            values.update(shared)
            if payloads is not None:
                values["payload"] = next(loaded)
            values["state"] = _STATES[values["state"]]
            if values["errors"] is None:
                values["errors"] = []
            if values["tags"] is None:
                values["tags"] = []
            jobs.append(cls.from_fields(values))
        return jobs

    def succeeded(self, result: Any, finished_at: datetime) -> Job:
        """This running job as its ack left it: succeeded with ``result``, lease and
        ``last_error`` cleared (``errors`` keeps the history)."""
        # A worker acks thousands of jobs a second; dataclasses.replace() re-runs the
        # whole __init__ machinery for each, copying the instance dict does not.
        values = dict(self.__dict__)
        values.update(
            state=JobState.SUCCEEDED,
            result=result,
            finished_at=finished_at,
            last_error=None,
            lease_token=None,
            lease_expires_at=None,
        )
        return Job.from_fields(values)

    def failed(
        self,
        state: JobState,
        run_at: datetime,
        error: str,
        errors: list[dict[str, Any]],
        finished_at: datetime,
    ) -> Job:
        """This running job as a failed attempt left it: queued again at ``run_at``, or
        dead (finished at ``finished_at``) once its attempts were used up; ``error`` is
        its ``last_error`` and ``errors`` the history with it appended."""
        values = dict(self.__dict__)
        values.update(
            state=state,
            run_at=run_at,
            finished_at=finished_at if state is JobState.DEAD else None,
            last_error=error,
            errors=errors,
            lease_token=None,
            lease_expires_at=None,
        )
        return Job.from_fields(values)

    # -- calling an attempt off -----------------------------------------------------
    # Not columns, and not dataclass fields: set on the one Job object a worker hands
    # the handler, and only when the attempt is called off. A worker claims thousands
    # of jobs a second, so nothing is allocated per job for it (an Event would cost
    # more than a no-op job); the event for wait_cancelled is made on first use.

    @property
    def cancelled(self) -> bool:
        """True once the worker running this attempt has called it off: the job was
        cancelled, its lease was lost (reaped after this worker stalled), the attempt
        overran its time limit, or the worker's shutdown timeout ran out. Its outcome
        will be discarded.

        A plain-function handler cannot be interrupted, so one that runs long should
        look at this now and then and return early (an ``async def`` handler is
        cancelled as well). The worker learns of a cancel or a lost lease from its
        heartbeat, so this turns True within about one heartbeat interval. Always
        False for a job no worker is running.
        """
        return bool(self.__dict__.get("_cancelled", False))

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Wait until this attempt is called off (see :attr:`cancelled`) or ``timeout``
        seconds have passed, and return :attr:`cancelled`: a handler's interruptible
        sleep, as in ``if job.wait_cancelled(5): return``."""
        with _cancel_lock:
            event = self.__dict__.get("_cancel_event")
            if event is None:
                event = self.__dict__["_cancel_event"] = threading.Event()
                if self.cancelled:
                    event.set()
        return event.wait(timeout)

    def mark_cancelled(self) -> None:
        """Call this attempt off: :attr:`cancelled` turns True and
        :meth:`wait_cancelled` returns. The worker calls it; so may a custom loop that
        runs handlers and gives up on one."""
        with _cancel_lock:
            self.__dict__["_cancelled"] = True
            event = self.__dict__.get("_cancel_event")
        if event is not None:
            event.set()

    # -- reporting progress ---------------------------------------------------------
    # As with calling off: not a field, set on the one Job object a worker hands the
    # handler (see report_progress_to), so nothing is allocated for jobs that never
    # report.

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far the running attempt has got: ``fraction`` done, from 0 to 1,
        and an optional ``message`` (cut to PROGRESS_MESSAGE_CHARS characters). Cheap
        and non-blocking, from a plain or an ``async def`` handler: the worker keeps the
        latest value and writes it with the others at most once per its progress
        interval (a second by default), and writes the last one before the attempt's
        outcome. It shows as ``progress`` in ``GET /jobs/{id}``, ``pgqueue job`` and the
        dashboard, and stays once the job has finished. A report from an attempt whose
        lease was lost is not written.

        Raises :class:`~pgqueue.errors.ValidationError` (a ValueError) for a fraction
        outside [0, 1] or a message that is not text, and RuntimeError for a job that no
        worker is running here."""
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise ValidationError("fraction", "must be a number from 0 to 1")
        if not 0.0 <= fraction <= 1.0:  # NaN fails too
            raise ValidationError("fraction", f"must be from 0 to 1, not {fraction!r}")
        if message is not None:
            if not isinstance(message, str):
                raise ValidationError("message", "must be a string or None")
            message = message[:PROGRESS_MESSAGE_CHARS].replace("\x00", "")
        sink = self.__dict__.get("_progress_sink")
        if sink is None:
            raise RuntimeError(
                f"job {self.id}: progress can be reported only by the handler a worker runs"
            )
        sink(float(fraction), message)

    def report_progress_to(self, sink: Callable[[float, str | None], None] | None) -> None:
        """Send this attempt's :meth:`progress` reports to ``sink`` (None: refuse them).
        The worker calls it before the handler, and with None after."""
        self.__dict__["_progress_sink"] = sink

    def __getstate__(self) -> dict[str, Any]:
        """What a pickled or copied job keeps: the row's fields. What a claim attached to
        the running attempt (its owner, with the claimer's pool, its completions, its
        cancellation event) stays with the original, so that a job can still be handed
        to a process pool or deep-copied; on a copy, ``complete``, ``fence``,
        ``effect_key`` and ``transaction`` raise :class:`~pgqueue.errors.NotAnAttempt`."""
        state = {name: self.__dict__[name] for name in _JOB_FIELDS}
        # What it waited for is data of the row's, not of the attempt: it goes along.
        if "_dependencies" in self.__dict__:
            state["_dependencies"] = self.__dict__["_dependencies"]
        return state

    # -- effects: completing in the caller's transaction ------------------------------
    # Only for the running attempt a claim handed out (a worker, WorkerProtocol.claim,
    # pytest-pgqueue's pgqueue_claim), which knows its schema: see pgqueue.effects.

    @overload
    def complete(self, conn: psycopg.Connection[Any], result: Any = None) -> None: ...

    @overload
    def complete(
        self, conn: psycopg.AsyncConnection[Any], result: Any = None
    ) -> Coroutine[Any, Any, None]: ...

    def complete(
        self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], result: Any = None
    ) -> Coroutine[Any, Any, None] | None:
        """Mark this attempt's job succeeded with ``result``, in the transaction open on
        ``conn`` (any psycopg connection to the queue's database; with an
        ``AsyncConnection``, await the call), fenced by the attempt's lease: the
        handler's own writes in that transaction and the job's completion commit
        together, or neither does.

        If the lease is no longer this attempt's (reaped after a stall, cancelled,
        claimed again), raises :class:`~pgqueue.LeaseLost` after failing the
        transaction with an error of PostgreSQL's own: nothing of it can commit, even if
        the caller catches LeaseLost. A result that cannot be stored (not JSON,
        NaN/Infinity, NUL, over the queue's ``max_result_bytes``) raises
        :class:`~pgqueue.ValidationError` before anything is sent.

        Once that transaction has committed, the worker writes nothing more for the
        attempt: what the handler returns (or raises) afterwards is ignored,
        ``on_success`` runs once with ``result``. If it rolls back and the handler
        returns, the attempt fails and is retried. Call it once per transaction, and
        leave no transaction open when the handler returns. On a connection in
        autocommit mode, outside a transaction block, the completion commits at once,
        alone.
        """
        from pgqueue import effects

        if isinstance(conn, psycopg.AsyncConnection):
            return effects.complete_async(self, conn, result)
        _check_connection(conn)
        effects.complete(self, conn, result)
        return None

    @overload
    def fence(self, conn: psycopg.Connection[Any]) -> None: ...

    @overload
    def fence(self, conn: psycopg.AsyncConnection[Any]) -> Coroutine[Any, Any, None]: ...

    def fence(
        self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]
    ) -> Coroutine[Any, Any, None] | None:
        """Hold this attempt's job in the transaction open on ``conn`` (await it with an
        ``AsyncConnection``), for writes that must not outlive the lease when the job's
        completion comes later (an ack when the handler returns, or ``complete`` in a
        later transaction).

        Raises :class:`~pgqueue.LeaseLost`, failing the transaction as ``complete``
        does, if the lease is already gone. Otherwise, until that transaction ends, the
        reaper cannot take the job (even past its lease) and a cancel of it waits, while
        the worker's heartbeat goes on extending the lease; the worker's own ack of the
        attempt waits too, so commit before the handler returns. Under REPEATABLE READ
        or SERIALIZABLE, a heartbeat since the transaction's snapshot makes it fail with
        a serialization error, to be retried as any.
        """
        from pgqueue import effects

        if isinstance(conn, psycopg.AsyncConnection):
            return effects.fence_async(self, conn)
        _check_connection(conn)
        effects.fence(self, conn)
        return None

    def effect_key(self, name: str) -> str:
        """A key for the effect ``name`` of this job outside the database (an HTTP
        ``Idempotency-Key`` header, a payment provider's idempotency token): the same
        on every attempt of this job, distinct between jobs (of any schema, and a job
        id reused after the schema was made again) and between names. A UUID in text,
        36 ASCII characters, which idempotency keys everywhere accept."""
        from pgqueue import effects

        return effects.effect_key(self, name)

    def set_result(self, value: Any) -> None:
        """The result :meth:`transaction` and :meth:`atransaction` complete the job with
        on a clean exit (None until set). Raises :class:`~pgqueue.ValidationError` at
        once for a result that cannot be stored."""
        from pgqueue import effects

        effects.set_result(self, value)

    def transaction(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """``with job.transaction() as conn:``, a connection lent by the worker running
        this attempt, in a transaction: on a clean exit the job is completed (as by
        :meth:`complete`, with the value given to :meth:`set_result`) in that same
        transaction, which then commits; an exception rolls everything back. For
        handlers that have no pool of their own."""
        from pgqueue import effects

        return effects.transaction(self)

    def atransaction(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """``async with job.atransaction() as conn:``, :meth:`transaction` for ``async
        def`` handlers, on a psycopg ``AsyncConnection``."""
        from pgqueue import effects

        return effects.atransaction(self)

    # -- what it waited for -----------------------------------------------------------
    # Not a column nor a dataclass field, like the above: set by the worker's claim on
    # the jobs enqueued with depends_on, and only on them.

    @property
    def dependencies(self) -> tuple[Dependency, ...]:
        """The jobs this one waited for (``depends_on``), in the order it named them,
        each with its id, task, state and result as the claim that handed this job to
        its worker found them: a fan-in sums its parents' results from here, without a
        query of its own. Empty for a job without dependencies, and for one that no
        worker claimed (read them with ``Queue.dependencies``). See
        :mod:`pgqueue.dependencies`, also for those pruned since."""
        found: tuple[Dependency, ...] = self.__dict__.get("_dependencies", ())
        return found

    def attach_dependencies(self, dependencies: Sequence[Dependency]) -> None:
        """Set :attr:`dependencies`: the claim does, before any handler sees the job."""
        self.__dict__["_dependencies"] = tuple(dependencies)

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
        # Named as the column and every answer of the API name it.
        out["progress"] = out.pop(PROGRESS_FIELD)
        return out


def _check_connection(conn: object) -> None:
    if not isinstance(conn, psycopg.Connection):
        raise TypeError(
            f"expected a psycopg Connection or AsyncConnection, not {type(conn).__name__}"
        )


_JOB_FIELDS = tuple(f.name for f in fields(Job))
PROGRESS_FIELD = "progress_report"
"""The field that holds the column ``progress``."""
# Guards the making of a Job's cancellation event (see Job.wait_cancelled); taken only
# by handlers that wait and by attempts called off.
_cancel_lock = threading.Lock()


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

    @classmethod
    def all_created(cls, jobs: Iterable[Job]) -> list[EnqueueResult]:
        """The results of a call that created every one of ``jobs``. Built as
        :meth:`Job.from_fields` builds jobs, without the frozen dataclass's ``__init__``
        and its ``object.__setattr__`` per field, which a large batch pays per job."""
        results: list[EnqueueResult] = []
        append = results.append
        for job in jobs:
            result = object.__new__(cls)
            values = result.__dict__
            values["job"] = job
            values["created"] = True
            append(result)
        return results
