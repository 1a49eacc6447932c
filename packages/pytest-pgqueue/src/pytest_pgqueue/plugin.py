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
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue import (
    Job,
    JobState,
    LifecycleHooks,
    Queue,
    WorkerProtocol,
    collect_tasks,
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
