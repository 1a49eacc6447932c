"""pytest fixtures for testing pgqueue handlers against a real PostgreSQL.

The server is ``DATABASE_URL`` when set, otherwise the project's embedded PostgreSQL 18
(started if needed, left running): the one ``pgqueue db url`` shows from the same
directory, found by :func:`pgqueue.embedded.locate`. Every test process gets a database
of its own and every test a freshly migrated schema, so ``pytest -n auto`` is safe.

Fixtures:

- ``pgqueue_server_url``: the server (session).
- ``pgqueue_database_url``: this test process's own database on it (session).
- ``pgqueue_schema``: a migrated schema for this test, dropped afterwards.
- ``pgqueue_queue``: a :class:`pgqueue.Queue` on that schema.
- ``pgqueue_run_jobs``: runs a burst worker until nothing is runnable and returns the
  finished jobs.
- ``pgqueue_claim``: enqueues a job and claims it as a worker would, for calling a
  handler yourself: ``job.complete``, ``job.fence``, ``job.effect_key`` and
  ``job.transaction()`` work on it as under a worker.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator, Collection, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue import (
    Job,
    JobState,
    LifecycleHooks,
    PgQueueError,
    Queue,
    WorkerProtocol,
    collect_tasks,
    connections,
    embedded,
    get_plugin_manager,
    migrate,
)

if TYPE_CHECKING:
    from pgqueue_worker.handlers import HandlerLike


def _process_tag(config: pytest.Config) -> str:
    """A name part unique to this test process: pytest-xdist's run id and worker id
    when running under xdist, else a random one."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput:
        return f"{workerinput['testrunuid'][:8]}_{workerinput['workerid']}"
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def pgqueue_server_url() -> str:
    """The PostgreSQL server under test: DATABASE_URL, else the project's embedded
    PostgreSQL (PGQUEUE_PGDATA, else the project's .pgdata; see ``pgqueue db status``)."""
    return os.environ.get("DATABASE_URL") or embedded.start()


@pytest.fixture(scope="session")
def pgqueue_database_url(pgqueue_server_url: str, pytestconfig: pytest.Config) -> Iterator[str]:
    """A database of this test process's own, created for the session and dropped after."""
    name = f"pgqueue_test_{_process_tag(pytestconfig)}"
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(pgqueue_server_url, autocommit=True) as conn:
        conn.execute(drop)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield make_conninfo(pgqueue_server_url, dbname=name)
    with psycopg.connect(pgqueue_server_url, autocommit=True) as conn:
        conn.execute(drop)


@pytest.fixture
def pgqueue_schema(pgqueue_database_url: str) -> Iterator[str]:
    """A freshly migrated schema of this test's own, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    migrate(pgqueue_database_url, name)
    yield name
    with psycopg.connect(pgqueue_database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def pgqueue_queue(pgqueue_database_url: str, pgqueue_schema: str) -> Iterator[Queue]:
    """A :class:`pgqueue.Queue` on this test's schema."""
    queue = Queue.connect(pgqueue_database_url, schema=pgqueue_schema, max_size=20)
    try:
        yield queue
    finally:
        queue.close()


class RunJobs(Protocol):
    """What ``pgqueue_run_jobs`` gives a test: see the fixture."""

    def __call__(
        self,
        handlers: Mapping[str, HandlerLike] | None = None,
        *,
        queues: Collection[str] = ...,
        plugins: bool = ...,
        retry_base: float = ...,
        retry_cap: float = ...,
        wait_for_retries: float = ...,
        **options: Any,
    ) -> list[Job]: ...


@pytest.fixture
def pgqueue_run_jobs(pgqueue_queue: Queue) -> RunJobs:
    """A function that runs a burst worker on ``pgqueue_queue`` until no job it can
    claim is runnable, then returns every finished job (succeeded, dead, cancelled),
    oldest first.

    The worker serves the task handlers of installed plugins (``plugins=False`` to
    leave them out) plus ``handlers``, a mapping of task names to callables that wins
    a name clash; lifecycle hooks of installed plugins run as in a real worker.
    ``queues`` defaults to ``("default",)``; ``retry_base`` and ``retry_cap`` set the
    backoff of failed attempts, and a retry due within ``wait_for_retries`` seconds is
    waited for and run too; other keyword arguments go to :class:`pgqueue_worker.Worker`.
    """
    from pgqueue_worker import Worker, as_task_handlers, merge_handlers

    def run_jobs(
        handlers: Mapping[str, HandlerLike] | None = None,
        *,
        queues: Collection[str] = ("default",),
        plugins: bool = True,
        retry_base: float = pgqueue_queue.retry_base,
        retry_cap: float = pgqueue_queue.retry_cap,
        wait_for_retries: float = 10.0,
        **options: Any,
    ) -> list[Job]:
        pm = get_plugin_manager(load_entrypoints=plugins)
        merged = merge_handlers(collect_tasks(pm), as_task_handlers(handlers or {}))
        queue = Queue(
            pgqueue_queue.pool,
            schema=pgqueue_queue.schema,
            hooks=LifecycleHooks(pm),
            retry_base=retry_base,
            retry_cap=retry_cap,
        )
        deadline = time.monotonic() + wait_for_retries
        while True:
            Worker(queue, merged, queues=queues, burst=True, **options).run()
            # The burst worker stops when nothing is runnable now; a failed job whose
            # backoff ends soon is run too, so "until empty" includes its retries.
            wait = WorkerProtocol(queue).next_run_in(queues, merged)
            if wait is None or time.monotonic() + wait > deadline:
                return _finished_jobs(pgqueue_queue)
            time.sleep(max(wait, 0.0))

    return run_jobs


class Claim(Protocol):
    """What ``pgqueue_claim`` gives a test: see the fixture."""

    def __call__(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str = ...,
        lease_seconds: float = ...,
        **options: Any,
    ) -> Job: ...


@pytest.fixture
def pgqueue_claim(pgqueue_queue: Queue) -> Claim:
    """A function that enqueues a job of ``task`` with ``payload`` (other keyword
    arguments go to :meth:`pgqueue.Queue.enqueue`) on ``pgqueue_queue`` and claims it
    under a real lease of ``lease_seconds`` (default 60), as a worker would: the
    :class:`pgqueue.Job` to hand your handler.

    On it, ``job.complete(conn)``, ``job.fence(conn)`` and ``job.effect_key(name)``
    work as under a worker, and ``job.transaction()`` and ``job.atransaction()`` lend
    a connection of their own to the test's database. Nothing acks the job for you:
    after the handler, ``pgqueue_queue.get(job.id)`` shows what it left (succeeded, if
    it completed the job in a transaction that committed; still running otherwise).
    Cancel the job (``pgqueue_queue.cancel``) or let its lease run out to see what the
    handler does once the lease is lost."""
    protocol = WorkerProtocol(pgqueue_queue)
    protocol.lender = _TestLender(pgqueue_queue)

    def claim(
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str = "default",
        lease_seconds: float = 60.0,
        **options: Any,
    ) -> Job:
        enqueued = pgqueue_queue.enqueue(task, payload, queue=queue, **options).job
        claimed = protocol.claim([queue], [task], 1, lease_seconds=lease_seconds)
        if not claimed:
            raise PgQueueError(
                f"pgqueue_claim: job {enqueued.id} is not runnable now "
                f"({enqueued.state.value}, run at {enqueued.run_at.isoformat()})"
            )
        if claimed[0].id != enqueued.id:
            raise PgQueueError(
                f"pgqueue_claim: job {claimed[0].id}, queued before job {enqueued.id} with "
                f"the same task, was claimed first (and is now running)"
            )
        return claimed[0]

    return claim


class _TestLender:
    """Lends ``job.transaction()`` and ``job.atransaction()`` a connection of its own
    to the queue's database, made as the queue's are, closed at the block's end: a test
    may run several event loops, and nothing is left open behind it."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        with connections.connect_beside(self._queue.pool, application_name="pytest-pgqueue") as c:
            yield c

    @asynccontextmanager
    async def aconnection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        conninfo, kwargs = connections.settings_of(self._queue.pool)
        options = {**connections.connection_defaults(conninfo), **kwargs}
        options.update(autocommit=True, application_name="pytest-pgqueue")
        async with await psycopg.AsyncConnection.connect(conninfo, **options) as conn:
            yield conn


def _finished_jobs(queue: Queue) -> list[Job]:
    finished: list[Job] = []
    for state in (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED):
        after = None
        while True:
            page = queue.list(state=state, limit=1000, after=after)
            finished.extend(page.jobs)
            if page.next_after is None:
                break
            after = page.next_after
    return sorted(finished, key=lambda job: job.id)
