"""Handlers that complete their job in their own transaction, under a real worker: the
worker writes nothing more for a job whose completion committed (no second ack, no
lost lease in its log, ``on_success`` once with the stored result), and fails the
attempt of one whose completion did not commit. ``job.transaction()`` and
``job.atransaction()`` lend the worker's connections for it."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from polling import wait_for
from worker_support import wait_until_state

from pgqueue import (
    Job,
    JobState,
    LeaseLost,
    LifecycleHooks,
    Queue,
    get_plugin_manager,
    hookimpl,
)


class Recorder:
    """A plugin recording on_success and on_fail calls."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.successes: list[tuple[int, Any, str]] = []
        self.failures: list[tuple[int, str]] = []

    @hookimpl
    def on_success(self, job: Job, result: Any) -> None:
        with self.lock:
            self.successes.append((job.id, result, job.state.value))

    @hookimpl
    def on_fail(self, job: Job, error: str) -> None:
        with self.lock:
            self.failures.append((job.id, error))


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def hooked_queue(queue: Queue, recorder: Recorder) -> Queue:
    """``queue`` with the recorder's hooks, and fast retries."""
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(recorder)
    return Queue(
        queue.pool,
        schema=queue.schema,
        hooks=LifecycleHooks(pm),
        retry_base=0.05,
        retry_cap=0.1,
    )


@pytest.fixture
def app_table(db: psycopg.Connection, schema: str) -> str:
    db.execute(f"CREATE TABLE {schema}.app_rows (job_id bigint NOT NULL, attempt int)")
    return f"{schema}.app_rows"


@pytest.fixture
def app_pool(database_url: str) -> Iterator[Any]:
    """The application's own pool, as a handler's module would hold it."""
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(database_url, min_size=1, max_size=4, open=True)
    try:
        yield pool
    finally:
        pool.close()


def app_rows(db: psycopg.Connection, table: str) -> list[tuple[int, int]]:
    return db.execute(f"SELECT job_id, attempt FROM {table} ORDER BY 1, 2").fetchall()


def ack_statements(db: psycopg.Connection, schema: str) -> int:
    """How many job_finish_many statements ran on this schema: a completion in the
    handler's transaction is one, and the worker must add none."""
    # Counted from the counters the statement bumps: every success adds one to
    # completed, whoever wrote it.
    row = db.execute(f"SELECT coalesce(sum(completed), 0)::int FROM {schema}.queue_counters")
    return row.fetchone()[0]  # type: ignore[index]


def test_a_handler_that_completes_in_its_own_transaction_is_not_acked_again(
    run_worker, hooked_queue, recorder, db, schema, app_table, app_pool, caplog
) -> None:
    def handler(payload: dict[str, Any], job: Job) -> str:
        with app_pool.connection() as conn:
            conn.execute(f"INSERT INTO {app_table} VALUES (%s, %s)", (job.id, job.attempts))
            job.complete(conn, {"stored": payload["n"]})
        return "ignored: the job was completed with its own result"

    jobs = [hooked_queue.enqueue("write", {"n": n}).job for n in range(20)]
    with caplog.at_level(logging.INFO, logger="pgqueue"):
        worker = run_worker({"write": handler}, on=hooked_queue)
        for job in jobs:
            done = wait_until_state(hooked_queue, job.id, JobState.SUCCEEDED)
            assert done.result == {"stored": job.payload["n"]}
        wait_for(lambda: worker.worker.counts["succeeded"] == 20, what="20 successes counted")
        assert worker.stop() is True
    assert app_rows(db, app_table) == [(job.id, 1) for job in jobs]
    assert sorted(recorder.successes) == [
        (job.id, {"stored": job.payload["n"]}, "succeeded") for job in jobs
    ]
    assert recorder.failures == []
    assert worker.worker.counts["lost"] == 0 and worker.worker.counts["failed"] == 0
    assert ack_statements(db, schema) == 20
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_completion_that_rolled_back_fails_the_attempt_and_it_is_retried(
    run_worker, hooked_queue, recorder, db, app_table, app_pool
) -> None:
    def handler(payload: dict[str, Any], job: Job) -> None:
        with app_pool.connection() as conn:
            conn.execute(f"INSERT INTO {app_table} VALUES (%s, %s)", (job.id, job.attempts))
            job.complete(conn, job.attempts)
            if job.attempts == 1:
                conn.rollback()  # the handler changes its mind: nothing happened

    job = hooked_queue.enqueue("flip", {}).job
    worker = run_worker({"flip": handler}, on=hooked_queue)
    done = wait_until_state(hooked_queue, job.id, JobState.SUCCEEDED)
    assert done.attempts == 2 and done.result == 2
    assert "did not commit" in done.errors[0]["error"]
    assert app_rows(db, app_table) == [(job.id, 2)]
    assert recorder.successes == [(job.id, 2, "succeeded")]
    assert len(recorder.failures) == 1 and "did not commit" in recorder.failures[0][1]
    assert worker.stop() is True


def test_a_handler_that_raises_after_its_completion_committed_leaves_the_job_succeeded(
    run_worker, hooked_queue, recorder, app_pool
) -> None:
    def handler(payload: dict[str, Any], job: Job) -> None:
        with app_pool.connection() as conn:
            job.complete(conn, "done")
        raise RuntimeError("after the fact")

    job = hooked_queue.enqueue("raise_late", {}).job
    worker = run_worker({"raise_late": handler}, on=hooked_queue)
    done = wait_until_state(hooked_queue, job.id, JobState.SUCCEEDED)
    assert done.attempts == 1 and done.result == "done"
    wait_for(lambda: recorder.successes, what="on_success")
    assert worker.stop() is True
    assert recorder.successes == [(job.id, "done", "succeeded")] and recorder.failures == []


def test_job_transaction_completes_with_the_result_set_in_the_same_commit(
    run_worker, hooked_queue, recorder, db, schema, app_table
) -> None:
    def handler(payload: dict[str, Any], job: Job) -> None:
        with job.transaction() as conn:
            conn.execute(f"INSERT INTO {app_table} VALUES (%s, %s)", (job.id, job.attempts))
            if payload.get("fail"):
                raise ValueError("rolled back with everything")
            job.set_result({"rows": 1})

    good = hooked_queue.enqueue("tx", {}).job
    bad = hooked_queue.enqueue("tx", {"fail": True}, max_attempts=1).job
    worker = run_worker({"tx": handler}, on=hooked_queue)
    assert wait_until_state(hooked_queue, good.id, JobState.SUCCEEDED).result == {"rows": 1}
    dead = wait_until_state(hooked_queue, bad.id, JobState.DEAD)
    assert "rolled back with everything" in dead.last_error
    assert app_rows(db, app_table) == [(good.id, 1)]
    wait_for(lambda: recorder.successes, what="on_success")
    assert recorder.successes == [(good.id, {"rows": 1}, "succeeded")]
    # The connection lent was one of the worker's handler connections.
    assert worker.stop() is True
    assert ack_statements(db, schema) == 1


def test_job_atransaction_for_an_async_handler(
    run_worker, hooked_queue, recorder, db, app_table
) -> None:
    async def handler(payload: dict[str, Any], job: Job) -> None:
        async with job.atransaction() as conn:
            assert isinstance(conn, psycopg.AsyncConnection)
            await conn.execute(f"INSERT INTO {app_table} VALUES (%s, %s)", (job.id, job.attempts))
            await asyncio.sleep(0.01)
            job.set_result(payload["n"])

    jobs = [hooked_queue.enqueue("atx", {"n": n}).job for n in range(10)]
    worker = run_worker({"atx": handler}, on=hooked_queue)
    for job in jobs:
        assert wait_until_state(hooked_queue, job.id, JobState.SUCCEEDED).result == job.payload["n"]
    wait_for(lambda: len(recorder.successes) == 10, what="ten on_success")
    assert worker.stop() is True
    assert app_rows(db, app_table) == [(job.id, 1) for job in jobs]


def test_the_handler_connections_are_the_workers_own(run_worker, hooked_queue, db) -> None:
    seen: list[str] = []

    def handler(payload: dict[str, Any], job: Job) -> None:
        with job.transaction() as conn:
            row = conn.execute("SELECT current_setting('application_name')").fetchone()
            seen.append(row[0])  # type: ignore[index]

    job = hooked_queue.enqueue("name", {}).job
    worker = run_worker({"name": handler}, on=hooked_queue)
    wait_until_state(hooked_queue, job.id, JobState.SUCCEEDED)
    assert worker.stop() is True
    assert seen == ["pgqueue-worker-handlers"]
    # Closed with the worker.
    wait_for(
        lambda: (
            not db.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'pgqueue-worker-handlers'"
                " AND datname = current_database()"
            ).fetchall()
        ),
        timeout=30,
        what="the handler connections to close",
    )


def test_a_cancelled_running_job_whose_handler_completes_stays_cancelled(
    run_worker, hooked_queue, recorder, db, app_table
) -> None:
    outcome: list[BaseException] = []
    started = threading.Event()

    def handler(payload: dict[str, Any], job: Job) -> None:
        started.set()
        job.wait_cancelled(30)
        try:
            with job.transaction() as conn:
                conn.execute(f"INSERT INTO {app_table} VALUES (%s, %s)", (job.id, job.attempts))
        except LeaseLost as exc:
            outcome.append(exc)
            raise

    job = hooked_queue.enqueue("slow", {}).job
    worker = run_worker({"slow": handler}, on=hooked_queue)
    assert started.wait(30)
    hooked_queue.cancel(job.id)
    wait_for(lambda: outcome, what="LeaseLost in the handler")
    assert worker.stop() is True
    assert hooked_queue.get(job.id).state is JobState.CANCELLED
    assert app_rows(db, app_table) == []
    assert recorder.successes == []


def test_a_completion_left_open_when_the_handler_returns_is_waited_for(
    run_worker, hooked_queue, recorder, database_url, caplog
) -> None:
    held: list[psycopg.Connection] = []

    def handler(payload: dict[str, Any], job: Job) -> None:
        conn = psycopg.connect(database_url)
        job.complete(conn, "eventually")
        held.append(conn)  # returned with the transaction open

    job = hooked_queue.enqueue("leak", {}).job
    with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
        worker = run_worker({"leak": handler}, on=hooked_queue)
        wait_for(lambda: "still open" in caplog.text, what="the warning")
        time.sleep(1.0)
        assert hooked_queue.get(job.id).state is JobState.RUNNING
        held[0].commit()
        held[0].close()
        assert wait_until_state(hooked_queue, job.id, JobState.SUCCEEDED).result == "eventually"
        wait_for(lambda: recorder.successes, what="on_success")
        assert worker.stop() is True
    assert recorder.successes == [(job.id, "eventually", "succeeded")]
    assert worker.worker.counts["lost"] == 0


@pytest.mark.parametrize("prepare", [True, False])
def test_lent_connections_prepare_statements_only_when_the_workers_do(
    prepare: bool, run_worker, database_url, schema
) -> None:
    # --no-prepare (prepare=False) is for PgBouncer in transaction mode, where a
    # statement prepared on one server connection is missing on the next: the
    # connections lent to handlers must not prepare either.
    queue = Queue.connect(database_url, schema=schema, prepare=prepare)
    prepared: list[int] = []

    def handler(payload: dict[str, Any], job: Job) -> None:
        with job.transaction() as conn:
            row = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
            prepared.append(row[0])  # type: ignore[index]

    try:
        jobs = [queue.enqueue("count", {}).job for _ in range(12)]
        worker = run_worker({"count": handler}, on=queue, concurrency=1)
        for job in jobs:
            wait_until_state(queue, job.id, JobState.SUCCEEDED)
        assert worker.stop() is True
    finally:
        queue.close()
    # One lent connection ran every job: psycopg prepares what runs often on it, unless
    # told not to.
    assert (max(prepared) > 0) is prepare, prepared
