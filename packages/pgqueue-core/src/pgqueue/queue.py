"""``Queue``: the one place that speaks SQL to the jobs table.

Every state transition is one statement in its own short transaction, guarded by the
state it leaves and, for a worker's outcome, by the lease token it was claimed with.
Lifecycle hooks, when a :class:`~pgqueue.plugins.LifecycleHooks` is given, run after
that transaction has committed.
"""

from __future__ import annotations

import builtins  # Queue.list shadows list in the class body: its annotations say builtins.list
import copy
import logging
import math
import os
import socket
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, cast

import psycopg
import psycopg.errors
import psycopg_pool
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from pgqueue import (
    bulk,
    dependencies,
    history,
    jsonb,
    keyed,
    migrations,
    queries,
    tracing,
    validation,
)
from pgqueue.backoff import DEFAULT_BASE_SECONDS, DEFAULT_CAP_SECONDS, backoff_seconds
from pgqueue.deadlines import WATCHDOG, DeadlineExceeded
from pgqueue.dependencies import BatchItem, JobDependencies
from pgqueue.errors import (
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidTransition,
    JobNotFound,
    LeaseLost,
    UniqueKeyHeld,
    ValidationError,
    error_line,
)
from pgqueue.job import FINISHED_STATES, EnqueueResult, Job, JobState, Lease
from pgqueue.locks import advisory_key
from pgqueue.queue_control import QueueControlMethods
from pgqueue.registry import NO_WORKER, RegistryMethods, UnservedTask, WorkerRegistration
from pgqueue.schedule_store import ScheduleMethods
from pgqueue.settings import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    DEFAULT_SCHEMA,
    check_schema,
)

log = logging.getLogger("pgqueue.queue")

CLAIM_MODES = tuple(queries.CLAIM_LOCKS)
DEFAULT_POOL_TIMEOUT = 5.0

# Connection defaults: fail fast when the server is unreachable, and notice a dead
# peer within about half a minute: TCP keepalives for an idle connection (instead of
# the kernel's two hours), TCP_USER_TIMEOUT (milliseconds) for a statement in flight,
# which keepalives do not cover (instead of about fifteen minutes of retransmissions).
# Whatever the connection string sets itself wins (see connection_defaults).
CONNECTION_DEFAULTS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
    "application_name": "pgqueue",
}

# SQLSTATE classes that mean "the database cannot take this now", not "your call is
# wrong": connection loss, admin shutdown, read-only server, disk full, timeouts.
_UNAVAILABLE = (
    psycopg.OperationalError,
    psycopg_pool.PoolTimeout,
    psycopg.errors.ReadOnlySqlTransaction,
    psycopg.errors.InsufficientResources,
    psycopg.errors.QueryCanceled,
    psycopg.errors.LockNotAvailable,
)


@dataclass(frozen=True)
class JobSpec:
    """A job to enqueue, validated on construction."""

    task: str
    payload: dict[str, Any] = field(default_factory=dict)
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    delay_seconds: float | None = None
    run_at: datetime | None = None
    idempotency_key: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    timeout_seconds: float | None = None
    unique_key: str | None = None
    """While a queued or running job holds this key, enqueueing another returns that job
    instead (see :mod:`pgqueue.keyed`)."""
    depends_on: Sequence[int | BatchItem] = ()
    """Jobs that must succeed before this one is queued: ids, or earlier items of the
    same ``enqueue_many`` call (see :mod:`pgqueue.dependencies`)."""

    def __post_init__(self) -> None:
        validation.name("task", self.task)
        validation.name("queue", self.queue)
        validation.priority(self.priority)
        validation.max_attempts(self.max_attempts)
        if self.delay_seconds is not None and self.run_at is not None:
            raise ValidationError("delay_seconds", "give delay_seconds or run_at, not both")
        if self.delay_seconds is not None:
            validation.seconds("delay_seconds", self.delay_seconds)
        if self.run_at is not None:
            validation.run_at(self.run_at)
        if self.idempotency_key is not None:
            validation.idempotency_key(self.idempotency_key)
        if self.unique_key is not None:
            validation.unique_key(self.unique_key)
        if self.timeout_seconds is not None:
            validation.seconds("timeout_seconds", self.timeout_seconds, positive=True)
        if self.depends_on:
            object.__setattr__(self, "depends_on", dependencies.checked(self.depends_on))
        # Validate (and measure) the payload once; the text is what gets stored.
        object.__setattr__(self, "_payload_text", validation.payload(self.payload))

    @property
    def payload_text(self) -> str:
        """The payload as the JSON text that is stored (validated and measured once)."""
        text: str = self.__dict__["_payload_text"]  # set by __post_init__
        return text

    def queued_job(
        self,
        job_id: int,
        run_at: datetime,
        enqueued_at: datetime,
        *,
        loaded_payload: dict[str, Any] | None = None,
    ) -> Job:
        """The job this spec became, as the table holds it right after the insert that
        gave it ``job_id`` and those times (the rest is the spec's). ``loaded_payload``
        is :attr:`payload_text` already loaded, by a caller that loads many at once."""
        if loaded_payload is None:
            # As the table gives it back: the stored JSON text, loaded.
            loaded_payload = jsonb.load_json(self.payload_text.encode())
        return Job(
            id=job_id,
            queue=self.queue,
            task=self.task,
            payload=loaded_payload,
            priority=self.priority,
            state=JobState.QUEUED,
            run_at=run_at,
            attempts=0,
            max_attempts=self.max_attempts,
            timeout_seconds=self.timeout_seconds,
            lease_token=None,
            lease_expires_at=None,
            worker_id=None,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_error=None,
            errors=[],
            result=None,
            idempotency_key=self.idempotency_key,
        )

    def params(self) -> dict[str, Any]:
        """Statement parameters for ``job_insert`` and ``job_insert_many``."""
        return {
            "queue": self.queue,
            "task": self.task,
            "payload": self._payload_text,  # type: ignore[attr-defined]
            "priority": self.priority,
            "run_at": self.run_at,
            "delay_seconds": self.delay_seconds or 0.0,
            "max_attempts": self.max_attempts,
            "timeout_seconds": self.timeout_seconds,
            "idempotency_key": self.idempotency_key,
            "trace_context": None,  # JSON text, set by an enqueue that is traced
        }


class Waiter(NamedTuple):
    """A worker that LISTENs for new jobs, as its claims name it: a claim that comes back
    short records it as waiting on its queues for ``seconds`` (until its next claim), and
    only enqueues into queues with a waiter send a notification (see ``job_claim``)."""

    key: str
    """Unique to the worker (and, in a worker claiming for several sets of tasks, to
    the set)."""
    seconds: float
    """How long the record lasts without another claim: longer than the worker's poll
    interval, so a waiting worker's claims keep it alive."""


@dataclass(frozen=True)
class AckBatch:
    """What ``ack_many`` wrote: succeeded jobs, jobs whose result could not be stored
    (recorded as failed attempts instead), and the ids whose lease was lost."""

    succeeded: list[Job]
    failed: list[Job]
    lost: list[int]
    lost_leases: list[Lease] = field(default_factory=list)
    """The leases lost, for telling apart two outcomes of one job in the same batch."""


@dataclass(frozen=True)
class JobPage:
    """One page of ``list``: newest first; pass ``next_after`` to get the next page."""

    jobs: list[Job]
    next_after: int | None


@dataclass(frozen=True)
class QueueStats:
    """Counts per state for one queue, how long its oldest runnable job has waited, and
    its operator settings (see :meth:`Queue.update_queue`)."""

    queue: str
    counts: dict[str, int]
    oldest_runnable_age_seconds: float | None
    unserved: dict[str, int] = field(default_factory=dict)
    """Per task, the queued jobs that no live worker serves (see :meth:`Queue.unserved`)."""
    paused: bool = False
    concurrency_limit: int | None = None
    """Jobs running at once across every worker, at most; None: no limit."""
    rate_limit: float | None = None
    """Jobs started per second across every worker, at most; None: no limit."""


@dataclass(frozen=True)
class FinishedMinute:
    """How many jobs of one queue finished in one state during one minute (see
    :meth:`Queue.finished_per_minute`)."""

    queue: str
    state: str
    minute: datetime
    """The minute's start, on the database clock."""
    jobs: int


@dataclass(frozen=True)
class QueueMetrics:
    """One queue's figures in a :class:`MetricsSnapshot`."""

    queue: str
    jobs: dict[str, int]
    """Jobs now in each state."""
    completed: int
    """Attempts that succeeded, ever; pruning does not lower it."""
    failures: int
    """Attempts that failed or whose lease expired, ever."""
    oldest_runnable_age_seconds: float | None = None
    """How long the oldest runnable queued job has waited; None when none is."""


@dataclass(frozen=True)
class RunTimes:
    """The run-time histogram of one queue and task's succeeded attempts: seconds from
    claim to ack, on the database clock, counted by the ack statement."""

    queue: str
    task: str
    bounds: list[float]
    """Each bucket's upper bound, ascending; the last is infinity."""
    counts: list[int]
    """Attempts per bucket (not cumulative), one per bound."""
    seconds: float
    """The run times of them all, added up."""


@dataclass(frozen=True)
class MetricsSnapshot:
    """Every queue's figures, read in one database snapshot."""

    queues: list[QueueMetrics]
    run_times: list[RunTimes] = field(default_factory=list)
    """The run-time histogram per queue and task (see :meth:`Queue.run_times`)."""
    unserved: list[UnservedTask] = field(default_factory=list)
    """Queued jobs that no live worker serves, per queue and task (see
    :meth:`Queue.unserved`), read right after the rest."""
    workers: dict[str, int] = field(default_factory=dict)
    """Live workers serving each queue (see :meth:`Queue.workers`), read with
    ``unserved``."""


def connection_defaults(conninfo: str) -> dict[str, Any]:
    """CONNECTION_DEFAULTS less what ``conninfo`` sets itself: libpq takes keyword
    arguments over the connection string, so passing every default would silently undo
    a ``?connect_timeout=30`` or ``keepalives_idle=60`` chosen for a given network."""
    try:
        given = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        given = {}  # malformed: connecting will say so
    return {name: value for name, value in CONNECTION_DEFAULTS.items() if name not in given}


def default_worker_id() -> str:
    """host:pid:nonce. The nonce keeps a restarted process that reuses a pid apart."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Queue(RegistryMethods, QueueControlMethods, ScheduleMethods):
    """A job queue in one PostgreSQL schema.

    ``Queue.connect(url)`` opens a connection pool; ``Queue(pool)`` uses yours. The
    pool waits at most ``DEFAULT_POOL_TIMEOUT`` seconds for a connection, and every
    database failure surfaces as :class:`~pgqueue.errors.DatabaseUnavailable`.
    """

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        *,
        schema: str = DEFAULT_SCHEMA,
        hooks: Any = None,
        retry_base: float = DEFAULT_BASE_SECONDS,
        retry_cap: float = DEFAULT_CAP_SECONDS,
        max_payload_bytes: int = validation.PAYLOAD_MAX_BYTES,
        max_result_bytes: int = validation.RESULT_MAX_BYTES,
        statement_timeout: float | None = None,
    ) -> None:
        if isinstance(pool, (str, bytes)):
            # An easy slip, which would otherwise fail much later, far from its cause.
            raise TypeError(
                "Queue() takes a connection pool, not a database URL: "
                "use Queue.connect(url) to open one"
            )
        self.pool = pool
        self.schema = check_schema(schema)
        self.hooks = hooks
        self.retry_base = validation.seconds("retry_base", retry_base, positive=True)
        self.retry_cap = validation.seconds("retry_cap", retry_cap, positive=True)
        self.max_payload_bytes = validation.byte_limit("max_payload_bytes", max_payload_bytes)
        """Payloads larger than this, as JSON text, are refused on enqueue."""
        self.max_result_bytes = validation.byte_limit("max_result_bytes", max_result_bytes)
        """Results larger than this, as JSON text, make their attempt a failed one."""
        self.statement_timeout = (
            None
            if statement_timeout is None
            else validation.seconds("statement_timeout", statement_timeout, positive=True)
        )
        self._queues_with_settings: dict[tuple[str, ...], bool] = {}
        """Per list of queues claimed together, whether one of them had settings at the
        last claim (see _send_claim); shared by copies of this Queue."""
        """Seconds each pooled connection's work may take before the connection is cut
        off (see :mod:`pgqueue.deadlines`); None waits as long as it takes."""

    @classmethod
    def connect(
        cls,
        conninfo: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        min_size: int = 1,
        max_size: int = 10,
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
        prepare: bool = True,
        **options: Any,
    ) -> Queue:
        """Open a pool to ``conninfo`` and return a Queue on it.

        ``prepare=False`` turns off server-side prepared statements, for PgBouncer in
        transaction mode. Other keyword arguments go to :class:`Queue`.
        """
        kwargs: dict[str, Any] = connection_defaults(conninfo)
        if not prepare:
            kwargs["prepare_threshold"] = None
        pool = psycopg_pool.ConnectionPool(
            conninfo,
            kwargs=kwargs,
            min_size=min_size,
            max_size=max_size,
            timeout=pool_timeout,
            open=True,
            name="pgqueue",
        )
        return cls(pool, schema=schema, **options)

    def with_statement_timeout(self, seconds: float | None) -> Queue:
        """This Queue, on the same pool, with hooks and limits, whose every statement on
        a pooled connection is cut off after ``seconds`` (None: never). A worker uses
        it so that no statement can hang it (see :mod:`pgqueue.deadlines`)."""
        bounded = copy.copy(self)
        bounded.statement_timeout = (
            None
            if seconds is None
            else validation.seconds("statement_timeout", seconds, positive=True)
        )
        return bounded

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------

    def _sql(self, name: str, lock: str = "skip-locked") -> psycopg.sql.SQL:
        return queries.bind(name, self.schema, lock)

    @contextmanager
    def _connection(self, conn: psycopg.Connection | None = None) -> Iterator[psycopg.Connection]:
        """A pooled connection in a transaction that commits on exit, or the caller's own
        connection untouched (its transaction is the caller's to commit)."""
        try:
            if conn is not None:
                yield conn
            elif self.statement_timeout is None:
                with self.pool.connection() as pooled:
                    yield pooled
            else:
                with (
                    self.pool.connection() as pooled,
                    WATCHDOG.watch(pooled, self.statement_timeout, "a statement"),
                ):
                    yield pooled
        except _UNAVAILABLE as exc:
            raise DatabaseUnavailable(_describe(exc)) from exc
        except DeadlineExceeded as exc:
            raise DatabaseUnavailable(f"database unavailable: {exc}") from exc

    def _rows(
        self,
        name: str,
        params: dict[str, Any] | None = None,
        *,
        conn: psycopg.Connection[Any] | None = None,
        lock: str = "skip-locked",
    ) -> list[dict[str, Any]]:
        with self._connection(conn) as c:
            cur = jsonb.cursor(c)
            cur.execute(self._sql(name, lock), params)
            return cur.fetchall() if cur.description else []

    def _notify(self, hook: str, **kwargs: Any) -> None:
        if self.hooks is not None:
            self.hooks.call(hook, **kwargs)

    def _notify_each(self, hook: str, calls: Iterable[Mapping[str, Any]]) -> None:
        if self.hooks is not None:
            self.hooks.call_each(hook, calls)

    # -- producing --------------------------------------------------------------

    def enqueue(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        delay_seconds: float | None = None,
        run_at: datetime | None = None,
        idempotency_key: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout_seconds: float | None = None,
        unique_key: str | None = None,
        depends_on: Sequence[int] = (),
        conn: psycopg.Connection | None = None,
    ) -> EnqueueResult:
        """Add one job; with an ``idempotency_key`` already in the table, return that job
        (``created=False``) if it has the same task, queue and payload, and raise
        :class:`~pgqueue.errors.IdempotencyConflict` if not.

        With a ``unique_key`` that a queued or running job holds, return that job
        (``created=False``), whatever its task, queue and payload; once it has finished,
        the key is free again. See :mod:`pgqueue.keyed` for both keys on one job.

        With ``depends_on`` (job ids), the job waits until those jobs have succeeded, and
        is cancelled if one ends dead or cancelled (see :mod:`pgqueue.dependencies`);
        ids that are no job raise :class:`~pgqueue.errors.UnknownDependencies`.

        Pass ``conn`` to enqueue inside your own transaction: the job then commits or
        rolls back with your writes, and workers are woken when you commit.
        """
        spec = JobSpec(
            task=task,
            payload={} if payload is None else payload,
            queue=queue,
            priority=priority,
            delay_seconds=delay_seconds,
            run_at=run_at,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts,
            timeout_seconds=timeout_seconds,
            unique_key=unique_key,
            depends_on=depends_on,
        )
        return self.enqueue_spec(spec, conn=conn)

    def enqueue_spec(
        self, spec: JobSpec, *, conn: psycopg.Connection | None = None
    ) -> EnqueueResult:
        """:meth:`enqueue` of the job ``spec`` describes (for a caller that has already
        built one, such as the HTTP API)."""
        if spec.idempotency_key is not None or spec.unique_key is not None or spec.depends_on:
            return self.enqueue_many([spec], conn=conn)[0]
        params = spec.params()
        validation.within_limit("payload", params["payload"], self.max_payload_bytes)
        if tracing.enabled():
            with tracing.sending([spec.queue], [spec.task]) as sent:
                params["trace_context"] = sent.trace_context
                row = self._insert_one(params, conn)
                sent.created([row["id"]])
        else:
            row = self._insert_one(params, conn)
        return EnqueueResult(spec.queued_job(row["id"], row["run_at"], row["enqueued_at"]), True)

    def _insert_one(self, params: dict[str, Any], conn: psycopg.Connection | None) -> Any:
        """Run job_insert for one job's ``params``: the row of what the server decided."""
        with self._connection(conn) as c:
            # No jsonb comes back, so a plain cursor: one with loaders of its own (as
            # jsonb.cursor makes) makes psycopg rebuild its adapters, about 40 us of CPU
            # per call, more than all of pgqueue's own Python on this path.
            cur = c.cursor(row_factory=dict_row)
            if conn is None:
                # One statement is its own transaction: in autocommit it costs one round
                # trip, where BEGIN, the statement and COMMIT cost more, even pipelined.
                c.autocommit = True
                try:
                    cur.execute(self._sql("job_insert"), params)
                finally:
                    c.autocommit = False
            else:
                cur.execute(self._sql("job_insert"), params)
            return cur.fetchone()

    def enqueue_many(
        self, specs: Iterable[JobSpec], *, conn: psycopg.Connection | None = None
    ) -> list[EnqueueResult]:
        """Add many jobs in one transaction, all or nothing; results follow the input
        order. Large keyless batches go in by COPY (see :mod:`pgqueue.bulk`).

        A payload over ``max_payload_bytes`` raises :class:`~pgqueue.validation.TooLarge`
        (a ValidationError) whose ``index`` is its position in ``specs``; nothing is added.

        Items whose idempotency key already exists (or repeats an earlier item's) return
        the existing job with ``created=False``, provided the job has the same task, queue
        and payload (payloads compared as JSON values). If not, the key names another job
        than the one asked for: :class:`~pgqueue.errors.IdempotencyConflict` is raised
        naming the items and what differs, and nothing is added, also in ``conn``'s
        transaction, which may still commit its other work. Priority, timing, attempts
        and time limit are not compared: a client retrying with other options still
        means the same job.

        Items whose unique key a queued or running job holds (or an earlier item of the
        call) return that job with ``created=False``, not compared (see
        :mod:`pgqueue.keyed`).

        An item's ``depends_on`` may name earlier items of the call by position,
        ``BatchItem(0)`` (see :mod:`pgqueue.dependencies`).
        """
        specs = list(specs)
        if not specs:
            return []
        if tracing.enabled():
            with tracing.sending([s.queue for s in specs], [s.task for s in specs]) as sent:
                results = self._enqueue_many(specs, conn, sent.trace_context)
                sent.created([result.job.id for result in results])
                return results
        return self._enqueue_many(specs, conn, None)

    def _enqueue_many(
        self, specs: list[JobSpec], conn: psycopg.Connection | None, trace_context: str | None
    ) -> list[EnqueueResult]:
        """enqueue_many, with ``trace_context`` (JSON text) stored with every job."""
        for index, spec in enumerate(specs):
            try:
                validation.within_limit("payload", spec.payload_text, self.max_payload_bytes)
            except validation.TooLarge as exc:
                exc.index = index
                raise
        if any(dependencies.has_dependencies(spec) for spec in specs):
            return self._enqueue_dependent(specs, conn, trace_context)
        if any(keyed.is_keyed(spec) for spec in specs):
            return self._enqueue_keyed(specs, conn, trace_context)
        if len(specs) >= bulk.COPY_MIN_JOBS:
            with self._connection(conn) as c, c.transaction() if c.autocommit else nullcontext():
                jobs = bulk.copy_jobs(c, self.schema, specs, trace_context)
            return [EnqueueResult(job, created=True) for job in jobs]
        rows = [spec.params() for spec in specs]
        if trace_context is not None:
            for row in rows:
                row["trace_context"] = trace_context
        columns = {key: [row[key] for row in rows] for key in rows[0]}
        with self._connection(conn) as c:
            cur = jsonb.cursor(c)
            if conn is not None:
                cur.execute(self._sql("job_insert_many"), columns)
            else:
                # A pooled connection and no key, so no conflict to check: the one
                # statement is its own transaction, in one round trip (as in enqueue).
                c.autocommit = True
                try:
                    cur.execute(self._sql("job_insert_many"), columns)
                finally:
                    c.autocommit = False
            # Keyless rows always insert, in input order, so their ids follow it.
            inserted = sorted((Job.from_row(row) for row in cur.fetchall()), key=lambda j: j.id)
            return [EnqueueResult(job, created=True) for job in inserted]

    def _enqueue_keyed(
        self, specs: list[JobSpec], conn: psycopg.Connection | None, trace_context: str | None
    ) -> list[EnqueueResult]:
        """enqueue_many of specs of which some carry an idempotency or a unique key."""
        with self._connection(conn) as c:
            # An autocommit connection would commit the insert before a conflict is
            # found or a key taken for nothing is released: make the statements one
            # transaction.
            atomic = conn is not None and c.autocommit
            with c.transaction() if atomic else nullcontext():
                cur = jsonb.cursor(c)
                results, conflicts = keyed.insert_keyed(cur, self.schema, specs, trace_context)
                if conflicts:
                    if conn is not None and not atomic:
                        # The caller's transaction: take back what this call added, so
                        # that it adds nothing (no savepoint: in a long transaction,
                        # one per call would overflow the server's subtransaction cache).
                        ids = [r.job.id for r in results if r.created]
                        cur.execute(self._sql("job_delete_created"), {"ids": ids})
                    # Otherwise the transaction is rolled back.
                    raise IdempotencyConflict(conflicts, items=len(specs))
                return results

    def _enqueue_dependent(
        self, specs: list[JobSpec], conn: psycopg.Connection | None, trace_context: str | None
    ) -> list[EnqueueResult]:
        """enqueue_many of specs of which some carry ``depends_on``."""
        dependencies.check_batch_items(specs)
        # In the caller's transaction, a savepoint: a refused batch (an idempotency
        # conflict, an unknown dependency) then takes back the dependency marks and
        # links it wrote as well as its jobs. Batches with dependencies are rare enough
        # for its cost.
        with self._connection(conn) as c, c.transaction():
            cur = jsonb.cursor(c)
            results, conflicts = dependencies.insert_with_dependencies(
                cur, self.schema, specs, trace_context
            )
            if conflicts:
                raise IdempotencyConflict(conflicts, items=len(specs))
        return results

    # -- working ----------------------------------------------------------------

    def claim(
        self,
        queues: Collection[str],
        tasks: Collection[str],
        limit: int = 1,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        worker_id: str | None = None,
        mode: str = "skip-locked",
        waiter: Waiter | None = None,
    ) -> list[Job]:
        """Claim up to ``limit`` runnable jobs of ``tasks`` in ``queues``, in one statement.

        Jobs come in claim order (priority DESC, run_at, id), each with a fresh
        ``lease_token`` valid for ``lease_seconds`` until a heartbeat extends it.

        A caller that LISTENs (see :meth:`listen`) passes a ``waiter``: enqueues notify
        only queues that a waiter's last claim found short of jobs.

        The queues' settings hold (see :meth:`update_queue`): a paused queue gives no
        job, a limited one no more than its concurrency and rate limits leave room for
        across every worker.

        Runs no hook: ``on_start`` belongs to whoever runs the handler, when it starts
        (the Worker does; a loop of your own may call
        ``queue.hooks.call("on_start", job=job)``).
        """
        params = _claim_params(queues, tasks, limit, lease_seconds, worker_id, mode, waiter)
        if params is None:
            return []
        key = tuple(params["queues"])
        plain = not self._queues_with_settings.get(key, True)
        claimed = self._claim_once(params, mode)
        if plain and self._queues_with_settings[key] and len(claimed) < limit:
            # A queue got settings since the last claim, and the plain claim took
            # nothing from it: claim again, now with the limited statement, so that the
            # caller is not told "no more jobs" (a worker would wait for a notification
            # that was sent before it began to wait).
            claimed += self._claim_once({**params, "limit": limit - len(claimed)}, mode)
        return self._refuse_undecodable(claimed)

    def _claim_once(self, params: dict[str, Any], mode: str) -> list[Job]:
        with self._connection() as conn:
            # Statements and COMMIT in one pipeline: a worker cut off after the claim
            # can never leave its transaction open on the server, holding the claimed
            # rows.
            with conn.pipeline():
                claim = self._send_claim(conn, params, mode)
                _send_commit(conn)
            return claim()

    def next_run_in(self, queues: Collection[str], tasks: Collection[str]) -> float | None:
        """Seconds until the earliest queued job of ``tasks`` in ``queues`` becomes
        runnable (zero or less: one is runnable now), measured on the database clock so
        a worker whose clock is off still wakes on time; None when none is queued."""
        rows = self._rows("job_next_run_delay", {"queues": list(queues), "tasks": list(tasks)})
        return rows[0]["seconds"] if rows else None

    def forget_waiters(self, waiters: Iterable[Waiter]) -> None:
        """Stop counting ``waiters`` as waiting for jobs (a worker that stops)."""
        keys = [waiter.key for waiter in waiters]
        if keys:
            self._rows("waiters_forget", {"waiters": keys})

    def listen(self, conn: psycopg.Connection) -> None:
        """Subscribe ``conn`` to this schema's new-job notifications. Each notification's
        payload is the name of a queue that just received runnable jobs (never a payload).

        ``conn`` must be a dedicated autocommit connection (not a pooled one: the
        subscription lasts as long as the session); read them with ``conn.notifies()``.
        """
        with self._connection(conn) as c:
            c.execute(self._sql("jobs_listen"))

    def heartbeat(
        self,
        leases: Iterable[Lease],
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        *,
        worker: WorkerRegistration | None = None,
    ) -> set[int]:
        """Extend every lease in one statement; return the ids whose lease was lost.
        With ``worker``, the same statement renews its row in the worker registry (and
        writes it again if it was lost), also when no lease is held.

        A lease whose row another transaction has locked right now (an ack, a cancel,
        the reaper) is neither extended nor reported lost: the next heartbeat decides."""
        leases = list(leases)
        if not leases and worker is None:
            return set()
        rows = self._rows(
            "job_heartbeat_many",
            {
                "ids": [lease.job_id for lease in leases],
                "tokens": [lease.token for lease in leases],
                "lease_seconds": lease_seconds,
                **(NO_WORKER if worker is None else worker.params()),
            },
        )
        return {row["id"] for row in rows}

    def ack(self, job: Job, result: Any = None) -> Job:
        """Mark ``job`` succeeded with ``result``, if its lease is still held.

        A result PostgreSQL cannot store (not JSON, NaN/Infinity, NUL) is recorded as a
        failed attempt instead, and the returned job says so. Raises
        :class:`~pgqueue.errors.LeaseLost` when the lease token no longer matches.
        """
        batch = self.ack_many([(job, result)])
        if batch.lost:
            raise LeaseLost(job.id)
        return (batch.succeeded or batch.failed)[0]

    def ack_many(self, outcomes: Iterable[tuple[Job, Any]]) -> AckBatch:
        """Acknowledge many jobs in one statement (results that cannot be stored become
        failed attempts, each its own statement)."""
        storable, unstorable = _split_storable(outcomes, self.max_result_bytes)
        written: _AckWritten | None = None
        if storable:
            with self._connection() as conn:
                # As in claim: a worker cut off mid-ack never leaves the rows locked.
                with conn.pipeline():
                    read_acks = self._send_acks(conn, storable)
                    _send_commit(conn)
                written = read_acks()
        return self._settle_acks(storable, written, unstorable)

    def _send_acks(
        self, conn: psycopg.Connection, storable: list[_Storable]
    ) -> Callable[[], _AckWritten]:
        """Send job_ack_many for ``storable`` in ``conn``'s current transaction (and
        pipeline), as one statement per ACK_STATEMENT_MAX_BYTES of results: a batch of
        large results would otherwise make a statement too large for PostgreSQL to take
        (1 GB), refused on every retry. The function returned reads what they wrote, as
        if one statement had written it all."""
        sent: list[tuple[int, psycopg.Cursor]] = []
        for offset, chunk in _ack_chunks(storable):
            cur = conn.cursor()
            cur.execute(self._sql("job_ack_many"), _ack_params(chunk))
            sent.append((offset, cur))

        def read() -> _AckWritten:
            finished_at = None
            refused: list[int] = []
            for offset, cur in sent:
                written = _AckWritten(*cur.fetchone()[:2])  # type: ignore[index]
                finished_at = finished_at or written.finished_at
                refused.extend(offset + position for position in written.refused)
            return _AckWritten(finished_at, refused)  # type: ignore[arg-type]

        return read

    def _send_claim(
        self, conn: psycopg.Connection, params: Mapping[str, Any], mode: str
    ) -> Callable[[], list[Job]]:
        """Send the claim and job_claim_times in ``conn``'s current transaction (and
        pipeline); the function returned reads the claimed jobs once they have come
        back, in claim order.

        Queues without settings, the common case, are claimed by job_claim. Queues of
        which one has settings (paused, limited) take job_claim_limited, behind
        job_claim_lock. Which one a claim sends is what the last claim of the same
        queues found (job_claim_times says); job_claim gives no job from a queue that
        has settings, so a stale guess costs one short claim, never a pause or a limit
        ignored (:meth:`claim` then claims again at once)."""
        key = tuple(params["queues"])
        rows = jsonb.cursor(conn, tuples=True)
        times = conn.cursor()
        if self._queues_with_settings.get(key, True):
            # Limited queues' claims take turns (see job_claim_lock): in a statement of
            # its own, so that the claim's snapshot, taken after the lock, sees the last
            # claim.
            conn.cursor().execute(self._sql("job_claim_lock"), params)
            rows.execute(self._sql("job_claim_limited", mode), params)
        else:
            rows.execute(self._sql("job_claim", mode), params)
        times.execute(self._sql("job_claim_times"), params)

        def read() -> list[Job]:
            jobs, settings = _claimed_jobs(rows, times, params)
            self._queues_with_settings[key] = settings
            return jobs

        return read

    def _settle_acks(
        self,
        storable: list[_Storable],
        written: _AckWritten | None,
        unstorable: list[tuple[Job, str]],
    ) -> AckBatch:
        """Turn what ``job_ack_many`` wrote into an AckBatch, record the unstorable
        results as failed attempts, and run ``on_success`` for what was acked."""
        succeeded: list[Job] = []
        lost: list[Lease] = []
        if written is not None:
            # Positions count from 1 in job_ack_many's arrays, which are in this order.
            refused = set(written.refused)
            for position, outcome in enumerate(storable, start=1):
                job = outcome.job
                if position in refused:
                    lost.append(Lease(job.id, job.lease_token))  # type: ignore[arg-type]
                else:
                    succeeded.append(job.succeeded(outcome.result, written.finished_at))
        failed: list[Job] = []
        for job, error in unstorable:
            try:
                failed.append(self.fail(job, error))
            except LeaseLost:
                lost.append(Lease(job.id, job.lease_token))  # type: ignore[arg-type]
        self._notify_each("on_success", ({"job": job, "result": job.result} for job in succeeded))
        return AckBatch(
            succeeded=succeeded,
            failed=failed,
            lost=[lease.job_id for lease in lost],
            lost_leases=lost,
        )

    def _refuse_undecodable(self, claimed: list[Job]) -> list[Job]:
        """The claimed jobs a handler can be given. A payload Python could not load
        (:class:`~pgqueue.jsonb.UndecodableJson`) makes its attempt a failed one, with
        the reason as its error, as an unstorable result does."""
        runnable = []
        for job in claimed:
            # Typed as the dict it should be; a payload Python could not load arrives
            # as UndecodableJson in its place.
            payload: object = job.payload
            if isinstance(payload, jsonb.UndecodableJson):
                with suppress(LeaseLost):
                    self.fail(job, f"payload could not be decoded: {payload.reason}")
            else:
                runnable.append(job)
        return runnable

    def fail(self, job: Job, error: str | BaseException) -> Job:
        """Record a failed attempt of ``job``: back to queued after a backoff, or dead
        when ``max_attempts`` is used up. Raises LeaseLost if the lease was lost."""
        message = _error_text(error)
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(
                self._sql("job_fail"),
                {
                    "id": job.id,
                    "token": job.lease_token,
                    "error": message,
                    "retry_delay": backoff_seconds(job.attempts, self.retry_base, self.retry_cap),
                },
            )
            rows = cur.fetchall()
            if not rows:
                raise LeaseLost(job.id)
            cancelled = self._cancel_dependents(cur, rows)
        failed = Job.from_row(rows[0])
        self._notify_failed(failed, message)
        self._notify_each("on_cancel", ({"job": dependent} for dependent in cancelled))
        return failed

    def _cancel_dependents(
        self, cur: psycopg.Cursor[dict[str, Any]], rows: Iterable[Mapping[str, Any]]
    ) -> list[Job]:
        """In ``cur``'s transaction, cancel the waiting dependents of the jobs in
        ``rows`` that ended dead or cancelled and have dependents."""
        ended = [
            (row["id"], str(row["state"]))
            for row in rows
            if row["has_dependents"] and row["state"] in ("dead", "cancelled")
        ]
        return dependencies.cancel_dependents(cur, self.schema, ended) if ended else []

    def _notify_failed(self, job: Job, message: str) -> None:
        dead = job.state is JobState.DEAD
        self._notify("on_fail", job=job, error=message, next_run_at=None if dead else job.run_at)
        if dead:
            self._notify("on_dead", job=job)

    def reap(self, limit: int = 1000) -> list[Job] | None:
        """Return expired leases to queued (with backoff) or dead; one reaper at a time.

        Returns the reaped jobs, or None when another process holds the reaper lock.
        """
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(self._sql("reaper_try_lock"), {"key": advisory_key("reap", self.schema)})
            if not queries.one_row(cur)["locked"]:
                return None
            cur.execute(
                self._sql("job_reap"),
                {"limit": limit, "base": self.retry_base, "cap": self.retry_cap},
            )
            rows = cur.fetchall()
            reaped = [Job.from_row(row) for row in rows]
            cancelled = self._cancel_dependents(cur, rows)
            # And the waiting records and registry rows of workers that stopped
            # without removing them.
            cur.execute(self._sql("waiters_expired_delete"))
            cur.execute(self._sql("workers_expired_delete"))
        for job in reaped:
            self._notify_failed(job, job.last_error or "lease expired")
        self._notify_each("on_cancel", ({"job": dependent} for dependent in cancelled))
        return reaped

    # -- operating --------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        """The job with this id. Raises JobNotFound."""
        rows = self._rows("job_get", {"id": job_id})
        if not rows:
            raise JobNotFound(job_id)
        return Job.from_row(rows[0])

    def dependencies(self, job_id: int) -> JobDependencies:
        """The jobs ``job_id`` depends on and the jobs that depend on it (ids that may
        since have been pruned). Empty for a job with neither; does not check that the
        job exists."""
        with self._connection() as conn:
            return dependencies.dependencies_of(jsonb.cursor(conn), self.schema, job_id)

    def cancel(self, job_id: int) -> Job:
        """Cancel a waiting, queued or running job; a running job's lease is revoked, so
        its worker's outcome is discarded and it is not retried. The jobs waiting for it
        are cancelled too, and theirs in turn (see :mod:`pgqueue.dependencies`).

        Raises JobNotFound, or InvalidTransition if the job has already finished."""
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(self._sql("job_cancel"), {"id": job_id})
            rows = cur.fetchall()
            cancelled = self._cancel_dependents(cur, rows)
        if not rows:
            raise InvalidTransition(job_id, self.get(job_id).state.value, "cancel")
        job = Job.from_row(rows[0])
        self._notify("on_cancel", job=job)
        self._notify_each("on_cancel", ({"job": dependent} for dependent in cancelled))
        return job

    def retry(self, job_id: int) -> Job:
        """Put a dead or cancelled job back to queued, runnable now, attempts reset to 0.

        Raises JobNotFound, or InvalidTransition for any other state; UniqueKeyHeld (an
        InvalidTransition) if another queued or running job holds its unique key."""
        try:
            rows = self._rows("job_retry", {"id": job_id})
        except psycopg.errors.UniqueViolation:
            # Only active_jobs_unique_key_idx can refuse the move (ids are unique).
            job = self.get(job_id)
            holders = self._rows("job_get_many_by_unique_key", {"unique_keys": [job.unique_key]})
            holder = holders[0]["id"] if holders else None
            raise UniqueKeyHeld(job_id, job.state.value, job.unique_key or "", holder) from None
        if not rows:
            raise InvalidTransition(job_id, self.get(job_id).state.value, "retry")
        job = Job.from_row(rows[0])
        self._notify("on_retry", job=job)
        return job

    def list(
        self,
        *,
        queue: str | None = None,
        state: str | JobState | None = None,
        task: str | None = None,
        limit: int = 50,
        after: int | None = None,
        above: int | None = None,
    ) -> JobPage:
        """Jobs newest first, filtered; ``after`` is the previous page's ``next_after``.

        ``above`` leaves out the jobs with that id or lower: with ``after``, a window of
        ids, which bounds how many jobs a filter that no index serves (``task``) reads."""
        if state is not None:
            try:
                state = JobState(state).value
            except ValueError:
                raise ValidationError(
                    "state", f"must be one of {', '.join(s.value for s in JobState)}"
                ) from None
        if not 1 <= limit <= 1000:
            raise ValidationError("limit", "must be between 1 and 1000")
        params = {"queue": queue, "state": state, "task": task, "after": after, "above": above}
        # Only the filters given, each as a plain comparison: a state filter then prunes
        # the finished jobs' partitions, which "state = %(state)s OR it is null" cannot.
        bounds = {"after": "<", "above": ">"}
        filters = sql.SQL("").join(
            sql.SQL(" AND {} {} {}").format(
                sql.Identifier("id" if name in bounds else name),
                sql.SQL(bounds.get(name, "=")),
                sql.Placeholder(name),
            )
            for name, value in params.items()
            if value is not None
        )
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(
                queries.compose("job_list", self.schema, filters=filters),
                {**params, "limit": limit + 1},
            )
            rows = cur.fetchall()
        jobs = [Job.from_row(row) for row in rows[:limit]]
        return JobPage(jobs=jobs, next_after=jobs[-1].id if len(rows) > limit else None)

    def get_by_idempotency_key(self, key: str) -> Job | None:
        """The job holding idempotency key ``key``, or None (the key was never used, or
        its job was pruned)."""
        validation.idempotency_key(key)
        rows = self._rows("job_get_by_idempotency_key", {"key": key})
        return Job.from_row(rows[0]) if rows else None

    def get_by_unique_key(self, key: str) -> Job | None:
        """The queued or running job holding unique key ``key``, or None (no such job:
        a finished job keeps its ``unique_key`` but no longer holds it). Indexed
        (active_jobs_unique_key_idx), however much history is kept."""
        validation.unique_key(key)
        rows = self._rows("job_get_many_by_unique_key", {"unique_keys": [key]})
        return Job.from_row(rows[0]) if rows else None

    def finished_per_minute(self, minutes: int = 60) -> builtins.list[FinishedMinute]:
        """Jobs finished per queue, state and minute over the last ``minutes`` minutes
        (the current one included), oldest first; minutes without any are left out.
        Reads only those minutes' jobs, however much history is kept."""
        if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= 1440:
            raise ValidationError("minutes", "must be an integer between 1 and 1440")
        rows = self._rows("jobs_finished_per_minute", {"minutes": minutes})
        return [
            FinishedMinute(row["queue"], row["state"], row["minute"], row["jobs"]) for row in rows
        ]

    def stats(self) -> builtins.list[QueueStats]:
        """Counts per queue and state, and the oldest runnable job's age, in one snapshot.

        Queued and running jobs are counted in the table of unfinished jobs, finished ones
        read from the counters their finishing statements keep, so this costs the same
        however much history is kept. ``unserved`` comes from :meth:`unserved`, read
        right after."""
        with self._connection() as conn:
            rows = self._rows("queue_stats", conn=conn)
            unserved = self.unserved(conn=conn)
        by_queue: dict[str, dict[str, int]] = {}
        for entry in unserved:
            by_queue.setdefault(entry.queue, {})[entry.task] = entry.jobs
        return [
            QueueStats(
                queue=row["queue"],
                counts={state.value: row[state.value] for state in JobState},
                oldest_runnable_age_seconds=row["oldest_runnable_age_seconds"],
                unserved=by_queue.get(row["queue"], {}),
                paused=row["paused"],
                concurrency_limit=row["concurrency_limit"],
                rate_limit=row["rate_limit"],
            )
            for row in rows
        ]

    def prune(
        self,
        older_than: timedelta | float,
        states: Iterable[str | JobState] = FINISHED_STATES,
        *,
        batch_size: int = 1000,
    ) -> int:
        """Delete finished jobs that finished longer ago than ``older_than``, in batches
        of ``batch_size`` (one short transaction each). Returns how many were deleted.
        Their idempotency keys become free again.

        Pruning by hand, to the second: it deletes rows, which vacuum then reclaims. The
        worker's automatic pruning (:meth:`prune_expired`) drops whole days instead."""
        seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
        validation.seconds("older_than", seconds)
        chosen = [JobState(s) for s in states]
        if any(not s.finished for s in chosen):
            raise ValidationError("states", "only succeeded, dead and cancelled jobs can be pruned")
        statement = queries.compose("job_prune", self.schema, table=sql.Identifier("finished_jobs"))
        params = {
            "states": [s.value for s in chosen],
            "older_than_seconds": seconds,
            "batch_size": batch_size,
        }
        total = 0
        while True:
            with self._connection() as conn:
                deleted: int = queries.one_row(conn.execute(statement, params))[0]
            total += deleted
            if deleted < batch_size:
                return total

    def prune_expired(
        self,
        retention: Mapping[str | JobState, timedelta | float],
        *,
        batch_size: int = 500,
        max_batches: int = 100,
    ) -> int | None:
        """The automatic pruner's round: create the coming days of the finished jobs'
        partitions, drop the days past their state's retention, and delete the jobs past
        it from the DEFAULT partitions (see :mod:`pgqueue.history`).

        ``retention`` maps finished states to how long after finishing their jobs are
        kept; states left out are kept forever. A job is dropped with its day, so it is
        kept for its retention and at most a day more. Each step (a day created or
        dropped, a batch of at most ``batch_size`` jobs deleted from a DEFAULT
        partition, at most ``max_batches`` of them) is a short transaction of its own
        holding a transaction-scoped advisory lock, so however many processes call this,
        one changes the history at a time, and no lock outlives its transaction (safe
        behind PgBouncer).

        Returns how many jobs were removed, or None when another process held the lock
        before this call removed anything.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValidationError("batch_size", "must be a positive integer")
        if isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1:
            raise ValidationError("max_batches", "must be a positive integer")
        rules = dict(_retention_rules(retention))
        key = advisory_key("prune", self.schema)

        def our_turn(conn: psycopg.Connection) -> bool:
            locked: bool = queries.one_row(
                conn.execute(self._sql("pruner_try_lock"), {"key": key})
            )[0]
            return locked

        with self._connection() as conn:
            history.create_days(conn, self.schema, our_turn)
            dropped = history.drop_expired_days(conn, self.schema, rules, our_turn)
        if dropped is None:
            return None
        total = dropped
        batches = 0
        for state, seconds in rules.items():
            statement = queries.compose(
                "job_prune", self.schema, table=sql.Identifier(history.default_partition(state))
            )
            params = {
                "states": [state.value],
                "older_than_seconds": seconds,
                "batch_size": batch_size,
            }
            while batches < max_batches:
                with self._connection() as conn:
                    if not our_turn(conn):
                        return total or None
                    deleted = conn.execute(statement, params).fetchone()[0]  # type: ignore[index]
                batches += 1
                total += deleted
                if deleted < batch_size:
                    break
        return total

    # -- observing --------------------------------------------------------------

    def metrics_snapshot(self) -> MetricsSnapshot:
        """Job counts by state and completed and failed attempts of every queue, from one
        snapshot (as :meth:`stats` reads them, so the cost does not grow with history);
        and, read right after, the queued jobs no worker is taking (:meth:`unserved`)."""
        with self._connection() as conn:
            rows = self._rows("queue_stats", conn=conn)
            unserved = self.unserved(conn=conn)
            serving = self._rows("workers_per_queue", conn=conn)
            run_times = self.run_times(conn=conn)
        queues = [
            QueueMetrics(
                queue=row["queue"],
                jobs={state.value: row[state.value] for state in JobState},
                completed=row["completed"],
                failures=row["failures"],
                oldest_runnable_age_seconds=row["oldest_runnable_age_seconds"],
            )
            for row in rows
        ]
        return MetricsSnapshot(
            queues=queues,
            run_times=run_times,
            unserved=unserved,
            workers={row["queue"]: row["workers"] for row in serving},
        )

    def run_times(self, *, conn: psycopg.Connection | None = None) -> builtins.list[RunTimes]:
        """Per queue and task, the histogram of how long succeeded attempts ran (claim
        to ack, on the database clock), as the ack statement counts them: a few rows
        per queue and task, however much history is kept. Pruning does not lower it."""
        histograms = []
        for row in self._rows("run_time_histogram", conn=conn):
            per_bound = dict(zip(row["les"], row["attempts"], strict=True))
            bounds = list(row["bounds"])
            counts = [int(per_bound.get(bound, 0)) for bound in bounds]
            histograms.append(RunTimes(row["queue"], row["task"], bounds, counts, row["seconds"]))
        return histograms

    def unmigrated(self) -> str | None:
        """What this queue's schema lacks of the migrations this version of pgqueue
        ships, in one line, or None (see :func:`pgqueue.migrations.unmigrated`). Raises
        :class:`~pgqueue.errors.DatabaseUnavailable`, or
        :class:`~pgqueue.migrations.UnknownSchemaVersion` for a schema made by another
        pgqueue."""
        with self._connection() as conn:
            return migrations.unmigrated(conn, self.schema)

    def connection_settings(self) -> tuple[str, dict[str, Any]]:
        """The conninfo and connection keyword arguments of this queue's pool, for a
        connection of its own (a listener's, a health check's). A pool may take its
        conninfo from a function (psycopg_pool's dynamic conninfo): it is asked now, as
        the pool asks it for each connection."""
        pool = self.pool
        kwargs = pool.kwargs() if callable(pool.kwargs) else dict(pool.kwargs or {})
        conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
        return conninfo, kwargs

    def ping(self, timeout: float = 2.0) -> None:
        """Check that the database answers a query, on a connection of its own, so neither
        the pool's wait for a free connection nor a stale pooled connection gets in the way.

        Connecting gives up after ``timeout`` seconds (libpq's minimum is 2) per address
        the host resolves to. Raises :class:`~pgqueue.errors.DatabaseUnavailable`."""
        conninfo, kwargs = self.connection_settings()
        options = {**kwargs, "connect_timeout": max(2, math.ceil(timeout))}
        try:
            with psycopg.connect(conninfo, autocommit=True, **options) as conn:
                conn.execute(self._sql("database_ping"))
        except psycopg.Error as exc:
            raise DatabaseUnavailable(_describe(exc)) from exc


def _claim_params(
    queues: Collection[str],
    tasks: Collection[str],
    limit: int,
    lease_seconds: float,
    worker_id: str | None,
    mode: str,
    waiter: Waiter | None = None,
) -> dict[str, Any] | None:
    """Checked parameters of ``job_claim``, or None when there is nothing to claim."""
    if mode not in CLAIM_MODES:
        raise ValidationError("mode", f"must be one of {', '.join(CLAIM_MODES)}")
    if limit < 1 or not tasks or not queues:
        return None
    validation.seconds("lease_seconds", lease_seconds, positive=True)
    if waiter is not None:
        validation.seconds("waiter.seconds", waiter.seconds, positive=True)
    return {
        "queues": list(queues),
        "tasks": list(tasks),
        "limit": limit,
        "lease_seconds": lease_seconds,
        "worker_id": worker_id or default_worker_id(),
        "waiter": None if waiter is None else waiter.key,
        "waiter_seconds": None if waiter is None else waiter.seconds,
    }


def _retention_rules(
    retention: Mapping[str | JobState, timedelta | float],
) -> list[tuple[JobState, float]]:
    """(state, seconds kept after finishing) per state in ``retention``, checked."""
    rules: list[tuple[JobState, float]] = []
    for state, kept in retention.items():
        try:
            chosen = JobState(state)
        except ValueError:
            raise ValidationError("retention", f"{state!r} is not a job state") from None
        if not chosen.finished:
            raise ValidationError(
                "retention", "only succeeded, dead and cancelled jobs can be pruned"
            )
        seconds = kept.total_seconds() if isinstance(kept, timedelta) else kept
        rules.append((chosen, validation.seconds("retention", seconds)))
    return rules


def _claimed_jobs(
    cur: psycopg.Cursor, times_cur: psycopg.Cursor, params: Mapping[str, Any]
) -> tuple[list[Job], bool]:
    """The jobs a claim just returned on ``cur`` (a tuple-row cursor), with the times
    job_claim_times returned on ``times_cur``, in claim order (UPDATE ... RETURNING
    does not keep the claim CTE's order); and whether one of the queues has settings."""
    started_at, lease_expires_at, settings = times_cur.fetchone()  # type: ignore[misc]
    result = cur.pgresult
    if result is None or not result.nfields or not result.ntuples:
        return [], settings
    # What job_claim set alike on every row, and so does not return per row.
    shared = {
        "state": JobState.RUNNING,
        "worker_id": params["worker_id"],
        "started_at": started_at,
        "lease_expires_at": lease_expires_at,
    }
    # Column names straight from the result: cur.description builds a Column object per
    # column on every call.
    columns = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    jobs = Job.from_tuples(columns, cur.fetchall(), shared)
    # job_claim returns the payloads as text, to be loaded all at once.
    texts: list[Any] = [job.payload for job in jobs]  # still the text job_claim returned
    payloads = jsonb.load_json_texts(texts)
    for job, payload in zip(jobs, payloads, strict=True):
        object.__setattr__(job, "payload", payload)
    return sorted(jobs, key=lambda j: (-j.priority, j.run_at, j.id)), settings


class _Storable(NamedTuple):
    """An outcome PostgreSQL can store: the job, the handler's result, and its JSON text."""

    job: Job
    result: Any
    text: str


def _split_storable(
    outcomes: Iterable[tuple[Job, Any]], max_result_bytes: int
) -> tuple[list[_Storable], list[tuple[Job, str]]]:
    """Outcomes whose result PostgreSQL can store, and (job, error) for those it cannot
    or that are over ``max_result_bytes`` as JSON text.

    The storable ones come in job id order, the order job_ack_many is given them: any
    two acks that meet on the same rows then lock them in the same order (heartbeats
    never wait for a row: see job_heartbeat_many)."""
    storable: list[_Storable] = []
    unstorable: list[tuple[Job, str]] = []
    for job, result in outcomes:
        if result is None:  # most handlers return nothing: no need to serialise it
            storable.append(_Storable(job, None, "null"))
            continue
        try:
            text = validation.jsonb_text("result", result)
            validation.within_limit("result", text, max_result_bytes)
        except ValidationError as exc:
            unstorable.append((job, f"result could not be stored: {exc}"))
        else:
            storable.append(_Storable(job, result, text))
    storable.sort(key=lambda s: s.job.id)
    return storable, unstorable


class _AckWritten(NamedTuple):
    """The row job_ack_many returns."""

    finished_at: datetime
    refused: list[int]
    """Positions (from 1) of the outcomes whose lease was no longer held."""


ACK_STATEMENT_MAX_BYTES = 16 * 1024 * 1024
"""Results sent in one job_ack_many statement, at most (a single larger result goes
alone): far under PostgreSQL's 1 GB message limit, and quick to send and parse."""


def _ack_chunks(ordered: list[_Storable]) -> Iterator[tuple[int, list[_Storable]]]:
    """``ordered`` in runs of at most ACK_STATEMENT_MAX_BYTES of result text, each with
    the number of outcomes before it (for positions across statements)."""
    start = 0
    size = 0
    for index, outcome in enumerate(ordered):
        # Characters, not bytes: counting bytes would encode every result once more.
        # A run may so hold up to four times the bound, still far under 1 GB.
        length = len(outcome.text)
        if index > start and size + length > ACK_STATEMENT_MAX_BYTES:
            yield start, ordered[start:index]
            start, size = index, 0
        size += length
    yield start, ordered[start:]


def _send_commit(conn: psycopg.Connection) -> None:
    """Queue a COMMIT in ``conn``'s pipeline, as a statement of its own.

    Not ``conn.commit()``: inside a pipeline, psycopg (3.3 at least) then sends a Sync
    and waits for the results with part of a large statement still unsent in libpq's
    output buffer, while the server waits for the rest of it: both wait forever (see
    docs/psycopg-pipeline-commit-hang.md). The COMMIT sent as a statement is flushed,
    with everything before it, by the pipeline's exit, which sends until its buffer is
    empty before it reads; and it still commits in the same round trip, so a worker
    cut off after sending never leaves its transaction open, holding the rows.
    """
    conn.execute(b"COMMIT", prepare=False)


def _ack_params(ordered: list[_Storable]) -> dict[str, Any]:
    # Array literals and one JSON array, as job_ack_many expects: ids and UUIDs need no
    # quoting, and each result is already valid JSON text. Tokens go as their 32 hex
    # digits, which PostgreSQL reads as a uuid too: formatting the integer costs a
    # fraction of str(UUID), which inserts the hyphens in Python code.
    return {
        "ids": "{" + ",".join([str(s.job.id) for s in ordered]) + "}",
        # Every outcome is of a claimed job, which holds a lease token.
        "tokens": "{"
        + ",".join([f"{cast(uuid.UUID, s.job.lease_token).int:032x}" for s in ordered])
        + "}",
        "results": "[" + ",".join([s.text for s in ordered]) + "]",
    }


def _error_text(error: str | BaseException) -> str:
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    # PostgreSQL text cannot hold NUL, and an error message must never fail to store.
    return text.replace("\x00", "\\0")[:10_000]


def _describe(exc: BaseException) -> str:
    return f"database unavailable: {error_line(exc)}"


__all__ = [
    "CLAIM_MODES",
    "CONNECTION_DEFAULTS",
    "AckBatch",
    "JobPage",
    "JobSpec",
    "MetricsSnapshot",
    "Queue",
    "QueueMetrics",
    "QueueStats",
    "UnservedTask",
    "WorkerRegistration",
    "connection_defaults",
    "default_worker_id",
    "error_line",  # defined in pgqueue.errors; still importable from here, as it was
]
