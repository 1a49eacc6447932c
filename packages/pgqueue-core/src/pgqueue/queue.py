"""``Queue``: the client of one queue schema, for producers and operators.

Every state transition is one statement in its own short transaction, guarded by the
state it leaves. Lifecycle hooks, when a
:class:`~pgqueue.lifecycle_hooks.LifecycleHooks` is given, run after that transaction
has committed.

Queue is one object made of parts, one module each, all on
:class:`~pgqueue.queue_base.QueueBase` (its settings and the way a statement gets a
connection): producing (:mod:`pgqueue.producing`), what it reports
(:mod:`pgqueue.queue_metrics`), retention (:mod:`pgqueue.pruning`), the worker registry
(:mod:`pgqueue.registry`), queue settings (:mod:`pgqueue.queue_control`) and periodic
jobs (:mod:`pgqueue.schedule_store`). This module holds the rest: opening and closing
it, and reading and changing single jobs as an operator does. The worker's side
(claims, heartbeats, outcomes, the reaper) is another object on the same pool,
:class:`~pgqueue.worker_protocol.WorkerProtocol`.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.errors
import psycopg_pool
from psycopg import sql

from pgqueue import connections, dependencies, jsonb, migrations, queries, validation
from pgqueue.backoff import DEFAULT_BASE_SECONDS, DEFAULT_CAP_SECONDS
from pgqueue.claiming import CLAIM_MODES, Waiter, default_worker_id
from pgqueue.connections import CONNECTION_DEFAULTS, DEFAULT_POOL_TIMEOUT, connection_defaults
from pgqueue.dependencies import (
    NEIGHBOURS_LIMIT,
    WORKFLOW_LIMIT,
    JobDependencies,
    JobNeighbours,
    Workflow,
)
from pgqueue.errors import (
    DatabaseUnavailable,
    DependenciesFailed,
    InvalidTransition,
    JobNotFound,
    UniqueKeyHeld,
    ValidationError,
    error_line,
)
from pgqueue.job import Job, JobState
from pgqueue.job_spec import JobSpec
from pgqueue.job_watch import JobWatcher
from pgqueue.outcomes import OutcomeBatch
from pgqueue.producer_connections import ProducerConnections
from pgqueue.producing import ProducerMethods
from pgqueue.pruning import PruneMethods
from pgqueue.queue_base import describe_unavailable
from pgqueue.queue_control import QueueControlMethods
from pgqueue.queue_metrics import MetricsMethods, MetricsSnapshot, QueueMetrics, QueueStats
from pgqueue.registry import RegistryMethods, UnservedTask, WorkerRegistration
from pgqueue.schedule_store import ScheduleMethods
from pgqueue.schedule_sync import ScheduleSyncMethods
from pgqueue.settings import DEFAULT_SCHEMA, check_schema


@dataclass(frozen=True)
class JobPage:
    """One page of ``list``: newest first; pass ``next_after`` to get the next page."""

    jobs: list[Job]
    next_after: int | None


class Queue(
    ProducerMethods,
    MetricsMethods,
    PruneMethods,
    RegistryMethods,
    QueueControlMethods,
    ScheduleMethods,
    ScheduleSyncMethods,
):
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
        """Seconds each pooled connection's work may take before the connection is cut
        off (see :mod:`pgqueue.deadlines`); None waits as long as it takes."""
        # Shared with the copies with_statement_timeout makes: one watcher per pool.
        self._watchers = _WatcherSlot()

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
        pool = connections.open_pool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            timeout=pool_timeout,
            prepare=prepare,
        )
        queue = cls(pool, schema=schema, **options)
        # The pool is the Queue's alone: its producers may keep connections between
        # enqueues (see pgqueue.producer_connections).
        queue._producer_connections = ProducerConnections(pool)
        return queue

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
        """Stop the job watcher, if a wait started it, and close the pool, with the
        connections producers keep."""
        self._watchers.close()
        if self._producer_connections is not None:
            self._producer_connections.close()
        self.pool.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------

    # -- producing --------------------------------------------------------------

    # -- working ----------------------------------------------------------------

    # -- operating --------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        """The job with this id. Raises JobNotFound."""
        rows = self._rows("job_get", {"id": job_id})
        if not rows:
            raise JobNotFound(job_id)
        return Job.from_row(rows[0])

    def wait(self, job_id: int, timeout: float) -> Job:
        """The job once it is final (succeeded, dead or cancelled), or as it is when
        ``timeout`` seconds have passed (check its ``state``). Raises JobNotFound.

        The wait costs no query while it lasts: the Queue's :meth:`job_watcher`, one
        LISTEN connection for every wait of the Queue, wakes it when the statement
        that finishes the job commits. A job retried after it finished, before this
        call read it, is waited for again until the timeout."""
        timeout = validation.seconds("timeout", timeout)
        deadline = time.monotonic() + timeout
        watcher = self.job_watcher()
        while True:
            woken = watcher.wait(job_id, deadline - time.monotonic())
            job = self.get(job_id)
            if job.state.finished or not woken or time.monotonic() >= deadline:
                return job

    def job_watcher(self) -> JobWatcher:
        """The Queue's :class:`~pgqueue.job_watch.JobWatcher`, made on first use: the one
        connection on which every :meth:`wait` of this Queue (and of the
        :class:`~pgqueue.AsyncProducer` and API on it) hears of finished jobs."""
        return self._watchers.get(self)

    def dependencies(self, job_id: int) -> JobDependencies:
        """The jobs ``job_id`` depends on and the jobs that depend on it (ids that may
        since have been pruned). Empty for a job with neither; does not check that the
        job exists."""
        with self._connection() as conn:
            return dependencies.dependencies_of(jsonb.cursor(conn), self.schema, job_id)

    def neighbours(self, job_id: int, limit: int = NEIGHBOURS_LIMIT) -> JobNeighbours:
        """The first ``limit`` jobs ``job_id`` depends on and the first ``limit`` that
        depend on it, ids ascending, with their tasks and states (None for one pruned
        since), and how many there are each way: what a job's page shows, bounded
        however large the fan-in or fan-out. Does not check that the job exists."""
        with self._connection() as conn:
            return dependencies.neighbours_of(jsonb.cursor(conn), self.schema, job_id, limit)

    def workflow(self, job_id: int, limit: int = WORKFLOW_LIMIT) -> Workflow:
        """The graph of dependencies around ``job_id``: the job, every job it depends on
        directly or not, every job that depends on it directly or not (up to ``limit``
        each way, nearest first; ``Workflow.truncated`` says when some were left out),
        their states and the links between them. One statement, active and finished
        jobs alike; a pruned job still named by a link has no task and no state.

        Raises JobNotFound if ``job_id`` is no job."""
        if not 1 <= limit <= 10_000:
            raise ValidationError("limit", "must be between 1 and 10000")
        with self._connection() as conn:
            graph = dependencies.workflow_of(jsonb.cursor(conn), self.schema, job_id, limit)
        if not any(job.id == job_id and job.state is not None for job in graph.jobs):
            raise JobNotFound(job_id)
        return graph

    def cancel(self, job_id: int) -> Job:
        """Cancel a waiting, queued or running job; a running job's lease is revoked, so
        its worker's outcome is discarded and it is not retried. The jobs waiting for it
        are cancelled too, and theirs in turn (see :mod:`pgqueue.dependencies`).

        Raises JobNotFound, or InvalidTransition if the job has already finished."""
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(self._sql("job_cancel"), {"id": job_id})
            rows = cur.fetchall()
            ended = [(row["id"], "cancelled") for row in rows if row["has_dependents"]]
            cancelled = dependencies.cancel_dependents(cur, self.schema, ended) if ended else []
        if not rows:
            raise InvalidTransition(job_id, self.get(job_id).state.value, "cancel")
        job = Job.from_row(rows[0])
        self._notify("on_cancel", job=job)
        self._notify_each("on_cancel", ({"job": dependent} for dependent in cancelled))
        return job

    def retry(self, job_id: int) -> Job:
        """Put a dead or cancelled job back to queued, runnable now, attempts reset to 0.
        A job with dependencies waits again for those that have not succeeded (and is
        queued at once if they all have; see :mod:`pgqueue.dependencies`).

        Raises JobNotFound, or InvalidTransition for any other state; UniqueKeyHeld (an
        InvalidTransition) if another queued or running job holds its unique key, and
        DependenciesFailed (one too) if a job it depends on ended dead or cancelled."""
        try:
            with self._connection() as conn:
                cur = jsonb.cursor(conn)
                cur.execute(self._sql("job_retry"), {"id": job_id})
                row = cur.fetchone()
                job = None if row is None else Job.from_row(row)
                if row is not None and row["state"] == JobState.WAITING.value:
                    # Its dependencies, checked in this transaction as an enqueue's are
                    # as it commits: the job comes back counted anew, queued, or
                    # cancelled again by a dependency that failed, which refuses the
                    # retry (the transaction rolls back).
                    [job] = dependencies.checked_now(cur, self.schema)
                    if job.state is JobState.CANCELLED:
                        failed = dependencies.failed_dependencies(cur, self.schema, job_id)
                        raise DependenciesFailed(job_id, row["retried_from"], failed)
        except psycopg.errors.UniqueViolation:
            # Only active_jobs_unique_key_idx can refuse the move (ids are unique).
            held = self.get(job_id)
            holders = self._rows("job_get_many_by_unique_key", {"unique_keys": [held.unique_key]})
            holder = holders[0]["id"] if holders else None
            raise UniqueKeyHeld(job_id, held.state.value, held.unique_key or "", holder) from None
        if job is None:
            raise InvalidTransition(job_id, self.get(job_id).state.value, "retry")
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
        tags: Sequence[str] = (),
        payload_contains: dict[str, Any] | str | None = None,
        partition_key: str | None = None,
    ) -> JobPage:
        """Jobs newest first, filtered; ``after`` is the previous page's ``next_after``.

        ``above`` leaves out the jobs with that id or lower: with ``after``, a window of
        ids, which bounds how many jobs a filter that no index serves (``task``) reads.

        ``tags``: only the jobs that carry every one of them. ``payload_contains``: only
        the jobs whose payload contains this JSON object (or its text), as
        PostgreSQL's ``@>`` has it: ``{"customer": 7}`` finds every payload whose
        ``customer`` is 7, whatever else it holds. Queued and running jobs are found
        through indexes, in milliseconds however large the backlog; finished jobs are
        read newest first until the page is full, so a filter that few of them match
        reads the whole history (pass a finished ``state`` to read only its
        partitions, or a queued or running one to read none).

        ``partition_key``: only the jobs of that key."""
        if state is not None:
            try:
                state = JobState(state).value
            except ValueError:
                raise ValidationError(
                    "state", f"must be one of {', '.join(s.value for s in JobState)}"
                ) from None
        if not 1 <= limit <= 1000:
            raise ValidationError("limit", "must be between 1 and 1000")
        wanted_tags = list(validation.tags(tags, "tag")) if tags else None
        contains = None
        if payload_contains is not None:
            contains = validation.payload_filter(payload_contains)
        if partition_key is not None:
            validation.partition_key(partition_key)
        params = {
            "queue": queue,
            "state": state,
            "task": task,
            "partition_key": partition_key,
            "after": after,
            "above": above,
        }
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
        statement = "job_list"
        if wanted_tags or contains:
            # Containment, each through its index on active_jobs (see job_search).
            statement = "job_search"
            if wanted_tags:
                filters += sql.SQL(" AND tags @> %(tags)s::text[]")
            if contains:
                filters += sql.SQL(" AND payload @> %(payload_contains)s::jsonb")
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(
                queries.compose(statement, self.schema, filters=filters),
                {**params, "tags": wanted_tags, "payload_contains": contains, "limit": limit + 1},
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

    # -- observing --------------------------------------------------------------

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
        return connections.settings_of(self.pool)

    def ping(self, timeout: float = 2.0, *, application_name: str | None = None) -> None:
        """Check that the database answers a query, on a connection of its own, so neither
        the pool's wait for a free connection nor a stale pooled connection gets in the way.

        Connecting gives up after ``timeout`` seconds (libpq's minimum is 2) per address
        the host resolves to. The connection is named as the pool's are, or
        ``application_name``, so that ``pg_stat_activity`` can tell a check apart from
        the pool. Raises :class:`~pgqueue.errors.DatabaseUnavailable`."""
        try:
            with connections.connect_beside(
                self.pool,
                application_name=application_name,
                connect_timeout=max(2, math.ceil(timeout)),
            ) as conn:
                conn.execute(self._sql("database_ping"))
        except psycopg.Error as exc:
            raise DatabaseUnavailable(describe_unavailable(exc)) from exc


class _WatcherSlot:
    """The one :class:`JobWatcher` of a Queue and its copies, made on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watcher: JobWatcher | None = None

    def get(self, queue: Queue) -> JobWatcher:
        with self._lock:
            if self._watcher is None:
                self._watcher = JobWatcher(queue)
            return self._watcher

    def close(self) -> None:
        with self._lock:
            watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.close()


__all__ = [
    "CLAIM_MODES",
    "CONNECTION_DEFAULTS",  # defined in pgqueue.connections; importable from here, as it was
    "DEFAULT_POOL_TIMEOUT",
    "JobPage",
    "JobSpec",
    "MetricsSnapshot",
    "OutcomeBatch",
    "Queue",
    "QueueMetrics",
    "QueueStats",
    "UnservedTask",
    "Waiter",
    "WorkerRegistration",
    "connection_defaults",  # as CONNECTION_DEFAULTS
    "default_worker_id",
    "error_line",  # defined in pgqueue.errors; still importable from here, as it was
]
